#!/usr/bin/env bash
# Where the engine's batching thread spends its time under 128 clients (issue 29): py-spy (carried in .whl in
# place of uvloop, which the engine does not use) attached to the engine of the server as shipped, 4 s of samples
# during a warm 128-client pass, every thread, idle included; once in Python frames, once with native frames.
# One lent H100, from the repo root:  bash bench/2026-11-server/run34.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
SPY=/tmp/spy/bin/py-spy
[ -x $SPY ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
serve spy bfloat16
step "warm pass" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128
for kind in python native; do
    flags=""; [ $kind = native ] && flags="--native"
    $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128,128 > "/tmp/bench-$kind.txt" 2>&1 & bench=$!
    sleep 1.5
    step "py-spy $kind" 30 $SPY record -p $server -d 4 -r 200 --threads --idle --nonblocking $flags -f raw -o "$OUT/spy-$kind.txt"
    wait $bench; grep "│" "/tmp/bench-$kind.txt" | tee -a "$log"
    python3 scripts/experiments/spy_summary.py "$OUT/spy-$kind.txt" | tee -a "$log"
done
stop spy
exit 0
