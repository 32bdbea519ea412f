#!/usr/bin/env bash
# The server's batching policy without HTTP (issue 29): 128 client threads in one process submit the 4096 files to a
# Service (scripts/experiments/service_policy.py), bfloat16, one lent GPU, the CLI beside; from the repo root with
# .whl carried:  bash bench/2026-11-server/run8.sh   (logs under $OUT)
# Variants: share (a batch takes requests down to this share of its longest; 0: all), keep (encoder layer graphs
# kept: LayerGraphs.KEEP), rows (max_batch).
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/cli-bf16" \
    --variant "txt: --dtype bfloat16"
step "policy 128" 300 python3 scripts/experiments/service_policy.py -m $ckpt --folder /tmp/f4096 --clients 128 --reps 2 \
    --json "$OUT/policy-128.json" --variant share=0.5 --variant share=0 --variant share=0.7 --variant share=0.5,keep=32 \
    --variant share=0.7,keep=32 --variant share=0.5,keep=32,rows=128
step "policy 32" 120 python3 scripts/experiments/service_policy.py -m $ckpt --folder /tmp/f4096 --clients 32 --reps 1 \
    --json "$OUT/policy-32.json" --variant share=0,keep=4 --variant share=0.5,keep=32 --variant share=0.7,keep=32
exit 0
