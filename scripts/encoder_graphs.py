#!/usr/bin/env python
"""The encoder with its layers replayed from one captured layer (`graphs.LayerGraphs`) against the eager loop.

    python scripts/encoder_graphs.py --model v3.nemo --json $OUT/encoder-graphs.json

For each dtype, batch size and length (real speech, joined and cut; the batch's rows a few seconds apart, as a
folder's longest-first batches are): the encoder alone (features made beforehand), eager and with layer graphs,
alternating, --reps times each. Reported per forward, medians: wall seconds (synchronised), host seconds (until
the call returns, the GPU still working), GPU seconds (CUDA events); the graph mode's first call on the shape
(capture included) apart; and whether the two outputs are bit-equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import graphscribe
from graphscribe.bench import speech_path


def batch_of(model, speech: torch.Tensor, batch: int, seconds: float) -> list[torch.Tensor]:
    """`batch` rows of real speech, the longest `seconds`, each next one 3% shorter."""
    rate = model.sample_rate
    reps = int(seconds * rate) // speech.numel() + 1
    long = torch.cat([speech] * reps)
    return [long[: int(seconds * rate * 0.97**r)] for r in range(batch)]


def measure(run) -> tuple[float, float, float]:
    """One call of `run`: wall seconds (synchronised), host seconds (until it returns), GPU seconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    run()
    end.record()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return time.perf_counter() - t0, host, start.elapsed_time(end) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--seconds", default="4,10,20")
    ap.add_argument("--long", default="77", help="seconds of one clip alone (B=1), besides the grid")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        model = graphscribe.load_model(args.model, device="cuda", dtype=dtype, graphs=True)
        speech = torch.cat(
            [model.read(speech_path(n)) for n in ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac")]
        )
        shapes = [(b, float(s)) for b in map(int, args.batches.split(",")) for s in args.seconds.split(",")]
        shapes += [(1, float(s)) for s in args.long.split(",") if s]
        for i, (batch, seconds) in enumerate([(2, 3.0)] + shapes):  # the first loads libraries: not reported
            features, frames = model.features(batch_of(model, speech, batch, seconds))
            modes = {
                "eager": lambda: model.module.encoder(features.to(model.dtype), frames),  # the eager loop
                "graphs": lambda: model.encoder_output(features, frames),
            }  # graphs=True: layer graphs
            with torch.inference_mode():
                eager_out, _ = modes["eager"]()
            first = measure(modes["graphs"])  # captures this shape
            graphed_out, _ = modes["graphs"]()
            equal, encoder_frames = torch.equal(eager_out, graphed_out), graphed_out.shape[1]
            del eager_out, graphed_out
            times: dict[str, list] = {"eager": [], "graphs": []}
            with torch.inference_mode():
                for _ in range(args.reps):  # alternating
                    for name, run in modes.items():
                        times[name].append(measure(run))
            if i == 0:
                continue
            row = {
                "dtype": dtype,
                "batch": batch,
                "seconds": seconds,
                "encoder_frames": encoder_frames,
                "bit_equal": equal,
                "graphs_first_call_s": first[0],
                "capture_s_total": model._layer_graphs.capture_seconds,
            }
            for name, got in times.items():
                wall, host, gpu = (statistics.median(t[field] for t in got) for field in range(3))
                row[name] = {
                    "wall_s": wall,
                    "host_s": host,
                    "gpu_s": gpu,
                    "wall_spread_s": [min(t[0] for t in got), max(t[0] for t in got)],
                }
            rows.append(row)
            print(
                f"{dtype:9s} B={batch:3d} {seconds:5.1f} s  eager {row['eager']['wall_s'] * 1e3:7.2f} ms "
                f"(host {row['eager']['host_s'] * 1e3:6.2f}, GPU {row['eager']['gpu_s'] * 1e3:6.2f})  "
                f"graphs {row['graphs']['wall_s'] * 1e3:7.2f} ms (host {row['graphs']['host_s'] * 1e3:6.2f}, "
                f"GPU {row['graphs']['gpu_s'] * 1e3:6.2f})  first {first[0] * 1e3:7.1f} ms  bit-equal {equal}",
                flush=True,
            )
        del model
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0 if all(r["bit_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
