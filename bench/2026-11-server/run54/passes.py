"""run54's timeline, first pass against second: per batch, the host's launches and the GPU's spans.

python bench/2026-11-server/run54/passes.py bench/2026-11-server/run54/tl-server.json
"""

import json
import statistics
import sys

rows = [r for r in json.load(open(sys.argv[1])) if "dec0" in r and "enc0" in r]
total, seen, ends = sum(r["rows"] for r in rows), 0, []
for r in rows:
    seen += r["rows"]
    ends.append(seen)
first = next(i for i, n in enumerate(ends) if n > total - 8192)  # the two passes: the last 8192 requests
second = next(i for i, n in enumerate(ends) if n > total - 4096)
for name, part in (("first pass", rows[first:second]), ("second pass", rows[second:])):
    cycles = [(b["dec_call"] - a["dec_call"]) * 1e3 for a, b in zip(part, part[1:])]

    def ms(a: str, b: str) -> str:
        v = sorted((r[b] - r[a]) * 1e3 for r in part)
        return f"{statistics.mean(v):.2f} ms (p90 {v[9 * len(v) // 10]:.2f})"

    print(
        f"{name}: {len(part)} batches of {statistics.mean(r['rows'] for r in part):.1f} rows, cycle "
        f"{statistics.mean(cycles):.2f} ms (median {statistics.median(cycles):.2f}), {sum(cycles):.0f} ms in all"
    )
    print(
        f"  host: launching a batch {ms('take1', 'launched')}; GPU: encoder {ms('enc0', 'enc1')}, decode {ms('dec0', 'dec1')}"
    )
