"""What each stage of one server-shaped batch costs the GPU on its own, and what launching it costs the host.

`engine_timeline.py` shows a 32-row batch costing about 1 ms of GPU time a row against 0.62 at 63 rows, under
load, where the stages of two batches overlap and the host may pace the GPU. This takes the load away: batches of
R clips drawn from the folder (seeded), their samples in pinned memory and gathered as the server gathers them
(`reading.gather`, the server's `pad_to`), each shape run once first (its graphs captured), then per batch:

- `ahead`: a spin kernel first (`torch.cuda._sleep`), so that the host has launched the features and the encoder
  before the GPU reaches them: CUDA events then time the GPU's own work (features with the packing, encoder:
  subsampling and layers), and the host's launch times are its own;
- `paced`: the same without the spin: what the GPU takes when it waits on the host's launches;
- the decode after, its own GPU time (its loop reads from the GPU, so the host is in it either way);

each with the packed features replayed from their graphs (`graphs.FeatureGraphs`) and computed eagerly.

`--profile R`: one more `ahead` batch of R rows under torch.profiler: its kernels' count and summed time (the
spin left out), and the twelve kernels with the most time, beside the stages' elapsed GPU time.

    python scripts/experiments/stage_cost.py -m v3.nemo --dtype bfloat16 --folder /tmp/f4096 --rows 16,32,63
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import random
import statistics
import time

import torch

from graphscribe import load_model
from graphscribe.io.audio import find_audio_files, read_input
from graphscribe.runtime.defaults import pad_samples
from graphscribe.runtime.reading import gather

SPIN_MS = 60.0  # the spin before an `ahead` batch: longer than the host's launches of features and encoder


def spin_cycles(ms: float) -> int:
    """Cycles of `torch.cuda._sleep` that take about `ms` milliseconds on this GPU."""
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)  # the first call loads the kernel
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    torch.cuda.synchronize()
    return int(probe * ms / start.elapsed_time(end))


def run_batch(model, batch, cycles: int) -> dict:
    """Features, encoder and decode of one gathered batch (as `pipeline._start` and `_decode` run them, on one
    stream); GPU and host milliseconds per stage. cycles: a spin first (0: none)."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    samples = batch.lengths.tolist()
    if cycles:
        torch.cuda._sleep(cycles)
    host = [time.perf_counter()]
    events[0].record()
    front = model.front_packing(samples, batch.audio.shape[1], None)
    features, frames = model.batch_features(batch.audio, batch.lengths, front)
    events[1].record()
    host.append(time.perf_counter())
    encoded, lengths = model.encoder_output(features, frames, None, samples, front)
    events[2].record()
    host.append(time.perf_counter())
    model.decode(encoded, lengths)
    events[3].record()
    torch.cuda.synchronize()
    host.append(time.perf_counter())
    gpu = [events[k].elapsed_time(events[k + 1]) for k in range(3)]
    return {
        "features_gpu": gpu[0],
        "encoder_gpu": gpu[1],
        "decode_gpu": gpu[2],
        "features_host": 1000 * (host[1] - host[0]),
        "encoder_host": 1000 * (host[2] - host[1]),
        "decode_host": 1000 * (host[3] - host[2]),
        "frames": int(lengths.max()),
    }


def profile(model, batch, cycles: int) -> dict:
    """The kernels of one `ahead` batch, the spin left out: their count and time, the longest by name."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        result = run_batch(model, batch, cycles)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and "spin_kernel" not in e.name]
    by_name: collections.Counter = collections.Counter()
    for e in kernels:
        by_name[e.name[:80]] += e.time_range.elapsed_us()
    total_us = sum(e.time_range.elapsed_us() for e in kernels)
    return {
        "stages_gpu_ms": {k: round(v, 2) for k, v in result.items() if k.endswith("_gpu")},
        "kernels": len(kernels),
        "kernel_ms": round(total_us / 1000, 2),
        "kernels_under_5us": sum(1 for e in kernels if e.time_range.elapsed_us() < 5),
        "top": [{"kernel": k, "ms": round(v / 1000, 2)} for k, v in by_name.most_common(12)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--folder", required=True)
    parser.add_argument("--rows", default="16,32,63")
    parser.add_argument("--batches", type=int, default=12, help="batches of each size (each shape run once first)")
    parser.add_argument("--profile", type=int, help="one more batch of this many rows under torch.profiler")
    parser.add_argument("--json")
    args = parser.parse_args()
    model = load_model(args.model, dtype=args.dtype, device="cuda")
    audios = [read_input(path, model.sample_rate).pin_memory() for path in find_audio_files(args.folder)]
    pad_to = pad_samples(model.device, model.dtype, model.sample_rate)
    cycles = spin_cycles(SPIN_MS)
    rng = random.Random(0)
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        picks = [rng.sample(range(len(audios)), rows) for _ in range(args.batches)]

        def batch_of(pick):
            return gather([(i, str(i), audios[i]) for i in pick], model.device, model.copy_stream, pad_to)

        for pick in picks:  # each shape's graphs captured, its plans made
            run_batch(model, batch_of(pick), 0)
        for (mode, spin), replay in itertools.product((("ahead", cycles), ("paced", 0)) * 2, ("on", "off")):
            model._feature_graphs.enabled = replay == "on"
            runs = [run_batch(model, batch_of(pick), spin) for pick in picks]
            row = {
                "rows": rows,
                "replay_features": replay,
                "mode": mode,
                "seconds": round(sum(audios[i].numel() for p in picks for i in p) / model.sample_rate / len(picks), 1),
            }
            for key in runs[0]:
                row[key] = round(statistics.median(r[key] for r in runs), 2)
            results.append(row)
            print(json.dumps(row), flush=True)
    report = {"levels": results}
    if args.profile:
        pick = rng.sample(range(len(audios)), args.profile)
        batch = gather([(i, str(i), audios[i]) for i in pick], model.device, model.copy_stream, pad_to)
        run_batch(model, batch, 0)
        report["profile"] = {"rows": args.profile, **profile(model, batch, cycles)}
        print(json.dumps(report["profile"], indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
