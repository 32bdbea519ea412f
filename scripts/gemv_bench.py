#!/usr/bin/env python
"""Experiment: how fast can one decode-step product (a few rows times a weight matrix) read its weights?

    python scripts/gemv_bench.py [--json F]

The fused step's products are GEMVs in all but name: 1-8 rows (batch rows x window frames) times the joint's
output layer (8198 x 640) or an LSTM layer (2560 x 640). Random weights of those shapes, no checkpoint. Each
variant is captured 50 times back to back in one CUDA graph; the time per call, and the weight bytes over it:

- cublas: torch.mm (TF32 off), the reference for a well-made GEMV;
- dot: tl.dot tiles of 16 rows (the fused step's way, "tf32x3" in float32);
- fma: products and sums on the CUDA cores, each row's sum in k order per lane, then a tree over the lanes.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl


@triton.jit
def _dot_kernel(x, w, y, M, C, K, BM: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, FP32: tl.constexpr):
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    rows = tl.arange(0, BM)
    acc = tl.zeros((BM, BC), tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        xk = tl.load(x + rows[:, None] * K + k[None, :], mask=(rows < M)[:, None], other=0.0)
        wk = tl.load(w + cols[:, None] * K + k[None, :], mask=(cols < C)[:, None], other=0.0)
        if FP32 == "":
            acc = tl.dot(xk.to(wk.dtype), tl.trans(wk), acc)
        else:
            acc = tl.dot(xk, tl.trans(wk), acc, input_precision=FP32)
    tl.store(y + rows[:, None] * C + cols[None, :], acc, mask=(rows < M)[:, None] & (cols < C)[None, :])


@triton.jit
def _fma_kernel(x, w, y, M, C, K, BM: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """y[m, c] = sum_k x[m, k] w[c, k]: each program BC columns, all BM rows; partial sums (BM, BC, BK) in
    registers over the k chunks, reduced over BK at the end."""
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    rows = tl.arange(0, BM)
    acc = tl.zeros((BM, BC, BK), tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        xk = tl.load(x + rows[:, None] * K + k[None, :], mask=(rows < M)[:, None], other=0.0).to(tl.float32)
        wk = tl.load(w + cols[:, None] * K + k[None, :], mask=(cols < C)[:, None], other=0.0).to(tl.float32)
        acc += xk[:, None, :] * wk[None, :, :]
    out = tl.sum(acc, axis=2)
    tl.store(y + rows[:, None] * C + cols[None, :], out, mask=(rows < M)[:, None] & (cols < C)[None, :])


def graph_time(fn, calls: int = 50, reps: int = 7) -> float:
    """Seconds per call of fn, replayed `calls` times in one CUDA graph (median of reps)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows_out = []
    shapes = {"joint": (8198, 640), "lstm": (2560, 640)}
    # the joint: 8 rows at B=1 (a window of 8 frames), 16 at B=8 (2 frames); an LSTM layer: 1 or 8 rows
    cases = [
        ("joint", torch.float32, 8),
        ("joint", torch.float32, 16),
        ("joint", torch.bfloat16, 8),
        ("lstm", torch.float32, 1),
        ("lstm", torch.float32, 8),
    ]
    for name, dtype, M in cases:
        C, K = shapes[name]
        w = torch.randn(C, K, device="cuda").to(dtype) / K**0.5
        x = torch.randn(M, K, device="cuda")
        y = torch.empty(M, C, device="cuda")
        ref = x.double() @ w.double().t()
        nbytes = w.numel() * w.element_size()

        def report(variant: str, seconds: float, out: torch.Tensor, **cfg) -> None:
            err = (out.double() - ref).abs().max().item()
            row = dict(
                shape=name,
                dtype=str(dtype).split(".")[1],
                rows=M,
                variant=variant,
                us=round(seconds * 1e6, 2),
                tb_s=round(nbytes / seconds / 1e12, 2),
                max_err=float(f"{err:.3g}"),
                **cfg,
            )
            rows_out.append(row)
            print(json.dumps(row), flush=True)

        xw = x.to(dtype)
        out = torch.empty(M, C, device="cuda", dtype=dtype)
        report("cublas", graph_time(lambda: torch.mm(xw, w.t(), out=out)), out)
        fp32 = "tf32x3" if dtype is torch.float32 else ""
        for bc, bk, warps, stages in itertools.product((32, 64), (64, 128), (4, 8), (3,)):
            fn = lambda: _dot_kernel[(triton.cdiv(C, bc),)](
                x,
                w,
                y,
                M,
                C,
                K,
                BM=16,
                BC=bc,
                BK=bk,
                FP32=fp32,  # noqa: E731
                num_warps=warps,
                num_stages=stages,
            )
            try:
                report("dot", graph_time(fn), y, bc=bc, bk=bk, warps=warps, stages=stages)
            except Exception as err:  # noqa: BLE001
                print("dot", bc, bk, warps, stages, "failed:", str(err).splitlines()[0])
        bm = triton.next_power_of_2(M)
        for bc, bk, warps, stages in itertools.product((8, 16, 32, 64), (32, 64, 128), (4, 8), (2, 3)):
            if bm * bc * bk > 8192 or bm * bc * bk < 1024:  # too many registers, or too little a chunk
                continue
            fn = lambda: _fma_kernel[(triton.cdiv(C, bc),)](
                x,
                w,
                y,
                M,
                C,
                K,
                BM=bm,
                BC=bc,
                BK=bk,  # noqa: E731
                num_warps=warps,
                num_stages=stages,
            )
            try:
                report("fma", graph_time(fn), y, bc=bc, bk=bk, warps=warps, stages=stages)
            except Exception as err:  # noqa: BLE001
                print("fma", bc, bk, warps, stages, "failed:", str(err).splitlines()[0])
    best = {}
    for r in rows_out:
        key = (r["shape"], r["dtype"], r["rows"], r["variant"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    print("\nbest per shape, dtype, rows, variant:")
    for r in best.values():
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows_out, best=list(best.values())), f, indent=1)


if __name__ == "__main__":
    main()
