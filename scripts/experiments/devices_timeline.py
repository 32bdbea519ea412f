"""When each `--devices` worker is ready and done, round by round, as the CLI runs them (a fresh pool each time).

    python3 scripts/experiments/devices_timeline.py --folder DIR --model v3.nemo --dtype bfloat16 --rounds 3

Per round: the transcription's seconds and RTFx as the CLI counts them (from the first worker ready to the last
result), then per device its start-up phases and its last batch in seconds from the run's start
(`DeviceStats.phases`: started, torch imported, CUDA started, job, loaded, warmed; `done_at`), its busy seconds
and files. A worker ready ("warmed") well after the first (or done well before the last) is a device idle on the
clock.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from graphscribe.devices import parse_devices, transcribe_on_devices
from graphscribe.io.audio import find_audio_files
from graphscribe.io.config import RunOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--devices", default="all")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    files = find_audio_files(args.folder)
    devices = parse_devices(args.devices)
    for n in range(args.rounds):
        start = time.perf_counter()
        run = transcribe_on_devices(files, devices, args.model, RunOptions(dtype=args.dtype))
        run.wait_loaded()
        audio = sum(t.audio_seconds for _, t in run)
        end = time.perf_counter()
        seconds = end - run.transcribing_since
        row = {
            "round": n,
            "whole_s": round(end - start, 3),
            "transcribe_s": round(seconds, 3),
            "rtfx": round(audio / seconds, 1),
            "devices": [s.to_json() for s in run.device_stats],
        }
        print(json.dumps(row), flush=True)
        run.close()  # the workers gone before the next round's start


if __name__ == "__main__":
    main()
