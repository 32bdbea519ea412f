"""Where a cache-aware engine's step goes at many streams, in process (bench/README.md, 2026-11-28).

    python scripts/experiments/cache_aware_steps.py CKPT DTYPE:STREAMS:ROWS:CHUNK[:p] ...

Each spec: STREAMS streams of a speech clip stepped together in batches of ROWS at CHUNK seconds: the time a step
takes, then each stage waited for (`StreamEngine.profile`); `:p` adds the torch profiler's tables.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

import graphscribe
from graphscribe.io.audio import read_input, speech_path
from graphscribe.runtime.cache_aware_streams import engine_for


def bench(ckpt: str, clip: np.ndarray, dtype: str, n: int, rows: int, chunk: float, prof: bool) -> None:
    model = graphscribe.load_model(ckpt, device="cuda", dtype=dtype)
    engine = engine_for(model, chunk, max_rows=rows)
    engine.warm_up(n)
    streams = [engine.open() for _ in range(n)]
    size = engine.geometry.frame_samples
    for s in streams:
        s.feed(clip[: 2 * size])
    position = 2 * size

    def run(steps: int) -> float:
        nonlocal position
        start = time.perf_counter()
        for _ in range(steps):
            for s in streams:
                s.feed(clip[position : position + size])
            position += size
            engine.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / steps * 1000

    run(3)
    per_step = run(10)
    engine.profile = {}
    run(10)
    stages = {k: round(v * 100, 1) for k, v in engine.profile.items()}
    engine.profile = None
    print(f"{dtype} {n} streams, rows {rows}, chunk {chunk}: step {per_step:.1f} ms; stages (ms) {stages}", flush=True)
    if prof:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
            run(3)
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70), flush=True)


def main() -> None:
    clip = np.tile(read_input(speech_path("librispeech_2086-149220-0033.wav"), 16000).numpy(), 4)
    for spec in sys.argv[2:]:
        dtype, n, rows, chunk, *rest = spec.split(":")
        bench(sys.argv[1], clip, dtype, int(n), int(rows), float(chunk), bool(rest))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
