#!/usr/bin/env python
"""Where the encoder's GPU time goes, by kernel kind, and what its float32 matrix products could run at.

    python scripts/encoder_profile.py --model v3.nemo --json $OUT/encoder-profile.json --md $OUT/encoder-profile.md

Part 1 (profile): for each "dtype batch seconds" config, the encoder alone, eagerly (features made beforehand;
real speech, rows 3% shorter each as a folder's batches are), under torch.profiler: GPU time of its kernels by
kind (matrix products, attention, softmax, layer norm, convolutions, element-wise, copies, other), the matrix
products' FLOPs (the profiler's count for aten::mm/addmm/bmm) and the rate they ran at.

Also the same by aten op and input shapes (the op whose kernels they are), and the subsampling alone.

Part 2 (gemm): the encoder's float32 linear layers' shapes (x (M, K) times W (N, K)^T) at the M of each config:
cuBLAS with float32 products (TF32 off, as graphscribe and NeMo run float32) against a Triton kernel whose
products are split in three TF32 products ("tf32x3", float32's accuracy on tensor cores, as the decode step's);
milliseconds (CUDA events, median of 20), TFLOPS, and each one's largest error against float64 products,
relative to the largest output.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import torch
import triton
import triton.language as tl
from encoder_graphs import batch_of  # scripts/ is on the path when run as a script

import graphscribe
from graphscribe.bench import speech_path

KINDS = (  # first match wins: (kind, substrings of the kernel's name, lower case)
    ("attention", ("fmha", "attention", "flash", "efficient")),
    ("matrix products", ("gemm", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "matmul", "_mm_")),
    ("softmax", ("softmax",)),
    ("layer norm", ("layer_norm", "layernorm")),
    ("convolutions", ("conv", "depthwise", "im2col", "col2im")),
    ("copies", ("copy", "memcpy", "memset", "cat")),
    ("element-wise", ("elementwise", "vectorized", "unrolled", "reduce", "index", "masked", "fill")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile_config(model, speech, dtype: str, batch: int, seconds: float, reps: int) -> dict:
    features, frames = model.features(batch_of(model, speech, batch, seconds))
    features = features.to(model.dtype)

    def run():
        return model.module.encoder(features, frames)

    with torch.inference_mode():
        for _ in range(2):
            out, _ = run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        torch.cuda.synchronize()
        forward_ms = start.elapsed_time(end) / reps
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts, with_flops=True, record_shapes=True) as prof:
            for _ in range(reps):
                run()
            torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            model.module.encoder.pre_encode(features.transpose(1, 2), frames)
        end.record()
        torch.cuda.synchronize()
        subsampling_ms = start.elapsed_time(end) / reps
    by_kind: dict[str, float] = defaultdict(float)
    by_kernel: dict[str, list] = defaultdict(lambda: [0.0, 0])
    flops = 0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            us = evt.device_time
            by_kind[kind_of(evt.name)] += us / reps
            by_kernel[evt.name][0] += us / reps
            by_kernel[evt.name][1] += 1
        elif evt.name in ("aten::mm", "aten::addmm", "aten::bmm") and evt.flops:
            flops += evt.flops
    flops /= reps
    kernel_ms = sum(by_kind.values()) / 1e3
    gemm_ms = by_kind.get("matrix products", 0.0) / 1e3
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:15]
    ops = [
        {
            "op": a.key,
            "shapes": str(a.input_shapes)[:160],
            "ms": a.self_device_time_total / reps / 1e3,
            "calls": a.count // reps,
        }
        for a in prof.key_averages(group_by_input_shape=True)
        if a.self_device_time_total > 0
    ]
    ops = sorted(ops, key=lambda o: -o["ms"])[:30]
    return {
        "dtype": dtype,
        "batch": batch,
        "seconds": seconds,
        "encoder_frames": int(out.shape[1]),
        "rows_x_frames": int(out.shape[0] * out.shape[1]),
        "forward_ms": forward_ms,
        "kernel_ms": kernel_ms,
        "by_kind_ms": {k: v / 1e3 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "gemm_tflop": flops / 1e12,
        "gemm_tflops_rate": flops / 1e12 / (gemm_ms / 1e3) if gemm_ms else None,
        "subsampling_ms": subsampling_ms,
        "top_kernels": [{"name": n[:120], "ms": v[0] / 1e3, "calls": v[1] // reps} for n, v in top],
        "top_ops": ops,
    }


@triton.jit
def _mm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    som,
    son,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """out (M, N) = x (M, K) @ w (N, K)^T in float32, products in PRECISION."""
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    in_group = GROUP * grid_n
    first_m = (pid // in_group) * GROUP
    size_m = min(grid_m - first_m, GROUP)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(
            x_ptr + rm[:, None] * sxm + (k0 + rk)[None, :] * sxk,
            mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            w_ptr + rn[None, :] * swn + (k0 + rk)[:, None] * swk,
            mask=(rn[None, :] < N) & ((k0 + rk)[:, None] < K),
            other=0.0,
        )
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    tl.store(out_ptr + rm[:, None] * som + rn[None, :] * son, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


TRITON_CONFIGS = [  # BM, BN, BK, stages, warps
    (128, 128, 32, 3, 8),
    (128, 256, 32, 3, 8),
    (128, 128, 64, 3, 8),
    (64, 128, 32, 4, 4),
    (128, 64, 32, 4, 4),
    (256, 128, 32, 3, 8),
]


def triton_mm(x, w, config, precision="tf32x3"):
    bm, bn, bk, stages, warps = config
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _mm_kernel[grid](
        x,
        w,
        out,
        m,
        n,
        k,
        *x.stride(),
        *w.stride(),
        *out.stride(),
        BM=bm,
        BN=bn,
        BK=bk,
        GROUP=8,
        PRECISION=precision,
        num_stages=stages,
        num_warps=warps,
    )
    return out


def time_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gemm_rows(m_values: list[int], d_model: int, expansion: int) -> list[dict]:
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = [
        (d_model, d_model * expansion),
        (d_model * expansion, d_model),
        (d_model, d_model),
        (d_model, 2 * d_model),
    ]  # (K, N): feed-forward in and out, attention, the conv module's first
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m in m_values:
        for k, n in shapes:
            x = torch.randn(m, k, device="cuda", generator=gen)
            w = torch.randn(n, k, device="cuda", generator=gen) / k**0.5
            exact = x.double() @ w.double().T
            scale = exact.abs().max().item()
            flop = 2.0 * m * n * k
            row = {"m": m, "k": k, "n": n}
            cublas = x @ w.T
            row["cublas_fp32"] = {
                "ms": time_ms(lambda: x @ w.T),
                "max_error": (cublas.double() - exact).abs().max().item() / scale,
            }
            best = None
            for config in TRITON_CONFIGS:
                try:
                    got = triton_mm(x, w, config)
                    ms = time_ms(lambda: triton_mm(x, w, config))
                except Exception as err:  # noqa: BLE001 - a config that does not fit is reported, not fatal
                    print(f"  config {config}: {type(err).__name__}: {str(err)[:100]}")
                    continue
                if best is None or ms < best["ms"]:
                    best = {
                        "ms": ms,
                        "config": list(config),
                        "max_error": (got.double() - exact).abs().max().item() / scale,
                    }
            row["triton_tf32x3"] = best
            for name in ("cublas_fp32", "triton_tf32x3"):
                if row[name]:
                    row[name]["tflops"] = flop / row[name]["ms"] / 1e9
            rows.append(row)
            t = row["triton_tf32x3"] or {}
            print(
                f"gemm M={m:6d} K={k:5d} N={n:5d}  cuBLAS fp32 {row['cublas_fp32']['ms']:7.3f} ms "
                f"({row['cublas_fp32']['tflops']:5.1f} TFLOPS, err {row['cublas_fp32']['max_error']:.1e})  "
                f"tf32x3 {t.get('ms', float('nan')):7.3f} ms ({t.get('tflops', float('nan')):5.1f} TFLOPS, "
                f"err {t.get('max_error', float('nan')):.1e}, {t.get('config')})",
                flush=True,
            )
    return rows


def markdown(profiles: list[dict], gemms: list[dict]) -> str:
    lines = [
        "# The encoder's GPU time by kernel kind (eager, torch.profiler)",
        "",
        "| dtype | B | s | rows x frames | forward ms | kernels ms | matrix products ms (TFLOPS) | attention "
        "| softmax | layer norm | convolutions | element-wise | copies | other |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in profiles:
        k = p["by_kind_ms"]
        rate = f" ({p['gemm_tflops_rate']:.1f})" if p["gemm_tflops_rate"] else ""
        cells = [
            f"{k.get(name, 0.0):.2f}"
            for name in ("attention", "softmax", "layer norm", "convolutions", "element-wise", "copies", "other")
        ]
        lines.append(
            f"| {p['dtype']} | {p['batch']} | {p['seconds']:g} | {p['rows_x_frames']} | "
            f"{p['forward_ms']:.2f} | {p['kernel_ms']:.2f} | {k.get('matrix products', 0.0):.2f}{rate} | "
            + " | ".join(cells)
            + " |"
        )
    if gemms:
        lines += [
            "",
            "# float32 matrix products: cuBLAS (float32 products) against Triton tf32x3",
            "",
            "| M | K | N | cuBLAS ms | TFLOPS | error | tf32x3 ms | TFLOPS | error | tile |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for g in gemms:
            c, t = g["cublas_fp32"], g["triton_tf32x3"] or {}
            lines.append(
                f"| {g['m']} | {g['k']} | {g['n']} | {c['ms']:.3f} | {c['tflops']:.1f} | "
                f"{c['max_error']:.1e} | {t.get('ms', float('nan')):.3f} | {t.get('tflops', float('nan')):.1f} "
                f"| {t.get('max_error', float('nan')):.1e} | {t.get('config')} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", default="float32 8 10;float32 32 10;bfloat16 128 10", help='"dtype batch seconds;..."')
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-gemm", action="store_true", help="leave part 2 out")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    configs = [(d, int(b), float(s)) for d, b, s in (c.split() for c in args.configs.split(";"))]
    profiles, m_values, d_model, expansion = [], [], 0, 4
    for dtype in dict.fromkeys(d for d, _, _ in configs):
        model = graphscribe.load_model(args.model, device="cuda", dtype=dtype, graphs=False)
        cfg = model.module.encoder.cfg
        d_model, expansion = cfg.d_model, cfg.ff_expansion
        speech = torch.cat(
            [model.read(speech_path(n)) for n in ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac")]
        )
        for d, batch, seconds in configs:
            if d != dtype:
                continue
            p = profile_config(model, speech, dtype, batch, seconds, args.reps)
            profiles.append(p)
            if dtype == "float32":
                m_values.append(p["rows_x_frames"])
            print(json.dumps({k: v for k, v in p.items() if k not in ("top_kernels", "top_ops")}), flush=True)
            for kernel in p["top_kernels"]:
                print(f"    {kernel['ms']:8.3f} ms  {kernel['calls']:4d}x  {kernel['name']}")
            for op in p["top_ops"]:  # self GPU time of the aten op that launched the kernels, by input shapes
                print(f"    {op['ms']:8.3f} ms  {op['calls']:4d}x  {op['op']}  {op['shapes']}")
        del model
        torch.cuda.empty_cache()
    gemms = [] if args.no_gemm or not m_values else gemm_rows(m_values, d_model, expansion)
    if args.json:
        args.json.write_text(
            json.dumps({"device": torch.cuda.get_device_name(), "profiles": profiles, "gemm": gemms}, indent=1)
        )
    if args.md:
        args.md.write_text(markdown(profiles, gemms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
