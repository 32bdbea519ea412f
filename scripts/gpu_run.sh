#!/usr/bin/env bash
# The GPU session in one command (run on the lent H100 from the repo root, with .whl and .whl-nemo carried):
#   bash scripts/gpu_run.sh                                  # the default parts; logs and JSON under $OUT (or ./gpu-out)
#   bash scripts/gpu_run.sh checkpoint compare bench         # some parts
# Parts (bench/README.md says which figures each one gives):
#   checkpoint   a calibrated parakeet-tdt-0.6b-v3-shaped checkpoint (random weights), made first in every command
#   compare      decoding against NeMo 3.0's own decoder on the same checkpoint and clips (scripts/compare_nemo.py)
#   tests        tests/test_gpu.py; gputests: every GPU-marked test
#   bench        `transcribe bench`: graphs on and off, float32 and bfloat16
#   folder       the CLI and the API against NeMo's transcribe() on 512 files (scripts/compare_folder.py)
#   api          the in-memory API alone on the folder, graphs on and off
#   cli          the CLI itself on the folder, txt output, one process a run
#   throughput   `transcribe bench --folder`: seconds per stage
#   shortfiles   host memory on 10 000 short files
#   coldstart    process start to the first transcript (scripts/cold_start.py)
#   long         10 to 180 minutes with local, auto and full attention, and the encoder alone
#   tune         the fused step's tiles and windows (scripts/experiments/tune_step.py)
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
run_compare() {  # NEMO_TF32=--nemo-tf32: NeMo with PyTorch's default TF32 convolutions; ROUND_SHARES: "0.7,1.0"
    local tag=float32${NEMO_TF32:+-nemo-tf32}
    step "compare with NeMo" 150 python3 scripts/compare_nemo.py --model $ckpt --nemo-path /tmp/nemo-site \
        --dtype float32 --batch-sizes 1,8 --reps 5 --out /tmp/compare ${NEMO_TF32:-} \
        ${ROUND_SHARES:+--round-shares $ROUND_SHARES}
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
run_gputests() {  # every GPU-marked test (decoding, pipeline, bench, timestamps); the files whose extras (av, ray,
    # openai, srt) the lent machine lacks are left out (their tests are CPU tests)
    step "gpu tests (all)" 300 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -m gpu --continue-on-collection-errors tests/
}
run_coldstart() {  # COLDSTART_CACHED=1: only the runs with a bytecode cache
    [ -n "${COLDSTART_CACHED:-}" ] ||
        step "cold start" 200 python3 scripts/cold_start.py --model $ckpt --reps 3 --json "$OUT/cold_start.json"
    step "cold start, bytecode cached" 200 python3 scripts/cold_start.py --model $ckpt --reps 3 \
        --pycache-prefix /tmp/pycache --json "$OUT/cold_start-pycache.json"
}
folder=/tmp/folder${FOLDER_FILES:+-$FOLDER_FILES}  # FOLDER_FILES: another number of files than 512
make_folder() {
    [ -d $folder ] || step "folder" 300 python3 scripts/make_folder.py $folder --files ${FOLDER_FILES:-512} --seed 0
}
run_folder() {  # our CLI and API against NeMo's transcribe() on 512 files (FOLDER_DTYPES: float32 at 8 and 32, bfloat16
               # at 128; FOLDER_GRAPHS: our modes in turn, default on,off)
    make_folder
    for dtype in ${FOLDER_DTYPES:-float32 bfloat16}; do
        local sizes=8,32 limit=330
        [ "$dtype" = bfloat16 ] && sizes=128 limit=240
        limit=${FOLDER_LIMIT:-$limit}  # seconds for one dtype
        step "folder $dtype" $limit python3 scripts/compare_folder.py --folder $folder --model $ckpt \
            --nemo-path /tmp/nemo-site --batch-sizes $sizes --dtypes $dtype --graphs "${FOLDER_GRAPHS:-on,off}" \
            --out "$OUT/folder-$dtype"
    done
}
run_throughput() {  # seconds per stage, graphs on and off (THROUGHPUT_DTYPES: bfloat16 at 128, float32 at
    make_folder       # THROUGHPUT_SIZES, default 8,32)
    for dtype in ${THROUGHPUT_DTYPES:-bfloat16 float32}; do
        local sizes=${THROUGHPUT_SIZES:-8,32}
        [ "$dtype" = bfloat16 ] && sizes=128
        step "throughput $dtype" 200 python3 -m graphscribe.cli bench --folder $folder --model $ckpt \
            --dtype $dtype --batch-sizes $sizes --json "$OUT/throughput-$dtype.json"
    done
}
run_shortfiles() {  # host memory on 10 000 short files
    step "short files" 120 python3 scripts/make_folder.py /tmp/short --files 10000 --short
    step "10 000 short files" 200 python3 -c "import resource, subprocess, sys; subprocess.run(sys.argv[1:]); \
print('peak RSS of the CLI: %.0f MB' % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024))" \
        python3 -m graphscribe.cli /tmp/short --model $ckpt --dtype bfloat16 --batch 128 -o /tmp/short-out
}
run_long() {  # 10 to 180 minutes, each dtype in a process of its own (peaks hold one model), then the encoder alone
    step "long audio bfloat16" 170 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/long-bfloat16" \
        --dtypes bfloat16 --minutes 10,30,60,180 --skip-encoder --budget-seconds 150
    step "long audio float32" 120 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/long-float32" \
        --dtypes float32 --minutes 10,30,60 --skip-encoder --budget-seconds 100
    step "encoder alone" 90 python3 scripts/long_audio_bench.py --model $ckpt --out "$OUT/encoder" \
        --dtypes bfloat16,float32 --batch-sizes 1,8,32 --skip-long --budget-seconds 200
}
run_api() {  # the in-memory API on the folder, graphs on and off, in this run (API_CONFIGS: "dtype batch;...";
            # API_GRAPHS: the modes in turn, default on,off)
    make_folder
    local dtype batch
    echo "${API_CONFIGS:-bfloat16 128}" | tr ';' '\n' | while read -r dtype batch; do
        step "api $dtype B=$batch" 300 python3 scripts/compare_folder.py --folder $folder --model $ckpt --parts api \
            --batch-sizes "$batch" --dtypes "$dtype" --graphs "${API_GRAPHS:-on,off}" --out "$OUT/api-$dtype-$batch"
    done
}
run_cli() {  # the CLI on the folder, txt output, a process a run, after one run that fills Triton's cache
    make_folder  # (CLI_CONFIGS: "dtype batch;..."; CLI_REPS)
    local dtype batch rep line
    echo "${CLI_CONFIGS:-bfloat16 128}" | tr ';' '\n' | while read -r dtype batch; do
        python3 -m graphscribe.cli $folder --model $ckpt --dtype $dtype --batch "$batch" -o /tmp/cli-out \
            >/dev/null 2>&1
        for rep in $(seq "${CLI_REPS:-3}"); do
            line=$(python3 -m graphscribe.cli $folder --model $ckpt --dtype $dtype --batch "$batch" -o /tmp/cli-out \
                2>&1 | grep 'loaded in')
            echo "cli $dtype B=$batch rep $rep: $line" | tee -a "$log"
        done
    done
}
run_tune() {  # TUNE_ARGS: more tune_step.py options; TUNE_SECONDS: its time limit
    step "tune" "${TUNE_SECONDS:-330}" python3 scripts/experiments/tune_step.py --model $ckpt --out "$OUT" ${TUNE_ARGS:-}
}

for what in "${@:-checkpoint compare gputests bench folder}"; do
    for part in $what; do "run_$part"; done
done
# the device tool brings back 8 files at most: everything but the log in one archive
(cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=run.log . 2>/dev/null)
