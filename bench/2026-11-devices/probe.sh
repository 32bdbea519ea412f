#!/usr/bin/env bash
# Why a bfloat16 --devices worker takes 17% longer a file than one device alone (issue 30): the host's NUMA layout
# and the GPUs' CPU affinity, then one CLI run on one GPU and one on all, each with `top` of every thread beside
# (the workers' GPU-feeding threads: at 100% a core, or waiting?). From the repo root with .whl carried:
#   bash bench/2026-11-devices/probe.sh   (logs under $OUT)
set -uo pipefail
source scripts/gpu_setup.sh
{ lscpu | grep -iE "numa|socket|model name|^cpu\(s\)|mhz"; nvidia-smi topo -m; } 2>&1 | tee -a "$log"
T="python3 -m graphscribe.cli"
$T /tmp/f4096 -m $ckpt --dtype bfloat16 > /dev/null 2>&1  # Triton's cache and the page cache warm
for devices in "" "--devices all"; do
    name=$([ -z "$devices" ] && echo one || echo all)
    $T /tmp/f4096 -m $ckpt --dtype bfloat16 $devices > /dev/null 2> "$OUT/$name.err" & run=$!
    sleep 3.5; top -H -b -n 8 -d 0.5 -w 220 > "$OUT/$name-top.txt"; wait $run
    tail -n 1 "$OUT/$name.err" | tee -a "$log"
    for k in 3 5 7; do awk -v k=$k '/^top -/{n++} n==k' "$OUT/$name-top.txt" | sed -n '1p;7,22p' | tee -a "$log"; done
done
exit 0
