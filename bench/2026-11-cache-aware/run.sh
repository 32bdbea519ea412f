#!/usr/bin/env bash
# Cache-aware streaming on one lent GPU: graphscribe's CacheAwareEngine against NeMo 3.0's CacheAwareRNNTPipeline on a
# nemotron-speech-streaming-en-0.6b-shaped checkpoint (random weights, calibrated: NOT NVIDIA's), the same real-speech
# files (scripts/make_folder.py, LibriSpeech/JFK cuts) at 0.08 s and 1.12 s chunks, float32, one command:
#   bash bench/2026-11-cache-aware/run.sh [PART...]   (carry .nemo-site.tar.xz and .whl-bench.tar.xz; about 8 minutes)
# .whl-bench.tar.xz: soundfile, cffi, pycparser and pyyaml out of .whl.tar.xz (1.3 MB; the whole .whl.tar.xz, 18 MB,
# with NeMo's 8.8 MB and the tree passes the 64 MiB a call carries):
#   tar xJf .whl.tar.xz -C DIR ./_cffi_backend.cpython-312-x86_64-linux-gnu.so ./_soundfile.py ./_soundfile_data ./cffi ./pycparser ./soundfile.py \
#       ./yaml ./_yaml ./typing_extensions.py && tar c -C DIR . | xz -9e > .whl-bench.tar.xz
# Parts (each makes what it needs first; all by default):
#   ours  graphscribe's streams bench (`transcribe bench --streams`): real-time levels (chunk latency, kept up) and
#         max pace (RTFx), JSON in $OUT/ours-{realtime,max}-CHUNK.json
#   nemo  NeMo's pipeline, max pace, N streams a level (RTFx; steps with N streams against the chunk: real time
#         kept or not) and every file's token ids: $OUT/nemo-DTYPE-CHUNK/{result,transcripts}.json
#   same  graphscribe's streams' token ids against NeMo's, every file a stream, 64 at a time: $OUT/same-CHUNK/compare.json
# Environment: CHUNKS ("0.08 1.12"), FILES (256 files of ~7.4 s on average), DTYPE (float32), NEMO_LEVELS (64,256),
# RT_LEVELS_0_08 (64,256), RT_LEVELS_1_12 (256,1024), MAX_LEVELS (64,256), SAME_STREAMS (64). The CPU dry run:
#   PY=.venv/bin/python NEMO_SITE=/work/nemo-cpu PRESET=tiny-cache-aware-rnnt DEVICE=cpu FILES=6 NEMO_LEVELS=2,4 \
#   RT_LEVELS_0_08=2 RT_LEVELS_1_12=4 MAX_LEVELS=4 SAME_STREAMS=4 CKPT=/tmp/ca-tiny.nemo OUT=/tmp/ca-out bash THIS
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"; log=$OUT/run.log
step() { local name=$1 limit=$2; shift 2; echo "=== $name: $*" | tee -a "$log"; local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$log"; echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"; }
# graphscribe's wheels and NeMo, unpacked once per machine (as scripts/gpu_setup.sh and ../shared/NEMO_ON_GPU.md)
PY=${PY:-python3}; nemo_site=${NEMO_SITE:-/tmp/nemo-site}; device=${DEVICE:-cuda}
for wheels in .whl-bench.tar.xz .whl.tar.xz; do
    [ -d /tmp/site ] || [ ! -f $wheels ] || { mkdir -p /tmp/site && tar xJf $wheels -C /tmp/site; }
done
[ -d $nemo_site ] || tar xJf .nemo-site.tar.xz -C /tmp
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nemo_path=$nemo_site:$PYTHONPATH
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; echo "cores: $(nproc)"; git log -1 --format=%h 2>/dev/null; } | tee -a "$log"
ckpt=${CKPT:-/tmp/nemotron.nemo}; speech=src/graphscribe/data; files=/tmp/fca${FILES:-256}; dtype=${DTYPE:-float32}
[ -f $ckpt ] || step checkpoint 240 $PY scripts/make_checkpoint.py ${PRESET:-nemotron-speech-streaming-en-0.6b} $ckpt \
    --calibrate $speech/librispeech_2086-149220-0033.wav --check $speech/jfk_44k1_stereo_24bit.flac
[ -d $files ] || step folder 120 $PY scripts/make_folder.py $files --files ${FILES:-256} --seed 0
levels() { local name=RT_LEVELS_${1/./_}; echo "${!name:-$([ "$1" = 0.08 ] && echo 64,256 || echo 256,1024)}"; }
parts=${*:-ours nemo same}
for part in $parts; do for chunk in ${CHUNKS:-0.08 1.12}; do case $part in
ours)
    step "ours realtime $chunk" 150 $PY -m graphscribe.cli bench --streams $(levels $chunk) --pace realtime \
        --folder $files --chunk $chunk -m $ckpt --device $device --dtype $dtype --json $OUT/ours-realtime-$chunk.json
    step "ours max $chunk" 90 $PY -m graphscribe.cli bench --streams ${MAX_LEVELS:-64,256} --pace max \
        --folder $files --chunk $chunk -m $ckpt --device $device --dtype $dtype --json $OUT/ours-max-$chunk.json ;;
nemo)
    step "nemo $chunk" 150 env PYTHONPATH=$nemo_path $PY scripts/nemo_cache_aware_bench.py $ckpt $files \
        --chunk $chunk --streams ${NEMO_LEVELS:-64,256} --device $device --dtype $dtype --out $OUT/nemo-$dtype-$chunk ;;
same)
    [ -f $OUT/nemo-float32-$chunk/transcripts.json ] || step "nemo ids $chunk" 120 env PYTHONPATH=$nemo_path $PY \
        scripts/nemo_cache_aware_bench.py $ckpt $files --chunk $chunk --streams ${SAME_STREAMS:-64} --device $device \
        --dtype float32 --out $OUT/nemo-float32-$chunk
    step "same ids $chunk" 90 $PY scripts/compare_cache_aware.py $ckpt $files --chunk $chunk \
        --streams ${SAME_STREAMS:-64} --device $device --dtype float32 --nemo $OUT/nemo-float32-$chunk/transcripts.json --out $OUT/same-$chunk ;;
esac; done; done
