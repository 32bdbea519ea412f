#!/usr/bin/env bash
# Where a request's time goes at 128 clients once batches are packed (issue 29), on one lent GPU, from the repo root
# with .whl and .scratch/probe carried:  bash bench/2026-11-server/run23.sh   (logs under $OUT)
# .scratch/probe/patch.py (its later version: run25/probe_patch.py, which takes the source folder first) copies src with stage times in each access-log line: upload read and parsed, decoded and
# sent to the engine, engine (sent -> answer back), answer sent. bfloat16 servers, 128 clients twice over the 4096
# files: 4 HTTP workers (as shipped), then 8; GPU utilisation beside.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
python3 .scratch/probe/patch.py /tmp/probe-src
stages() {  # per pass of 4096 requests: the stages' means from the access log
    python3 - "$OUT/serve-$1.log" <<'PY' | tee -a "$log"
import re, sys
rows = [l for l in open(sys.argv[1]) if "| pre" in l]
keys = ["queue", "total", "pre", "read", "submit", "engine", "answer"]
for k in range(0, len(rows), 4096):
    part = rows[k : k + 4096]
    means = {key: sum(float(re.search(rf"{key} ([0-9.]+)", l).group(1)) for l in part) / len(part) for key in keys}
    print(sys.argv[1].split("/")[-1], f"requests {k}-{k + len(part)}:", ", ".join(f"{key} {v:.1f} ms" for key, v in means.items()))
PY
}
for w in 4 8; do
    EXTRA="--http-workers $w" serve w$w bfloat16 PYTHONPATH=/tmp/site:/tmp/probe-src
    util w$w
    step "server w$w 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-w$w.json"
    unutil w$w
    stop w$w
    stages w$w
done
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
