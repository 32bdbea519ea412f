#!/usr/bin/env bash
# The subsampling of a packed (16-bit) batch in runs of rows of like lengths (`Packing.runs`, each run padded to its
# own longest) against one pass over the padded batch (.snap: the code before), interleaved. Tried at stop 36 (run27:
# 64 mixed rows back to back 10110 -> 11631; run30: the server slower, its host thread the limit then); the host now
# launches the next batch while the GPU decodes, and run42's timeline has the server bound by its GPU. The CLI in
# bfloat16 (3 rounds: its batches are sorted, one run each); the server, 128 clients twice over the 4096 files, 2
# pairs, 32, 8 and 1 clients in the first. Issue 29. Not adopted: the change is kept as runs_patch.diff, applied
# here to a copy of src (at stop 40 it ran from the tree, the code before from .snap).
# One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run45.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/runs; mkdir /tmp/runs; cp -r src tests /tmp/runs/; patch -d /tmp/runs -p1 < bench/2026-11-server/runs_patch.diff
step "gpu tests" 150 bash -c "cd /tmp/runs && GRAPHSCRIBE_TEST_V3=$ckpt PYTHONPATH=/tmp/site:/tmp/runs/src python3 -m pytest -q \
    -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_packing.py tests/test_pipeline.py"
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out /tmp/cli-bf16 \
    --variant "after: --dtype bfloat16 @PYTHONPATH=/tmp/site:/tmp/runs/src" --variant "before: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
ab_servers /tmp/runs/src -
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
