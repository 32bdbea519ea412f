#!/usr/bin/env bash
# A warm-up of every packed-row shape (service.packed_shape_plans; layer graphs kept up to 4 GiB) against the warm-up
# before it: does a server's first pass under 128 clients reach its second? after, before, before, after, each
# twice over the 4096 files; the CLI in bfloat16 (3 rounds) beside; and where a clip's float32 numbers move with its
# batch (scripts/experiments/f32_invariance.py). Issue 29. One lent H100, from the repo root with .whl.tar.xz
# carried:  bash bench/2026-11-server/run57.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/run57/grid.diff | tee -a "$log"
step "f32 invariance" 120 python3 scripts/experiments/f32_invariance.py -m $ckpt --folder /tmp/f512 --clip clip_366.flac
step "f32 invariance graphs" 120 python3 scripts/experiments/f32_invariance.py -m $ckpt --folder /tmp/f512 --clip clip_366.flac --graphs
ab_servers - /tmp/before
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out /tmp/cli-bf16 \
    --variant "shipped: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
