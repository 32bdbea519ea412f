#!/usr/bin/env python
"""What the folder job's first pass pays that a second pass in the same process does not, by stage and by batch.

    python scripts/experiments/first_uses.py --model v3.nemo --folder /tmp/folder --dtype float32 --batch 32 --json F

Loads the model (priming CUDA's libraries meanwhile, as the CLI does), then transcribes the folder `--passes`
times in one process as the CLI does (reading ahead, longest first, txt: no word times), timing on the host every
call of the main thread's stages for every batch:
features, encoder (both only queue GPU work unless something blocks: a plan, a capture, a kernel load),
decode (which waits for the GPU at its host reads) and make_transcript (text). Also per pass: the wall time, the
pipeline's StageClock (GPU seconds of features, encoder, decode; the main thread's wait for reads), and the
seconds the decoder spent capturing graphs and loading its fused step, and the encoder's captured layers.
Run it after one CLI run on the machine (Triton's kernel cache filled): the first pass is then what a user's
one-pass CLI pays, the second what the same work costs once everything is made. Prints the stages' totals per
pass and the batches whose first pass cost most over their second. cProfile (`--cprofile K`) in Python 3.12
also samples the reader threads while it is on: read its main-thread functions (graphscribe's stages, torch, triton).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections import defaultdict
from pathlib import Path

import torch

import graphscribe
from graphscribe.io.audio import find_audio_files
from graphscribe.runtime.clock import StageClock
from graphscribe.runtime.priming import prime

STAGES = ("batch_features", "encoder_output", "decode")


def counters(model) -> dict[str, float]:
    layers = model._layer_graphs
    return dict(
        decode_capture=model.decoder.capture_seconds,
        decode_compile=model.decoder.compile_seconds,
        layer_capture=layers.capture_seconds if layers is not None else 0.0,
    )


def sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def one_pass(model, files, batch: int, profiles: dict | None = None, profiled: int = 0) -> dict:
    """One pass; `profiles`: a cProfile.Profile per stage, run around its first `profiled` calls."""
    calls: dict[str, list] = defaultdict(list)
    originals = {name: getattr(model, name) for name in (*STAGES, "make_transcript")}

    def timed(name):
        fn = originals[name]

        def wrapper(*args, **kwargs):
            profile = profiles.get(name) if profiles is not None and len(calls[name]) < profiled else None
            if profile is not None:
                profile.enable()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if profile is not None:
                profile.disable()
            seconds = time.perf_counter() - start
            shape = list(args[0].shape) if name != "make_transcript" else None
            calls[name].append((seconds, shape))
            return out

        return wrapper

    for name in originals:
        setattr(model, name, timed(name))
    before = counters(model)
    clock = StageClock(model.device)
    sync(model)
    start = time.perf_counter()
    try:
        results = list(model.transcribe_iter(files, batch_size=batch, clock=clock, word_times=False))
        sync(model)
    finally:
        for name in originals:
            delattr(model, name)  # the class's methods again
    wall = time.perf_counter() - start
    after = counters(model)
    return dict(
        wall_s=wall,
        files=len(results),
        errors=sum(1 for _, t in results if t.error),
        clock=clock.seconds(),
        counters={k: after[k] - before[k] for k in after},
        host={name: sum(s for s, _ in calls[name]) for name in calls},
        calls={name: calls[name] for name in STAGES},
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--folder", type=Path, required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--json", type=Path, help="append one line of JSON")
    ap.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="K",
        help="cProfile each stage's first K calls in the first two passes; print the top functions",
    )
    args = ap.parse_args()
    start = time.perf_counter()
    primer = prime("auto", args.dtype)  # as the CLI: CUDA's libraries load while the checkpoint does
    model = graphscribe.load_model(args.model, dtype=args.dtype)
    if primer is not None:
        primer.join()
    load_s = time.perf_counter() - start
    files = find_audio_files(args.folder)
    profiles = [{name: cProfile.Profile() for name in STAGES} for _ in range(args.passes)]
    passes = [
        one_pass(model, files, args.batch, profiles[i] if i < 2 else None, args.cprofile) for i in range(args.passes)
    ]
    label = f"{args.dtype} B={args.batch}"
    print(
        f"{label}: {len(files)} files, loaded in {load_s:.2f} s ({' '.join(f'{k} {v:.2f}' for k, v in model.load_seconds.items())})"
    )
    for i, p in enumerate(passes, 1):
        host = " ".join(f"{k} {v:.3f}" for k, v in p["host"].items())
        clock = " ".join(f"{k} {v:.3f}" for k, v in p["clock"].items())
        made = " ".join(f"{k} {v:.3f}" for k, v in p["counters"].items())
        print(f"  pass {i}: wall {p['wall_s']:.3f} s | host {host} | clock {clock} | made {made}")
    if len(passes) >= 2:
        first, second = passes[0]["calls"], passes[1]["calls"]
        extra = []
        for name in STAGES:
            for k, ((a, shape), (b, _)) in enumerate(zip(first[name], second[name])):
                extra.append((a - b, name, k, shape, a, b))
        extra.sort(reverse=True)
        for name in STAGES:
            total = sum(x[0] for x in extra if x[1] == name)
            print(f"  {name}: first pass {total * 1e3:.0f} ms more over {len(first[name])} calls")
        for _, name, k, shape, a, b in extra[:20]:
            print(f"    batch {k} {name} {shape}: {a * 1e3:.1f} ms first, {b * 1e3:.1f} ms second")
    for i in range(min(2, args.passes) if args.cprofile else 0):
        for name, profile in profiles[i].items():
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
            body = text.getvalue()
            print(f"  --- cProfile pass {i + 1} {name}, first {args.cprofile} calls:")
            print(body[body.find("   ncalls") :].rstrip())
    if args.json:
        with args.json.open("a") as f:
            f.write(
                json.dumps(dict(label=label, dtype=args.dtype, batch=args.batch, load_s=load_s, passes=passes)) + "\n"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
