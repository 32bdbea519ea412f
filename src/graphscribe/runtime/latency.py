"""Latency figures shared by the live benches (`bench --streams` in process, `bench --realtime` over the WebSocket):
one percentile and one verdict per stream or session, so that the two sides of the realtime bar are judged alike."""

from __future__ import annotations

import math

BEHIND_SHOWN = 8  # the streams or sessions that fell behind, listed in a level's report


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (a value that was measured; the NeMo scripts' too), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def behind(latencies: list[list[float]], bound: float) -> list[int]:
    """The positions of the latency lists whose p95 is above `bound` (they did not keep up), the furthest first."""
    p95 = [percentile(values, 95) or 0.0 for values in latencies]
    return sorted((i for i, p in enumerate(p95) if p > bound), key=lambda i: -p95[i])


def lateness(values: list[float]) -> dict:
    """One stream's or session's latencies (seconds, not empty): its p95 and slowest (ms), and which one that was."""
    slowest = max(values)
    return {
        "p95_ms": round(1000 * percentile(values, 95), 1),
        "max_ms": round(1000 * slowest, 1),
        "slowest_at": values.index(slowest),
    }
