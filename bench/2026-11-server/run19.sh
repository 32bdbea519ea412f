#!/usr/bin/env bash
# Where the engine's batching thread spends its time as shipped (issue 29), on one lent GPU, from the repo root with
# .whl carried:  bash bench/2026-11-server/run19.sh   (logs under $OUT)
# The stack sampler (scripts/experiments/sampler) in-process (service_policy.py, 128 clients, 2 passes) and in a
# bfloat16 server's processes (128 clients twice over the 4096 files); GPU utilisation beside each.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
S=$PWD/scripts/experiments/sampler
util() { nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "/tmp/util-$1.txt" & utilpid=$!; }
unutil() { kill $utilpid; python3 -c "import sys; v=[int(x) for x in open(sys.argv[1]) if x.strip()]; b=[x for x in v if x>0]; print(f'GPU utilisation {sys.argv[2]}: mean {sum(v)/len(v):.0f}% over {len(v)} samples, {sum(b)/max(1,len(b)):.0f}% over the {len(b)} nonzero')" "/tmp/util-$1.txt" $1 | tee -a "$log"; }
util inproc
GRAPHSCRIBE_SAMPLE_DIR=/tmp/s-inproc PYTHONPATH=/tmp/site:$PWD/src:$S step "policy 128" 200 python3 scripts/experiments/service_policy.py \
    -m $ckpt --folder /tmp/f4096 --clients 128 --reps 2 --variant ""
unutil inproc
cat /tmp/s-inproc/*.txt > "$OUT/samples-inproc.txt"
serve sampled bfloat16 PYTHONPATH=/tmp/site:$PWD/src:$S GRAPHSCRIBE_SAMPLE_DIR=/tmp/s-serve
util serve
step "server sampled" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-sampled.json"
unutil serve
sleep 3
stop sampled
for f in /tmp/s-serve/*.txt; do echo "--- $f"; cat $f; done > "$OUT/samples-serve.txt"
rm -f "$OUT"/serve-*.log
exit 0
