#!/usr/bin/env bash
# run58.sh again in steady state, three pairs: a first server started and left out (the machine's first pays its own
# first uses), then after, before, before, after, after, before under 128 clients twice over the 4096 files; then the
# GPU-marked tests (the layer graphs' shared static buffers on real captures). Issue 29. One lent H100, from the repo
# root with .whl.tar.xz carried:  bash bench/2026-11-server/run59.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
rm -rf /tmp/before; cp -r src /tmp/before; patch -R -d /tmp/before -p2 < bench/2026-11-server/run58/shapes.diff | tee -a "$log"
serve first bfloat16; stop first
for name in after-1 before-1 before-2 after-2 after-3 before-3; do
    if [ "${name%-*}" = before ]; then serve $name bfloat16 PYTHONPATH=/tmp/site:/tmp/before; else serve $name bfloat16; fi
    loaded $name; stop $name
done
step "gpu tests" 200 env GRAPHSCRIBE_TEST_V3=$ckpt python3 -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors tests/
(cd "$OUT" && tar czf logs.tgz serve-*.log metrics-*.txt serve-*.json && rm -f serve-*.log metrics-*.txt serve-*.json)
exit 0
