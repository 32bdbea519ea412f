"""Summaries of `py-spy record --threads --idle -f raw` files: per thread, the share of samples in each of its top
functions (inclusive) and where it waits.

    python scripts/experiments/spy_summary.py PROFILE.txt [...]
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict


def summary(path: str, top: int = 14) -> str:
    threads: Counter[str] = Counter()
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread, n = frames[0], int(count)
        threads[thread] += n
        names = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].split(":")[0] for f in frames[1:]]
        for name in set(names):
            inclusive[thread][name] += n
        if names:
            leaves[thread][names[-1]] += n
    lines = [f"== {path}"]
    for thread, total in threads.most_common(8):
        lines.append(f"-- {thread}: {total} samples")
        lines += [f"   {100 * n / total:5.1f}%  {name}" for name, n in inclusive[thread].most_common(top)]
        lines += [f"   leaf {100 * n / total:5.1f}%  {name}" for name, n in leaves[thread].most_common(5)]
    return "\n".join(lines)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(summary(p))
