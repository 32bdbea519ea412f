#!/usr/bin/env bash
# run28's server after c26ed7a ran slower than before it on that machine: which change (issue 29)? On one lent GPU,
# from the repo root with .whl and .scratch/before8d (the files of src that differ at 8d50e3a) carried:  bash bench/2026-11-server/run29.sh
# bfloat16 servers, 128 clients twice over the 4096 files, GPU utilisation beside, in turn: 8d50e3a; as now; as now
# with the copy on the current stream (model._copied a plain copy); as now with the subsampling in one run
# (Packing.MAX_GROUPS = 1). Then the CLI, bfloat16, one round.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/before /tmp/nocopy /tmp/onegroup; cp -r src /tmp/nocopy; cp -r src /tmp/onegroup; cp -r src /tmp/before
cp .scratch/before8d/*.py /tmp/before/graphscribe/
python3 - <<'PY'
p = "/tmp/nocopy/graphscribe/model.py"; s = open(p).read()
s = s.replace('if self.device.type != "cuda" or not host.is_pinned():', 'if True:'); open(p, "w").write(s)
p = "/tmp/onegroup/graphscribe/encoder.py"; s = open(p).read()
s = s.replace("MAX_GROUPS = 4", "MAX_GROUPS = 1"); open(p, "w").write(s)
PY
grep -c "if True:" /tmp/nocopy/graphscribe/model.py; grep "MAX_GROUPS = " /tmp/onegroup/graphscribe/encoder.py
one() {  # NAME SRC
    serve $1 bfloat16 PYTHONPATH=/tmp/site:$2
    util $1
    step "server $1" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-$1.json"
    unutil $1
    stop $1
}
one before /tmp/before
one now $PWD/src
one nocopy /tmp/nocopy
one onegroup /tmp/onegroup
one before-again /tmp/before
step "cli bfloat16 4096" 60 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-bf16 \
    --variant "txt: --dtype bfloat16"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
