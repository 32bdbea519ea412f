#!/usr/bin/env bash
# The code as shipped at the end of stop 41 (the front end on packed rows), issue 29's bars in one command: the CLI
# in bfloat16 (5 rounds), the server under 128 clients twice over the 4096 files (two servers; 32, 8 and 1 clients
# on the first); a variant with the decode stream at normal priority (prio0: CLI and one server, interleaved);
# float32: an idle server's 7.4 s clip and 8 at once, its text per file against the CLI's on 512 files; the
# GPU-marked tests. One lent H100, from the repo root with .whl.tar.xz carried:  bash bench/2026-11-server/run49.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/prio0; cp -r src /tmp/prio0
sed -i 's/torch.cuda.Stream(device, priority=-1)/torch.cuda.Stream(device, priority=0)/' /tmp/prio0/graphscribe/pipeline.py
grep -c "priority=0" /tmp/prio0/graphscribe/pipeline.py | tee -a "$log"
step "cli bfloat16 4096" 220 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 5 --out /tmp/cli-bf16 \
    --variant "shipped: --dtype bfloat16" --variant "prio0: --dtype bfloat16 @PYTHONPATH=/tmp/site:/tmp/prio0"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
serve shipped-1 bfloat16; loaded shipped-1; low shipped-1; stop shipped-1
serve prio0 bfloat16 PYTHONPATH=/tmp/site:/tmp/prio0; loaded prio0; stop prio0
serve shipped-2 bfloat16; loaded shipped-2; stop shipped-2
f32_bars
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
