#!/usr/bin/env bash
# The warm-up of every packed-row shape as built (run58/shapes.diff: encoder only, largest first; the layer graphs'
# static buffers shared, up to 512 shapes kept) against the code before it: a server's first pass under 128 clients
# against its second, its warm-up seconds and the GPU memory it holds once ready. after, before, before, after, each
# twice over the 4096 files (32, 8 and 1 clients on the first pair); the CLI in bfloat16 (5 rounds) beside. Issue 29.
# One lent H100, from the repo root with .whl.tar.xz carried:  bash bench/2026-11-server/run58.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/run58/shapes.diff | tee -a "$log"
loaded_memory() { loaded "$1"; echo "GPU memory used with $1 up: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)" | tee -a "$log"; }
for name in after-1 before-1 before-2 after-2; do
    if [ "${name%-*}" = before ]; then serve $name bfloat16 PYTHONPATH=/tmp/site:/tmp/before; else serve $name bfloat16; fi
    loaded_memory $name; [ "${name#*-}" = 1 ] && low $name; stop $name
done
step "cli bfloat16 4096" 220 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 5 --out /tmp/cli-bf16 \
    --variant "shipped: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
