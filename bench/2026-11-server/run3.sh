#!/usr/bin/env bash
# transcribe serve with HTTP worker processes (issue 29) and json against txt with the render workers (issue 34), on
# one lent GPU, from the repo root with .whl carried:  bash bench/2026-11-server/run3.sh   (logs under $OUT)
# 1. the CLI on the 4096-file folder in bfloat16, txt and json (-f json -o DIR), 2 rounds interleaved: transcription
#    RTFx (the server's bar is 90% of txt's; issue 34's json bar is 0.9x txt).
# 2. a bfloat16 server (default --http-workers) load-tested by `transcribe bench --serve` (aiohttp clients): 128 and
#    32 clients over the 4096 files, 8 and 1 over the 512; /metrics after.
# 3. float32: a fresh server; one 7.4 s clip at a time (1 client) and 8 at a time, latency measured by the client,
#    upload included; the server's text for each of the 512 files against the CLI's (scripts/compare_server.py).
# 4. the GPU tests.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
python3 -c "import uvicorn, starlette, aiohttp, uvloop; print('uvicorn', uvicorn.__version__, 'starlette', starlette.__version__, 'aiohttp', aiohttp.__version__)" 2>&1 | tee -a "$log"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "cli bfloat16 4096 txt json" 150 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/cli-bf16" \
    --variant "txt: --dtype bfloat16" --variant "json: --dtype bfloat16 -f json -o {out}"
$T serve -m $ckpt --dtype bfloat16 --port 8000 2> "$OUT/serve-bf16.log" & server=$!
wait_ready; grep serving "$OUT/serve-bf16.log" | tee -a "$log"
step "server bfloat16 4096" 150 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-bf16-4096.json"
step "server bfloat16 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-bf16-512.json"
curl -s localhost:8000/metrics > "$OUT/metrics-bf16.txt"; grep -E "batch_rows_(sum|count)|capture" "$OUT/metrics-bf16.txt" | tee -a "$log"
kill -TERM $server; wait $server; echo "server exit $?" | tee -a "$log"
grep "POST" "$OUT/serve-bf16.log" | grep -vc " 200 " | sed 's/^/non-200 POST lines: /' | tee -a "$log"
$T serve -m $ckpt --dtype float32 --port 8000 2> "$OUT/serve-f32.log" & server=$!
wait_ready; grep serving "$OUT/serve-f32.log" | tee -a "$log"
step "server float32 7.4 s clip" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8 --json "$OUT/serve-f32-latency.json"
step "cli float32 512 json" 60 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 90 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
kill -TERM $server; wait $server; echo "server exit $?" | tee -a "$log"
# does the CLI itself keep a file's float32 text across batch sizes? (a near tie moves with the batch's shape)
for b in 8 16; do $T /tmp/f512 -m $ckpt --dtype float32 -b $b -f json -o /tmp/cli-f32-b$b 2>&1 | tail -1 | tee -a "$log"; done
python3 scripts/compare_outputs.py /tmp/cli-f32 /tmp/cli-f32-b8 /tmp/cli-f32-b16 2>&1 | tee -a "$log"
[ -z "${SKIP_TESTS:-}" ] && step "gpu tests" ${TEST_SECONDS:-150} env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -x -m gpu \
    tests/test_gpu.py tests/test_pipeline.py tests/test_timestamps.py tests/test_bench.py
exit 0
