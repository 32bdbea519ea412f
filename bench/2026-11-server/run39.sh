#!/usr/bin/env bash
# Again batches gathered on the GPU from pinned memory (as shipped) against the server before it (.snap: collated on
# the batching thread), and a third server keeping 4 GiB of encoder layer graphs (keep_bytes_patch.py: do warm passes
# still capture?), interleaved, 128 clients twice over the 4096 files each; in round 1 also 32 clients (4096 files)
# and 8 and 1 (512 files) on the first two; the CLI before and after. Issue 29.
# One lent H100, from the repo root with .whl and .snap carried:  bash bench/2026-11-server/run39.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
T="python3 -m graphscribe.cli"
rm -rf /tmp/before /tmp/keep; cp -r src /tmp/before; cp .snap/src/graphscribe/*.py /tmp/before/graphscribe/
cp -r src /tmp/keep; python3 bench/2026-11-server/keep_bytes_patch.py /tmp/keep | tee -a "$log"
step "cli bfloat16 4096" 90 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out /tmp/cli-a \
    --variant "txt: --dtype bfloat16"
cp /tmp/cli-a/grid.md "$OUT/cli-a.md"
serve gather-1 bfloat16; loaded gather-1; low gather-1; stop gather-1
serve before-1 bfloat16 PYTHONPATH=/tmp/site:/tmp/before; loaded before-1; low before-1; stop before-1
serve keep-1 bfloat16 PYTHONPATH=/tmp/site:/tmp/keep; loaded keep-1; stop keep-1
serve before-2 bfloat16 PYTHONPATH=/tmp/site:/tmp/before; loaded before-2; stop before-2
serve keep-2 bfloat16 PYTHONPATH=/tmp/site:/tmp/keep; loaded keep-2; stop keep-2
serve gather-2 bfloat16; loaded gather-2; stop gather-2
step "cli bfloat16 4096 again" 60 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 1 --out /tmp/cli-b \
    --variant "txt: --dtype bfloat16"
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
