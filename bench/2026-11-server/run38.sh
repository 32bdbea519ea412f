#!/usr/bin/env bash
# Batches gathered on the GPU from each request's pinned memory (`pipeline.gather`: the intake threads receive the
# samples into pinned memory, the batching thread only launches the copies) against the server before it (collated
# into one pinned buffer on the batching thread), interleaved, 128 clients twice over the 4096 files each time; the
# CLI before and after. Then the new server alone: float32 one 7.4 s clip at a time and 8 at a time, its text per
# file against the CLI's; bfloat16 32, 8 and 1 clients. The GPU test of the service path first. Issue 29.
# One lent H100, from the repo root with .whl and .snap (src/graphscribe/*.py of the commit before) carried:
#   bash bench/2026-11-server/run38.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/before; cp -r src /tmp/before; cp .snap/src/graphscribe/*.py /tmp/before/graphscribe/
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "gpu test service" 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k service
step "cli bfloat16 4096" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-a \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-a/grid.md "$OUT/cli-a.md"
for round in 1 2; do
    serve gather-$round bfloat16; loaded gather-$round; stop gather-$round
    serve before-$round bfloat16 PYTHONPATH=/tmp/site:/tmp/before; loaded before-$round; stop before-$round
done
step "cli bfloat16 4096 again" 60 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-b \
    --variant "txt: --dtype bfloat16"
serve f32 float32
step "server float32 7.4 s clip" 50 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8
step "cli float32 512 json" 50 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 60 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
stop f32
serve gather-c bfloat16
step "server 32" 50 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 32 --json "$OUT/serve-32.json"
step "server 8 1" 50 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-8-1.json"
stop gather-c
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
