#!/usr/bin/env python
"""Greedy decoding with and without phrases boosted, the same encoder output, decode time alone (the design of
`model/chains.py`: a token model's lookup along each state's back-off chain).

    python scripts/experiments/boost_decode.py MODEL.nemo DIR PHRASES.txt [--device cuda] [--batch 4] [--reps 5]

Encodes the first --batch files of DIR once, then times `model.decode` on that output (median of --reps, after one
untimed decode) plain and with the phrases file's phrases (`hotwords`); prints the tree's depth (`order`), its
states and the longest back-off chain, and the ratio. On the CPU it shows where a boosted step's time goes; the bar
of issue 50 is the GPU's, end to end (`bench/2026-11-boost-confidence/run.sh`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import graphscribe as gs
from graphscribe.io.hotwords import read_hotwords_file
from graphscribe.model.boosting import boosting_tables


def timed(model, encoded, lengths, reps: int, call=None) -> float:
    """The median seconds of `call` (the decode of `encoded` by default) over `reps` runs, after one warm run."""
    call = call or (lambda: model.decode(encoded, lengths))
    call()
    seconds = []
    for _ in range(reps):
        if encoded.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if encoded.device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("folder", type=Path)
    ap.add_argument("phrases")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    phrases = tuple(f"{p}:{s}" if s else p for p, s in read_hotwords_file(args.phrases))
    files = sorted(p for p in args.folder.iterdir() if p.is_file())[: args.batch]
    results = {}
    for name, hotwords in (("plain", ()), ("boosted", phrases)):
        model = gs.load_model(args.model, device=args.device, hotwords=hotwords)
        encoded, lengths = model.encode([model.read(f) for f in files])
        results[name] = timed(model, encoded, lengths, args.reps)
        if hotwords:
            tables = boosting_tables(read_hotwords_file(args.phrases), model.tokenizer, model.tokenizer.vocab_size)
            print(f"tree: {len(phrases)} phrases, order {tables.order}, {len(tables.backoff_to)} states")
    print(f"decode of {len(files)} files: plain {results['plain']:.3f} s, boosted {results['boosted']:.3f} s, "
          f"ratio {results['boosted'] / results['plain']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
