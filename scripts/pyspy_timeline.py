#!/usr/bin/env python
"""A py-spy speedscope profile of the CLI as a timeline: what the main thread did when, and how busy the readers were.

    py-spy record --idle --threads --nonblocking --rate 250 --format speedscope -o cli.json -- python -m graphscribe.cli ...
    python scripts/pyspy_timeline.py cli.json --md timeline.md

py-spy's speedscope profiles keep every thread's samples in time order. The main thread's samples are labelled by
their deepest graphscribe frame and the frame below it (the library call it was in), consecutive equal labels
merged into one stretch; stretches shorter than --min-ms are folded into the next one's "(+ n short)". Beside
it, per --bucket-ms: how many reader threads were reading (a sample inside `load_audio`).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def _label(stack: list[dict]) -> str:
    ours = [i for i, f in enumerate(stack) if "graphscribe" in f["file"]]
    if not ours:
        return stack[-1]["name"] if stack else "(none)"
    i = ours[-1]
    below = f" > {stack[i + 1]['name']}" if i + 1 < len(stack) else ""
    return f"{stack[i]['name']}{below}"


def timeline(profile: dict, frames: list[dict], min_s: float) -> list[tuple[float, float, str, int]]:
    """(start s, seconds, label, short stretches folded in) of a thread's samples."""
    out: list[list] = []
    t = 0.0
    for sample, weight in zip(profile["samples"], profile["weights"]):
        label = _label([frames[i] for i in sample])
        if out and out[-1][2] == label:
            out[-1][1] += weight
        else:
            out.append([t, weight, label, 0])
        t += weight
    merged: list[list] = []
    short = 0
    for stretch in out:
        if stretch[1] < min_s:
            short += 1
            continue
        if merged and merged[-1][2] == stretch[2]:
            merged[-1][1] = stretch[0] + stretch[1] - merged[-1][0]
            merged[-1][3] += short
        else:
            stretch[3] = short
            merged.append(stretch)
        short = 0
    return [tuple(s) for s in merged]


def totals(profile: dict, frames: list[dict]) -> list[tuple[str, float]]:
    """(label, seconds) of a thread's samples, most first."""
    out: dict[str, float] = {}
    for sample, weight in zip(profile["samples"], profile["weights"]):
        label = _label([frames[i] for i in sample])
        out[label] = out.get(label, 0.0) + weight
    return sorted(out.items(), key=lambda kv: -kv[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path, help="py-spy --format speedscope output (.json or .json.gz)")
    ap.add_argument("--min-ms", type=float, default=8.0)
    ap.add_argument("--bucket-ms", type=float, default=50.0)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    opener = gzip.open if args.profile.suffix == ".gz" else open
    with opener(args.profile, "rt") as f:
        data = json.load(f)
    frames = data["shared"]["frames"]
    names = {i: {frames[j]["name"] for s in p["samples"] for j in s} for i, p in enumerate(data["profiles"])}
    main_index = next(i for i, n in names.items() if "transcribe_command" in n or "main" in n and "entry" in n)
    lines = [
        f"# {args.profile.name}: main thread (profile {main_index}), stretches of at least {args.min_ms:g} ms",
        "",
        "| start s | ms | where (deepest graphscribe frame > the call below it) | short stretches before |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {start:.3f} | {seconds * 1e3:.0f} | {label} | {short or ''} |"
        for start, seconds, label, short in timeline(data["profiles"][main_index], frames, args.min_ms / 1e3)
    ]
    readers = [p for i, p in enumerate(data["profiles"]) if "load_audio" in names[i]]
    if readers:
        bucket = args.bucket_ms / 1e3
        counts: dict[int, float] = {}
        for p in readers:
            t = 0.0
            for sample, weight in zip(p["samples"], p["weights"]):
                if any(frames[j]["name"] == "load_audio" for j in sample):
                    counts[int(t / bucket)] = counts.get(int(t / bucket), 0.0) + weight
                t += weight
        lines += [
            "",
            f"Reader threads ({len(readers)}): threads reading on average, per {args.bucket_ms:g} ms "
            "(from the start of each thread's profile)",
            "",
            "| from s | reading |",
            "| --- | --- |",
        ]
        lines += [f"| {k * bucket:.2f} | {v / bucket:.1f} |" for k, v in sorted(counts.items())]
    lines += ["", "Every thread's samples by label (with --gil: while it held the GIL), most first", ""]
    for p in data["profiles"]:
        lines += [
            f"- {p.get('name', '?')}: {sum(p['weights']):.2f} s: "
            + "; ".join(f"{label} {seconds:.2f}" for label, seconds in totals(p, frames)[:8])
        ]
    text = "\n".join(lines) + "\n"
    if args.md:
        args.md.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
