#!/usr/bin/env bash
# run29 again, interleaved (issue 29): the subsampling in up to four runs of rows (as now) against one run
# (Packing.MAX_GROUPS = 1), three servers each, alternating; each bfloat16, 128 clients twice over the 4096 files, GPU
# utilisation beside; then the CLI, bfloat16, one round. One lent GPU, from the repo root with .whl carried:
#   bash bench/2026-11-server/run30.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/onegroup; cp -r src /tmp/onegroup
sed -i 's/MAX_GROUPS = 4/MAX_GROUPS = 1/' /tmp/onegroup/graphscribe/encoder.py; grep "MAX_GROUPS = " /tmp/onegroup/graphscribe/encoder.py
one() {  # NAME SRC
    serve $1 bfloat16 PYTHONPATH=/tmp/site:$2
    util $1
    step "server $1" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-$1.json"
    unutil $1
    stop $1
}
for r in 1 2 3; do one now$r $PWD/src; one onegroup$r /tmp/onegroup; done
step "cli bfloat16 4096" 60 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-bf16 \
    --variant "txt: --dtype bfloat16"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt run.log && rm -f serve-*.log metrics-*.txt serve-*.json)
grep -E "^\[|│ +128 |utilisation|\| txt" "$OUT/run.log" > "$OUT/summary.txt"
exit 0
