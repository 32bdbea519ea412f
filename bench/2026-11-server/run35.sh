#!/usr/bin/env bash
# Batches collated without zeroing what follows each row (pipeline.collate; the features mask it) against the same
# code zeroing it (a patched copy), rounds interleaved: the server (4 HTTP workers on sockets of their own), 128
# clients twice over the 4096 files, each process's and thread's share of a core beside; and the CLI. Issue 29.
# One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run35.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
TN=$PWD/scripts/experiments/thread_names
rm -rf /tmp/zeroing; cp -r src /tmp/zeroing
python3 - <<'PY'
p = "/tmp/zeroing/graphscribe/pipeline.py"; s = open(p).read()
old = "        padded[row, : audio.numel()].copy_(audio)\n"
assert s.count(old) == 1
s = s.replace(old, old + "        padded[row, audio.numel() :].zero_()\n"); open(p, "w").write(s)
PY
step "cli bfloat16 4096" 200 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli \
    --variant "unzeroed: --dtype bfloat16" --variant "zeroing: --dtype bfloat16 @PYTHONPATH=/tmp/site:/tmp/zeroing"
cp /tmp/cli/grid.md "$OUT/cli.md"
for round in 1 2; do
    serve unzeroed-$round bfloat16 PYTHONPATH=/tmp/site:$PWD/src:$TN; probed unzeroed-$round
    serve zeroing-$round bfloat16 PYTHONPATH=/tmp/site:/tmp/zeroing:$TN; probed zeroing-$round
done
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
