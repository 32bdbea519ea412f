#!/usr/bin/env bash
# Issue 51, ninth session: the GIL's switch interval in every process of a one-GPU server (its own, its HTTP
# workers), through a sitecustomize.py that sets it from GS_SWITCH: a thread that wakes for a request's message
# waits for the batching thread's GIL up to the interval (5 ms by default). Servers interleaved default, 1 ms,
# 0.5 ms, default, each under 64 and 128 clients twice over the 4096 files (16 client processes); RTFx and the
# access log's stages as routed.sh prints them. One H200, `.whl-serve.tar.xz` carried:
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
python3 - "$OUT" $NAMES <<'PY' | tee "$OUT/summary.txt"
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
stage = re.compile(r"POST \S+ 200 audio \S+ s, upload (\d+) ms, decode (\d+) ms, queue (\d+) ms, batch (\d+) ms, total (\d+) ms")
def spread(v):
    v = sorted(v)
    return f"{v[len(v) // 2]}/{v[int(len(v) * 0.95)]}"
for name in sys.argv[2:]:
    report = out / f"serve-{name}.json"
    rows = json.loads(report.read_text())["rows"] if report.exists() else []
    print(name, [(r["concurrency"], r["rtfx"], r["failed"]) for r in rows])
    log = out / f"serve-{name}.log"
    found = [tuple(map(int, m.groups())) for m in map(stage.search, log.read_text().splitlines()) if m] if log.exists() else []
    for k, r in enumerate(rows):  # a level is 4096 requests, in the log's order
        part = found[4096 * k : 4096 * (k + 1)]
        if part:
            cols = list(zip(*part))
            way = [t - u - d - q - b for u, d, q, b, t in part]
            print(f"  {r['concurrency']} clients: upload {spread(cols[0])}, decode {spread(cols[1])}, queue {spread(cols[2])}, "
                  f"batch {spread(cols[3])}, way {spread(way)}, total {spread(cols[4])}")
PY
