#!/usr/bin/env bash
# Pinned blocks for the requests' samples made before the first request (`Service.pin_ahead`, run53/pin.diff; not
# adopted) against the code without it (as run: the tree with pin.diff reversed; to run again at a later commit,
# apply pin.diff to a copy instead): a server's first pass over the folder ran at 73-78% of the
# CLI (run52), its second at 98-106%. Servers interleaved after, before, before, after, after, before, each under
# 128 clients twice over the 4096 files. Issue 29. One lent H100, from the repo root with .whl.tar.xz carried:
#     bash bench/2026-11-server/run53.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/run53/pin.diff | tee -a "$log"
for name in after-1 before-1 before-2 after-2 after-3 before-3; do
    if [ "${name%-*}" = before ]; then serve $name bfloat16 PYTHONPATH=/tmp/site:/tmp/before; else serve $name bfloat16; fi
    loaded $name; stop $name
done
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
