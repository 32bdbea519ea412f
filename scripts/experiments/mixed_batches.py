"""What a server's batch costs: requests of mixed lengths (drawn from a folder's), packed or not, against batches of
like lengths (the CLI's, cut from the sorted folder), run back to back through `transcribe_stream`.

Per (kind, rows, packing): ms a batch in steady state (after a pass that captures the shapes' graphs), the GPU's ms
a batch per stage (features, encoder, decode: CUDA events), audio seconds a batch and the RTFx that makes. With
--profile, each pass once more under torch.profiler, graphs off (their kernels show one by one): the kernels with
the most GPU time a batch.

    python scripts/experiments/mixed_batches.py -m v3.nemo --folder /tmp/f4096 --rows 16,32,64 --batches 24
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import soundfile as sf
import torch

import graphscribe.model.packing
from graphscribe import load_model
from graphscribe.io.audio import find_audio_files, read_input, speech_path
from graphscribe.runtime.clock import StageClock
from graphscribe.runtime.defaults import pad_samples
from graphscribe.runtime.pipeline import WARM_UP_CLIP, transcribe_stream
from graphscribe.runtime.reading import HostBuffers, collate


class Batches:
    """transcribe_stream's source: the given batches in order."""

    def __init__(self, batches):
        self.batches, self.items = batches, {}

    def __iter__(self):
        yield from self.batches

    def recycle(self, batch) -> None:
        pass

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--folder", required=True, help="lengths are drawn from its files'")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", default="16,32,64")
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--json")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    model = load_model(args.model, dtype=args.dtype)
    rate = model.sample_rate
    clip = read_input(speech_path(WARM_UP_CLIP), rate)
    lengths = np.array(sorted(sf.info(str(p)).duration for p in find_audio_files(args.folder)))
    rng = np.random.default_rng(0)
    cuda = model.device.type == "cuda"
    pad_to = pad_samples(model.device, model.dtype, rate)
    shipped = graphscribe.model.packing.Packing.MAX_SHARE
    out = []

    def audio(seconds: float) -> torch.Tensor:
        return clip.repeat(int(seconds * rate) // clip.numel() + 1)[: int(seconds * rate)]

    for rows in (int(r) for r in args.rows.split(",")):
        mixed = [sorted(rng.choice(lengths, rows), reverse=True) for _ in range(args.batches)]
        starts = rng.integers(0, len(lengths) - rows, args.batches)
        like = [sorted(lengths[s : s + rows], reverse=True) for s in starts]
        for kind, plan in (("mixed", mixed), ("like", like)):
            batches = [
                collate([(r, "<mixed>", audio(s)) for r, s in enumerate(b)], HostBuffers(0, cuda), pad_to, cuda)
                for b in plan
            ]
            seconds = sum(map(sum, plan))
            for packing in ("packed", "unpacked"):
                graphscribe.model.packing.Packing.MAX_SHARE = shipped if packing == "packed" else 0.0
                for _ in transcribe_stream(model, Batches(batches), word_times=False):  # captures the shapes' graphs
                    pass
                clock = StageClock(model.device)
                torch.cuda.synchronize() if cuda else None
                start = time.perf_counter()
                for _ in transcribe_stream(model, Batches(batches), clock=clock, word_times=False):
                    pass
                torch.cuda.synchronize() if cuda else None
                wall = time.perf_counter() - start
                stages = clock.seconds()
                row = {
                    "kind": kind,
                    "rows": rows,
                    "packing": packing,
                    "ms_a_batch": round(wall / len(batches) * 1e3, 2),
                    **{f"{k}_ms": round(v / len(batches) * 1e3, 2) for k, v in stages.items()},
                    "audio_s_a_batch": round(seconds / len(batches), 1),
                    "rtfx": round(seconds / wall, 1),
                }
                out.append(row)
                print(json.dumps(row), flush=True)
                if args.profile:
                    profile_pass(model, batches, f"{kind} {rows} rows {packing}")
    graphscribe.model.packing.Packing.MAX_SHARE = shipped
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def profile_pass(model, batches, title: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    model.use_graphs(False)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in transcribe_stream(model, Batches(batches), word_times=False):
            pass
        torch.cuda.synchronize()
    model.use_graphs(True)
    events = prof.key_averages()
    total = sum(e.self_device_time_total for e in events) / 1e3 / len(batches)
    print(f"=== {title}: GPU kernels {total:.2f} ms a batch (graphs off)")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:18]:
        print(f"  {e.self_device_time_total / 1e3 / len(batches):7.3f} ms  {e.count // len(batches):5d}x  {e.key[:90]}")


if __name__ == "__main__":
    main()
