#!/usr/bin/env bash
# Where a packed batch of mixed lengths spends the GPU's time against one of like lengths (issue 29): kernels by GPU
# time, graphs off, on one lent GPU, from the repo root with .whl carried:  bash bench/2026-11-server/run26.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
step "mixed batches profiled" 300 python3 scripts/experiments/mixed_batches.py -m $ckpt --folder /tmp/f4096 --rows 32 \
    --batches 16 --profile --json "$OUT/mixed.json"
exit 0
