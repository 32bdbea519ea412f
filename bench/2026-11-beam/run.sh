#!/usr/bin/env bash
# Issue 49's beam bars on one lent GPU: graphscribe's greedy and beam search (its steps replayed from CUDA graphs)
# against NeMo 3.0's greedy_batch and malsd_batch on a parakeet-tdt-0.6b-v3-shaped checkpoint (random weights,
# calibrated: NOT NVIDIA's) and a folder of LibriSpeech-like real-speech files (scripts/make_folder.py), one command:
#   bash bench/2026-11-beam/run.sh [PART...]   (carry .nemo-site.tar.xz and .whl-bench.tar.xz, as ../2026-11-cache-aware)
# Parts (each makes the checkpoint and folders first, once per machine; all by default). A lent machine's command
# stops after 10 minutes: there, run `greedy beam`, `nemo` and `same table` as three calls on the warm machine.
#   greedy `transcribe bench --folder` on the FILES (4096) files, DTYPE (bfloat16), batch BATCH (128): the
#          CUDA-graph rows (`bench --graphs`; median of REPS, 3), $OUT/ours-greedy.json
#   beam   the same with --beam BEAM (4): $OUT/ours-beam.json
#   nemo   scripts/nemo_beam_bench.py: NeMo's greedy_batch (its CUDA-graph decoder) and malsd_batch beam BEAM (its
#          CUDA graphs), the same files, DTYPE, batch BATCH: $OUT/nemo-DTYPE.json
#   same   float32, the first AGREE (512) files: our CLI `--beam BEAM -f json` (batch AGREE_BATCH, 32) and NeMo's
#          malsd_batch token ids: $OUT/ours-ids/, $OUT/nemo-float32.json
#   table  scripts/compare_beam.py: RTFx ratios and the agreement against the bars, $OUT/summary.md (and .json)
# The CPU dry run (tiny random TDT model, a few files):
#   PY=/work/main/.venv/bin/python NEMO_SITE=/work/nemo-cpu PRESET=tiny-tdt DEVICE=cpu FILES=6 AGREE=4 BATCH=4 \
#   AGREE_BATCH=4 REPS=1 WORKERS=0 CKPT=/tmp/beam-tiny.nemo OUT=/tmp/beam-out bash THIS
set -uo pipefail
GS_LAZY=1 CKPT=${CKPT:-/tmp/v3.nemo} source scripts/gpu_setup.sh  # wheels, NeMo, step, checkpoint, folder
nfiles=${FILES:-4096}; files=/tmp/f$nfiles
beam=${BEAM:-4}; batch=${BATCH:-128}; dtype=${DTYPE:-bfloat16}; agree=${AGREE:-512}; workers=${WORKERS:-8}
checkpoint ${PRESET:-parakeet-tdt-0.6b-v3} $ckpt
folder $files $nfiles
# the agreement's files: the first AGREE of the folder (make_folder's files of one seed are a prefix of a larger draw
# only in name, so they are linked from the folder itself: both sides read the same bytes)
subset=/tmp/f$nfiles-first$agree
[ -d $subset ] || { mkdir -p $subset && ls $files | sort | head -n $agree | while read -r f; do ln -s $files/$f $subset/$f; done; }
bench() { step "ours $1" 240 $PY -m graphscribe.cli bench --folder $files --batch-sizes $batch --reps ${REPS:-3} --graphs \
    -m $ckpt --device $device --dtype $dtype "${@:3}" --json $OUT/ours-$2.json; }
for part in ${*:-greedy beam nemo same table}; do case $part in
greedy) bench greedy greedy ;;
beam) bench "beam $beam" beam --beam $beam ;;
nemo)
    step "nemo $dtype" 300 env PYTHONPATH=$nemo_path $PY scripts/nemo_beam_bench.py --model $ckpt --folder $files \
        --runs greedy,beam --beam $beam --batch-size $batch --dtype $dtype --num-workers $workers --device $device \
        --json $OUT/nemo-$dtype.json ;;
same)
    rm -rf $OUT/ours-ids
    step "ours float32 ids" 300 $PY -m graphscribe.cli $subset -m $ckpt --beam $beam --dtype float32 --device $device \
        --batch ${AGREE_BATCH:-32} -f json -o $OUT/ours-ids
    step "nemo float32 ids" 590 env PYTHONPATH=$nemo_path $PY scripts/nemo_beam_bench.py --model $ckpt --folder $subset \
        --runs beam --beam $beam --batch-size ${AGREE_BATCH:-32} --dtype float32 --num-workers $workers \
        --device $device --json $OUT/nemo-float32.json ;;
table)
    step table 60 $PY scripts/compare_beam.py --ours-greedy $OUT/ours-greedy.json --ours-beam $OUT/ours-beam.json \
        --nemo $OUT/nemo-$dtype.json --ours-ids $OUT/ours-ids --nemo-ids $OUT/nemo-float32.json --out $OUT/summary.md ;;
esac; done
