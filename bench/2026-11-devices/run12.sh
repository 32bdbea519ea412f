#!/usr/bin/env bash
# run11.sh on the code as shipped at stop 40 (workers forked from the fork server; a batch's first decode steps
# queued before the next batch's launches), with 5 bfloat16 rounds; scripts/cli_grid.py keeps each --devices run's
# per-device lines in grid.json. On the lent 2-GPU machine from the repo root with .whl carried:
#   bash bench/2026-11-devices/run12.sh   (logs under $OUT)
BF16_ROUNDS=5 exec bash bench/2026-11-devices/run11.sh
