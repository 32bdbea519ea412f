#!/usr/bin/env python
"""Where the GPU waits in the folder pipeline: a torch.profiler trace of one warm pass, reduced to its idle gaps.

    python scripts/experiments/trace_pipeline.py --model v3.nemo --folder /tmp/folder --dtype bfloat16 --batch 128 --out $OUT/trace

One untimed pass first (kernels, graphs, the allocator's pool), then one pass under the profiler; --cold: the
first pass, as the one-pass CLI runs it (Triton's kernels loaded, graphs captured, plans made as it goes). Writes
gaps.json: the GPU's busy time (the union of its kernels and copies), and every idle stretch over
--min-gap-ms with the host-side ops (PyTorch ops and Python functions of the main thread) running while
the GPU waited, longest first. The host names say what the GPU waited for.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import graphscribe
from graphscribe.io.audio import find_audio_files


def gaps(events: list[dict], min_gap_us: float) -> dict:
    device = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        key=lambda e: e["ts"],
    )
    host = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function", "user_annotation")
    ]
    busy, idle, end = 0.0, [], None
    first = device[0]["ts"] if device else 0.0
    for e in device:
        start, stop = e["ts"], e["ts"] + e["dur"]
        if end is None or start > end:
            if end is not None and start - end >= min_gap_us:
                idle.append((end, start))
            busy += e["dur"]
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    report = []
    for a, b in sorted(idle, key=lambda g: g[0] - g[1])[:40]:
        names = Counter()
        for e in host:
            overlap = min(b, e["ts"] + e["dur"]) - max(a, e["ts"])
            if overlap > 0.3 * (b - a) or overlap > 500:
                names[e["name"][:120]] += overlap
        report.append(
            dict(
                start_ms=(a - first) / 1e3,
                gap_ms=(b - a) / 1e3,
                host=[(n, round(us / 1e3, 2)) for n, us in names.most_common(12)],
            )
        )
    span = (end - first) if device else 0.0
    return dict(
        span_ms=span / 1e3,
        busy_ms=busy / 1e3,
        idle_ms=(span - busy) / 1e3,
        idle_over_min_ms=sum(b - a for a, b in idle) / 1e3,
        gaps=report,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--folder", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--min-gap-ms", type=float, default=1.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--cold", action="store_true", help="trace the process's first pass (what the CLI runs), no warm one"
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = graphscribe.load_model(args.model, device="cuda", dtype=args.dtype)
    files = find_audio_files(args.folder)
    if not args.cold:
        model.transcribe(files, batch_size=args.batch)  # warm
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=False) as prof:
        start = time.perf_counter()
        model.transcribe(files, batch_size=args.batch)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    trace = args.out / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    report = dict(
        wall_s=wall,
        files=len(files),
        dtype=args.dtype,
        batch=args.batch,
        cold=args.cold,
        **gaps(events, args.min_gap_ms * 1e3),
    )
    (args.out / "gaps.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "gaps"}))
    for g in report["gaps"][:15]:
        print(f"gap {g['gap_ms']:.1f} ms at {g['start_ms']:.0f} ms: {g['host'][:6]}")
    (args.out / "key_averages.txt").write_text(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))
    trace.unlink()  # large; the gaps and averages are what we keep
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
