#!/usr/bin/env bash
# run55.sh with Triton's cache kept (a server restarted on a machine that ran one before): does the warm-up of mixed
# lengths cost a warm server anything? A first server started, loaded and left out, then after, before, before,
# after under 128 clients twice over the 4096 files. Issue 29. One lent H100, from the repo root with .whl.tar.xz
# carried:  bash bench/2026-11-server/run56.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/run55/warm.diff | tee -a "$log"
serve first bfloat16; loaded first; stop first
ab_servers - /tmp/before
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
