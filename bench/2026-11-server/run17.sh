#!/usr/bin/env bash
# The encoder's layer graphs for every batch size, and more captured shapes kept (issues 29 and 30), on one lent
# GPU, from the repo root with .whl carried:  bash bench/2026-11-server/run17.sh   (logs under $OUT)
# Copies of src with graphs.LayerGraphs changed (/tmp/all: MAX_FRAMES for 16 bits raised past any batch;
# /tmp/keep: KEEP 128 instead of 32), against src as it is:
# 1. the CLI on the 4096-file folder in bfloat16, txt, 2 rounds each: as shipped, all.
# 2. bfloat16 servers, 128, 32, 128 clients over the 4096 files: as shipped, keep, all.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/all /tmp/keep && cp -r src /tmp/all && cp -r src /tmp/keep
sed -i 's/^    MAX_FRAMES = {4: 768, 2: 6144}/    MAX_FRAMES = {4: 768, 2: 1 << 30}/' /tmp/all/graphscribe/graphs.py
sed -i 's/^    KEEP = 32$/    KEEP = 128/' /tmp/keep/graphscribe/graphs.py
grep -n "^    MAX_FRAMES\|^    KEEP" /tmp/all/graphscribe/graphs.py /tmp/keep/graphscribe/graphs.py | tee -a "$log"
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-shipped \
    --variant "txt: --dtype bfloat16"
PYTHONPATH=/tmp/site:/tmp/all step "cli bfloat16 4096, layer graphs for all" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 \
    --model $ckpt --rounds 2 --out /tmp/cli-all --variant "txt: --dtype bfloat16"
for name in shipped keep all; do
    if [ $name = shipped ]; then serve $name bfloat16; else serve $name bfloat16 PYTHONPATH=/tmp/site:/tmp/$name; fi
    step "server $name 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-$name-4096.json"
    stop $name
done
cat /tmp/cli-shipped/grid.md /tmp/cli-all/grid.md > "$OUT/cli-bf16.md"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
