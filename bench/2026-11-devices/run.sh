#!/usr/bin/env bash
# --devices all against one GPU (issue 30), on the lent 2-GPU machine (nvidia-h100-x2), from the repo root with .whl
# carried:  bash bench/2026-11-devices/run.sh   (logs under $OUT)
# The 4096-file folder in bfloat16 and float32 with default batching, whole CLI processes, rounds interleaved
# (scripts/cli_grid.py); then the outputs of one GPU and of two compared file by file in both dtypes; then the
# in-process scaling at steady state (warm workers). run1/: before the workers started ahead of the parent's torch
# import, warmed up during loading and left without their teardown on the clock (the transcription clock then
# also held the workers' ~1 s of first uses and their teardown; one GPU's held its first uses).
set -uo pipefail
source scripts/gpu_setup.sh
ROUNDS=${ROUNDS:-3}
T="python3 -m graphscribe.cli"
step "bfloat16 4096" 260 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds $ROUNDS --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
step "float32 4096" 360 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds $ROUNDS --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
for dtype in bfloat16 float32; do
    step "$dtype texts" 150 bash -c "rm -rf /tmp/one /tmp/two; $T /tmp/f4096 -m $ckpt --dtype $dtype -o /tmp/one 2>&1 | tail -1;
        $T /tmp/f4096 -m $ckpt --dtype $dtype --devices all -o /tmp/two 2>&1 | tail -1;
        echo files: \$(ls /tmp/one | wc -l) \$(ls /tmp/two | wc -l); diff -rq /tmp/one /tmp/two | wc -l | sed 's/^/differing files: /'"
done
step "devices bench" 150 $T bench --folder /tmp/f4096 -m $ckpt --dtype bfloat16 --devices all --reps 3 --json "$OUT/devices-bf16.json"
