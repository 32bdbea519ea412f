#!/usr/bin/env bash
# Why 128 clients through HTTP run slower than the same batching in-process (issue 29), on one lent GPU, from the
# repo root with .whl carried:  bash bench/2026-11-server/run15.sh   (logs under $OUT)
# 1. the CLI on the 4096-file folder in bfloat16, txt, 2 rounds.
# 2. in-process batching, 128 clients: the cost rule as shipped and the length cut of stop 35 (share=0.5).
# 3. bfloat16 servers at 128 clients (4096 files, twice each), GPU utilisation sampled every 100 ms by nvidia-smi:
#    as shipped; with the stack sampler (scripts/experiments/sampler) in every process; with a 0.5 ms GIL switch
#    interval; with 1 and 8 HTTP workers.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
util() { nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$OUT/util-$1.txt" & utilpid=$!; }
unutil() { kill $utilpid; python3 -c "import sys; v=[int(x) for x in open(sys.argv[1]) if x.strip()]; v=v[3:-3]; print(f'GPU utilisation {sys.argv[2]}: mean {sum(v)/len(v):.0f}% over {len(v)} samples')" "$OUT/util-$1.txt" $1 | tee -a "$log"; }
step "cli bfloat16 4096" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/cli-bf16" \
    --variant "txt: --dtype bfloat16"
util inproc
step "policy 128" 200 python3 scripts/experiments/service_policy.py -m $ckpt --folder /tmp/f4096 --clients 128 --reps 2 \
    --json "$OUT/policy-128.json" --variant "" --variant share=0.5
unutil inproc
one() {  # NAME [ENV=VALUE ...] [-- SERVE ARGS]: a server, 128 clients twice over the 4096 files, utilisation beside
    local name=$1; shift
    serve $name bfloat16 "$@"
    util $name
    step "server $name" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-$name.json"
    unutil $name
    stop $name
}
one shipped
one sampled PYTHONPATH=/tmp/site:$PWD/src:$PWD/scripts/experiments/sampler GRAPHSCRIBE_SAMPLE_DIR=/tmp/samples
for f in /tmp/samples/*.txt; do echo "--- $f"; cat $f; done > "$OUT/samples.txt"
one switch PYTHONPATH=/tmp/site:$PWD/src:$PWD/scripts/experiments/sampler GRAPHSCRIBE_SWITCH_INTERVAL=0.0005
EXTRA="--http-workers 1" one workers1
EXTRA="--http-workers 8" one workers8
(cd "$OUT" && tar czf rest.tgz --exclude=run.log --exclude=samples.txt --exclude=rest.tgz . && find . -mindepth 1 ! -name run.log ! -name samples.txt ! -name rest.tgz -delete)
exit 0
