#!/usr/bin/env bash
# Which Triton kernels compile after a server's warm-up on a fresh machine (issue 29: the first request as fast as
# the hundredth), on one lent GPU, from the repo root with .whl carried:  bash bench/2026-11-server/run20.sh
set -uo pipefail
source scripts/gpu_setup.sh
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
ls ~/.triton/cache 2>/dev/null | wc -l | sed 's/^/triton cache entries before: /' | tee -a "$log"
step "compiles bfloat16" 200 python3 scripts/experiments/triton_compiles.py -m $ckpt --folder /tmp/f4096 --clients 128
step "compiles float32" 200 python3 scripts/experiments/triton_compiles.py -m $ckpt --folder /tmp/f512 --clients 32 --dtype float32
exit 0
