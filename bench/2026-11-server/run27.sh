#!/usr/bin/env bash
# A packed batch's front end (issue 29): the subsampling in runs of rows of like lengths, and each batch's audio
# copied to the GPU on a stream of its own, on one lent GPU, from the repo root with .whl, .scratch/before (src at
# 8d50e3a) and .scratch/probe carried:  bash bench/2026-11-server/run27.sh   (logs under $OUT)
# 1. the GPU tests, the encoder's kernels and the packing tests. 2. mixed and like batches of 32 and 64 rows
# (scripts/experiments/mixed_batches.py), before and after. 3. bfloat16 servers before and after (stage times in
# the access log: run25/probe_patch.py), 128 clients twice over the 4096 files; after: 32, then 8 and 1 over the
# 512 files. 4. the CLI, bfloat16, two rounds, before and after. 5. float32 as shipped: one clip at a time and 8 at a
# time; the server's text per file against the CLI's.
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
step "gpu tests" 240 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -x -m gpu \
    tests/test_gpu.py tests/test_pipeline.py tests/test_timestamps.py tests/test_bench.py
step "kernel and packing tests" 120 python3 -m pytest -q -x tests/test_encoder_kernels.py tests/test_packing.py tests/test_graphs.py
cp scripts/experiments/mixed_batches.py /tmp/mixed_batches.py
for v in before after; do
    src=$PWD/src; [ $v = before ] && src=$PWD/.scratch/before/src
    PYTHONPATH=/tmp/site:$src step "mixed batches $v" 200 python3 /tmp/mixed_batches.py -m $ckpt --folder /tmp/f4096 \
        --rows 32,64 --batches 16 --json "$OUT/mixed-$v.json"
done
python3 bench/2026-11-server/run25/probe_patch.py .scratch/before/src /tmp/p0
python3 bench/2026-11-server/run25/probe_patch.py src /tmp/p1
stages() {  # per pass of 4096 requests: the stages' means from the access log
    python3 - "$OUT/serve-$1.log" <<'PY' | tee -a "$log"
import re, sys
rows = [l for l in open(sys.argv[1]) if "| pre" in l]
keys = ["queue", "total", "read", "submit", "engine", "answer"]
for k in range(0, min(len(rows), 8192), 4096):
    part = rows[k : k + 4096]
    means = {key: sum(float(re.search(rf"{key} ([0-9.]+)", l).group(1)) for l in part) / len(part) for key in keys}
    print(sys.argv[1].split("/")[-1], f"requests {k}-{k + len(part)}:", ", ".join(f"{key} {v:.1f} ms" for key, v in means.items()))
PY
}
serve before bfloat16 PYTHONPATH=/tmp/site:/tmp/p0
util before
step "server before 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128 --json "$OUT/serve-before-4096.json"
unutil before
stop before
stages before
serve after bfloat16 PYTHONPATH=/tmp/site:/tmp/p1
util after
step "server after 4096" 100 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 --concurrency 128,128,32 --json "$OUT/serve-after-4096.json"
unutil after
step "server after 512" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/f512 --concurrency 8,1 --json "$OUT/serve-after-512.json"
stop after
stages after
step "cli bfloat16 4096" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-bf16 \
    --variant "after: --dtype bfloat16" --variant "before: --dtype bfloat16 @PYTHONPATH=/tmp/site:$PWD/.scratch/before/src"
cp /tmp/cli-bf16/grid.md "$OUT/cli-bf16.md"
serve f32 float32
step "server float32 7.4 s clip" 60 $T bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 --concurrency 1,8,1,8 --json "$OUT/serve-f32-latency.json"
step "cli float32 512 json" 60 $T /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
step "server float32 texts" 90 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 --cli-out /tmp/cli-f32 --clients 16
stop f32
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt && rm -f serve-*.log metrics-*.txt)
exit 0
