#!/usr/bin/env bash
# Each HTTP worker on a socket of its own (SO_REUSEPORT, server.PORT_PER_WORKER) against one socket shared by the
# workers (a patched copy: PORT_PER_WORKER = False), and the engine with one torch CPU thread (OMP_NUM_THREADS=1),
# rounds interleaved; 128 clients twice over the 4096 files per server, each process's and thread's share of a core
# beside (cpu_probe.py; threads named by scripts/experiments/thread_names); the CLI before and after (issue 29).
# One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run33.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
TN=$PWD/scripts/experiments/thread_names
rm -rf /tmp/shared; cp -r src /tmp/shared
sed -i 's/^PORT_PER_WORKER = .*/PORT_PER_WORKER = False/' /tmp/shared/graphscribe/server.py
grep -n "^PORT_PER_WORKER" /tmp/shared/graphscribe/server.py | tee -a "$log"
step "cli bfloat16 4096" 120 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-a \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-a/grid.md "$OUT/cli-a.md"
for round in 1 2; do
    serve own-$round bfloat16 PYTHONPATH=/tmp/site:$PWD/src:$TN; probed own-$round
    serve shared-$round bfloat16 PYTHONPATH=/tmp/site:/tmp/shared:$TN; probed shared-$round
    serve omp1-$round bfloat16 PYTHONPATH=/tmp/site:$PWD/src:$TN OMP_NUM_THREADS=1; probed omp1-$round
done
step "cli bfloat16 4096 again" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-b \
    --variant "txt: --dtype bfloat16"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
