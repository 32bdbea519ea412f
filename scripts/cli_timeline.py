#!/usr/bin/env python
"""When the CLI's lines reach stderr, and when its process ends: the cost of start-up and of exiting.

    python scripts/cli_timeline.py [--json F] -- python3 -m graphscribe.cli folder/ --model v3.nemo ...

Runs the command once, stdout discarded, and timestamps every stderr line as it arrives (seconds from the
start); prints the last lines and the seconds from the last line (the CLI's summary) to the process's end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None, help="append the timeline as one JSON line here")
    ap.add_argument("--label", default="")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = [(time.perf_counter() - start, line.rstrip()) for line in process.stderr]
    process.wait()
    end = time.perf_counter() - start
    last = lines[-1][0] if lines else 0.0
    for at, line in lines[-2:]:
        print(f"{args.label} {at:7.2f} s  {line[:160]}")
    print(f"{args.label} {end:7.2f} s  exit {process.returncode}: {end - last:.2f} s after the last line")
    if args.json:
        with open(args.json, "a") as f:
            f.write(
                json.dumps(
                    dict(
                        label=args.label,
                        command=command,
                        lines=lines,
                        exit_s=end,
                        after_last_line_s=end - last,
                        returncode=process.returncode,
                    )
                )
                + "\n"
            )


if __name__ == "__main__":
    main()
