#!/usr/bin/env bash
# The server as shipped at the end of stop 37 (packed rows, whole 16-bit batches, samples read whole, text-only
# batches answered when decoded, copies on a stream of their own) against the server of c006257 (stop 36) and the
# CLI, in one command on one lent GPU (issue 29), from the repo root with .whl and .scratch/beforeS (the files of src
# that differ at c006257) carried:  bash bench/2026-11-server/run31.sh   (logs under $OUT)
# bfloat16: servers before and after, 128 clients three times over the 4096 files, then 32; after: 8 and 1 over the
# 512 files; GPU utilisation beside. The CLI, bfloat16, txt, two rounds. float32 as shipped: one 7.4 s clip at a time
# and 8 at a time; the server's text per file against the CLI's.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/before; cp -r src /tmp/before; cp .scratch/beforeS/*.py /tmp/before/graphscribe/
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "cli bfloat16 4096" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-bf16 \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
serve before bfloat16 PYTHONPATH=/tmp/site:/tmp/before
util before
step "server before 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128,128,32 --json "$OUT/serve-before-4096.json"
unutil before
stop before
serve after bfloat16
util after
step "server after 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128,128,32 --json "$OUT/serve-after-4096.json"
unutil after
step "server after 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-after-512.json"
stop after
step "cli bfloat16 4096 again" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-bf16b \
    --variant "txt: --dtype bfloat16"
serve f32 float32
step "server float32 7.4 s clip" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8
step "cli float32 512 json" 60 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 90 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
stop f32
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
