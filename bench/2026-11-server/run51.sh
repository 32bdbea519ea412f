#!/usr/bin/env bash
# run50.sh again, with less noise: a server started and loaded first and left out (a fresh machine's first server
# ran slow in run50), then packed rows aligned to 16 (before), 64 and 128 frames, interleaved twice, each under
# 128 clients twice over the 4096 files. Issue 29. One lent H100, from the repo root with .whl.tar.xz carried:
#     bash bench/2026-11-server/run51.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
for align in 64 128; do
    rm -rf /tmp/align$align; cp -r src /tmp/align$align
    sed -i "s/^    ALIGN = 16  #/    ALIGN = $align  #/" /tmp/align$align/graphscribe/packing.py
    grep -h "^    ALIGN = " /tmp/align$align/graphscribe/packing.py | tee -a "$log"
done
serve first bfloat16; loaded first; stop first
for round in 1 2; do
    serve before-$round bfloat16; loaded before-$round; stop before-$round
    for align in 64 128; do
        serve align$align-$round bfloat16 PYTHONPATH=/tmp/site:/tmp/align$align; loaded align$align-$round; stop align$align-$round
    done
done
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
