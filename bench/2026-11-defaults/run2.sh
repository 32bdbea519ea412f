#!/usr/bin/env bash
# Issue 34's bars on the shipped defaults, one GPU, NeMo 3.0 beside, from the repo root with .whl and .whl-nemo
# carried:  bash bench/2026-11-defaults/run2.sh   (logs under $OUT)
# The plain command (no batch flags) against explicit batches, both dtypes, 512 and 4096 files; json against txt
# (bfloat16, 4096); NeMo's transcribe() on the same files (scripts/nemo_folder.py).
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
step "bfloat16 4096" 220 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16-4096" \
    --variant "default: " --variant "b128: -b 128" --variant "b256: -b 256" \
    --variant "json-default: -f json -o {out}"
step "bfloat16 512" 90 python3 scripts/cli_grid.py --folder /tmp/f512 --model $ckpt --rounds 2 --out "$OUT/bf16-512" \
    --variant "default: " --variant "b128: -b 128" --no-warmup
step "float32 512" 120 python3 scripts/cli_grid.py --folder /tmp/f512 --model $ckpt --rounds 2 --out "$OUT/f32-512" \
    --variant "default: --dtype float32" --variant "b64: --dtype float32 -b 64" --variant "b16: --dtype float32 -b 16"
step "nemo" 200 env PYTHONPATH=/tmp/nemo-site python3 scripts/nemo_folder.py --model $ckpt --folder /tmp/f4096 \
    --batch-sizes 128 --dtype bfloat16 --json "$OUT/nemo-bf16-4096.json"
