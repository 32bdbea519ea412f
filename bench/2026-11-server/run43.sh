#!/usr/bin/env bash
# A decode whose host launches the next batch before its first read queues a first round as long as the last
# decode's rate predicts (`Decoder.rate`), not the lower bound: run42's timeline had the decode stream idle through
# most of those ~17 ms of launches. Against the code before it (.snap), interleaved: the CLI in bfloat16 (3 rounds);
# the server, 128 clients twice over the 4096 files, 2 pairs, 32, 8 and 1 clients in the first; the new server's
# timeline (timeline_patch.py); float32 outputs on 512 files before and after. Issue 29.
# One lent H100, from the repo root with .whl and .snap carried:  bash bench/2026-11-server/run43.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/before /tmp/tl; cp -r src /tmp/before; cp .snap/src/graphscribe/*.py /tmp/before/graphscribe/
cp -r src /tmp/tl; python3 bench/2026-11-server/timeline_patch.py /tmp/tl | tee -a "$log"
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out /tmp/cli-bf16 \
    --variant "after: --dtype bfloat16" --variant "before: --dtype bfloat16 @PYTHONPATH=/tmp/site:/tmp/before"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
ab_servers - /tmp/before
serve timeline bfloat16 PYTHONPATH=/tmp/site:/tmp/tl GRAPHSCRIBE_TIMELINE=$OUT/tl-server.json; loaded timeline; stop timeline
step "float32 outputs" 90 bash -c "rm -rf /tmp/o-after /tmp/o-before; $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/o-after 2>&1 | tail -1;
    PYTHONPATH=/tmp/site:/tmp/before $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/o-before 2>&1 | tail -1;
    echo files: \$(ls /tmp/o-after | wc -l) \$(ls /tmp/o-before | wc -l); diff -rq /tmp/o-after /tmp/o-before | wc -l | sed 's/^/differing files: /'"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
