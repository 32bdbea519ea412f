#!/usr/bin/env bash
# Issue 50's cost bars on one lent GPU: greedy throughput of `transcribe bench --folder` with 100 phrases boosted
# (phrases.txt beside this file, --boost 1.0) and with word confidence on, each against plain greedy in the same
# command, and NeMo 3.0's greedy, GPU-PB boosting and confidence on the same checkpoint and files beside it
# (scripts/nemo_beam_bench.py --runs greedy,boost,confidence); the calibrated parakeet-tdt-0.6b-v3-shaped checkpoint
# (random weights, NOT NVIDIA's), bfloat16, batch 128, the 4096-file folder:
#   bash bench/2026-11-boost-confidence/run.sh [PART...]   (carry .nemo-site.tar.xz and .whl-bench.tar.xz)
# Parts (all by default): ours (plain txt, boosted txt, plain json, json with confidence, REPS each; RUNS: some of
# "plain boost json confidence"),
# nemo (NeMo's three runs), table (the ratios against the bars: boosting costs at most 10%, confidence at most 5%).
# The CPU dry run: PY=.venv/bin/python NEMO_SITE=/work/nemo-cpu PRESET=tiny-tdt DEVICE=cpu FILES=6 BATCH=4 REPS=1 \
#   WORKERS=0 DTYPE=float32 CKPT=/tmp/boost-tiny.nemo OUT=/tmp/boost-out bash THIS
set -uo pipefail
GS_LAZY=1 CKPT=${CKPT:-/tmp/v3.nemo} source scripts/gpu_setup.sh  # wheels, NeMo, step, checkpoint, folder
nfiles=${FILES:-4096}; files=/tmp/f$nfiles; batch=${BATCH:-128}; dtype=${DTYPE:-bfloat16}
phrases=bench/2026-11-boost-confidence/phrases.txt
checkpoint ${PRESET:-parakeet-tdt-0.6b-v3} $ckpt
folder $files $nfiles
ours() { step "ours $1" 240 $PY -m graphscribe.cli bench --folder $files --batch-sizes $batch --reps ${REPS:-3} --graphs \
    -m $ckpt --device $device --dtype $dtype "${@:2}" --json $OUT/ours-$1.json; }
for part in ${*:-ours nemo table}; do case $part in
ours)
    for run in ${RUNS:-plain boost json confidence}; do case $run in
    plain) ours plain ;;
    boost) ours boost --hotwords-file $phrases --boost 1.0 ;;
    json) ours json --format json ;;
    confidence) ours confidence --format json --confidence ;;
    esac; done ;;
nemo)
    step "nemo $dtype" 540 env PYTHONPATH=$nemo_path $PY scripts/nemo_beam_bench.py --model $ckpt --folder $files \
        --runs greedy,boost,confidence --phrases $phrases --boost 1.0 --batch-size $batch --dtype $dtype \
        --num-workers ${WORKERS:-8} --device $device --json $OUT/nemo-$dtype.json ;;
table)
    $PY - "$OUT" "$dtype" <<'PY' | tee -a "$log"
import json, sys
from pathlib import Path
out, dtype = Path(sys.argv[1]), sys.argv[2]
def ours(name):
    path = out / f"ours-{name}.json"
    if not path.exists():
        return None
    rows = json.loads(path.read_text())["throughput"]
    return max(rows, key=lambda r: (r["graphs"], r["batch"]))["rtfx"]
nemo_path = out / f"nemo-{dtype}.json"
nemo = {r["run"]: r.get("rtfx") for r in json.loads(nemo_path.read_text())["runs"]} if nemo_path.exists() else {}
def ratio(a, b):
    return f"{a / b:.3f}" if a and b else "-"
def rtfx(x):
    return f"{x:.0f}" if x else "-"
rows = [("phrases boosted (txt)", ours("boost"), ours("plain"), nemo.get("boost"), nemo.get("greedy"), 0.90),
        ("confidence on (json)", ours("confidence"), ours("json"), nemo.get("confidence"), nemo.get("greedy"), 0.95)]
print(f"| {dtype} | ours RTFx | ours / our greedy | bar | NeMo RTFx | NeMo / NeMo greedy | ours / NeMo |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, a, b, na, nb, bar in rows:
    print(f"| {name} | {rtfx(a)} | {ratio(a, b)} | {bar} | {rtfx(na)} | {ratio(na, nb)} | {ratio(a, na)} |")
print(f"| greedy | {rtfx(ours('plain'))} (json: {rtfx(ours('json'))}) | | | {rtfx(nemo.get('greedy'))} | | "
      f"{ratio(ours('plain'), nemo.get('greedy'))} |")
PY
    ;;
esac; done
