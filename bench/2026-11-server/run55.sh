#!/usr/bin/env bash
# Warm-up batches of mixed lengths (16 bits: clips sharing rows from the samples on), so that the packed paths'
# kernels compile before the first request, against the warm-up before it (the tree with run55/warm.diff reversed).
# A fresh machine's first server stalled 2 s in its first pass (run50, run54: p99 2.2 s); here every server starts
# with an empty Triton cache (TRITON_CACHE_DIR of its own), as on a fresh machine. Servers interleaved after,
# before, before, after, each under 128 clients twice over the 4096 files. Issue 29. One lent H100, from the repo
# root with .whl.tar.xz carried:  bash bench/2026-11-server/run55.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/run55/warm.diff | tee -a "$log"
for name in after-1 before-1 before-2 after-2; do
    rm -rf /tmp/tc-$name
    if [ "${name%-*}" = before ]; then
        serve $name bfloat16 PYTHONPATH=/tmp/site:/tmp/before TRITON_CACHE_DIR=/tmp/tc-$name
    else
        serve $name bfloat16 TRITON_CACHE_DIR=/tmp/tc-$name
    fi
    loaded $name; stop $name
done
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
