#!/usr/bin/env bash
# Where a server's first pass over the folder loses against its second (73-78% of the CLI against 98-106%, run52):
# the timeline of every batch (timeline_patch.py) of one server as shipped under 128 clients twice over the 4096
# files, a first server started and loaded before it and left out. Issue 29. One lent H100, from the repo root with
# .whl.tar.xz carried:  bash bench/2026-11-server/run54.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/tl; cp -r src /tmp/tl; python3 bench/2026-11-server/timeline_patch.py /tmp/tl | tee -a "$log"
serve first bfloat16; loaded first; stop first
serve timeline bfloat16 PYTHONPATH=/tmp/site:/tmp/tl GRAPHSCRIBE_TIMELINE=$OUT/tl-server.json; loaded timeline; stop timeline
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
