#!/usr/bin/env bash
# transcribe serve against the one-shot CLI (issue 29), and --devices at steady state (issue 30), on the lent GPU
# machine, from the repo root with .whl carried:  bash bench/2026-11-server/run.sh   (logs under $OUT)
# 1. bfloat16: the CLI on the 4096-file folder (transcription RTFx, 2 runs), then a server on the same GPU, load-tested
#    with 128 and 32 clients over the 4096 files, 8 and 1 over the 512 (`transcribe bench --serve`).
# 2. float32: a fresh server; one 7.4 s clip at a time (1 client) and 8 at a time, latency measured by the client,
#    upload included; the server's text for each of the 512 files against the CLI's (scripts/compare_server.py).
# 3. `transcribe bench --folder --devices all` (in-process, warm workers): RTFx on 1 and 2 devices, busy per device.
# 4. the GPU tests.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
wait_ready() { for _ in $(seq 240); do curl -sf localhost:8000/health >/dev/null && return 0; sleep 0.5; done; return 1; }
python3 -c "import typer, click, uvicorn, starlette; print('typer', typer.__version__, 'uvicorn', uvicorn.__version__, 'starlette', starlette.__version__)" 2>/dev/null | tee -a "$log"
$T serve --help | grep -E -- "--port|--host" | tee -a "$log"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "cli bfloat16 4096" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds ${CLI_ROUNDS:-2} --out "$OUT/cli-bf16" \
    --variant "cli: --dtype bfloat16"
$T serve -m $ckpt --dtype bfloat16 --port 8000 2> "$OUT/serve-bf16.log" & server=$!
wait_ready; tail -n 1 "$OUT/serve-bf16.log"
step "server bfloat16 4096" 150 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,32,128 --json "$OUT/serve-bf16-4096.json"
step "server bfloat16 512" 90 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-bf16-512.json"
curl -s localhost:8000/metrics > "$OUT/metrics-bf16.txt"; kill -TERM $server; wait $server; echo "server exit $?" | tee -a "$log"
grep -v " 200 " "$OUT/serve-bf16.log" | grep -c "POST" | sed 's/^/non-200 POST lines: /' | tee -a "$log"
$T serve -m $ckpt --dtype float32 --port 8000 2> "$OUT/serve-f32.log" & server=$!
wait_ready; tail -n 1 "$OUT/serve-f32.log"
step "server float32 7.4 s clip" 90 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8 --json "$OUT/serve-f32-latency.json"
step "cli float32 512 json" 90 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 120 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
kill -TERM $server; wait $server; echo "server exit $?" | tee -a "$log"
unset CUDA_VISIBLE_DEVICES
[ "$(nvidia-smi -L | wc -l)" -gt 1 ] && [ -z "${SKIP_DEVICES:-}" ] && step "devices bench" 150 $T bench --folder /tmp/f4096 -m $ckpt --dtype bfloat16 --devices all --reps 2 --json "$OUT/devices-bf16.json"
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -x -m gpu \
    tests/test_gpu.py tests/test_pipeline.py tests/test_timestamps.py tests/test_bench.py
