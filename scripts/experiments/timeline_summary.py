#!/usr/bin/env python
"""Where a batch cycle goes, from the timelines `bench/2026-11-server/timeline_patch.py` writes (one JSON row a batch:
host marks and CUDA events on the host's clock). For a server's timeline, only its last 4096 requests (the load
test's second pass) are summarised.

    python scripts/experiments/timeline_summary.py bench/2026-11-server/run42/tl-server.json [more.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys


def summary(path: str) -> list[str]:
    rows = [r for r in json.load(open(path)) if "dec0" in r and "enc0" in r]
    if "server" in path:  # the second pass: the last 4096 requests
        total, seen = sum(r["rows"] for r in rows), 0
        for i, r in enumerate(rows):
            seen += r["rows"]
            if seen >= total - 4096:
                rows = rows[i + 1 :]
                break

    def ms(a: str, b: str) -> str:
        v = sorted((r[b] - r[a]) * 1e3 for r in rows)
        return f"{statistics.mean(v):.2f} ms (p10 {v[len(v) // 10]:.2f}, p90 {v[9 * len(v) // 10]:.2f})"

    cycles = [(b["dec_call"] - a["dec_call"]) * 1e3 for a, b in zip(rows, rows[1:])]
    return [
        f"{path}: {len(rows)} batches, {sum(r['rows'] for r in rows)} rows "
        f"({statistics.mean(r['rows'] for r in rows):.1f} a batch)",
        f"  cycle (one decode call to the next): {statistics.mean(cycles):.2f} ms, median {statistics.median(cycles):.2f}",
        f"  host: the next batch taken and launched inside the decode {ms('hook0', 'hook1')}",
        f"  host: decode call to return {ms('dec_call', 'dec_ret')}; return to answered {ms('dec_ret', 'answered')}",
        f"  GPU: decode call to the decode's start (its encoder finishing) {ms('dec_call', 'dec0')}",
        f"  GPU: the decode, first kernel to last {ms('dec0', 'dec1')}",
        f"  GPU: the decode left after the host's launches {ms('hook1', 'dec1')}",
        f"  GPU: the encoder done after its launches {ms('launched', 'enc1')}",
    ]


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print("\n".join(summary(path)))
