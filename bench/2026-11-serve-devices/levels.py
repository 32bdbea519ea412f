"""Each server's RTFx by level and its access log's stages a level (p50 / p95 ms), from `$OUT/serve-NAME.json` and
`$OUT/serve-NAME.log` (routed.sh and switch.sh):  python3 bench/2026-11-serve-devices/levels.py OUT NAME..."""

import json
import re
import sys
from pathlib import Path

STAGE = re.compile(
    r"POST \S+ 200 audio \S+ s, upload (\d+) ms, decode (\d+) ms, queue (\d+) ms, batch (\d+) ms, total (\d+) ms"
)
LEVEL = 4096  # requests a level: the 4096 files once


def spread(values) -> str:
    values = sorted(values)
    return f"{values[len(values) // 2]}/{values[int(len(values) * 0.95)]}"


out = Path(sys.argv[1])
for name in sys.argv[2:]:
    report = out / f"serve-{name}.json"
    rows = json.loads(report.read_text())["rows"] if report.exists() else []
    print(name, [(r["concurrency"], r["rtfx"], r["failed"]) for r in rows])
    log = out / f"serve-{name}.log"
    lines = log.read_text().splitlines() if log.exists() else []
    found = [tuple(map(int, m.groups())) for m in map(STAGE.search, lines) if m]
    for k, row in enumerate(rows):  # the levels' requests, in the log's order
        part = found[LEVEL * k : LEVEL * (k + 1)]
        if part:
            cols = list(zip(*part))
            way = [t - u - d - q - b for u, d, q, b, t in part]
            print(
                f"  {row['concurrency']} clients: upload {spread(cols[0])}, decode {spread(cols[1])}, "
                f"queue {spread(cols[2])}, batch {spread(cols[3])}, way {spread(way)}, total {spread(cols[4])}"
            )
