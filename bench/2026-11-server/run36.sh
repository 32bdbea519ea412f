#!/usr/bin/env bash
# The load test's clients in one process against four (`transcribe bench --serve --client-processes`, default one
# per 4 cores, at most 4), with 4 and 8 HTTP workers (each on a socket of its own), interleaved, 128 clients twice
# over the 4096 files each time; 32, 8 and 1 clients as shipped; the CLI before and after. Issue 29.
# One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run36.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
step "cli bfloat16 4096" 120 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-a \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-a/grid.md "$OUT/cli-a.md"
load() {  # NAME PROCESSES
    step "server $1 client processes $2" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
        --concurrency 128,128 --client-processes $2 --json "$OUT/serve-$1-p$2.json"
}
EXTRA="--http-workers 4" serve w4-a bfloat16; load w4-a 1; load w4-a 4; stop w4-a
EXTRA="--http-workers 8" serve w8 bfloat16; load w8 4; load w8 1; stop w8
serve w4-b bfloat16; load w4-b 4; load w4-b 1
step "server w4-b 32" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 32 --json "$OUT/serve-32.json"
step "server w4-b 8 1" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-8-1.json"
stop w4-b
step "cli bfloat16 4096 again" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-b \
    --variant "txt: --dtype bfloat16"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
