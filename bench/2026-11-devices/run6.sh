#!/usr/bin/env bash
# --devices all with each worker on its own half of the cores, as shipped (devices.core_shares), against the same
# workers left unpinned (a patched copy) and one GPU (issue 30), on the lent 2-GPU machine, from the repo root with
# .whl carried:  bash bench/2026-11-devices/run6.sh   (logs under $OUT)
# The 4096-file folder, default batching, whole CLI processes, rounds interleaved: bfloat16 3 rounds; float32 1.
set -uo pipefail
source scripts/gpu_setup.sh
rm -rf /tmp/unpinned; cp -r src /tmp/unpinned
python3 - <<'PY'
p = "/tmp/unpinned/graphscribe/devices.py"; s = open(p).read()
old = '    if not hasattr(os, "sched_getaffinity"):'
assert old in s
s = s.replace(old, '    if True:'); open(p, "w").write(s)
PY
step "bfloat16 4096" 330 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all" \
    --variant "devices-unpinned: --dtype bfloat16 --devices all @PYTHONPATH=/tmp/site:/tmp/unpinned"
step "float32 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
exit 0
