#!/usr/bin/env bash
# --devices workers forked from multiprocessing's fork server, which imports torch once for all of them while the
# parent imports its own (as shipped), against each worker spawned and importing torch itself (.snap: the src of
# the commit before), one timeline round each in turn, twice (bfloat16); then the bar, one GPU against --devices
# all, bfloat16, 2 rounds interleaved. Issue 30. On the lent 2-GPU machine from the repo root, .whl and .snap
# carried:  bash bench/2026-11-devices/run10.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
rm -rf /tmp/old; cp -r src /tmp/old; cp .snap/src/graphscribe/*.py /tmp/old/graphscribe/
tl() { step "timeline $1" 40 env PYTHONPATH=/tmp/site:$2 python3 scripts/experiments/devices_timeline.py --folder /tmp/f4096 \
    --model $ckpt --dtype bfloat16 --rounds 1; }
tl warm-up src  # Triton's cache filled, files read once
for round in 1 2; do tl "forked-$round" src; tl "spawned-$round" /tmp/old; done
step "bfloat16 4096" 100 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
exit 0
