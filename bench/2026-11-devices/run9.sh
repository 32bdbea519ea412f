#!/usr/bin/env bash
# Each --devices worker seeing its own GPU alone (CUDA_VISIBLE_DEVICES narrowed before torch is imported) against
# every worker seeing every GPU (src of the commit before, .snap), one round each in turn, 4 times
# (scripts/experiments/devices_timeline.py, bfloat16): how far apart the workers are ready, with torch's import and
# CUDA's start now marked apart. Then the bar, as shipped: one GPU against --devices all, bfloat16 2 rounds and
# float32 1, interleaved. Issue 30. On the lent 2-GPU machine from the repo root with .whl and .snap carried:
#   bash bench/2026-11-devices/run9.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
rm -rf /tmp/old; cp -r src /tmp/old; cp .snap/src/graphscribe/*.py /tmp/old/graphscribe/
nvidia-smi -q | grep -i -m2 persistence | tee -a "$log"
tl() { step "timeline $1" 60 env PYTHONPATH=/tmp/site:$2 python3 scripts/experiments/devices_timeline.py --folder /tmp/f4096 \
    --model $ckpt --dtype bfloat16 --rounds 1; }
tl warm-up src  # Triton's cache filled, files read once
for round in 1 2 3 4; do tl "own-$round" src; tl "every-$round" /tmp/old; done
step "bfloat16 4096" 240 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
step "float32 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
exit 0
