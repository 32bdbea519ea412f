#!/usr/bin/env bash
# After run41.sh on the same machine: the GPU-marked tests on the new code; the CLI in float32 before and after
# (2 rounds, interleaved) and their output files (json: text, token ids and times) compared file by file.
# Issue 29. One lent H100, from the repo root with .whl and .snap carried:  bash bench/2026-11-server/run41b.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/before; cp -r src /tmp/before; cp .snap/src/graphscribe/*.py /tmp/before/graphscribe/
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/
step "cli float32 4096" 200 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-f32 \
    --variant "after: --dtype float32" --variant "before: --dtype float32 @PYTHONPATH=/tmp/site:/tmp/before"
cp /tmp/cli-f32/grid.md "$OUT/cli-f32.md"
step "float32 outputs" 120 bash -c "rm -rf /tmp/o-after /tmp/o-before; $T /tmp/f4096 -m $ckpt --dtype float32 -f json -o /tmp/o-after 2>&1 | tail -1;
    PYTHONPATH=/tmp/site:/tmp/before $T /tmp/f4096 -m $ckpt --dtype float32 -f json -o /tmp/o-before 2>&1 | tail -1;
    echo files: \$(ls /tmp/o-after | wc -l) \$(ls /tmp/o-before | wc -l); diff -rq /tmp/o-after /tmp/o-before | wc -l | sed 's/^/differing files: /'"
exit 0
