#!/usr/bin/env python
"""Measure the fused decode step's tile sizes and window per batch size on the GPU (the figures behind
`fused_step.FP32_TILES` / `HALF_TILES` and `decoding.WINDOWS`).

    python scripts/experiments/tune_step.py --model v3.nemo --out DIR [--parts tiles,windows]

Decode-only times of the 77 s bench tier (the clip repeated B times), graphs on, median of 5
after a warm-up that compiles and captures; float32 and bfloat16 (the joint in bfloat16, as
`--dtype bfloat16` runs it). Every row says whether its tokens equal the default's. Writes
tune.json and tune.md to DIR, after every row (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch

import graphscribe as gs
from graphscribe.bench.decode import tier_clips
from graphscribe.model import decoding
from graphscribe.model.decoding import GreedyDecoder, size_class
from graphscribe.model.fused_step import FP32_TILES, HALF_TILES, ONE_ROW, FusedStep, Tiles


def _around(base: Tiles) -> list[Tiles]:
    """The defaults, then one setting changed at a time, then a few pairs."""
    out = [base]
    for field, values in (
        ("rows", (32, 64)),
        ("joint_cols", (32, 128)),
        ("units", (16,)),
        ("proj_cols", (32,)),
        ("k", (32, 128)),
        ("warps", (2,)),
        ("stages", (4, 6)),
        ("gate_stages", (4, 6)),
        ("advance_warps", (2, 8)),
    ):
        out += [replace(base, **{field: v}) for v in values if v != getattr(base, field)]
    out += [
        replace(base, proj_cols=32, stages=6, gate_stages=4),
        replace(base, rows=64, warps=8),
        replace(base, proj_cols=32, stages=6, gate_stages=4, advance_warps=8),
    ]
    return out


TILES = {"float32": _around(FP32_TILES), "bfloat16": _around(HALF_TILES)}


def _one_row(base: Tiles) -> list[Tiles]:
    """The one-row class: its default (CUDA-core products) and the default with the joint's settings changed
    (warps, stages, k, and columns a program: a GEMV read the joint's output layer faster in 32 columns a program
    than in 64)."""
    one = replace(base, **ONE_ROW)
    return [
        one,
        replace(one, joint_cols=32),
        replace(one, joint_cols=32, warps=4),
        replace(one, joint_cols=16, warps=4),
        replace(one, joint_cols=128),
        replace(one, joint_cols=32, stages=4),
    ]


def _large(base: Tiles) -> list[Tiles]:
    """Large batches (32 rows and more): the defaults, then taller tiles (a weight tile read from L2 once for 32, 64
    or 128 batch rows instead of 16), with more warps and wider joint blocks."""
    return [
        base,
        replace(base, rows=32),
        replace(base, rows=64),
        replace(base, rows=64, warps=8),
        replace(base, rows=64, joint_cols=128, warps=8),
        replace(base, rows=64, units=16),
        replace(base, rows=128, warps=8),
    ]


def tiles_changes(text: str) -> dict:
    """ "field=value,..." -> `Tiles` changes, each value of its field's type (bools as 0 or 1); ValueError if not."""
    changes = {}
    for item in text.split(","):
        field, _, value = item.partition("=")
        if field not in {f.name for f in fields(Tiles)} or not value:
            raise ValueError(f"{item!r}: want FIELD=VALUE, FIELD one of {', '.join(f.name for f in fields(Tiles))}")
        kind = type(getattr(FP32_TILES, field))
        changes[field] = bool(int(value)) if kind is bool else kind(value)
    return changes


def _tiles(t) -> str:
    return (
        f"joint {t.joint_cols}, units {t.units}, proj {t.proj_cols}, k {t.k}, {t.fp32 or 'tensor cores'}, "
        f"warps {t.warps}/{t.advance_warps}, stages {t.stages}/{t.gate_stages}, rows {t.rows}"
        + (f", net {t.net} k {t.net_k} warps {t.net_warps}" if t.net else "")
    )


SHARE = decoding.ROUND_SHARE
_ROUND_STEPS = decoding.round_steps


_LAST_ROUND: dict = {}  # the "last" policy's previous round, between calls of a decode


def _last_round_rate(buf, remaining, first, queued, rate=None, _last=_LAST_ROUND):
    """Round sizes from the rate of the last round alone (the "last" policy)."""
    lower = -(-remaining // (buf.window + buf.max_skip + 1))
    last = _last.get("at") if queued else None
    _last["at"] = (remaining, queued)
    if last is None or last[0] <= remaining:
        return lower
    rate = (last[0] - remaining) / (queued - last[1])
    return max(lower, min(remaining, math.ceil(remaining / rate)))


def _rounds(policy) -> None:
    """Use a rounds policy: a ROUND_SHARE, or "last"."""
    if policy == "last":
        decoding.round_steps = _last_round_rate
    else:
        decoding.round_steps, decoding.ROUND_SHARE = _ROUND_STEPS, policy


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
    ap.add_argument(
        "--parts", default="tiles,windows", help="of tiles, onerow, rounds, warps, large, variants, windows"
    )
    ap.add_argument("--policies", default="last,1.0,0.7", help="rounds: the policies (ROUND_SHARE values, or last)")
    ap.add_argument("--tiers", default="2", help="bench tiers by index (0: 7.4 s, 1: 23 s, 2: 77 s), comma separated")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--windows", default="1,2,4,8")
    ap.add_argument("--tile-batches", default="1,8,128")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--rounds", type=int, default=5, help="onerow, warps: rounds over the settings, each a median of 5")
    ap.add_argument(
        "--variants",
        default="stages=4;k=32,stages=6",
        metavar="FIELD=VALUE,...;...",
        help="variants: `Tiles` changes, each set in every size class and measured against the defaults",
    )
    ap.add_argument(
        "--baseline-step",
        type=Path,
        default=None,
        metavar="FUSED_STEP_PY",
        help="variants: another version's src/graphscribe/fused_step.py (e.g. from `git show`), measured "
        "first in the same rounds",
    )
    args = ap.parse_args()
    try:
        variants = [tiles_changes(v) for v in filter(None, args.variants.split(";"))]
    except ValueError as err:
        ap.error(f"--variants {err}")
    baseline = None
    if args.baseline_step:  # another version's fused_step.py, as a module of the package (its relative imports)
        spec = importlib.util.spec_from_file_location("graphscribe.fused_step_baseline", args.baseline_step)
        baseline = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
        spec.loader.exec_module(baseline)
    args.out.mkdir(parents=True, exist_ok=True)
    model = gs.load_model(args.model, device="cuda", dtype="float32")
    tiers = [tier_clips(model)[int(i)] for i in args.tiers.split(",")]
    encoded = {tier.name: model.encode([tier.audio]) for tier in tiers}
    tier = tiers[-1]  # every part but rounds: the last of --tiers
    joints = {"float32": model.module.joint, "bfloat16": copy.deepcopy(model.module.joint).to(torch.bfloat16)}
    rows, lines = [], []
    header = [
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, decode only, graphs, median of 5 (ms); "
        "tier: the clip; steps: the row's; queued: steps run, the finished row's included",
        "",
        "| what | tier | dtype | B | tiles | ms | steps | queued | us/step | warm-up s | same tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def save() -> None:
        print(lines[-1], flush=True)
        (args.out / "tune.md").write_text("\n".join(header + lines) + "\n")
        (args.out / "tune.json").write_text(json.dumps(rows, indent=1) + "\n")

    def inputs(dtype, batch, name=None):
        """A tier's encoder output in `dtype`, repeated for `batch` rows, and its lengths."""
        encoded32, lengths1 = encoded[name or tier.name]
        return encoded32.to(getattr(torch, dtype)).expand(batch, -1, -1).contiguous(), lengths1.expand(
            batch
        ).contiguous()

    def decoder_for(dtype, window=None, tiles=None, one_row=None, changes=None, step_class=FusedStep):
        """changes: `Tiles` fields set in every size class (e.g. {"stages": 4}); step_class: the baseline's FusedStep."""
        decoder = GreedyDecoder(
            model.module.decoder, joints[dtype], model.cfg.decoding, graphs=True, window=window, fused=True
        )
        step = decoder._fused_step = step_class(
            decoder.prediction, decoder.joint, getattr(torch, dtype), model.cfg.decoding.durations, tiles, one_row
        )
        if changes:
            step.tiles, step.one_row = replace(step.tiles, **changes), replace(step.one_row, **changes)
            step.tall = {least: replace(t, **changes) for least, t in step.tall.items()}
        return decoder

    def run(dtype, batch, window=None, tiles=None, one_row=None):
        decoder = decoder_for(dtype, window, tiles, one_row)
        ms, warm, hyps = timed(decoder, *inputs(dtype, batch))
        return ms, warm, hyps[0].steps, decoder.queued_steps, [(h.token_ids, h.frames) for h in hyps]

    def final_state(decoder, batch):
        """Row 0's LSTM state (h of every layer) after a decode: the bits a batch's tiles gave it."""
        buf = decoder._buffers[size_class(batch)]
        return decoder._fused_step.state(buf)[0][:, 0].clone()

    def alternating(dtype, batch, settings, name=None, compare_bits=False):
        """(tiles, one_row[, rounds policy[, changes[, step class]]]) settings measured in alternating rounds, each a
        median of 5; a row per setting. A policy: a ROUND_SHARE, or "last" (the rate of the last round
        alone); None: the default. changes, step class: as `decoder_for`'s. compare_bits: whether row 0's final LSTM
        state has the same bits as with the first setting."""
        name = name or tier.name
        encoded, lengths = inputs(dtype, batch, name)
        reference = None
        configs = []
        for tiles, one_row, *rest in settings:
            policy = rest[0] if rest and rest[0] is not None else decoding.ROUND_SHARE
            decoder = decoder_for(
                dtype,
                tiles=tiles,
                one_row=one_row,
                changes=rest[1] if len(rest) > 1 else None,
                step_class=rest[2] if len(rest) > 2 else FusedStep,
            )
            _rounds(policy)
            _, warm, hyps = timed(decoder, encoded, lengths, reps=1)
            same_bits = None
            if compare_bits:
                state = final_state(decoder, batch)
                reference = state if reference is None else reference
                same_bits = torch.equal(state, reference)
            configs.append(
                (decoder, policy, warm, [(h.token_ids, h.frames) for h in hyps], [], hyps[0].steps, same_bits)
            )
        for _ in range(args.rounds):
            for decoder, policy, _, _, times, _, _ in configs:
                _rounds(policy)
                times.append(timed(decoder, encoded, lengths)[0])
        _rounds(SHARE)
        base = configs[0][3]
        for decoder, policy, warm, result, times, steps, same_bits in configs:
            used = decoder._fused_step.tiles_for(size_class(batch))
            ms = statistics.median(times)
            which = "baseline" if type(decoder._fused_step) is not FusedStep else "this tree"
            row = dict(
                part="alternating",
                step=which,
                tier=name,
                dtype=dtype,
                batch=batch,
                tiles=asdict(used),
                rounds_policy=policy,
                ms=ms,
                rounds=times,
                steps=steps,
                queued=decoder.queued_steps,
                host_reads=decoder.host_reads,
                us_per_step=ms * 1e3 / steps,
                warm_s=warm,
                same=result == base,
            )
            if same_bits is not None:
                row["state_bits_as_first"] = same_bits
            rows.append(row)
            lines.append(
                f"| {which}, alternating, rounds {policy}, {decoder.host_reads} reads | {name} | {dtype} | {batch} | "
                f"{_tiles(used)} | {ms:.3f} ({min(times):.3f}-"
                f"{max(times):.3f}) | {steps} | {decoder.queued_steps} | {row['us_per_step']:.1f} | "
                f"{warm:.1f} | {row['same']}"
                + (f", state bits as the first: {same_bits}" if same_bits is not None else "")
                + " |"
            )
            save()

    for dtype in args.dtypes.split(","):
        if "tiles" in args.parts:
            for batch in map(int, args.tile_batches.split(",")):
                base = None
                for tiles in TILES[dtype]:
                    ms, warm, steps, queued, result = run(dtype, batch, tiles=tiles)
                    base = base or result
                    row = dict(
                        part="tiles",
                        tier=tier.name,
                        dtype=dtype,
                        batch=batch,
                        tiles=asdict(tiles),
                        ms=ms,
                        steps=steps,
                        queued=queued,
                        us_per_step=ms * 1e3 / steps,
                        warm_s=warm,
                        same=result == base,
                    )
                    rows.append(row)
                    lines.append(
                        f"| tiles | {tier.name} | {dtype} | {batch} | {_tiles(tiles)} | {ms:.2f} | {steps} | "
                        f"{queued} | {row['us_per_step']:.1f} | {warm:.1f} | {row['same']} |"
                    )
                    save()
        base_tiles = FP32_TILES if dtype == "float32" else HALF_TILES
        if "onerow" in args.parts:  # B = 1: the one-row class's tiles
            alternating(dtype, 1, [(None, one) for one in _one_row(base_tiles)])
        if "rounds" in args.parts:  # B = 1: the round sizes of --policies, on each tier
            one = replace(base_tiles, **ONE_ROW)
            policies = [p if p == "last" else float(p) for p in args.policies.split(",")]
            for t in tiers:
                alternating(dtype, 1, [(None, one, policy) for policy in policies], t.name)
        if "warps" in args.parts:  # the other classes: 4 or 8 warps a matrix program
            for batch in map(int, args.tile_batches.split(",")):
                alternating(dtype, batch, [(base_tiles, None), (replace(base_tiles, warps=8), None)])
        if "large" in args.parts:  # large batches: taller tiles, and whether row 0's state keeps its bits
            for batch in map(int, args.tile_batches.split(",")):
                alternating(dtype, batch, [(tiles, None) for tiles in _large(base_tiles)], compare_bits=True)
        if "variants" in args.parts:  # --variants against the defaults, in every size class; the baseline first
            first = [(None, None, None, {}, baseline.FusedStep)] if baseline else []
            for batch in map(int, args.tile_batches.split(",")):
                for t in tiers:
                    alternating(dtype, batch, first + [(None, None, None, v) for v in [{}, *variants]], t.name)
        if "windows" in args.parts:
            for batch in map(int, args.batches.split(",")):
                for window in map(int, args.windows.split(",")):
                    ms, warm, steps, queued, _ = run(dtype, batch, window=window)
                    row = dict(
                        part="windows",
                        tier=tier.name,
                        dtype=dtype,
                        batch=batch,
                        window=window,
                        ms=ms,
                        steps=steps,
                        queued=queued,
                        us_per_step=ms * 1e3 / steps,
                        warm_s=warm,
                    )
                    rows.append(row)
                    lines.append(
                        f"| window {window} | {tier.name} | {dtype} | {batch} | default | {ms:.2f} | {steps} | "
                        f"{queued} | {row['us_per_step']:.1f} | {warm:.1f} | |"
                    )
                    save()


if __name__ == "__main__":
    main()
