#!/usr/bin/env bash
# --devices all against one GPU (issue 30), on the lent 2-GPU machine (nvidia-h100-x2), from the repo root with .whl
# carried:  bash bench/2026-11-devices/run.sh   (logs under $OUT)
# The 4096-file folder in bfloat16 and float32 with default batching, whole CLI processes, rounds interleaved
# (scripts/cli_grid.py); then float32 outputs of one GPU and of two compared file by file.
set -uo pipefail
source scripts/gpu_setup.sh
step "bfloat16 4096" 200 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
step "float32 4096" 260 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
step "float32 texts" 120 bash -c "python3 -m graphscribe.cli /tmp/f4096 -m $ckpt --dtype float32 -o /tmp/one 2>/dev/null;
    python3 -m graphscribe.cli /tmp/f4096 -m $ckpt --dtype float32 --devices all -o /tmp/two 2>/dev/null;
    echo files: \$(ls /tmp/one | wc -l) \$(ls /tmp/two | wc -l); diff -rq /tmp/one /tmp/two | wc -l | sed 's/^/differing files: /'"
