#!/usr/bin/env bash
# The features and the subsampling on packed rows too (`Model.front_packing`: a 16-bit batch whose layers pack lays
# its clips' samples end to end, `Packing.pack_samples`; the features normalise each clip over its own frames, the
# subsampling masks the frames between clips), against the code before it (the tree with $FRONT/front.diff
# reversed), interleaved: mixed and like batches back to back in-process (experiments/mixed_batches.py, stage
# times); the server, 128 clients twice over the 4096 files, 2 pairs, 32, 8 and 1 clients in the first; the CLI
# in bfloat16 (5 rounds, both); the GPU-marked tests. Issue 29. run48: the front end's layout in one copy from
# pinned memory; run47 (run47.sh) ran this on its first version. One lent H100, from the repo root with .whl
# carried:  bash bench/2026-11-server/run48.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/${FRONT:-run48}/front.diff | tee -a "$log"
for who in after before; do
    path=$PWD/src; [ $who = before ] && path=/tmp/before
    step "mixed batches $who" 150 env PYTHONPATH=/tmp/site:$path python3 scripts/experiments/mixed_batches.py -m $ckpt \
        --folder /tmp/f4096 --rows 32,64 --batches 16 --json "$OUT/mixed-$who.json"
done
step "cli bfloat16 4096" 200 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 5 --out /tmp/cli-bf16 \
    --variant "after: --dtype bfloat16" --variant "before: --dtype bfloat16 @PYTHONPATH=/tmp/site:/tmp/before"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
ab_servers - /tmp/before
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
