"""Python's collector against a real-time level of cache-aware streams (bench/README.md, 2026-11-28).

    python scripts/experiments/realtime_collector.py CKPT FOLDER STREAMS asis freeze off

A 0.08 s real-time level of the stream bench (bfloat16) run as is, then with the heap frozen, then with the collector
off (in that order, one process): kept up, chunk latency, steps and their sizes, full collections and the longest.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import numpy as np

import graphscribe
from graphscribe.bench import streams as bench
from graphscribe.runtime.cache_aware_streams import engine_for


def main() -> None:
    model = graphscribe.load_model(sys.argv[1], device="cuda", dtype="bfloat16")
    audios, _ = bench.read_folder(sorted(Path(sys.argv[2]).glob("*.*")), model.sample_rate)
    n = int(sys.argv[3])
    engine = engine_for(model, 0.08)
    engine.warm_up(n)
    sizes: list[int] = []
    step = engine.step

    def counted(streams=None) -> int:
        sizes.append(step(streams))
        return sizes[-1]

    engine.step = counted
    warm = [a[: 2 * engine.geometry.frame_samples] for a in audios[:n]]
    bench.max_pace_level(engine, warm * max(1, n // len(warm)), n)
    pauses: list[float] = []
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] == 2:
            pauses.append(time.perf_counter() - started[0])

    gc.callbacks.append(timed)
    for mode in sys.argv[4:]:
        sizes.clear()
        pauses.clear()
        if mode == "freeze":
            gc.collect()
            gc.freeze()
        elif mode == "off":
            gc.disable()
        row = bench.realtime_level(engine, audios, n)
        print(
            mode,
            row["kept_up"],
            row["chunk_latency_ms"],
            f"busy {row['busy_share']}, {len(sizes)} steps, streams a step p10/50/90 {np.percentile(sizes, [10, 50, 90])}",
            f"full collections {len(pauses)}, longest {max(pauses, default=0) * 1000:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
