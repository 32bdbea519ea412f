#!/usr/bin/env bash
# --devices all on the lent 2-GPU machine against one GPU, the CLI as shipped, rounds interleaved (bfloat16 2
# rounds, float32 1); then when each worker was ready and done, round by round
# (scripts/experiments/devices_timeline.py, bfloat16, 3 rounds): is a worker ready late, or one done early? Issue 30.
# From the repo root with .whl carried:  bash bench/2026-11-devices/run7.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
step "bfloat16 4096" 240 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
step "timeline bfloat16" 120 python3 scripts/experiments/devices_timeline.py --folder /tmp/f4096 --model $ckpt \
    --dtype bfloat16 --rounds 3
step "float32 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
exit 0
