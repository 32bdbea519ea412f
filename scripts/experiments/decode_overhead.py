#!/usr/bin/env python
"""Where a decode's time goes outside its steps: setup, host reads between rounds, collecting the tokens.

    python scripts/experiments/decode_overhead.py --model v3.nemo [--dtypes float32,bfloat16] [--tiers 0,2] [--batches 1,8]
        [--reps 20] [--json F] [--md F]

For each bench tier (the clip repeated B times; 0: 7.4 s, 1: 23 s, 2: 77 s) and dtype, with graphs:

- `ms`: `GreedyDecoder.decode` timed alone, synchronised around it, median of `--reps` after a warm-up
  (`tune_step.timed`);
- one more decode with every phase it calls wrapped (`PHASES`: the encoder projection, the start state, the buffers'
  reset, the host reads, the graph replays, the collection of the tokens): per phase its calls, host time and GPU
  time (from a CUDA event recorded before the call to one recorded after it; a host read's GPU time is the GPU
  waiting for the host), and the GPU's time before its first replay and after its last one.

The wrappers cost host time themselves (two events a call): the instrumented decode is slower than `ms`; read its
phases as shares. Works on any version that has the phases' names (those missing are left out), so that two
versions can be measured one after the other (`gpu_run.sh decodeab`).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from tune_step import timed  # scripts/experiments/, beside this one

import graphscribe as gs
from graphscribe.bench.decode import tier_clips
from graphscribe.model import decoding

# (owner, attribute, phase, factory): what decode() calls, wrapped where it exists in this version; a factory
# returns the callable that is timed (a graph replay, or eager calls)
PHASES = [
    ("joint", "project_encoder", "encoder projection", False),
    ("decoder", "start_state", "start state", False),
    ("buffers", "reset", "reset", False),
    ("buffers", "load", "load", False),
    ("decoder", "_restarter", "restart", True),
    ("step", "start", "start (W_hh h)", False),
    ("decoding", "progress", "host read", False),
    ("Progress", "read", "host read", False),
    ("decoding", "_collect", "collect", False),
    ("decoder", "_runner", "replays", True),
]
REPLAY = "replays"


class Marks:
    """CUDA events and host times around each wrapped call."""

    def __init__(self):
        self.calls: list[tuple[str, float, float, torch.cuda.Event, torch.cuda.Event]] = []
        self.origin = (time.perf_counter(), _event())

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            before, host = _event(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append((name, host, time.perf_counter(), before, _event()))

        return wrapped

    def summary(self, end_host: float, end_event: torch.cuda.Event) -> dict:
        torch.cuda.synchronize()
        host0, gpu0 = self.origin
        by_phase = defaultdict(lambda: {"calls": 0, "host_us": 0.0, "gpu_us": 0.0})
        replays = [c for c in self.calls if c[0] == REPLAY]
        for name, h0, h1, e0, e1 in self.calls:
            row = by_phase[name]
            row["calls"] += 1
            row["host_us"] += (h1 - h0) * 1e6
            row["gpu_us"] += e0.elapsed_time(e1) * 1e3
        out = {
            "wall_us": (end_host - host0) * 1e6,
            "gpu_span_us": gpu0.elapsed_time(end_event) * 1e3,
            "phases": dict(by_phase),
        }
        if replays:
            out["gpu_before_first_replay_us"] = gpu0.elapsed_time(replays[0][3]) * 1e3
            out["gpu_after_last_replay_us"] = replays[-1][4].elapsed_time(end_event) * 1e3
        return out


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def instrumented(decoder, encoded, lengths) -> dict:
    """One decode with its phases wrapped (the decoder already warm)."""
    marks = Marks()
    step = decoder._fused_step
    buf = decoder._buffers[decoding.size_class(encoded.shape[0])]
    owners = {
        "joint": decoder.joint,
        "decoder": decoder,
        "buffers": buf,
        "step": step,
        "decoding": decoding,
        "Progress": getattr(decoding, "Progress", None),
    }
    saved = []
    for owner, attr, name, factory in PHASES:
        target = owners[owner]
        if target is None or not hasattr(target, attr):
            continue
        original = getattr(target, attr)
        saved.append((target, attr, vars(target).get(attr, _MISSING)))  # a class's descriptor, as it is there
        setattr(target, attr, _wrap_made(marks, name, original) if factory else marks.wrap(name, original))
    try:
        marks.origin = (time.perf_counter(), _event())
        decoder.decode(encoded, lengths)
        end_event, end_host = _event(), time.perf_counter()
    finally:
        for target, attr, value in reversed(saved):
            if value is _MISSING:
                delattr(target, attr)
            else:
                setattr(target, attr, value)
    return marks.summary(end_host, end_event)


_MISSING = object()


def _wrap_made(marks: Marks, name: str, factory):
    return lambda *args, **kwargs: marks.wrap(name, factory(*args, **kwargs))


def by_operation(decoder, encoded, lengths) -> str:
    """One decode under torch.profiler: host and GPU time by operation, most host time first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        decoder.decode(encoded, lengths)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)


def table(rows: list[dict]) -> str:
    names = list(dict.fromkeys(name for _, _, name, _ in PHASES if any(name in r["phases"] for r in rows)))
    head = [
        "tier",
        "dtype",
        "B",
        "ms",
        "steps",
        "queued",
        "reads",
        "instrumented us",
        "GPU before 1st replay",
        "GPU after last",
    ] + [f"{n} (host / GPU us)" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [
            r["tier"],
            r["dtype"],
            r["batch"],
            f"{r['ms']:.3f}",
            r["steps"],
            r["queued"],
            r["host_reads"],
            f"{r['wall_us']:.0f}",
            f"{r.get('gpu_before_first_replay_us', 0):.0f}",
            f"{r.get('gpu_after_last_replay_us', 0):.0f}",
        ]
        for n in names:
            p = r["phases"].get(n)
            cells.append(f"{p['calls']} x: {p['host_us']:.0f} / {p['gpu_us']:.0f}" if p else "-")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--tiers", default="0,2", help="bench tiers by index (0: 7.4 s, 1: 23 s, 2: 77 s)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--label", default="", help="a name for this version in the output")
    ap.add_argument("--json", type=Path, default=None, help="append the rows here, one JSON line each")
    ap.add_argument("--md", type=Path, default=None, help="write the table here")
    ap.add_argument(
        "--ops",
        type=Path,
        default=None,
        help="append here, for each row, one more decode's host time by PyTorch operation (torch.profiler)",
    )
    args = ap.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        model = gs.load_model(args.model, device="cuda", dtype=dtype)
        tiers = tier_clips(model)
        for index in args.tiers.split(","):
            tier = tiers[int(index)]
            encoded1, lengths1 = model.encode([tier.audio])
            for batch in map(int, args.batches.split(",")):
                encoded = encoded1.expand(batch, -1, -1).contiguous()
                lengths = lengths1.expand(batch).contiguous()
                decoder = model.decoder
                ms, _, hyps = timed(decoder, encoded, lengths, args.reps)
                row = {
                    "label": args.label,
                    "tier": tier.name,
                    "dtype": dtype,
                    "batch": batch,
                    "ms": ms,
                    "steps": hyps[0].steps,
                    "queued": decoder.queued_steps,
                    "host_reads": decoder.host_reads,
                    "tokens": hyps[0].token_ids,
                    **instrumented(decoder, encoded, lengths),
                }
                rows.append(row)
                if args.ops:
                    with args.ops.open("a") as f:
                        f.write(
                            f"## {args.label} {tier.name} {dtype} B={batch}\n\n{by_operation(decoder, encoded, lengths)}\n\n"
                        )
                print(
                    f"{args.label} {tier.name} {dtype} B={batch}: {ms:.3f} ms, "
                    f"{row['host_reads']} reads, {row['queued']} steps queued",
                    flush=True,
                )
                if args.json:
                    with args.json.open("a") as f:
                        f.write(json.dumps(row) + "\n")
        del model
        torch.cuda.empty_cache()
    text = table(rows)
    print(text)
    if args.md:
        args.md.write_text(text + "\n")


if __name__ == "__main__":
    main()
