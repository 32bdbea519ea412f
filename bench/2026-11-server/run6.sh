#!/usr/bin/env bash
# Where a bfloat16 server's time goes under 128 clients (issue 29), on one lent GPU, from the repo root with .whl
# carried (py-spy among its wheels):  bash bench/2026-11-server/run6.sh   (logs under $OUT)
# 1. the real server, 128 clients over the 4096 files; meanwhile py-spy samples the engine's threads and one HTTP
#    worker's (idle included), and top the threads' CPU.
# 2. the same with the model's work replaced by an instant answer (scripts/experiments/serve_without_model.py): what
#    the HTTP workers, the engine's intake and the load test's clients manage alone here.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
SPY=/tmp/site/bin/py-spy
profile() {  # NAME PORT ENGINE_PID: a 128-client level with py-spy and top beside
    local name=$1 port=$2 engine=$3
    local worker=$(pgrep -P $engine -f multiprocessing | head -1)
    $T bench --serve http://127.0.0.1:$port --folder /tmp/f4096 --concurrency 128 --json "$OUT/$name-warm.json" > /dev/null 2>&1
    $T bench --serve http://127.0.0.1:$port --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/$name.json" > "$OUT/$name-bench.txt" 2>&1 & local bench=$!
    sleep 2
    $SPY record -p $engine -d 4 -r 250 --threads --idle -f raw -o "$OUT/$name-engine.txt" > /dev/null 2>&1 &
    $SPY record -p $worker -d 4 -r 250 --threads --idle -f raw -o "$OUT/$name-worker.txt" > /dev/null 2>&1 &
    top -H -b -n 2 -d 3 -w 200 > "$OUT/$name-top.txt"
    wait $bench; cat "$OUT/$name-bench.txt" | tee -a "$log"
    curl -s localhost:$port/metrics | grep -E "batch_rows_(sum|count)" | tee -a "$log"
}
$T serve -m $ckpt --dtype bfloat16 --port 8000 2> "$OUT/serve-bf16.log" & server=$!
wait_ready 8000; grep serving "$OUT/serve-bf16.log" | tee -a "$log"
profile real 8000 $server
kill -TERM $server; wait $server
python3 scripts/experiments/serve_without_model.py -m $ckpt --dtype bfloat16 --port 8001 2> "$OUT/serve-instant.log" & server=$!
wait_ready 8001; grep serving "$OUT/serve-instant.log" | tee -a "$log"
profile instant 8001 $server
kill -TERM $server; wait $server
python3 scripts/experiments/spy_summary.py "$OUT"/*-engine.txt "$OUT"/*-worker.txt 2>&1 | tee -a "$log"
exit 0
