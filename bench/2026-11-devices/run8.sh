#!/usr/bin/env bash
# Where the two --devices workers' start-up differs (issue 30): per round, each worker's phases on one clock
# (DeviceStats.phases: its main started, torch imported, the job received, the model loaded, warmed up) with
# scripts/experiments/devices_timeline.py, bfloat16, 4 rounds. From the repo root with .whl carried, on the lent
# 2-GPU machine:  bash bench/2026-11-devices/run8.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
step "timeline bfloat16" 150 python3 scripts/experiments/devices_timeline.py --folder /tmp/f4096 --model $ckpt \
    --dtype bfloat16 --rounds 4
exit 0
