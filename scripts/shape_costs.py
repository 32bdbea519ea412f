#!/usr/bin/env python
"""What a batch of a new shape costs the host: the encoder on lengths it has not seen, then again on the same.

    python scripts/shape_costs.py --model v3.nemo --dtype bfloat16 --batch 128 --json $OUT/shapes.json

A folder gives the encoder a new (B, T) almost every batch; cuDNN (convolutions, and attention where
PyTorch picks its backend) builds a plan per shape. For each of --lengths (seconds), on random features:
the first call's seconds (new shape) and the median of --reps repeats (plans cached), each synchronised, for
every --sdpa choice of backends for scaled_dot_product_attention ("default", or a comma list of
torch.nn.attention.SDPBackend names). A fresh process per choice would be cleaner; lengths differ per
choice instead (each choice adds --step seconds), so no choice finds another's plans.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import graphscribe


def timed(fn, sync) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lengths", default="29.3,27.1,25.7,24.2", help="seconds of audio per row, one shape each")
    ap.add_argument("--step", type=float, default=0.37, help="seconds added to the lengths per --sdpa choice")
    ap.add_argument("--sdpa", default="default;EFFICIENT_ATTENTION;CUDNN_ATTENTION;EFFICIENT_ATTENTION,MATH")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = graphscribe.load_model(args.model, device=args.device, dtype=args.dtype)
    cuda = model.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(model.device)) if cuda else (lambda: None)
    hop, n_mels = model.cfg.features.hop_length, model.cfg.features.n_mels
    rows = []
    warm = torch.randn(args.batch, n_mels, 200, device=model.device)
    model.encoder_output(warm, torch.full((args.batch,), 200, device=model.device))  # libraries, not plans
    sync()
    for c, choice in enumerate(args.sdpa.split(";")):
        backends = None if choice == "default" else [getattr(SDPBackend, name) for name in choice.split(",")]
        for seconds in (float(s) + c * args.step for s in args.lengths.split(",")):
            frames = int(seconds * model.sample_rate / hop)
            features = torch.randn(args.batch, n_mels, frames, device=model.device)
            lengths = torch.full((args.batch,), frames, device=model.device)
            lengths[1::2] = frames * 3 // 4  # padded rows, as in a folder batch
            context = sdpa_kernel(backends) if backends else contextlib.nullcontext()
            with context:
                run = lambda: model.encoder_output(features, lengths)  # noqa: E731
                first = timed(run, sync)
                again = [timed(run, sync) for _ in range(args.reps)]
            row = dict(
                sdpa=choice,
                seconds=seconds,
                frames=frames,
                first_s=first,
                again_s=statistics.median(again),
                new_shape_cost_s=first - statistics.median(again),
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                dict(
                    model=args.model,
                    dtype=args.dtype,
                    batch=args.batch,
                    rows=rows,
                    device=torch.cuda.get_device_name() if cuda else "cpu",
                    torch=torch.__version__,
                ),
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
