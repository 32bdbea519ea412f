#!/usr/bin/env bash
# Issue 51, ninth session: the GIL's switch interval in every process of a one-GPU server (its own, its HTTP
# workers), through a sitecustomize.py that sets it from GS_SWITCH: a thread that wakes for a request's message
# waits for the batching thread's GIL up to the interval (5 ms by default). Servers interleaved default, 1 ms,
# 0.5 ms, default, each under 64 and 128 clients twice over the 4096 files (16 client processes); RTFx and the
# access log's stages a level (levels.py). One H200, `.whl-serve.tar.xz` carried:
#   bash bench/2026-11-serve-devices/switch.sh
source scripts/gpu_setup.sh
mkdir -p /tmp/swi
cat > /tmp/swi/sitecustomize.py <<'PY'
import os, sys
if os.environ.get("GS_SWITCH"):
    sys.setswitchinterval(float(os.environ["GS_SWITCH"]))
PY
NAMES=${NAMES:-default-1 ms1-1 ms05-1 default-2}
for name in $NAMES; do
    case $name in
        ms1-*) switch=0.001 ;;
        ms05-*) switch=0.0005 ;;
        *) switch= ;;
    esac
    EXTRA="--devices cuda:0" serve $name bfloat16 PYTHONPATH=/tmp/swi:/tmp/site:$PWD/src GS_SWITCH=$switch
    step "server $name" 120 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
        --concurrency ${CONCURRENCY:-64,128,64,128} --client-processes 16 --json "$OUT/serve-$name.json"
    stop $name
done
python3 bench/2026-11-serve-devices/levels.py "$OUT" $NAMES | tee "$OUT/summary.txt"
