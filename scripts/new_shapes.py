#!/usr/bin/env python
"""What a batch of a new shape costs, stage by stage, and what each remedy does to it and to the numbers.

    python scripts/new_shapes.py --model v3.nemo --configs "bfloat16 128;float32 8" --json $OUT/new_shapes.json

A folder's batches are cut longest first, so almost every batch has a length no batch before it had, and every
library that plans per shape (cuFFT's STFT plans, cuDNN's convolution plans, a captured encoder layer) plans
again. For each config (dtype, batch) and each variant, a fresh process loads the model, runs one warm-up batch,
then for each of --lengths (seconds; rows alternate that length and three quarters of it) times each stage
synchronised: its first call (a new shape) and the least of two more (plans cached). Stages: features, the
subsampling convolutions, the encoder (its subsampling already planned, so the layers' cost), decoding. Variants:

  default       as shipped
  v7-api        TORCH_CUDNN_V8_API_DISABLED=1 (cuDNN's older API: no execution plans to build)
  heur-b        TORCH_CUDNN_USE_HEURISTIC_MODE_B=1
  no-cudnn-sub  the subsampling convolutions with cuDNN off (PyTorch's own kernels; now the default)
  cudnn-sub     the subsampling convolutions through cuDNN, in one call (the default before session 18)
  fft-rows      the STFT as windowed frames and torch.fft.rfft on a fixed number of rows a call (one cuFFT plan)
  no-graphs     graphs off (no captured encoder layer per shape)

Each variant's features and subsampling output are hashed per length; the report says which variants give the
default's exact bits (what float32 parity with NeMo needs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "default": {},
    "v7-api": {"TORCH_CUDNN_V8_API_DISABLED": "1"},
    "heur-b": {"TORCH_CUDNN_USE_HEURISTIC_MODE_B": "1"},
    "no-cudnn-sub": {},
    "cudnn-sub": {},
    "fft-rows": {},
    "no-graphs": {},
}
STAGES = ("features", "subsampling", "encoder", "decode")
FFT_ROWS = 1 << 15


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", default="bfloat16 128;float32 8")
    ap.add_argument("--variants", default="default,cudnn-sub")
    ap.add_argument("--lengths", default="29.3,23.1,17.9,13.7,10.9,8.3")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        dtype, batch, variant = args.child.split(":")
        print("RESULT " + json.dumps(child(args.model, dtype, int(batch), variant, args.lengths)), flush=True)
        return 0
    runs = []
    for config in args.configs.split(";"):
        dtype, batch = config.split()
        for variant in args.variants.split(","):
            env = dict(os.environ, **VARIANTS[variant])
            start = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--model",
                    args.model,
                    "--lengths",
                    args.lengths,
                    "--child",
                    f"{dtype}:{batch}:{variant}",
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            lines = [line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(f"{dtype} B={batch} {variant}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
                continue
            run = json.loads(lines[-1])
            run["process_s"] = time.perf_counter() - start
            runs.append(run)
            print(summary_line(run), flush=True)
    report = dict(model=args.model, lengths=args.lengths, runs=runs)
    text = table(runs)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.md:
        args.md.write_text(text)
    return 0


def child(model_path: str, dtype: str, batch: int, variant: str, lengths: str) -> dict:
    import torch

    import graphscribe
    from graphscribe import encoder as encoder_module

    model = graphscribe.load_model(model_path, dtype=dtype, graphs=variant != "no-graphs")
    if variant == "no-cudnn-sub":
        convs = encoder_module.Subsampling._convs

        def without_cudnn(self, x, lengths):
            with torch.backends.cudnn.flags(enabled=False):
                return convs(self, x, lengths)

        encoder_module.Subsampling._convs = without_cudnn
    if variant == "cudnn-sub":
        encoder_module.Subsampling._convs = lambda self, x, lengths: self._conv_stack(x.unsqueeze(1), lengths)
    if variant == "fft-rows":
        torch.stft = fixed_rows_stft(torch.stft)
    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rate = model.sample_rate
    sub = model.module.encoder.pre_encode
    gen = torch.Generator().manual_seed(0)

    def batch_of(seconds: float):
        n = int(seconds * rate)
        audio = torch.randn(batch, n, generator=gen) * 0.1
        audio = audio.pin_memory() if cuda else audio
        counts = torch.full((batch,), n, dtype=torch.long)
        counts[1::2] = n * 3 // 4
        for row in range(1, batch, 2):
            audio[row, n * 3 // 4 :] = 0
        return audio, counts

    def timed_stages(audio, counts) -> tuple[dict, dict]:
        seconds, outs = {}, {}
        with torch.inference_mode():
            start = time.perf_counter()
            feats, frames = model.padded_features(audio, counts)
            sync()
            seconds["features"] = time.perf_counter() - start
            start = time.perf_counter()
            outs["subsampling"] = sub(feats.to(model.dtype).transpose(1, 2), frames)[0]
            sync()
            seconds["subsampling"] = time.perf_counter() - start
            start = time.perf_counter()
            encoded, enc_lengths = model.encoder_output(feats, frames)
            sync()
            seconds["encoder"] = time.perf_counter() - start
            outs["encoder"] = encoded
            start = time.perf_counter()
            model.decode(encoded, enc_lengths)
            sync()
            seconds["decode"] = time.perf_counter() - start
            outs["features"] = feats
        return seconds, outs

    timed_stages(*batch_of(5.0))  # libraries, kernels, the decoder's buffers
    rows = []
    for seconds in (float(s) for s in lengths.split(",")):
        audio, counts = batch_of(seconds)
        first, outs = timed_stages(audio, counts)
        again = [timed_stages(audio, counts)[0] for _ in range(2)]
        rows.append(
            dict(
                seconds=seconds,
                first=first,
                again={s: min(a[s] for a in again) for s in STAGES},
                hashes={k: digest(v) for k, v in outs.items()},
            )
        )
    return dict(
        dtype=dtype,
        batch=batch,
        variant=variant,
        rows=rows,
        device=torch.cuda.get_device_name() if cuda else "cpu",
        torch=torch.__version__,
    )


def fixed_rows_stft(stft):
    """torch.stft (center=False) as windowed frames through torch.fft.rfft, FFT_ROWS frames a call."""
    import torch
    import torch.nn.functional as F

    def replacement(x, n_fft, hop_length=None, win_length=None, window=None, center=True, return_complex=None, **kw):
        if center or x.dim() != 2:
            return stft(
                x,
                n_fft,
                hop_length=hop_length,
                win_length=win_length,
                window=window,
                center=center,
                return_complex=return_complex,
                **kw,
            )
        left = (n_fft - window.numel()) // 2
        window = F.pad(window, (left, n_fft - window.numel() - left))
        frames = x.unfold(-1, n_fft, hop_length)  # (B, F, n_fft)
        b, f, _ = frames.shape
        flat = (frames * window).reshape(b * f, n_fft)
        out = torch.empty(b * f, n_fft // 2 + 1, dtype=torch.complex64, device=x.device)
        for start in range(0, b * f, FFT_ROWS):
            part = flat[start : start + FFT_ROWS]
            rows = part.shape[0]
            if rows < FFT_ROWS:
                part = F.pad(part, (0, 0, 0, FFT_ROWS - rows))
            out[start : start + rows] = torch.fft.rfft(part)[:rows]
        return out.reshape(b, f, -1).transpose(1, 2)

    return replacement


def digest(t) -> str:
    import torch

    data = t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha1(data).hexdigest()[:12]


def new_shape_ms(run: dict, stage: str) -> float:
    rows = run["rows"]
    return 1e3 * sum(r["first"][stage] - r["again"][stage] for r in rows) / len(rows)


def summary_line(run: dict) -> str:
    parts = ", ".join(f"{s} {new_shape_ms(run, s):.1f}" for s in STAGES)
    return f"{run['dtype']} B={run['batch']} {run['variant']}: ms a new shape: {parts} ({run['process_s']:.0f} s)"


def table(runs: list[dict]) -> str:
    lines = [
        "Host cost of a new batch shape, ms (first call less the cached call, mean over the lengths); "
        "GPU ms of a cached call summed over the lengths; bits: features / subsampling / encoder the same as "
        "the default's on every length.",
        "",
        "| dtype | B | variant | "
        + " | ".join(f"{s} new" for s in STAGES)
        + " | "
        + " | ".join(f"{s} cached" for s in STAGES)
        + " | bits |",
        "| --- | --- | --- | " + " | ".join("---" for _ in STAGES * 2) + " | --- |",
    ]
    default = {(r["dtype"], r["batch"]): r for r in runs if r["variant"] == "default"}
    for run in runs:
        base = default.get((run["dtype"], run["batch"]))
        same = "-"
        if base is not None:
            same = " / ".join(
                "yes" if all(a["hashes"][k] == b["hashes"][k] for a, b in zip(run["rows"], base["rows"])) else "no"
                for k in ("features", "subsampling", "encoder")
            )
        cached = [1e3 * sum(r["again"][s] for r in run["rows"]) for s in STAGES]
        lines.append(
            f"| {run['dtype']} | {run['batch']} | {run['variant']} | "
            + " | ".join(f"{new_shape_ms(run, s):.1f}" for s in STAGES)
            + " | "
            + " | ".join(f"{c:.1f}" for c in cached)
            + f" | {same} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
