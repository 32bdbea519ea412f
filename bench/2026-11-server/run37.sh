#!/usr/bin/env bash
# The batching thread taking and collating batch k+1 while the GPU runs batch k's encoder, before decoding batch
# k-1 (a patched copy: bench/2026-11-server/lookahead_patch.py), against the server as shipped, interleaved; 128
# clients twice over the 4096 files each; the CLI beside. Issue 29. One lent H100, from the repo root with .whl
# carried:  bash bench/2026-11-server/run37.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/la; cp -r src /tmp/la; python3 bench/2026-11-server/lookahead_patch.py /tmp/la | tee -a "$log"
step "cli bfloat16 4096" 120 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-a \
    --variant "txt: --dtype bfloat16"
load() {
    util $1
    step "server $1" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-$1.json"
    unutil $1; stop $1
}
for round in 1 2; do
    serve ahead-$round bfloat16 PYTHONPATH=/tmp/site:/tmp/la; load ahead-$round
    serve shipped-$round bfloat16; load shipped-$round
done
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
