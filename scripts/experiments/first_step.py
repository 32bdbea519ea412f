"""Why a level's first step of many fresh cache-aware streams is slow (bench/README.md, issue 52): after the
engine's warm-up, N fresh streams stepped twice, each stage waited for (`StreamEngine.profile`), then N others.

    python scripts/experiments/first_step.py CKPT CHUNK N [DTYPE]
"""

from __future__ import annotations

import sys
import time

import torch

import graphscribe
from graphscribe.io.audio import read_input, speech_path
from graphscribe.runtime.cache_aware_streams import engine_for


def main() -> None:
    ckpt, chunk, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bfloat16"
    model = graphscribe.load_model(ckpt, device="cuda", dtype=dtype)
    engine = engine_for(model, chunk)
    engine.warm_up(1024)
    clip = read_input(speech_path("librispeech_2086-149220-0033.wav"), 16000).numpy()
    size = engine.geometry.frame_samples
    for round_ in range(3):
        streams = [engine.open() for _ in range(n)]
        for s in streams:
            s.feed(clip[: 3 * size + 1])
        for step in range(2):
            engine.profile = {}
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.step(streams)
            torch.cuda.synchronize()
            ms = {k: round(v * 1000, 1) for k, v in engine.profile.items()}
            print(
                f"round {round_} step {step}: {n} streams {1000 * (time.perf_counter() - start):.1f} ms {ms}",
                flush=True,
            )
        engine.profile = None
        for s in streams:
            engine.close(s)


if __name__ == "__main__":
    main()
