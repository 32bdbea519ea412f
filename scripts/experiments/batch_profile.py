"""Where a batch's fixed cost goes: batches of one shape run back to back through `transcribe_stream` (as
batch_cost.py runs them) under torch.profiler; prints wall ms a batch, GPU kernel ms a batch (the GPU's busy share),
and the host operations and CUDA runtime calls that take the most time a batch.

    python scripts/experiments/batch_profile.py -m v3.nemo --dtype bfloat16 --shape 1x2 --shape 16x8
"""

from __future__ import annotations

import argparse
import time

import torch
from batch_cost import Repeat  # the sibling script's source of batches
from torch.profiler import ProfilerActivity, profile

from graphscribe import load_model
from graphscribe.io.audio import read_input, speech_path
from graphscribe.runtime.defaults import pad_samples
from graphscribe.runtime.pipeline import WARM_UP_CLIP, transcribe_stream
from graphscribe.runtime.reading import HostBuffers, collate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--shape", action="append", default=[], help="ROWSxSECONDS")
    parser.add_argument("--times", type=int, default=40)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    model = load_model(args.model, dtype=args.dtype)
    rate = model.sample_rate
    clip = read_input(speech_path(WARM_UP_CLIP), rate)
    pad_to = pad_samples(model.device, model.dtype, rate)
    for shape in args.shape or ["1x2", "16x8"]:
        rows, seconds = int(shape.split("x")[0]), float(shape.split("x")[1])
        audio = clip.repeat(int(seconds * rate) // clip.numel() + 1)[: int(seconds * rate)]
        batch = collate([(r, "<p>", audio) for r in range(rows)], HostBuffers(keep=0, pin=True), pad_to, True)
        for _ in transcribe_stream(model, Repeat(batch, 3), word_times=False):
            pass
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in transcribe_stream(model, Repeat(batch, args.times), word_times=False):
            pass
        torch.cuda.synchronize()
        plain = (time.perf_counter() - start) / args.times * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in transcribe_stream(model, Repeat(batch, args.times), word_times=False):
                pass
            torch.cuda.synchronize()
        events = prof.key_averages()
        gpu = sum(e.self_device_time_total for e in events) / 1e3 / args.times
        print(f"\n=== {rows} x {seconds} s: {plain:.2f} ms a batch unprofiled; GPU kernels {gpu:.2f} ms a batch")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=60))
        print(events.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
