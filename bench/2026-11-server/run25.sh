#!/usr/bin/env bash
# The engine's readers (issue 29): samples read in one call that waits for all of them (MSG_WAITALL), text-only
# batches answered as soon as they are decoded, and the engine's GIL switch interval, on one lent GPU, from the repo
# root with .whl, .scratch/before (src at 5ad8650) and .scratch/probe carried:  bash bench/2026-11-server/run25.sh
# Every server is a copy with stage times in its access log (.scratch/probe/patch.py, kept as run25/probe_patch.py; run23); bfloat16, 128 clients
# twice over the 4096 files: before; after; after with a 0.5 ms and a 0.1 ms switch interval in the engine. Then the
# CLI, bfloat16, two rounds.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
python3 .scratch/probe/patch.py .scratch/before/src /tmp/p0
python3 .scratch/probe/patch.py src /tmp/p1
stages() {  # per pass of 4096 requests: the stages' means from the access log
    python3 - "$OUT/serve-$1.log" <<'PY' | tee -a "$log"
import re, sys
rows = [l for l in open(sys.argv[1]) if "| pre" in l]
keys = ["queue", "total", "read", "submit", "engine", "answer"]
for k in range(0, len(rows), 4096):
    part = rows[k : k + 4096]
    means = {key: sum(float(re.search(rf"{key} ([0-9.]+)", l).group(1)) for l in part) / len(part) for key in keys}
    print(sys.argv[1].split("/")[-1], f"requests {k}-{k + len(part)}:", ", ".join(f"{key} {v:.1f} ms" for key, v in means.items()))
PY
}
one() {  # NAME SRC [ENV=VALUE ...]
    local name=$1 src=$2; shift 2
    serve $name bfloat16 PYTHONPATH=/tmp/site:$src "$@"
    util $name
    step "server $name" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-$name.json"
    unutil $name
    stop $name
    stages $name
}
one before /tmp/p0
one after /tmp/p1
one after-switch0.5 /tmp/p1 PROBE_SWITCH=0.0005
one after-switch0.1 /tmp/p1 PROBE_SWITCH=0.0001
step "cli bfloat16 4096" 60 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-bf16 \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
