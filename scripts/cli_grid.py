#!/usr/bin/env python
"""The `transcribe` command over one folder in several variants (flags, environment), rounds interleaved.

    python scripts/cli_grid.py --folder DIR --model v3.nemo --rounds 2 --out OUT/grid \
        --variant "default: --dtype float32" \
        --variant "b32: --dtype float32 --batch 32" \
        --variant "b32-omp4: --dtype float32 --batch 32 @OMP_NUM_THREADS=4"

A variant is `NAME: ARGS [@VAR=VALUE ...]`; `{out}` in ARGS is a fresh output folder of that run. Each run is a
whole process (`python -m graphscribe.cli DIR --model M ARGS`, stdout to /dev/null), timed from start to exit;
the summary line gives the transcription's own seconds (after loading) and its RTFx. One untimed run of the first
variant goes first (Triton's disk cache, the files' pages). Rounds alternate the variants, so a machine's drift
touches them alike. Writes OUT/grid.json (every run) and OUT/grid.md (medians), printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUMMARY = re.compile(r"transcribed (\d+) of (\d+) files(?: \(([^)]*)\))?: ([\d.]+) s of audio in ([\d.]+) s")
DEVICE_LINE = re.compile(r"  (cpu|cuda(:\d+)?): \d+ files")
LOADED = re.compile(r"loaded in ([\d.]+) s(?: \(([\d.]+) s of it warming up\))?")


def parse_variant(text: str) -> tuple[str, list[str], dict[str, str]]:
    name, _, rest = text.partition(":")
    args, env = [], {}
    for word in shlex.split(rest):
        if word.startswith("@") and "=" in word:
            key, _, value = word[1:].partition("=")
            env[key] = value
        else:
            args.append(word)
    return name.strip(), args, env


def run(folder: str, model: str, args: list[str], env: dict[str, str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="grid-") as out:
        command = [sys.executable, "-m", "graphscribe.cli", folder, "--model", model]
        command += [a.replace("{out}", out) for a in args]
        start = time.perf_counter()
        done = subprocess.run(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            env={**os.environ, **env},
        )
        wall = time.perf_counter() - start
    row = {"exit": done.returncode, "wall_s": round(wall, 3)}
    summary, loaded = SUMMARY.search(done.stderr), LOADED.search(done.stderr)
    if summary:
        audio, seconds = float(summary.group(4)), float(summary.group(5))
        row.update(files=int(summary.group(1)), audio_s=audio, transcribe_s=seconds, rtfx=round(audio / seconds, 1))
    if loaded:
        row["load_s"] = float(loaded.group(1))
        if loaded.group(2):
            row["warm_up_s"] = float(loaded.group(2))  # part of load_s
    per_device = [line.strip() for line in done.stderr.splitlines() if DEVICE_LINE.match(line)]
    if per_device:  # --devices: the lines under the summary, one a device
        row["devices"] = per_device
    if done.returncode != 0 or not summary:
        row["stderr_tail"] = done.stderr[-2000:]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--variant", action="append", required=True, metavar="'NAME: ARGS [@VAR=VALUE]'")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_warmup:
        name, flags, env = variants[0]
        print(f"warm-up ({name}): {run(args.folder, args.model, flags, env, args.timeout)}", flush=True)
    runs: list[dict] = []
    for r in range(args.rounds):
        for name, flags, env in variants:
            row = {"variant": name, "round": r, "args": flags, "env": env}
            row.update(run(args.folder, args.model, flags, env, args.timeout))
            runs.append(row)
            print(json.dumps(row), flush=True)
            (args.out / "grid.json").write_text(json.dumps({"folder": args.folder, "runs": runs}, indent=1) + "\n")
    lines = [
        f"folder {args.folder}, model {args.model}, {args.rounds} rounds (medians)",
        "",
        "| variant | args | env | RTFx (transcription) | transcription s | whole process s | load s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, flags, env in variants:
        mine = [row for row in runs if row["variant"] == name and "rtfx" in row]
        if not mine:
            lines.append(f"| {name} | `{' '.join(flags)}` | {env or ''} | failed | | | |")
            continue

        def med(key: str) -> float:
            return statistics.median(row[key] for row in mine if key in row)

        spread = ", ".join(str(row["rtfx"]) for row in mine)
        lines.append(
            f"| {name} | `{' '.join(flags)}` | {' '.join(f'{k}={v}' for k, v in env.items())} | "
            f"{med('rtfx'):.0f} ({spread}) | {med('transcribe_s'):.2f} | {med('wall_s'):.2f} | {med('load_s'):.2f} |"
        )
    table = "\n".join(lines) + "\n"
    (args.out / "grid.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
