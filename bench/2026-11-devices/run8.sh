#!/usr/bin/env bash
# Each --devices worker's start-up phases on one clock (DeviceStats.phases: started, torch imported, job, loaded,
# warmed = ready; done_at), round by round (scripts/experiments/devices_timeline.py): which phase makes one worker
# ready later than the other? bfloat16 5 rounds on both GPUs, then each GPU alone 2 rounds (a phase slower only
# beside the other worker is contention), float32 1 round; then the CLI's bar, one GPU against --devices all,
# bfloat16, 2 rounds interleaved. Issue 30. On the lent 2-GPU machine from the repo root with .whl carried:
#   bash bench/2026-11-devices/run8.sh   (logs under $OUT; SRC=DIR runs another copy of src/graphscribe)
set -uo pipefail
source scripts/gpu_setup.sh
[ -n "${SRC:-}" ] && export PYTHONPATH=/tmp/site:$SRC
nvidia-smi topo -m | tee -a "$log"
tl() { step "timeline $*" 200 python3 scripts/experiments/devices_timeline.py --folder /tmp/f4096 --model $ckpt "$@"; }
tl --dtype bfloat16 --rounds 5
tl --dtype bfloat16 --rounds 2 --devices cuda:0
tl --dtype bfloat16 --rounds 2 --devices cuda:1
tl --dtype float32 --rounds 1
step "bfloat16 4096" 240 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all"
exit 0
