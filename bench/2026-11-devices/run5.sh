#!/usr/bin/env bash
# --devices all against one GPU (issue 30) as shipped at stop 37 (batches' audio copied on a stream of their own),
# and each worker pinned to its own half of the host's cores (a patched copy: is the launching threads' slowdown beside
# another worker a matter of cores?), on the lent 2-GPU machine, from the repo root with .whl carried:
#   bash bench/2026-11-devices/run5.sh   (logs under $OUT)
# The 4096-file folder, default batching, whole CLI processes, rounds interleaved (scripts/cli_grid.py): bfloat16
# 2 rounds (one GPU, two, two pinned), float32 2; then float32's outputs of one GPU and of two compared file by file.
set -uo pipefail
source scripts/gpu_setup.sh
T="python3 -m graphscribe.cli"
nvidia-smi topo -m | head -4 | tee -a "$log"; lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA node" | tee -a "$log"
rm -rf /tmp/pinned; cp -r src /tmp/pinned
python3 - <<'PY'
p = "/tmp/pinned/graphscribe/devices.py"; s = open(p).read()
old = "    limit_host_threads(options.device, share)\n"
assert old in s
s = s.replace(old, old + """    cores = sorted(os.sched_getaffinity(0))
    k, n = (int(options.device.split(":")[1]) if ":" in options.device else 0), cuda_device_count()
    os.sched_setaffinity(0, cores[k * len(cores) // n : (k + 1) * len(cores) // n])
""")
open(p, "w").write(s)
PY
step "bfloat16 4096" 300 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/bf16" \
    --variant "one-gpu: --dtype bfloat16" --variant "devices-all: --dtype bfloat16 --devices all" \
    --variant "devices-pinned: --dtype bfloat16 --devices all @PYTHONPATH=/tmp/site:/tmp/pinned"
step "float32 4096" 260 python3 scripts/cli_grid.py --folder /tmp/f4096 --model $ckpt --rounds 2 --out "$OUT/f32" \
    --variant "one-gpu: --dtype float32" --variant "devices-all: --dtype float32 --devices all"
step "float32 texts" 150 bash -c "rm -rf /tmp/one /tmp/two; $T /tmp/f4096 -m $ckpt --dtype float32 -o /tmp/one 2>&1 | tail -1;
    $T /tmp/f4096 -m $ckpt --dtype float32 --devices all -o /tmp/two 2>&1 | tail -1;
    echo files: \$(ls /tmp/one | wc -l) \$(ls /tmp/two | wc -l); diff -rq /tmp/one /tmp/two | wc -l | sed 's/^/differing files: /'"
exit 0
