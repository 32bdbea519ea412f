#!/usr/bin/env bash
# --devices all against one GPU (issue 30) after the encoder's layer graphs cover every bfloat16 batch and replay every layer of a shape seen before (fewer
# launches for each device's host thread), on the lent 2-GPU machine, from the repo root with .whl carried:
#   bash bench/2026-11-devices/run4.sh   (logs under $OUT)
# The 4096-file folder, default batching, whole CLI processes, rounds interleaved (scripts/cli_grid.py): bfloat16
# 3 rounds, float32 2; then float32's outputs of one GPU and of two compared file by file.
set -uo pipefail
source scripts/gpu_setup.sh
T="python3 -m graphscribe.cli"
nvidia-smi topo -m | head -4 | tee -a "$log"
step "bfloat16 4096" 260 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
step "float32 4096" 260 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
step "float32 texts" 150 bash -c "rm -rf /tmp/one /tmp/two; $T /tmp/f4096 -m $ckpt --dtype float32 -o /tmp/one 2>&1 | tail -1;
    $T /tmp/f4096 -m $ckpt --dtype float32 --devices all -o /tmp/two 2>&1 | tail -1;
    echo files: \$(ls /tmp/one | wc -l) \$(ls /tmp/two | wc -l); diff -rq /tmp/one /tmp/two | wc -l | sed 's/^/differing files: /'"
exit 0
