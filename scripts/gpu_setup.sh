#!/usr/bin/env bash
# Sourced by the bench/*/run.sh scripts on the lent GPU machine: the wheels and NeMo carried in, the calibrated
# parakeet-tdt-0.6b-v3-shaped checkpoint (random weights, NOT NVIDIA's) and folders of LibriSpeech-like FLAC files,
# each made once per machine; `step NAME SECONDS COMMAND...` runs and logs a command.
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"; log=$OUT/run.log
# PY, DEVICE, NEMO_SITE: another interpreter, device or NeMo for a CPU dry run (PY=.venv/bin/python DEVICE=cpu
# NEMO_SITE=/work/nemo-cpu); GS_LAZY=1: make no checkpoint or folder here (a run.sh calling `checkpoint` and `folder`
# for its own).
PY=${PY:-python3}; device=${DEVICE:-cuda}; nemo_site=${NEMO_SITE:-/tmp/nemo-site}
# The wheels (scripts/make_packs.sh makes them): .whl-bench.tar.xz (soundfile, cffi, pycparser, pyyaml: 1.3 MB,
# where NeMo's 8.8 MB leaves too little of what a call carries for the whole set), .whl-serve.tar.xz (the serve
# extra without onnxruntime and silero_vad: 3 MB), .whl-vad.tar.xz (those two, 8 MB, beside serve's for server VAD)
# or .whl.tar.xz (18 MB); each one carried is unpacked once per machine
for wheels in .whl-bench.tar.xz .whl-serve.tar.xz .whl-vad.tar.xz .whl.tar.xz; do
    [ -f /tmp/site/$wheels.unpacked ] || [ ! -f $wheels ] || { mkdir -p /tmp/site && tar xJf $wheels -C /tmp/site && touch /tmp/site/$wheels.unpacked; }
done
[ -d /tmp/site ] || [ ! -d .whl ] || $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
# NeMo 3.0 beside (../shared/NEMO_ON_GPU.md): carry .nemo-site.tar.xz; `env PYTHONPATH=$nemo_path` runs with it
[ -d $nemo_site ] || [ ! -f .nemo-site.tar.xz ] || tar xJf .nemo-site.tar.xz -C /tmp
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nemo_path=$nemo_site:$PYTHONPATH
step() { local name=$1 limit=$2; shift 2; echo "=== $name: $*" | tee -a "$log"; local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"; echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; echo "cores: $(nproc)"; git log -1 --format=%h 2>/dev/null; } | tee -a "$log"
speech=src/graphscribe/data
# `checkpoint PRESET PATH`: scripts/make_checkpoint.py's PRESET (random weights calibrated on real speech, NOT
# NVIDIA's) at PATH, once per machine; `folder DIR N`: N LibriSpeech-like files (scripts/make_folder.py, seed 0)
checkpoint() { [ -f $2 ] || step "checkpoint $1" 240 $PY scripts/make_checkpoint.py $1 $2 \
    --calibrate $speech/librispeech_2086-149220-0033.wav --check $speech/jfk_44k1_stereo_24bit.flac; }
folder() { [ -d $1 ] || step "folder $1" 150 $PY scripts/make_folder.py $1 --files $2 --seed 0; }
ckpt=${CKPT:-/tmp/v3.nemo}
if [ -z "${GS_LAZY:-}" ]; then
    checkpoint ${PRESET:-parakeet-tdt-0.6b-v3} $ckpt
    [ -d /tmp/f4096 ] || step folders 150 bash -c "$PY scripts/make_folder.py /tmp/f512 --files 512 --seed 0 & $PY scripts/make_folder.py /tmp/f4096 --files 4096 --seed 0; wait"
fi
# A server on port 8000 for the bench/2026-11-server runs: `serve NAME DTYPE [ENV=VALUE ...]` starts one in the
# background (its stderr in $OUT/serve-NAME.log) and returns when it is warm; `stop NAME` keeps its /metrics, then
# stops it with SIGTERM.
wait_ready() { for _ in $(seq 240); do curl -sf localhost:${1:-8000}/health >/dev/null && return 0; sleep 0.5; done; return 1; }
serve() {
    local name=$1 dtype=$2; shift 2
    env "$@" python3 -m graphscribe.cli serve -m $ckpt --dtype $dtype --port 8000 ${EXTRA:-} 2> "$OUT/serve-$name.log" & server=$!
    wait_ready; echo "[$name: $*] $(grep serving "$OUT/serve-$name.log")" | tee -a "$log"
}
stop() {
    curl -s localhost:8000/metrics > "$OUT/metrics-$1.txt"
    grep -E "batch_rows_(sum|count)|capture_seconds_total [0-9]|padded_seconds_total [0-9]|audio_seconds_total [0-9]" "$OUT/metrics-$1.txt" | tee -a "$log"
    kill -TERM $server; wait $server; echo "server exit $?; non-200 POST lines: $(grep POST "$OUT/serve-$1.log" | grep -vc ' 200 ')" | tee -a "$log"
}
# GPU utilisation beside a step: `util NAME` samples nvidia-smi every 100 ms, `unutil NAME` stops and logs the mean
# over the nonzero samples (the idle ones around a step left out).
util() { nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "/tmp/util-$1.txt" & utilpid=$!; }
unutil() { kill $utilpid; python3 -c "import sys; v=[int(x) for x in open(sys.argv[1]) if x.strip()]; b=[x for x in v if x>0]; print(f'GPU utilisation {sys.argv[2]}: {sum(b)/max(1,len(b)):.0f}% over the {len(b)} nonzero of {len(v)} samples')" "/tmp/util-$1.txt" $1 | tee -a "$log"; }
# `loaded NAME`: 128 clients twice over the 4096 files on the server up now, the GPU's utilisation beside; `low NAME`:
# 32 clients over the 4096 files, then 8 and 1 over the 512 (JSON under $OUT as serve-NAME*.json).
loaded() {
    util $1
    step "server $1" 80 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
        --concurrency 128,128 --json "$OUT/serve-$1.json"
    unutil $1
}
low() {
    step "server $1 32" 40 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
        --concurrency 32 --json "$OUT/serve-$1-32.json"
    step "server $1 8 1" 40 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f512 \
        --concurrency 8,1 --json "$OUT/serve-$1-8-1.json"
}
# `ab_servers AFTER BEFORE`: two builds' servers in bfloat16, interleaved as after, before, before, after, each under
# 128 clients twice over the 4096 files (`loaded`), the first pair at 32, 8 and 1 clients too (`low`); AFTER and
# BEFORE are a source folder for PYTHONPATH, or - for the tree's own src.
ab_servers() {
    local name path
    for name in after-1 before-1 before-2 after-2; do
        path=$1; [ "${name%-*}" = before ] && path=$2
        if [ "$path" = - ]; then serve $name bfloat16; else serve $name bfloat16 PYTHONPATH=/tmp/site:$path; fi
        loaded $name; [ "${name#*-}" = 1 ] && low $name; stop $name
    done
}
# `f32_bars [ENV=VALUE ...]`: issue 29's float32 bars on a server started with that environment: an idle server's
# 7.4 s clip and 8 at once (64 requests a level, twice), and its text per file against the CLI's on the 512 files.
f32_bars() {
    mkdir -p /tmp/clip74; for k in $(seq -w 1 64); do cp $speech/librispeech_2086-149220-0033.wav /tmp/clip74/c$k.wav; done
    serve f32 float32 "$@"
    step "server float32 7.4 s clip" 50 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/clip74 \
        --concurrency 1,8,1,8
    step "cli float32 512 json" 50 python3 -m graphscribe.cli /tmp/f512 -m $ckpt --dtype float32 -f json -o /tmp/cli-f32
    step "server float32 texts" 60 python3 scripts/compare_server.py --url http://127.0.0.1:8000 --folder /tmp/f512 \
        --cli-out /tmp/cli-f32 --clients 16
    stop f32
}
