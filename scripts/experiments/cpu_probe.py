"""Where the host's CPU goes while a command runs: CPU seconds per process and per thread.

    python3 scripts/experiments/cpu_probe.py --pid SERVER_PID -- transcribe bench --serve URL ...

Reads /proc before and after COMMAND for every process under each --pid (the pid and its descendants, each
thread apart) and reports each one's share of a core over COMMAND's wall time, with COMMAND's own CPU (its
whole tree, from getrusage) beside. A process at ~100% of a core (or a thread at ~100%) is the one that limits.
Linux only.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/*/stat parents)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _threads(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (comm, CPU seconds) for every thread of `pid`."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def _snapshot(roots: list[int]) -> dict[int, dict[int, tuple[str, float]]]:
    return {pid: _threads(pid) for root in roots for pid in _tree(root)}


def _cmdline(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(w.decode(errors="replace") for w in words if w).replace("\n", " ")[:90]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pid", type=int, action="append", default=[], help="a process to watch, with its children")
    parser.add_argument("--threads", type=int, default=4, help="the busiest threads to list per process")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a COMMAND after --")
    names = {pid: _cmdline(pid) for root in args.pid for pid in _tree(root)}
    before, start = _snapshot(args.pid), time.perf_counter()
    code = subprocess.call(command)
    wall, after = time.perf_counter() - start, _snapshot(args.pid)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu_probe: {wall:.2f} s wall; the command's own tree {100 * (usage.ru_utime + usage.ru_stime) / wall:.0f}%")
    for pid, threads in after.items():
        old = before.get(pid, {})
        spent = {tid: cpu - old.get(tid, (comm, 0.0))[1] for tid, (comm, cpu) in threads.items()}
        total = sum(spent.values())
        if total < 0.01 * wall:
            continue
        busiest = sorted(spent.items(), key=lambda item: -item[1])[: args.threads]
        listed = ", ".join(f"{threads[tid][0]}/{tid} {100 * s / wall:.0f}%" for tid, s in busiest)
        print(f"cpu_probe: pid {pid} {100 * total / wall:.0f}% [{listed}] {names.get(pid, _cmdline(pid))}")
    return code


if __name__ == "__main__":
    sys.exit(main())
