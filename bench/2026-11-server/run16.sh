#!/usr/bin/env bash
# The server with an upload's samples sent raw to the engine (not pickled with their SUBMIT) and batches chosen by
# cost (issue 29), on one lent GPU, from the repo root with .whl carried:  bash bench/2026-11-server/run16.sh
# 1. the CLI on the 4096-file folder in bfloat16, txt, 2 rounds.
# 2. bfloat16 servers, GPU utilisation sampled by nvidia-smi every 100 ms: as shipped (128, 32, 128 clients over
#    the 4096 files, then 8 and 1 over the 512 files); the length cut of stop 35 (a copy of src with
#    service.SHARE = 0.5), 128, 32, 128 clients.
# 3. float32: one 7.4 s clip at a time and 8 at a time; the server's text per file against the CLI's.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
util() { nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "/tmp/util-$1.txt" & utilpid=$!; }
unutil() { kill $utilpid; python3 -c "import sys; v=[int(x) for x in open(sys.argv[1]) if x.strip()]; v=v[3:-3]; print(f'GPU utilisation {sys.argv[2]}: mean {sum(v)/len(v):.0f}% over {len(v)} samples')" "/tmp/util-$1.txt" $1 | tee -a "$log"; }
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-bf16 \
    --variant "txt: --dtype bfloat16"
serve bf16 bfloat16
util bf16
step "server bfloat16 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-bf16-4096.json"
unutil bf16
step "server bfloat16 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-bf16-512.json"
stop bf16
rm -rf /tmp/cut && cp -r src /tmp/cut && sed -i 's/^SHARE = 0.0$/SHARE = 0.5/' /tmp/cut/graphscribe/service.py
grep -n "^SHARE" /tmp/cut/graphscribe/service.py | tee -a "$log"
serve cut bfloat16 PYTHONPATH=/tmp/site:/tmp/cut
util cut
step "server cut 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-cut-4096.json"
unutil cut
stop cut
serve f32 float32
step "server float32 7.4 s clip" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8 --json "$OUT/serve-f32-latency.json"
step "cli float32 512 json" 60 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 90 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
stop f32
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
