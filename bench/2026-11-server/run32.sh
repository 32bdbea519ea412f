#!/usr/bin/env bash
# 4 HTTP workers (the default on 16 cores) against 8 with the server as shipped at stop 37 (issue 29), interleaved
# twice, on one lent GPU, from the repo root with .whl carried:  bash bench/2026-11-server/run32.sh  (logs under $OUT)
# bfloat16, 128 clients twice over the 4096 files per server, GPU utilisation beside.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
one() {  # NAME WORKERS
    EXTRA="--http-workers $2" serve $1 bfloat16
    util $1
    step "server $1" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-$1.json"
    unutil $1
    stop $1
}
for r in 1 2; do one w4-$r 4; one w8-$r 8; done
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt serve-*.json)
grep -E "^\[|│ +128 |utilisation" "$OUT/run.log" > "$OUT/summary.txt"
exit 0
