#!/usr/bin/env bash
# The GPU session in one command (run on the lent H100 from the repo root, with .whl and .whl-nemo carried):
#   bash scripts/gpu_run.sh                                  # all parts; logs and JSON under $OUT (or ./gpu-out)
#   bash scripts/gpu_run.sh checkpoint compare bench           # some parts
# 1. a calibrated parakeet-tdt-0.6b-v3-shaped checkpoint; 2. graphscribe against NeMo 3.0 on the same checkpoint
# and clips; 3. the GPU tests; 4. graphscribe bench, float32 and bfloat16; 5. the step profile (fused and PyTorch
# steps); 6. the fused step's tile and window measurements.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
log="$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
if [ -d .whl-nemo ]; then  # NeMo, for the comparison; not our huggingface_hub: transformers there pins an older one
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/nemo-site .whl-nemo/*.whl \
        .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
ckpt=/tmp/v3.nemo
speech=src/graphscribe/data

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log everything
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*" | tee -a "$log"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } | tee -a "$log"
run_checkpoint() {
    step checkpoint 150 python3 scripts/make_checkpoint.py parakeet-tdt-0.6b-v3 $ckpt \
        --calibrate $speech/librispeech_2086-149220-0033.wav --check $speech/jfk_44k1_stereo_24bit.flac
}
run_compare() {  # NEMO_TF32=--nemo-tf32: NeMo with PyTorch's default TF32 convolutions
    local tag=float32${NEMO_TF32:+-nemo-tf32}
    step "compare with NeMo" 150 python3 scripts/compare_nemo.py --model $ckpt --nemo-path /tmp/nemo-site \
        --dtype float32 --batch-sizes 1,8 --reps 5 --out /tmp/compare ${NEMO_TF32:-}
    cp /tmp/compare/compare.md "$OUT/compare-nemo-$tag.md"
    cp /tmp/compare/nemo.json "$OUT/nemo-$tag.json"
    cp /tmp/compare/graphscribe.json "$OUT/compare-graphscribe-$tag.json"
}
run_tests() {
    step "gpu tests" 240 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -m gpu tests/test_gpu.py
}
run_bench() {
    for dtype in float32 bfloat16; do
        step "bench $dtype" 120 python3 -m graphscribe.cli bench --model $ckpt --dtype $dtype --reps 5 \
            --batch-sizes 1,8 --json "$OUT/bench-$dtype.json"
    done
}
run_profile() {
    local dtype batch kind flag  # PROFILES: "dtype batch step [--no-pdl];..."
    echo "${PROFILES:-float32 1 fused;float32 1 fused --no-pdl;bfloat16 1 fused;bfloat16 1 fused --no-pdl;float32 8 fused}" |
    tr ';' '\n' | while read -r dtype batch kind flag; do
        step "profile $dtype B=$batch $kind $flag" 90 python3 scripts/profile_step.py --model $ckpt --dtype $dtype \
            --batch $batch --step $kind $flag --json "$OUT/profile.jsonl"
    done
}
run_tune() {  # TUNE_ARGS: more tune_step.py options; TUNE_SECONDS: its time limit
    step "tune" "${TUNE_SECONDS:-330}" python3 scripts/tune_step.py --model $ckpt --out "$OUT" ${TUNE_ARGS:-}
}

for what in "${@:-checkpoint compare tests bench profile tune}"; do
    for part in $what; do "run_$part"; done
done
