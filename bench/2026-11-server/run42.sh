#!/usr/bin/env bash
# Where a batch cycle goes: the timeline of every batch (timeline_patch.py: host marks and CUDA events) in the server
# under 128 clients (twice over the 4096 files) and in the CLI on the same files, bfloat16, the code as shipped.
# Issue 29. One lent H100, from the repo root with .whl carried:  bash bench/2026-11-server/run42.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/tl; cp -r src /tmp/tl; python3 bench/2026-11-server/timeline_patch.py /tmp/tl | tee -a "$log"
step "cli warm (Triton's cache)" 90 $T /tmp/f4096 -m $ckpt --dtype bfloat16 -o /tmp/cli-warm
step "cli timeline" 60 env GRAPHSCRIBE_TIMELINE=$OUT/tl-cli.json PYTHONPATH=/tmp/site:/tmp/tl $T /tmp/f4096 -m $ckpt --dtype bfloat16 -o /tmp/cli-tl
serve timeline bfloat16 PYTHONPATH=/tmp/site:/tmp/tl GRAPHSCRIBE_TIMELINE=$OUT/tl-server.json; loaded timeline; stop timeline
ls -la $OUT | tee -a "$log"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
