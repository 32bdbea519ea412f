#!/usr/bin/env bash
# The code as shipped at the end of stop 40: the GPU-marked tests, then issue 29's float32 bars: an idle server's
# latency for one 7.4 s clip and for 8 at once (client-measured, upload included), and its text per file against
# the CLI's on 512 files. One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run44.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/
serve f32 float32
step "server float32 7.4 s clip" 50 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8
step "cli float32 512 json" 50 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 60 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
stop f32
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
