#!/usr/bin/env python
"""Where the time goes in a `py-spy record -f raw [--subprocesses] [--idle]` profile: per process and thread, the
samples, and the functions that hold most of them, by self time (the innermost frame) and by inclusive time.

    python scripts/experiments/pyspy_summary.py PYSPY.txt [--top 12] [--match TEXT]

`--match TEXT`: only the stacks with a frame containing TEXT (a function or file), to see inside one path. Raw
lines are folded stacks, outermost first, separated by ';', then a space and a count; with `--subprocesses` the
leading frames name the process (its parents first), and with `--threads` a thread frame follows them.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

_LOCATION = re.compile(r" \(([^)]*?)(?::\d+)?\)$")  # "func (path/file.py:123)" -> func (file.py)


def _short(frame: str) -> str:
    m = _LOCATION.search(frame)
    if not m:
        return frame
    return f"{frame[: m.start()]} ({Path(m.group(1)).name})"


def _frames(stack: str) -> list[str]:
    """A folded stack's frames; a process frame's command line may hold ';' itself (spawn's `-c` code)."""
    frames: list[str] = []
    for part in stack.split(";"):
        if frames and frames[-1].startswith("process ") and not frames[-1].endswith('"'):
            frames[-1] += ";" + part
        else:
            frames.append(part)
    return frames


def summarise(lines: list[str], top: int, match: str | None) -> str:
    by_thread: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    inclusive: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = _frames(stack)
        if match and not any(match in f for f in frames):
            continue
        k = 0  # a child's stack names its parents first: the last process frame is the sampled one
        while k < len(frames) and frames[k].startswith("process "):
            k += 1
        process = frames[k - 1] if k else "process"
        thread = frames[k] if k < len(frames) and frames[k].startswith("thread ") else "thread"
        body = [_short(f) for f in frames[k + (thread != "thread") :]]
        key, n = (process[:100], thread[:60]), int(count)
        totals[key] += n
        if body:
            by_thread[key][body[-1]] += n
            for name in set(body):
                inclusive[key][name] += n
    out = []
    for key, n in totals.most_common():
        out.append(f"{key[0]} / {key[1]}: {n} samples")
        out.append("  self:      " + "; ".join(f"{f} {c / n:.0%}" for f, c in by_thread[key].most_common(top)))
        out.append("  inclusive: " + "; ".join(f"{f} {c / n:.0%}" for f, c in inclusive[key].most_common(top)))
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--match", default=None)
    args = p.parse_args()
    print(summarise(args.profile.read_text().splitlines(), args.top, args.match))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
