#!/usr/bin/env bash
# The next batch launched from inside the decode (after its first round of steps is queued, before the host's first
# read; `pipeline._decode`'s `then`) against the code before it (the next batch's features and encoder launched
# before the decode began: a batch's answer waited for those launches), interleaved: the CLI in bfloat16 (3 rounds)
# and the server, 128 clients twice over the 4096 files each time, 2 pairs, with 32, 8 and 1 clients in the first.
# Issue 29. One lent H100, from the repo root with .whl and .snap (src/graphscribe/*.py of the commit before)
# carried:  bash bench/2026-11-server/run41.sh   (logs under $OUT; run41b.sh after it: float32 and the GPU tests)
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; cp .snap/src/graphscribe/*.py /tmp/before/graphscribe/
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out /tmp/cli-bf16 \
    --variant "after: --dtype bfloat16" --variant "before: --dtype bfloat16 @PYTHONPATH=/tmp/site:/tmp/before"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
ab_servers - /tmp/before
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
