#!/usr/bin/env bash
# Prepared at stop 39, run at stop 40. A shallower server pipeline (shallow_patch.py: each batch
# decoded and answered before the next is taken) against the server as shipped, interleaved, 128 clients twice over
# the 4096 files each time, 2 rounds; 32 clients and 8 and 1 (512 files) on both in round 1; the CLI before and
# after. Issue 29. One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run40.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/shallow; cp -r src /tmp/shallow; python3 bench/2026-11-server/shallow_patch.py /tmp/shallow | tee -a "$log"
step "cli bfloat16 4096" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-a \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-a/grid.md "$OUT/cli-a.md"
serve shallow-1 bfloat16 PYTHONPATH=/tmp/site:/tmp/shallow; loaded shallow-1; low shallow-1; stop shallow-1
serve shipped-1 bfloat16; loaded shipped-1; low shipped-1; stop shipped-1
serve shipped-2 bfloat16; loaded shipped-2; stop shipped-2
serve shallow-2 bfloat16 PYTHONPATH=/tmp/site:/tmp/shallow; loaded shallow-2; stop shallow-2
step "cli bfloat16 4096 again" 60 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-b \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-b/grid.md "$OUT/cli-b.md"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
