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
#   ids   each side's ids at 64 and at 256 streams a step, float32, every pair of the four compared: $OUT/ids-CHUNK.json
# Environment: CHUNKS ("0.08 1.12"), FILES (256 files of ~7.4 s on average), DTYPE (float32), NEMO_LEVELS (64,256),
# RT_LEVELS_0_08 (64,256), RT_LEVELS_1_12 (256,1024), MAX_LEVELS (64,256), SAME_STREAMS (64). The CPU dry run:
#   PY=.venv/bin/python NEMO_SITE=/work/nemo-cpu PRESET=tiny-cache-aware-rnnt DEVICE=cpu FILES=6 NEMO_LEVELS=2,4 \
#   RT_LEVELS_0_08=2 RT_LEVELS_1_12=4 MAX_LEVELS=4 SAME_STREAMS=4 CKPT=/tmp/ca-tiny.nemo OUT=/tmp/ca-out bash THIS
set -uo pipefail
GS_LAZY=1 CKPT=${CKPT:-/tmp/nemotron.nemo} source scripts/gpu_setup.sh  # wheels, NeMo, step, checkpoint, folder
files=/tmp/fca${FILES:-256}; dtype=${DTYPE:-float32}
checkpoint ${PRESET:-nemotron-speech-streaming-en-0.6b} $ckpt
folder $files ${FILES:-256}
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
ids)
    # how far float32 rounding moves the ids on this checkpoint: each side at SAME_STREAMS and at 256 streams a step
    # (other matrix shapes; IDS_STREAMS), every pair of the runs compared ($OUT/ids-CHUNK.json; the ids under /tmp)
    ids=/tmp/ids-$chunk
    for n in ${IDS_STREAMS:-${SAME_STREAMS:-64} 256}; do
        step "nemo ids $chunk x$n" 150 env PYTHONPATH=$nemo_path $PY scripts/nemo_cache_aware_bench.py $ckpt $files \
            --chunk $chunk --streams $n --device $device --dtype float32 --out $ids/nemo-$n
        step "our ids $chunk x$n" 90 $PY scripts/compare_cache_aware.py $ckpt $files --chunk $chunk --streams $n \
            --device $device --dtype float32 --nemo $ids/nemo-${SAME_STREAMS:-64}/transcripts.json --out $ids/ours-$n
    done
    step "ids pairs $chunk" 30 $PY scripts/compare_cache_aware.py --pairs $ids/{nemo,ours}-*/transcripts.json \
        --out $OUT/ids-$chunk.json ;;
esac; done; done
