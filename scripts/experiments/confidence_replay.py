#!/usr/bin/env python
"""Where word confidence's replay goes (`confidence.replay_batch`, issue 50's 5% bar): one batch's decode and its
confidences' replay timed on the same encoder output, then the replay under the torch profiler.

    python scripts/experiments/confidence_replay.py MODEL.nemo DIR [--device cuda] [--dtype bfloat16] [--batch 128]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from boost_decode import timed  # beside this file: a call's median time, warmed up

import graphscribe as gs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("folder", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    files = sorted(p for p in args.folder.iterdir() if p.is_file())[: args.batch]
    model = gs.load_model(args.model, device=args.device, dtype=args.dtype, confidence=True)
    encoded, lengths = model.encode([model.read(f) for f in files])
    hyps = model.decode(encoded, lengths)
    cuda = encoded.device.type == "cuda"
    decode_ms = 1000 * timed(model, encoded, lengths, 5)
    replay_ms = 1000 * timed(model, encoded, lengths, 5, lambda: model.add_confidences(encoded, hyps))
    tokens = sum(len(h.token_ids) for h in hyps)
    longest = max(len(h.token_ids) for h in hyps)
    print(
        f"{len(files)} files, {tokens} tokens (longest row {longest}): decode {decode_ms:.1f} ms, "
        f"replay {replay_ms:.1f} ms",
        flush=True,
    )
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as p:
        for _ in range(3):
            model.add_confidences(encoded, hyps)
        if cuda:
            torch.cuda.synchronize()
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    print(p.key_averages().table(sort_by=sort, row_limit=20, max_name_column_width=60), flush=True)
    print(p.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60), flush=True)


if __name__ == "__main__":
    main()
