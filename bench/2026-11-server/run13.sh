#!/usr/bin/env bash
# The server's batches chosen by cost (issue 29), on one lent GPU, from the repo root with .whl carried:
#   bash bench/2026-11-server/run13.sh   (logs under $OUT)
# 1. batch cost by rows and padded length, bfloat16 and float32 (scripts/experiments/batch_cost.py): the fit behind
#    service.BATCH_COST.
# 2. the CLI on the 4096-file folder in bfloat16, txt, 2 rounds.
# 3. in-process batching (no HTTP), 128 and 32 clients: the length cut (share=0.5, stop 35) against the cost rule.
# 4. a bfloat16 server as shipped (the cost rule), load-tested by `transcribe bench --serve`: 128, 32, 128 clients
#    over the 4096 files, then 8 and 1 over the 512 files.
# 5. float32: one 7.4 s clip at a time (1 client) and 8 at a time; the server's text per file against the CLI's.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "batch cost bfloat16" 150 python3 scripts/experiments/batch_cost.py -m $ckpt --dtype bfloat16 --json "$OUT/cost-bf16.json"
step "batch cost float32" 150 python3 scripts/experiments/batch_cost.py -m $ckpt --dtype float32 --rows 1,2,4,8,16,32 --json "$OUT/cost-f32.json"
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/cli-bf16" \
    --variant "txt: --dtype bfloat16"
step "policy 128" 200 python3 scripts/experiments/service_policy.py -m $ckpt --folder /tmp/f4096 --clients 128 --reps 2 \
    --json "$OUT/policy-128.json" --variant share=0.5 --variant "" --variant fixed=86,extra=8.6 --variant fixed=21,extra=2.2
step "policy 32" 100 python3 scripts/experiments/service_policy.py -m $ckpt --folder /tmp/f4096 --clients 32 --reps 1 \
    --json "$OUT/policy-32.json" --variant share=0.5 --variant ""
serve bf16 bfloat16
step "server bfloat16 4096" 150 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-bf16-4096.json"
step "server bfloat16 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-bf16-512.json"
stop bf16
serve f32 float32
step "server float32 7.4 s clip" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8 --json "$OUT/serve-f32-latency.json"
step "cli float32 512 json" 60 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 90 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
stop f32
exit 0
