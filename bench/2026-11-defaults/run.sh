#!/usr/bin/env bash
# Defaults chosen by measurement (issue 34), on the lent H100, from the repo root, carrying .whl, .espeak/debs,
# .espeak/libpcaudio.so.0 and .textdata:  bash bench/2026-11-defaults/run.sh   (logs under $OUT)
# 1. the calibrated parakeet-tdt-0.6b-v3-shaped checkpoint (random weights, NOT NVIDIA's), folders of 512 and 4096
#    LibriSpeech-like FLAC files; 2. the plain command against explicit batches and CPU thread counts, float32 on
#    512 files and bfloat16 on 4096 (txt and json), whole processes, rounds interleaved (scripts/cli_grid.py);
#    3. word error rate of the bundled demo model in float32 and bfloat16 on 400 held-out synthetic utterances.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"; log=$OUT/run.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "=== $name: $*" | tee -a "$log"; local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"; echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; } | tee -a "$log"
ckpt=/tmp/v3.nemo; speech=src/graphscribe/data
step checkpoint 120 python3 scripts/make_checkpoint.py parakeet-tdt-0.6b-v3 $ckpt \
    --calibrate $speech/librispeech_2086-149220-0033.wav --check $speech/jfk_44k1_stereo_24bit.flac
step folders 150 bash -c "python3 scripts/make_folder.py /tmp/f512 --files 512 --seed 0 & python3 scripts/make_folder.py /tmp/f4096 --files 4096 --seed 0; wait"
if [ -z "${SKIP_F32:-}" ]; then
step "float32 512" 200 python3 scripts/cli_grid.py --folder /tmp/f512 --model $ckpt --rounds 2 --out "$OUT/f32-512" \
    --variant "default: --dtype float32" --variant "default-omp4: --dtype float32 @OMP_NUM_THREADS=4" \
    --variant "b16-omp4: --dtype float32 -b 16 @OMP_NUM_THREADS=4" --variant "b32: --dtype float32 -b 32" \
    --variant "b32-omp4: --dtype float32 -b 32 @OMP_NUM_THREADS=4" --variant "b64-omp4: --dtype float32 -b 64 @OMP_NUM_THREADS=4"
fi
step "bfloat16 4096" 290 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16-4096" \
    --variant "default: --dtype bfloat16" --variant "default-omp4: --dtype bfloat16 @OMP_NUM_THREADS=4" \
    --variant "b128-omp4: --dtype bfloat16 -b 128 @OMP_NUM_THREADS=4" --variant "b256-omp4: --dtype bfloat16 -b 256 @OMP_NUM_THREADS=4" \
    --variant "json-b128-omp4: --dtype bfloat16 -b 128 -f json -o {out} @OMP_NUM_THREADS=4" \
    --variant "json-default-omp4: --dtype bfloat16 -f json -o {out} @OMP_NUM_THREADS=4"
step "wer" 150 python3 scripts/eval_demo.py src/graphscribe/data/demo.nemo --n 400 --seed 7 --workers 12 \
    --dtypes float32,bfloat16 --batch-size 64 --json "$OUT/wer.json"
step "gpu tests" 120 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -x -m gpu tests/test_gpu.py tests/test_pipeline.py
