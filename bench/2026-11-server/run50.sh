#!/usr/bin/env bash
# Packed rows a multiple of 64 frames long (Packing.ALIGN 16 -> 64; simulated on the folder's lengths, 150 server
# batches of 30-55 requests: 84 -> 35 distinct (rows, length) shapes, 1.087 -> 1.085 times their frames), so a
# server's batches meet fewer new shapes (each a capture of the layer graph, and first uses): servers interleaved
# after, before, before, after under 128 clients twice over the 4096 files, 32, 8 and 1 clients on the first pair;
# one server at 128 frames (align128). Issue 29. One lent H100, from the repo root with .whl.tar.xz carried:
#     bash bench/2026-11-server/run50.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/after /tmp/align128; cp -r src /tmp/after; cp -r src /tmp/align128
sed -i 's/^    ALIGN = 16  #/    ALIGN = 64  #/' /tmp/after/graphscribe/packing.py
sed -i 's/^    ALIGN = 16  #/    ALIGN = 128  #/' /tmp/align128/graphscribe/packing.py
grep -h "^    ALIGN = " /tmp/after/graphscribe/packing.py /tmp/align128/graphscribe/packing.py | tee -a "$log"
ab_servers /tmp/after -
serve align128 bfloat16 PYTHONPATH=/tmp/site:/tmp/align128; loaded align128; stop align128
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
