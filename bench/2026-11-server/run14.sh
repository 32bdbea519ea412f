#!/usr/bin/env bash
# Where a batch's fixed cost goes, and the cost rule against the length cut through HTTP (issue 29), on one lent GPU,
# from the repo root with .whl carried:  bash bench/2026-11-server/run14.sh   (logs under $OUT)
# 1. torch.profiler over batches of 1 x 2 s, 16 x 8 s and 64 x 8 s in bfloat16, 1 x 2 s in float32
#    (scripts/experiments/batch_profile.py).
# 2. bfloat16 servers load-tested by `transcribe bench --serve`: the length cut of stop 35 (a copy of src with
#    service.SHARE = 0.5) and the cost rule as shipped (service.BATCH_COST fitted in run13), 128, 32, 8 clients.
# 3. the CLI on the 4096-file folder in bfloat16, txt, 2 rounds; float32 idle and 8-at-once latency as shipped.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "profile bfloat16" 150 python3 scripts/experiments/batch_profile.py -m $ckpt --dtype bfloat16 --shape 1x2 --shape 16x8 --shape 64x8
step "profile float32" 60 python3 scripts/experiments/batch_profile.py -m $ckpt --dtype float32 --shape 1x2
rm -rf /tmp/cut && cp -r src /tmp/cut && sed -i 's/^SHARE = 0.0$/SHARE = 0.5/' /tmp/cut/graphscribe/service.py
grep -n "^SHARE" /tmp/cut/graphscribe/service.py | tee -a "$log"
serve cut bfloat16 PYTHONPATH=/tmp/site:/tmp/cut
step "server cut 4096" 120 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-cut-4096.json"
step "server cut 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8 --json "$OUT/serve-cut-512.json"
stop cut
serve cost bfloat16
step "server cost 4096" 120 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-cost-4096.json"
step "server cost 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-cost-512.json"
stop cost
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/cli-bf16" \
    --variant "txt: --dtype bfloat16"
serve f32 float32
step "server float32 7.4 s clip" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8 --json "$OUT/serve-f32-latency.json"
stop f32
exit 0
