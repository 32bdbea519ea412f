#!/usr/bin/env python
"""The one-row joint kernel's inner loop, compiled for a Hopper GPU (sm_90) on the CPU: its instructions by kind.

    python scripts/kernel_loop.py [--fp32 tf32x3|ieee] [--dtype float32|bfloat16]

Triton's compiler and the ptxas/nvdisasm it ships run without a GPU. Prints the kernel's registers and the
instruction mix of its k loop (the one backward branch), a chunk of `Tiles.k` columns of the reduction, and then
how far two "tf32x3" splits are from the float64 product, emulated in NumPy on the joint's shapes (each product and
sum exact, so that only the split's error shows): tl.dot's own (cvt.rna for both parts, as `fused_step._mac` uses)
and the one of bench/h100-session23/run3/tf32x3-split.patch (high parts rounded, low parts read by the tensor cores
by truncation), beside a float32 product.
"""

from __future__ import annotations

import argparse
import glob
import inspect
import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import replace

import numpy as np
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from graphscribe import fused_step as fs

BIN = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin"))[0]


def compile_joint(dtype: str, fp32: str):
    tiles = replace(fs.FP32_TILES if dtype == "float32" else fs.HALF_TILES, **fs.ONE_ROW)
    weights = "*fp32" if dtype == "float32" else "*bf16"
    pointers = dict(
        enc=weights,
        g=weights,
        t="*i64",
        active="*i1",
        w_out=weights,
        b_out="*fp32",
        tok_val="*fp32",
        tok_idx="*i32",
        dur_val="*fp32",
        dur_idx="*i32",
    )
    constexprs = dict(
        BM=tiles.rows,
        BC=tiles.joint_cols,
        BK=tiles.k,
        FP32=fp32 if dtype == "float32" else "",
        TDT=True,
        NBD=2,
        SKIP=True,
        PDL=True,
    )
    names = list(inspect.signature(fs._joint_kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i32") for n in names}
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in [*pointers, "J"]}
    return triton.compile(
        ASTSource(fs._joint_kernel, signature, constexprs, attrs=aligned),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=tiles.warps, num_stages=tiles.stages),
    )


def loop_mix(cubin: bytes) -> tuple[str, Counter]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run(
            [f"{BIN}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
        sass = subprocess.run([f"{BIN}/nvdisasm", "-c", f.name], capture_output=True, text=True).stdout.splitlines()
    address = lambda line: int(re.search(r"/\*([0-9a-f]{4})\*/", line).group(1), 16)  # noqa: E731
    labels, current, code = {}, None, []
    for line in sass:
        if m := re.match(r"\.L_x_(\d+):", line.strip()):
            current = m.group(1)
        elif re.search(r"/\*[0-9a-f]{4}\*/", line):
            code.append(line)
            if current is not None:
                labels.setdefault(current, address(line))
    for line in code:  # the loop: a branch back to an earlier label
        m = re.search(r"BRA.*\.L_x_(\d+)", line)
        if m and labels.get(m.group(1), 1 << 30) < address(line):
            first, last = labels[m.group(1)], address(line)
            body = [c for c in code if first <= address(c) <= last]
            return " ".join(re.findall(r"REG:\d+|SHARED:\d+", usage)), Counter(
                re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", c).group(1) for c in body
            )
    raise RuntimeError("no loop found")


def split_errors(seed: int = 0) -> dict[str, float]:
    """Largest error / largest output of x (8, 640) @ w (4096, 640)^T, against float64, for each way."""
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.standard_normal((8, 640)).astype(np.float32), 0)
    w = (rng.standard_normal((4096, 640)) * 0.05).astype(np.float32)

    def rna(a):  # to TF32, to nearest, ties away from zero (cvt.rna.tf32)
        return ((a.view(np.int32).astype(np.int64) + 0x1000) & ~0x1FFF).astype(np.int32).view(np.float32)

    def truncated(a):  # what the tensor cores read of a float32 operand
        return (a.view(np.int32) & np.int32(-0x2000)).view(np.float32)

    def mm(a, b):
        return a.astype(np.float64) @ b.astype(np.float64).T

    exact, (xh, wh) = mm(x, w), (rna(x), rna(w))
    ways = {
        "the patch's tf32x3": mm(truncated(x - xh), wh) + mm(xh, truncated(w - wh)) + mm(xh, wh),
        "tl.dot tf32x3": mm(rna(x - xh), wh) + mm(xh, rna(w - wh)) + mm(xh, wh),
        "float32 (NumPy)": (x @ w.T).astype(np.float64),
        "one TF32 product": mm(truncated(x), truncated(w)),
    }
    scale = np.abs(exact).max()
    return {name: float(np.abs(got - exact).max() / scale) for name, got in ways.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--fp32", default="tf32x3", choices=["tf32x3", "ieee"], help="float32 products of the joint")
    args = ap.parse_args()
    resources, mix = loop_mix(compile_joint(args.dtype, args.fp32).asm["cubin"])
    print(
        f"_joint_kernel, one-row tiles, {args.dtype}{'' if args.dtype != 'float32' else ' ' + args.fp32}: {resources}"
    )
    print(f"k loop: {sum(mix.values())} instructions a chunk:", ", ".join(f"{k} {v}" for k, v in mix.most_common(12)))
    for name, error in split_errors().items():
        print(f"split error against float64, {name}: {error:.1e}")


if __name__ == "__main__":
    main()
