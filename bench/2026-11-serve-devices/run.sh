#!/usr/bin/env bash
# Issue 51's bar: one server on both GPUs (`serve --devices all`: an engine process each) against one server on one
# GPU (`serve --devices cuda:0`: today's single-process path), the calibrated v3-shaped checkpoint (random weights,
# NOT NVIDIA's) in bfloat16, 128 clients twice over the 4096 files each (`transcribe bench --serve`, the clients
# spread over $CLIENTS processes so that they are not the limit), servers interleaved one, all, all, one; then each
# run's RTFx, the ratio of the medians (bar: 1.9 or more) and the failed requests (bar: none). On the lent 2-GPU
# machine from the repo root with .whl-serve.tar.xz carried (.whl.tar.xz without onnxruntime and silero_vad: the tree
# and the whole .whl.tar.xz pass the 64 MiB a call carries):  bash bench/2026-11-serve-devices/run.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
unset CUDA_VISIBLE_DEVICES
# CONCURRENCY: the timed rounds' clients at once, a report row each (the bar: 128, twice)
# 2026-11-28: 4 client processes sent 475 requests a second each at 1.32x: 16, so that they are not the limit
CLIENTS=${CLIENTS:-16}
loaded2() {
    step "server $1" 120 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
        --concurrency ${CONCURRENCY:-128,128} --client-processes $CLIENTS --json "$OUT/serve-$1.json"
}
# ALL_EXTRA: options for the two-GPU server only (an experiment against the one-GPU server as it is: for instance
# `--max-wait-ms 0`, since an idle engine waits for company that the other engine may take).
# PYSPY=1 (carry .pyspy.xz: scripts/make_packs.sh pyspy): after the first run of each server's timed rounds, another
# PYSPY_ROUNDS (8) rounds of the same load (a round takes about 2 s), every process of the server (its own, its HTTP
# workers, the engines) sampled through them as raw folded stacks: $OUT/pyspy-NAME.txt
# (scripts/experiments/pyspy_summary.py: each process and thread's time); the rounds' report: serve-NAME-profiled.json
profiled() {
    [ -n "${PYSPY:-}" ] && [ "${1#*-}" = 1 ] || return 0
    [ -x /tmp/py-spy ] || { xz -dc .pyspy.xz > /tmp/py-spy && chmod +x /tmp/py-spy; }
    /tmp/py-spy record --pid $server --subprocesses --threads --idle --nonblocking -d ${PYSPY_S:-30} -r 100 -f raw \
        -o $OUT/pyspy-$1.txt > $OUT/pyspy-$1.log 2>&1 & spy=$!
    sleep 2  # py-spy finds the children and attaches
    local rounds; rounds=$(printf '128,%.0s' $(seq ${PYSPY_ROUNDS:-8})); rounds=${rounds%,}
    step "server $1, profiled" 180 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
        --concurrency $rounds --client-processes $CLIENTS --json "$OUT/serve-$1-profiled.json"
    kill -INT $spy 2>/dev/null; wait $spy
}
# NAMES: the servers run, in order (one-N: one GPU; all-N: both)
for name in ${NAMES:-one-1 all-1 all-2 one-2}; do
    case $name in
        one-*) EXTRA="--devices cuda:0 ${HTTP:-}" ;;
        *) EXTRA="--devices all ${HTTP:-} ${ALL_EXTRA:-}" ;;
    esac
    EXTRA=$EXTRA serve $name bfloat16
    util $name; loaded2 $name; unutil $name  # the GPUs' mean busy share over their nonzero samples
    profiled $name
    grep -E '^graphscribe_device_(requests_total|restarts_total)' <(curl -s localhost:8000/metrics) | tee -a "$log"
    stop $name
done
python3 - "$OUT" "${NAMES:-one-1 all-1 all-2 one-2}" <<'PY' | tee -a "$log"
import json, statistics, sys
from collections import defaultdict
from pathlib import Path
out = Path(sys.argv[1])
rtfx, failed = defaultdict(list), 0  # (group, clients) -> RTFx of each row
names = sys.argv[2].split()
for name in names:
    path = out / f"serve-{name}.json"
    if not path.exists():
        print(f"{name}: no report"); continue
    report = json.loads(path.read_text())
    rows = report["rows"]
    for r in rows:
        rtfx[name.split("-")[0], r["concurrency"]].append(r["rtfx"])
    failed += sum(r["failed"] for r in rows)
    print(f"{name}: {report['server'].get('device')}: RTFx {[r['rtfx'] for r in rows]}, failed {[r['failed'] for r in rows]}")
import re
stage = re.compile(r"POST \S+ 200 audio \S+ s, upload (\d+) ms, decode (\d+) ms, queue (\d+) ms, batch (\d+) ms, total (\d+) ms")
for name in names:  # the access log's stages of a transcription in the timed rounds, p50 / p95 (ms)
    path = out / f"serve-{name}.log"
    rows = [tuple(map(int, m.groups())) for m in map(stage.search, path.read_text().splitlines()) if m] if path.exists() else []
    rows = rows[: 2 * 4096]  # the profiled rounds come after
    if rows:
        cols = list(zip(*rows))
        rest = sorted(t - u - d - q - b for u, d, q, b, t in rows)
        def spread(v):
            v = sorted(v)
            return f"{v[len(v) // 2]}/{v[int(len(v) * 0.95)]}"
        print(f"{name}: {len(rows)} requests, upload {spread(cols[0])}, decode {spread(cols[1])}, queue {spread(cols[2])}, "
              f"batch {spread(cols[3])}, to the engine and back {spread(rest)}, total {spread(cols[4])} ms (p50/p95)")
for clients in sorted({c for _, c in rtfx}):
    if rtfx["one", clients] and rtfx["all", clients]:
        one, two = statistics.median(rtfx["one", clients]), statistics.median(rtfx["all", clients])
        print(f"{clients} clients, median RTFx: one GPU {one:.1f}, both {two:.1f}: {two / one:.2f}x (bar 1.9x at 128)")
print(f"failed requests: {failed} (bar 0)")
PY
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json pyspy-*.log 2>/dev/null; rm -f serve-*.log metrics-*.txt pyspy-*.log)
exit 0
