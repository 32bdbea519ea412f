#!/usr/bin/env bash
# Issue 51, ninth session: what the way through an engine process costs (the path `--devices` takes with several
# devices: HTTP worker -> the server's process -> the engine's and back), on one GPU: `transcribe serve --devices
# cuda:0` (its engine in the server's process) against scripts/experiments/serve_routed.py (the same device behind
# an engine process), interleaved in-process, routed, routed, in-process, each under 64 and 128 clients twice over
# the 4096 files (16 client processes); then each server's RTFx and its access log's stages (p50 / p95 ms). One H200,
# `.whl-serve.tar.xz` carried:  bash bench/2026-11-serve-devices/routed.sh
source scripts/gpu_setup.sh
for name in inproc-1 routed-1 routed-2 inproc-2; do
    if [ "${name%-*}" = routed ]; then
        python3 scripts/experiments/serve_routed.py -m $ckpt --dtype bfloat16 --port 8000 --devices cuda:0 \
            2> "$OUT/serve-$name.log" & server=$!
        wait_ready; echo "[$name] $(grep serving "$OUT/serve-$name.log")" | tee -a "$log"
    else
        EXTRA="--devices cuda:0" serve $name bfloat16
    fi
    step "server $name" 120 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
        --concurrency ${CONCURRENCY:-64,128,64,128} --client-processes 16 --json "$OUT/serve-$name.json"
    stop $name
done
python3 bench/2026-11-serve-devices/levels.py "$OUT" inproc-1 routed-1 routed-2 inproc-2 | tee "$OUT/summary.txt"
