#!/usr/bin/env bash
# Where clip_366's float32 numbers move with its batch, stage by stage (scripts/experiments/f32_invariance.py
# --inject): the whole pipeline, then the encoder given the clip's features computed alone, and the decode given
# its encoder output computed alone, in batches of 1-64 rows and padded lengths. Issue 29's float32 text bar. One
# lent H100, from the repo root with .whl.tar.xz carried:  bash bench/2026-11-server/run61.sh
set -uo pipefail
source scripts/gpu_setup.sh
python3 scripts/experiments/f32_invariance.py -m $ckpt --folder /tmp/f512 --clip clip_366.flac --inject 2>&1 | tee "$OUT/probe.log"
