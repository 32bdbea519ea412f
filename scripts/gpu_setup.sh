#!/usr/bin/env bash
# Sourced by the bench/*/run.sh scripts on the lent GPU machine: wheels carried in .whl (and NeMo's in
# .whl-nemo), the calibrated parakeet-tdt-0.6b-v3-shaped checkpoint (random weights, NOT NVIDIA's) and folders of
# LibriSpeech-like FLAC files, each made once per machine; `step NAME SECONDS COMMAND...` runs and logs a command.
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"; log=$OUT/run.log
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
if [ -d .whl-nemo ] && [ ! -f /tmp/nemo-site/.done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/nemo-site .whl-nemo/*.whl &&
        touch /tmp/nemo-site/.done
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "=== $name: $*" | tee -a "$log"; local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"; echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; echo "cores: $(nproc)"; git log -1 --format=%h 2>/dev/null; } | tee -a "$log"
ckpt=/tmp/v3.nemo; speech=src/graphscribe/data
[ -f $ckpt ] || step checkpoint 120 python3 scripts/make_checkpoint.py parakeet-tdt-0.6b-v3 $ckpt\
    --calibrate $speech/librispeech_2086-149220-0033.wav --check $speech/jfk_44k1_stereo_24bit.flac
[ -d /tmp/f4096 ] || step folders 150 bash -c "python3 scripts/make_folder.py /tmp/f512 --files 512 --seed 0 & python3 scripts/make_folder.py /tmp/f4096 --files 4096 --seed 0; wait"
