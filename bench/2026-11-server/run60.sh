#!/usr/bin/env bash
# The size classes' warm-up rows of 35.84 s (run60/decode36.diff: every class's decode buffers then hold 512
# frames, no regrowth under LibriSpeech's longest requests) against 20 s, on top of the packed-shape warm-up (run58):
# a first server left out, then after, before, before, after under 128 clients twice over the 4096 files (32, 8 and
# 1 clients on the first pair); the CLI in bfloat16 (5 rounds) beside; the float32 bars on the tree. Issue 29. One
# lent H100, from the repo root with .whl.tar.xz carried:  bash bench/2026-11-server/run60.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/run60/decode36.diff | tee -a "$log"
serve first bfloat16; stop first
ab_servers - /tmp/before
step "cli bfloat16 4096" 220 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 5 --out /tmp/cli-bf16 \
    --variant "shipped: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
f32_bars
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
