#!/usr/bin/env bash
# The bar of issue 30 on the code as shipped (workers forked from the fork server), in one command: --devices all
# against one GPU on the 4096-file folder, default batching, whole CLI processes, rounds interleaved
# (scripts/cli_grid.py), bfloat16 3 rounds ($BF16_ROUNDS) and float32 2; then the outputs of one GPU and of two compared file by
# file in both dtypes. On the lent 2-GPU machine from the repo root with .whl carried:
#   bash bench/2026-11-devices/run11.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
T="python3 -m graphscribe.cli"
step "bfloat16 4096" 200 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds ${BF16_ROUNDS:-3} --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
step "float32 4096" 200 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
for dtype in float32 bfloat16; do
    step "$dtype texts" 120 bash -c "rm -rf /tmp/one /tmp/two; $T /tmp/f4096 -m $ckpt --dtype $dtype -o /tmp/one 2>&1 | tail -1;
        $T /tmp/f4096 -m $ckpt --dtype $dtype --devices all -o /tmp/two 2>&1 | tail -1;
        echo files: \$(ls /tmp/one | wc -l) \$(ls /tmp/two | wc -l); diff -rq /tmp/one /tmp/two | wc -l | sed 's/^/differing files: /'"
done
exit 0
