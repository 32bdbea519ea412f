#!/usr/bin/env bash
# Where the host's CPU goes with 128 clients (issue 29): the server as shipped with 4 HTTP workers (its default on
# 16 cores) and with 8, interleaved, each process's and thread's share of a core over the load test beside it
# (scripts/experiments/cpu_probe.py); the load test's clients in 1, 2 and 4 processes (load_processes.py, at commit
# a088f4d; now `transcribe bench --serve --client-processes`); the CLI
# before and after. One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run32.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
P="python3 scripts/experiments/cpu_probe.py"
step "cli bfloat16 4096" 120 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-a \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-a/grid.md "$OUT/cli-a.md"
for round in 1 2; do
    for w in 4 8; do
        EXTRA="--http-workers $w" serve w$w-$round bfloat16
        util w$w-$round
        step "server w$w round $round" 100 $P --pid $server -- $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
            --concurrency 128,128 --json "$OUT/serve-w$w-$round.json"
        unutil w$w-$round
        if [ $round = 2 ]; then
            step "client processes w$w" 120 $P --pid $server -- python3 scripts/experiments/load_processes.py \
                --folder /tmp/f4096 --clients 128 --processes 1,2,4,1
        fi
        stop w$w-$round
    done
done
step "cli bfloat16 4096 again" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-b \
    --variant "txt: --dtype bfloat16"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
