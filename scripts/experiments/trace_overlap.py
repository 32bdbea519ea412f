"""How a profiled pass's GPU time splits over its streams: from a Chrome trace (`engine_load.py --trace`), each
stream's kernel time (the union of its kernels' intervals), the time two or more streams ran kernels at once, and
the time no kernel ran, between the first kernel and the last.

    python scripts/experiments/trace_overlap.py trace.json [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--json")
    args = parser.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    by_stream: dict[str, list[tuple[float, float]]] = defaultdict(list)
    names: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        stream = str(e.get("args", {}).get("stream", e.get("tid")))
        by_stream[stream].append((e["ts"], e["ts"] + e["dur"]))
        names[stream][e["name"][:60]] += e["dur"]
    spans = {s: union(v) for s, v in by_stream.items()}
    every = union([i for v in spans.values() for i in v])
    if not every:
        raise SystemExit(
            f"error: {args.trace}: no GPU kernels in the trace (a CUDA pass's, from engine_load.py --trace)"
        )
    first, last = every[0][0], every[-1][1]
    # time with at least one kernel, and the sum of each stream's: their difference is the overlap (two streams)
    busy, summed = length(every), sum(length(v) for v in spans.values())
    report = {
        "window_ms": round((last - first) / 1000, 1),
        "busy_ms": round(busy / 1000, 1),
        "idle_ms": round((last - first - busy) / 1000, 1),
        "overlap_ms": round((summed - busy) / 1000, 1),
        "streams": {
            s: {
                "kernel_ms": round(length(v) / 1000, 1),
                "kernels": len(by_stream[s]),
                "top": sorted(((n, round(t / 1000, 1)) for n, t in names[s].items()), key=lambda x: -x[1])[:5],
            }
            for s, v in sorted(spans.items(), key=lambda kv: -length(kv[1]))
        },
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
