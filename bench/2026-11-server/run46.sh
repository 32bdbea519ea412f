#!/usr/bin/env bash
# A continuous decode in the server (rows join a decode of 2 x --max-batch slots as others finish:
# continuous_patch.diff, `decoding.ContinuousDecode`, `pipeline.continuous_stream`; not adopted) against batch
# decodes (the tree's code, which the patch applies to at commit 3133e2d), interleaved: 128 clients twice over the
# 4096 files, 2 pairs, 32, 8 and 1 clients in the first; a server with --max-batch slots only (slots64); the CLI in bfloat16 beside (3 rounds); float32: an idle server's 7.4 s clip,
# 8 at once, and its text per file against the CLI's on 512 files; the GPU-marked tests. Issue 29.
# One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run46.sh
# (As run, the patched code was the tree's and the code before it .snap's; the GPU tests ran on the patched code.)
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/after /tmp/slots64; cp -r src /tmp/after; patch -d /tmp/after -p2 < bench/2026-11-server/continuous_patch.diff
cp -r /tmp/after /tmp/slots64; sed -i 's/^SLOTS_PER_BATCH_ROW = 2$/SLOTS_PER_BATCH_ROW = 1/' /tmp/slots64/graphscribe/service.py
grep -c "SLOTS_PER_BATCH_ROW = 1" /tmp/slots64/graphscribe/service.py | tee -a "$log"
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 3 --out /tmp/cli-bf16 \
    --variant "cli: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
ab_servers /tmp/after -
serve slots64 bfloat16 PYTHONPATH=/tmp/site:/tmp/slots64; loaded slots64; stop slots64
f32_bars PYTHONPATH=/tmp/site:/tmp/after
step "gpu tests" 200 env PYTHONPATH=/tmp/site:/tmp/after GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
