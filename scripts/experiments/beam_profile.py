#!/usr/bin/env python
"""Where a beam search's decode time goes: the same encoder output decoded greedily and by beam search, graphs on,
then the beam's steps run eagerly under the torch profiler (kernels per step, GPU time by operator).

    python scripts/experiments/beam_profile.py MODEL.nemo DIR [--device cuda] [--dtype bfloat16] [--batch 128]
        [--beam 4] [--reps 3] [--json OUT.json]

Encodes the first --batch files of DIR once; times `model.decode` (median of --reps after one untimed decode, which
also captures the graphs) greedy and beam; prints each decode's steps and the time a step, then the profiler's
table of the eager beam decode (its GPU time is the kernels' alone: what a graph replay cannot remove).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from boost_decode import timed  # beside this file: the decode's median time, warmed up

import graphscribe as gs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("folder", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=40, help="the profiler table's rows")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    files = sorted(p for p in args.folder.iterdir() if p.is_file())[: args.batch]
    report = {"files": len(files), "batch": args.batch, "beam": args.beam, "dtype": args.dtype}
    for name, beam in (("greedy", 1), ("beam", args.beam)):
        model = gs.load_model(args.model, device=args.device, dtype=args.dtype, beam_size=beam)
        encoded, lengths = model.encode([model.read(f) for f in files])
        seconds = timed(model, encoded, lengths, args.reps)
        decoder = model.beam if beam > 1 else model.decoder
        steps = getattr(decoder, "steps", 0)
        report[name] = {"seconds": seconds, "steps": steps, "ms_per_step": 1e3 * seconds / max(steps, 1)}
        print(f"{name}: decode {seconds * 1e3:.1f} ms, {steps} steps, {1e3 * seconds / max(steps, 1):.3f} ms a step")
    model.use_graphs(False)
    eager = timed(model, encoded, lengths, 1)
    report["beam_eager_seconds"] = eager
    print(f"beam eager: {eager * 1e3:.1f} ms")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if encoded.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        model.decode(encoded, lengths)
        torch.cuda.synchronize() if encoded.device.type == "cuda" else None
    steps = model.beam.steps
    events = prof.key_averages()
    sort = "cuda_time_total" if encoded.device.type == "cuda" else "cpu_time_total"
    table = events.table(sort_by=sort, row_limit=args.rows)
    print(table)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time for e in kernels) if kernels else 0.0
    report["profile"] = {
        "steps": steps,
        "kernels_per_step": len(kernels) / max(steps, 1),
        "kernel_us_per_step": gpu_us / max(steps, 1),
        "table": table,
    }
    print(
        f"eager beam: {len(kernels) / max(steps, 1):.1f} kernels a step, {gpu_us / max(steps, 1):.1f} us of kernels a step"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
