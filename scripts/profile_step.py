#!/usr/bin/env python
"""Where a decode step's time goes: GPU kernel time per step (torch.profiler) against graph replay time.

    python scripts/profile_step.py --model v3.nemo --dtype float32 --batch 1

Decodes the 77 s bench tier eagerly under the profiler and divides each kernel's total GPU
time by the number of steps; then times the same decode replayed from CUDA graphs. The
gap between "sum of kernel time" and "graph time per step" is what launching the kernels
one after another costs inside the graph.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import graphscribe as gs
from graphscribe.bench import tier_clips
from graphscribe.decoding import GreedyDecoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--compile", action="store_true", help="experiment: torch.compile the step before capture")
    args = ap.parse_args()

    model = gs.load_model(args.model, device="cuda", dtype=args.dtype)
    tier = tier_clips(model)[-1]
    encoded, lengths = model.encode([tier.audio])
    encoded = encoded.expand(args.batch, -1, -1).contiguous()
    lengths = lengths.expand(args.batch).contiguous()

    eager = GreedyDecoder(model.module.decoder, model.module.joint, model.cfg.decoding, graphs=False)
    steps = eager.decode(encoded, lengths)[0].steps
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eager.decode(encoded, lengths)
        torch.cuda.synchronize()
    per_kernel = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name][0] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            per_kernel[event.name][1] += 1
    total_us = sum(t for t, _ in per_kernel.values())
    launches = sum(c for _, c in per_kernel.values())

    graphed = GreedyDecoder(model.module.decoder, model.module.joint, model.cfg.decoding, graphs=True)
    if args.compile:
        from graphscribe.decoding import decode_step

        graphed.step_fn = torch.compile(decode_step, dynamic=False)
    start = time.perf_counter()
    reference = [(h.token_ids, h.frames) for h in eager.decode(encoded, lengths)]
    same = [(h.token_ids, h.frames) for h in graphed.decode(encoded, lengths)] == reference
    print(f"first graphed decode (capture{' and compile' if args.compile else ''}): {time.perf_counter() - start:.1f} s; "
          f"same tokens as eager: {same}")
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graphed.decode(encoded, lengths)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    graph_us = sorted(times)[2] * 1e6 / steps

    print(f"{tier.name}, B={args.batch}, {args.dtype}: {steps} steps")
    print(f"kernels per step: {launches / steps:.1f}; GPU kernel time per step: {total_us / steps:.1f} us; "
          f"graph replay per step: {graph_us:.1f} us; launch gaps per step: {graph_us - total_us / steps:.1f} us")
    print(f"{'us/step':>8} {'calls/step':>10}  kernel")
    for name, (t, c) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{t / steps:8.2f} {c / steps:10.2f}  {name[:110]}")


if __name__ == "__main__":
    main()
