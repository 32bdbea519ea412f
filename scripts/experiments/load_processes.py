"""The load test's clients spread over several processes: is one client process the limit?

    python3 scripts/experiments/load_processes.py --url http://127.0.0.1:8000 --folder DIR --clients 128 \
        --processes 1,2,4

Per process count P: P processes (forked), each with clients/P aiohttp clients and every P-th file, start
together (a barrier, after their bodies are built) and send their files as `transcribe bench --serve` does
(`loadtest._level`). RTFx: all the audio over the time from the first start to the last answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from pathlib import Path

from graphscribe.audio import audio_seconds, find_audio_files
from graphscribe.loadtest import _level, multipart_body


def _one(url: str, paths: list[Path], clients: int, barrier, results) -> None:
    fields = {"model": "graphscribe", "response_format": "json"}
    bodies = [multipart_body(p.name, p.read_bytes(), fields) for p in paths]
    barrier.wait()
    start = time.time()
    row = asyncio.run(_level(url, {}, bodies, clients))
    results.put({**row, "start": start, "end": time.time()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--processes", default="1,2,4")
    args = parser.parse_args()
    paths = find_audio_files(args.folder)
    audio = sum(audio_seconds(p) or 0.0 for p in paths)
    context = multiprocessing.get_context("fork")
    for count in [int(v) for v in args.processes.split(",")]:
        barrier, results = context.Barrier(count), context.Queue()
        procs = [
            context.Process(target=_one, args=(args.url, paths[k::count], args.clients // count, barrier, results))
            for k in range(count)
        ]
        for p in procs:
            p.start()
        rows = [results.get() for _ in procs]
        for p in procs:
            p.join()
        wall = max(r["end"] for r in rows) - min(r["start"] for r in rows)
        print(
            json.dumps(
                {
                    "processes": count,
                    "clients": args.clients,
                    "rtfx": round(audio / wall, 1),
                    "wall_s": round(wall, 3),
                    "failed": sum(r["failed"] for r in rows),
                    "p50_ms": [r["p50_ms"] for r in rows],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
