#!/usr/bin/env python
"""Experiment: what a one-row step's joint kernel (`fused_step._joint_kernel`) spends its 13 us on.

    python scripts/joint_bench.py [--json F]

The kernel alone, on random weights of the 0.6b's shapes (output layer 8198 x 640, float32 or bfloat16), one batch
row, captured `--calls` times back to back in one CUDA graph (no PDL); microseconds per call, median of `--reps`
replays. Variants change one thing at a time against the step's one-row tiles:

- window: valid rows of the tile (the step's 8 frames, or 1): the share of the frames' loads (f + g per row);
- skip: the has-work check (a load of `active` before the products) off;
- cold: a 64 MB write between calls, so that every call reads its weights from DRAM rather than L2;
- k / stages: the reduction chunk and the depth of the loads' pipeline.

bench/h100-session22/ has the variants of a patch that was tried (the products as W x^T on Hopper's wgmma).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch
import triton
from gemv_bench import graph_time  # scripts/, beside this one

from graphscribe.fused_step import FP32_TILES, HALF_TILES, ONE_ROW, _joint_kernel, _next_pow2

O, J, V1, T = 8198, 640, 8193, 1024  # outputs (V + 1 tokens, 5 durations), joint hidden, token logits, frames


def run(dtype: torch.dtype, tiles, window: int, cold: bool, calls: int, reps: int) -> float:
    """Microseconds per call of the joint kernel with these tiles, `window` valid rows."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    w_out = (torch.randn(O, J, device=device, generator=gen) * 0.05).to(dtype)
    b_out = torch.randn(O, device=device, generator=gen) * 0.1
    enc = torch.randn(1, T, J, device=device, generator=gen).to(dtype)
    g = torch.randn(1, J, device=device, generator=gen).to(dtype)
    t = torch.tensor([100], device=device)
    active = torch.ones(1, device=device, dtype=torch.bool)
    blocks = triton.cdiv(O, tiles.joint_cols)
    duration_blocks = blocks - V1 // tiles.joint_cols
    nbd = _next_pow2(duration_blocks)
    tok_val = torch.empty(window, blocks, device=device)
    tok_idx = torch.empty(window, blocks, device=device, dtype=torch.int32)
    dur_val = torch.empty(window, nbd, device=device)
    dur_idx = torch.empty(window, nbd, device=device, dtype=torch.int32)
    flush = torch.empty(64 * 2**20, device=device, dtype=torch.uint8)

    def call():
        _joint_kernel[(blocks, triton.cdiv(window, tiles.rows))](
            enc,
            g,
            t,
            active,
            w_out,
            b_out,
            tok_val,
            tok_idx,
            dur_val,
            dur_idx,
            1,
            T,
            window,
            J,
            V1,
            O,
            blocks,
            BM=tiles.rows,
            BC=tiles.joint_cols,
            BK=tiles.k,
            FP32=tiles.fp32 or "",
            TDT=True,
            NBD=nbd,
            num_warps=tiles.warps,
            num_stages=tiles.stages,
            PDL=0,
            SKIP=tiles.skip,
        )

    if not cold:
        return graph_time(call, calls, reps) * 1e6
    flush_only = lambda: flush.fill_(1)  # noqa: E731
    with_flush = graph_time(lambda: (flush_only(), call()), calls, reps)
    return (with_flush - graph_time(flush_only, calls, reps)) * 1e6  # the flushes' own time taken out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for dtype, base in ((torch.float32, FP32_TILES), (torch.bfloat16, HALF_TILES)):
        one = replace(base, **ONE_ROW)
        variants = [
            ("one-row tiles", one, 8, False),
            ("window 1", one, 1, False),
            ("no skip", replace(one, skip=False), 8, False),
            ("cold weights", one, 8, True),
            ("cold, window 1", one, 1, True),
            ("stages 4", replace(one, stages=4), 8, False),
            ("stages 5", replace(one, stages=5), 8, False),
            ("k 32, stages 6", replace(one, k=32, stages=6), 8, False),
            ("k 128, stages 2", replace(one, k=128, stages=2), 8, False),
            ("k 128, stages 3", replace(one, k=128, stages=3), 8, False),
            ("warps 4", replace(one, warps=4), 8, False),
        ]
        for name, tiles, window, cold in variants:
            try:
                us = run(dtype, tiles, window, cold, args.calls, args.reps)
            except Exception as err:  # a variant the compiler refuses (shared memory): say so, go on
                print(f"{dtype} {name}: {type(err).__name__}: {str(err)[:160]}", flush=True)
                continue
            weight_mb = O * J * torch.empty(0, dtype=dtype).element_size() / 1e6
            row = dict(
                dtype=str(dtype).removeprefix("torch."),
                variant=name,
                window=window,
                cold=cold,
                us_per_call=round(us, 2),
                weight_tb_s=round(weight_mb / us, 2),
                device=torch.cuda.get_device_name(),
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
