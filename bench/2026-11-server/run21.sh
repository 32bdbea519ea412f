#!/usr/bin/env bash
# Run at commit 48bb5b4, reverted after it (see bench/README.md): service.OVERLAP no longer exists.
# Each batch decoded on a thread of its own while the batching thread launches the next (service.OVERLAP, issue 29),
# on one lent GPU, from the repo root with .whl carried:  bash bench/2026-11-server/run21.sh   (logs under $OUT)
# 1. the GPU tests. 2. in-process, 128 clients: overlap on, off, on. 3. bfloat16 servers, overlap off (a copy of src
# with service.OVERLAP = False) and on, 128, 32, 128 clients; GPU utilisation beside. 4. the CLI, bfloat16, one
# round. 5. float32 as shipped: one clip at a time and 8 at a time; the server's text per file against the CLI's.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
util() { nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "/tmp/util-$1.txt" & utilpid=$!; }
unutil() { kill $utilpid; python3 -c "import sys; v=[int(x) for x in open(sys.argv[1]) if x.strip()]; b=[x for x in v if x>0]; print(f'GPU utilisation {sys.argv[2]}: {sum(b)/max(1,len(b)):.0f}% over the {len(b)} nonzero of {len(v)} samples')" "/tmp/util-$1.txt" $1 | tee -a "$log"; }
step "gpu tests" 240 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -x -m gpu \
    tests/test_gpu.py tests/test_pipeline.py tests/test_timestamps.py tests/test_bench.py
step "policy 128" 200 python3 scripts/experiments/service_policy.py -m $ckpt --folder /tmp/f4096 --clients 128 --reps 2 \
    --json "$OUT/policy-128.json" --variant "" --variant overlap=0 --variant overlap=1
rm -rf /tmp/off && cp -r src /tmp/off && sed -i 's/^OVERLAP = True$/OVERLAP = False/' /tmp/off/graphscribe/service.py
grep -n "^OVERLAP" /tmp/off/graphscribe/service.py | tee -a "$log"
serve off bfloat16 PYTHONPATH=/tmp/site:/tmp/off
util off
step "server off 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-off-4096.json"
unutil off
stop off
serve on bfloat16
util on
step "server on 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-on-4096.json"
unutil on
step "server on 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-on-512.json"
stop on
step "cli bfloat16 4096" 60 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-bf16 \
    --variant "txt: --dtype bfloat16"
serve f32 float32
step "server float32 7.4 s clip" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8 --json "$OUT/serve-f32-latency.json"
step "cli float32 512 json" 60 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 90 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
stop f32
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
