#!/usr/bin/env python
"""Measure the fused decode step's tile sizes and window per batch size on the GPU (the figures behind
`fused_step.FP32_TILES` / `HALF_TILES` and `decoding.WINDOWS`).

    python scripts/tune_step.py --model v3.nemo --out DIR [--parts tiles,windows]

Decode-only times of the 77 s bench tier (the clip repeated B times), graphs on, median of 5
after a warm-up that compiles and captures; float32 and bfloat16 (the joint in bfloat16, as
`--dtype bfloat16` runs it). Every row says whether its tokens equal the default's. Writes
tune.json and tune.md to DIR, after every row (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

import graphscribe as gs
from graphscribe.bench import tier_clips
from graphscribe.decoding import GreedyDecoder, size_class
from graphscribe.fused_step import FP32_TILES, HALF_TILES, ONE_ROW, FusedStep, Tiles

def _around(base: Tiles) -> list[Tiles]:
    """The defaults, then one setting changed at a time, then a few pairs."""
    out = [base]
    for field, values in (("rows", (32, 64)), ("joint_cols", (32, 128)), ("units", (16,)),
                          ("proj_cols", (32,)), ("k", (32, 128)), ("warps", (2,)), ("stages", (4, 6)),
                          ("gate_stages", (4, 6)), ("advance_warps", (2, 8))):
        out += [replace(base, **{field: v}) for v in values if v != getattr(base, field)]
    out += [replace(base, proj_cols=32, stages=6, gate_stages=4), replace(base, rows=64, warps=8),
            replace(base, proj_cols=32, stages=6, gate_stages=4, advance_warps=8)]
    return out


TILES = {"float32": _around(FP32_TILES), "bfloat16": _around(HALF_TILES)}


def _one_row(base: Tiles) -> list[Tiles]:
    """The one-row class: its default (CUDA-core products), the tensor-core tiles of the other classes, and the
    default with the joint's settings changed (the sweep of session 15's first run settled the net's)."""
    one = replace(base, **ONE_ROW)
    return [one, base, replace(one, warps=8), replace(one, stages=2), replace(one, k=128),
            replace(one, warps=8, stages=2)]


def _tiles(t) -> str:
    return (f"joint {t.joint_cols}, units {t.units}, proj {t.proj_cols}, k {t.k}, {t.fp32 or 'tensor cores'}, "
            f"warps {t.warps}/{t.advance_warps}, stages {t.stages}/{t.gate_stages}, rows {t.rows}"
            + (f", net {t.net} k {t.net_k} warps {t.net_warps}" if t.net else ""))


def timed(decoder, encoded, lengths, reps=5):
    start = time.perf_counter()
    hyps = decoder.decode(encoded, lengths)  # warm-up: compile (or load the kernel cache) and capture
    warm = time.perf_counter() - start
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        decoder.decode(encoded, lengths)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, warm, hyps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="tiles,windows", help="of tiles, onerow, warps, windows")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--windows", default="1,2,4,8")
    ap.add_argument("--tile-batches", default="1,8,128")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=5, help="onerow, warps: rounds over the settings, each a median of 5")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = gs.load_model(args.model, device="cuda", dtype="float32")
    tier = tier_clips(model)[-1]
    encoded32, lengths1 = model.encode([tier.audio])
    joints = {"float32": model.module.joint, "bfloat16": copy.deepcopy(model.module.joint).to(torch.bfloat16)}
    rows, lines = [], []
    header = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {tier_clips(model)[-1].name} tier, decode only, "
              "graphs, median of 5 (ms)", "", "| what | dtype | B | tiles | ms | steps | us/step | warm-up s | same tokens |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def save() -> None:
        print(lines[-1], flush=True)
        (args.out / "tune.md").write_text("\n".join(header + lines) + "\n")
        (args.out / "tune.json").write_text(json.dumps(rows, indent=1) + "\n")

    def inputs(dtype, batch):
        """The tier's encoder output in `dtype`, repeated for `batch` rows, and its lengths."""
        return encoded32.to(getattr(torch, dtype)).expand(batch, -1, -1).contiguous(), lengths1.expand(batch).contiguous()

    def decoder_for(dtype, window=None, tiles=None, one_row=None):
        decoder = GreedyDecoder(model.module.decoder, joints[dtype], model.cfg.decoding, graphs=True, window=window, fused=True)
        decoder._fused_step = FusedStep(decoder.prediction, decoder.joint, getattr(torch, dtype),
                                        model.cfg.decoding.durations, tiles, one_row)
        return decoder

    def run(dtype, batch, window=None, tiles=None, one_row=None):
        ms, warm, hyps = timed(decoder_for(dtype, window, tiles, one_row), *inputs(dtype, batch))
        return ms, warm, hyps[0].steps, [(h.token_ids, h.frames) for h in hyps]

    def alternating(dtype, batch, settings):
        """(tiles, one_row) settings measured in alternating rounds, each a median of 5; a row per setting."""
        encoded, lengths = inputs(dtype, batch)
        configs = []
        for tiles, one_row in settings:
            decoder = decoder_for(dtype, tiles=tiles, one_row=one_row)
            _, warm, hyps = timed(decoder, encoded, lengths, reps=1)
            configs.append((decoder, warm, [(h.token_ids, h.frames) for h in hyps], [], hyps[0].steps))
        for _ in range(args.rounds):
            for decoder, _, _, times, _ in configs:
                times.append(timed(decoder, encoded, lengths)[0])
        base = configs[0][2]
        for decoder, warm, result, times, steps in configs:
            used = decoder._fused_step.tiles_for(size_class(batch))
            ms = statistics.median(times)
            row = dict(part="alternating", dtype=dtype, batch=batch, tiles=asdict(used), ms=ms, rounds=times,
                       steps=steps, us_per_step=ms * 1e3 / steps, warm_s=warm, same=result == base)
            rows.append(row)
            lines.append(f"| alternating | {dtype} | {batch} | {_tiles(used)} | {ms:.2f} ({min(times):.2f}-"
                         f"{max(times):.2f}) | {steps} | {row['us_per_step']:.1f} | {warm:.1f} | {row['same']} |")
            save()

    for dtype in args.dtypes.split(","):
        if "tiles" in args.parts:
            for batch in map(int, args.tile_batches.split(",")):
                base = None
                for tiles in TILES[dtype]:
                    ms, warm, steps, result = run(dtype, batch, tiles=tiles)
                    base = base or result
                    row = dict(part="tiles", dtype=dtype, batch=batch, tiles=asdict(tiles), ms=ms, steps=steps,
                               us_per_step=ms * 1e3 / steps, warm_s=warm, same=result == base)
                    rows.append(row)
                    lines.append(f"| tiles | {dtype} | {batch} | {_tiles(tiles)} | {ms:.2f} | {steps} | "
                                 f"{row['us_per_step']:.1f} | {warm:.1f} | {row['same']} |")
                    save()
        base_tiles = FP32_TILES if dtype == "float32" else HALF_TILES
        if "onerow" in args.parts:  # B = 1: the one-row class's tiles
            alternating(dtype, 1, [(None, one) for one in _one_row(base_tiles)])
        if "warps" in args.parts:  # the other classes: 4 or 8 warps a matrix program
            for batch in map(int, args.tile_batches.split(",")):
                alternating(dtype, batch, [(base_tiles, None), (replace(base_tiles, warps=8), None)])
        if "windows" in args.parts:
            for batch in map(int, args.batches.split(",")):
                for window in map(int, args.windows.split(",")):
                    ms, warm, steps, result = run(dtype, batch, window=window)
                    row = dict(part="windows", dtype=dtype, batch=batch, window=window, ms=ms, steps=steps,
                               us_per_step=ms * 1e3 / steps, warm_s=warm)
                    rows.append(row)
                    lines.append(f"| window {window} | {dtype} | {batch} | default | {ms:.2f} | {steps} | "
                                 f"{row['us_per_step']:.1f} | {warm:.1f} | |")
                    save()


if __name__ == "__main__":
    main()
