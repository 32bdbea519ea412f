#!/usr/bin/env bash
# The final code of stop 41 (the warm-up with batches of mixed lengths): the CLI in bfloat16 (3 rounds), two servers
# under 128 clients twice over the 4096 files (32, 8 and 1 clients on the first), the GPU-marked tests. Issue 29.
# One lent H100, from the repo root with .whl.tar.xz carried:  bash bench/2026-11-server/run57.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out /tmp/cli-bf16 \
    --variant "shipped: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
serve shipped-1 bfloat16; loaded shipped-1; low shipped-1; stop shipped-1
serve shipped-2 bfloat16; loaded shipped-2; stop shipped-2
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
