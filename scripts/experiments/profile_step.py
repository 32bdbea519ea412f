#!/usr/bin/env python
"""Where a decode step's time goes: kernels per step, GPU time per step, achieved bandwidth, graph replay.

    python scripts/experiments/profile_step.py --model v3.nemo --dtype float32 --batch 1 [--step fused|pytorch]

Decodes the 77 s bench tier eagerly under torch.profiler and divides each kernel's GPU time by
the number of steps; then times the same decode replayed from CUDA graphs (median of 5). The
weights a step reads once set its floor: bytes / kernel time is the bandwidth achieved. The
gap between "graph replay per step" and "GPU kernel time per step" is what running the kernels
one after another costs inside the graph.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, replace

import torch
from torch.profiler import ProfilerActivity, profile
from tune_step import tiles_changes  # scripts/experiments/, beside this one

import graphscribe as gs
from graphscribe.bench.decode import tier_clips
from graphscribe.model.decoding import GreedyDecoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--step", default="fused", choices=["fused", "pytorch"])
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default=None, help="append the summary as one JSON line here")
    ap.add_argument(
        "--no-pdl",
        action="store_true",
        help="launch the kernels one after another (with PDL the profiler counts a kernel's wait as its time)",
    )
    ap.add_argument(
        "--one-row",
        default="",
        metavar="FIELD=VALUE,...",
        help="change the one-row class's tiles, e.g. warps=4,stages=4",
    )
    args = ap.parse_args()
    if args.one_row and args.batch != 1:
        ap.error("--one-row changes the tiles of a batch of one row: use it with --batch 1")
    try:
        changes = tiles_changes(args.one_row) if args.one_row else {}
    except ValueError as err:
        ap.error(f"--one-row {err}")

    model = gs.load_model(args.model, device="cuda", dtype=args.dtype)
    tier = tier_clips(model)[-1]
    encoded, lengths = model.encode([tier.audio])
    encoded = encoded.expand(args.batch, -1, -1).contiguous()
    lengths = lengths.expand(args.batch).contiguous()
    fused = args.step == "fused"

    def decoder(graphs: bool) -> GreedyDecoder:
        made = GreedyDecoder(model.module.decoder, model.module.joint, model.cfg.decoding, graphs=graphs, fused=fused)
        if fused:
            step = made._step_fn(encoded.device, encoded.dtype)
            step.pdl &= not args.no_pdl
            step.one_row = replace(step.one_row, **changes)
        return made

    eager = decoder(False)
    start = time.perf_counter()
    reference = eager.decode(encoded, lengths)
    first_s = time.perf_counter() - start
    steps = reference[0].steps
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eager.decode(encoded, lengths)
        torch.cuda.synchronize()
    per_kernel = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name][0] += event.device_time_total
            per_kernel[event.name][1] += 1
    total_us = sum(t for t, _ in per_kernel.values())
    launches = sum(c for _, c in per_kernel.values())

    graphed = decoder(True)
    same = [(h.token_ids, h.frames) for h in graphed.decode(encoded, lengths)] == [
        (h.token_ids, h.frames) for h in reference
    ]
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graphed.decode(encoded, lengths)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    graph_ms = statistics.median(times) * 1e3
    step_bytes = eager._fused_step.weight_bytes() if fused else None
    summary = {
        "tier": tier.name,
        "batch": args.batch,
        "dtype": args.dtype,
        "step": args.step,
        "steps": steps,
        "pdl": fused and eager._fused_step.pdl,
        "tiles": asdict(eager._fused_step.tiles_for(args.batch)) if fused else None,
        "tokens": len(reference[0].token_ids),
        "kernels_per_step": launches / steps,
        "gpu_us_per_step": total_us / steps,
        "graph_ms": graph_ms,
        "graph_us_per_step": graph_ms * 1e3 / steps,
        "weight_mb_per_step": step_bytes / 1e6 if step_bytes else None,
        "achieved_tb_s": step_bytes / (total_us / steps) / 1e6 if step_bytes else None,
        "first_decode_s": first_s,
        "graphs_same_as_eager": same,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    print(
        f"{tier.name}, B={args.batch}, {args.dtype}, {args.step} step{' (PDL)' if summary['pdl'] else ''}{' ' + args.one_row if args.one_row else ''}: {steps} steps, {summary['tokens']} tokens; "
        f"first decode (kernel compile or cache load) {first_s:.2f} s; graphs == eager: {same}"
    )
    print(
        f"kernels per step: {launches / steps:.1f}; GPU kernel time per step: {total_us / steps:.1f} us; "
        f"graph replay per step: {summary['graph_us_per_step']:.1f} us ({graph_ms:.2f} ms a decode)"
    )
    if step_bytes:
        print(
            f"weights read per step: {step_bytes / 1e6:.1f} MB -> {summary['achieved_tb_s']:.2f} TB/s over the kernel time"
        )
    print(f"{'us/step':>8} {'calls/step':>10}  kernel")
    for name, (t, c) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{t / steps:8.2f} {c / steps:10.2f}  {name[:110]}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
