#!/usr/bin/env bash
# What a server's batch costs (issue 29): batches of requests of mixed lengths, packed and not, against batches of like
# lengths (the CLI's), per stage on the GPU, on one lent GPU, from the repo root with .whl carried:
#   bash bench/2026-11-server/run24.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
step "mixed batches" 300 python3 scripts/experiments/mixed_batches.py -m $ckpt --folder /tmp/f4096 --rows 16,32,64 \
    --batches 24 --json "$OUT/mixed.json"
exit 0
