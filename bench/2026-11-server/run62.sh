#!/usr/bin/env bash
# The code as shipped at the end of stop 42 (the warm-up of every packed-row shape, decode rows of 35.84 s), issue
# 29's bars in one command: the CLI in bfloat16 (5 rounds); a first server left out (the machine's own first uses),
# then two servers under 128 clients twice over the 4096 files (32, 8 and 1 clients on the first); float32: an idle
# server's 7.4 s clip and 8 at once, its text per file against the CLI's on 512 files; the GPU-marked tests. One
# lent H100, from the repo root with .whl.tar.xz carried:  bash bench/2026-11-server/run62.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
step "cli bfloat16 4096" 220 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 5 --out /tmp/cli-bf16 \
    --variant "shipped: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
serve first bfloat16; stop first
serve shipped-1 bfloat16; loaded shipped-1; low shipped-1; stop shipped-1
serve shipped-2 bfloat16; loaded shipped-2; stop shipped-2
f32_bars
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_bench.py tests/test_cli.py tests/test_gpu.py tests/test_pipeline.py tests/test_timestamps.py
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
