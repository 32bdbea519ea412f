#!/usr/bin/env python
"""Long recordings on one GPU: local / auto / full attention, and the full-attention encoder old vs SDPA.

    python scripts/long_audio_bench.py --model /tmp/v3.nemo --out bench/long-audio
    python scripts/long_audio_bench.py --model demo --device cpu --minutes 0.2,0.5 --batch-sizes 1,2 \\
        --dtypes float32 --budget-seconds 60 --out /tmp/bench        # a quick check on the CPU

Part 1, long audio: recordings of `--minutes` made in memory by repeating the speech shipped with
the package (and the test fixtures when present), each transcribed end to end (features, encoder,
decoding, text) with `--attention` local, auto and full, per `--dtypes`: wall seconds, RTFx, peak
GPU memory (allocated and reserved), tokens, and whether auto switched to local attention. An
out-of-memory error is a result ("OOM"), not a failure.

Part 2, encoder only, full attention: batches of 1, 8, 32, 128 copies of a 7.4 s and a 20 s clip,
per dtype, the previous formulation (NeMo's matmul / rel_shift / softmax, several (B, H, T, T)
tensors) against scaled_dot_product_attention with the position bias: median of `--reps` after
a warm-up, and the largest difference between the two outputs.

Everything is timed with CUDA synchronised around it. `--budget-seconds` bounds the whole run:
a row whose predicted time (from the rows before it: linear in length for local attention,
quadratic for full) would not fit in what is left is skipped and listed as such. Writes
results.json and results.md to `--out`.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

import graphscribe
from graphscribe.api import load_model
from graphscribe.model import encoder as encoder_module

ROOT = Path(__file__).resolve().parent.parent
SPEECH = [
    ROOT / "src/graphscribe/data/librispeech_2086-149220-0033.wav",
    ROOT / "tests/fixtures/nemo-timestamps/clips/long_mix_62s.flac",
    *sorted((ROOT / "tests/fixtures/nemo-timestamps/clips").glob("demo*.flac")),
    *sorted((ROOT / "tests/fixtures/demo-heldout").glob("*.wav")),
]
SAMPLE_RATE = 16000


def say(*parts) -> None:
    print(*parts, flush=True)


def speech(sample_rate: int) -> np.ndarray:
    """The shipped 16 kHz mono speech, one after the other (the package's own clip at least)."""
    parts = []
    for path in SPEECH:
        if path.exists():
            audio, rate = sf.read(path, dtype="float32")
            if rate == sample_rate and audio.ndim == 1:
                parts.append(audio)
    if not parts:
        raise SystemExit(f"no {sample_rate} Hz speech found under {ROOT}")
    return np.concatenate(parts)


def recording(source: np.ndarray, seconds: float, sample_rate: int) -> torch.Tensor:
    return torch.from_numpy(np.resize(source, int(seconds * sample_rate)))


class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 2),
    }


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err)


def predicted(done: list[dict], minutes: float, attention: str) -> float:
    """Seconds a row should take, from the longest finished row of the same kind (0 when none)."""
    if not done:
        return 0.0
    last = max(done, key=lambda r: r["minutes"])
    power = 2 if attention == "full" else 1
    return last["seconds"] * (minutes / last["minutes"]) ** power


def long_audio(args, device: torch.device, budget: Budget) -> tuple[list[dict], float | None]:
    """Rows of part 1, shortest recordings first for every dtype; and the GiB the loaded weights take."""
    source = speech(SAMPLE_RATE)
    models = {}
    for dtype in args.dtypes:
        say(f"\n== long audio: loading {args.model} in {dtype}")
        model = load_model(args.model, device=args.device, dtype=dtype)
        warm = recording(source, 20, model.sample_rate)
        for attention in ("local", "full"):  # compile the decode step and capture its graphs once
            model.options = replace(model.options, attention=attention)
            model.transcribe([warm])
        models[dtype] = model
    reset_peak(device)
    weights = round(torch.cuda.memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None
    say(f"weights and buffers of {len(models)} model(s) in memory: {weights} GiB (in every peak below)")
    rows = []
    finished: dict[tuple[str, str], list[dict]] = {}
    failed: set[tuple[str, str]] = set()
    for minutes in args.minutes:
        audio = recording(source, minutes * 60, SAMPLE_RATE)
        for dtype, model in models.items():
            for attention in args.attention:
                kind = (dtype, attention)
                row = {"dtype": dtype, "minutes": minutes, "attention": attention}
                guess = predicted(finished.get(kind, []), minutes, attention)
                if kind in failed:
                    row["status"] = "skipped: OOM at a shorter length"
                elif guess > budget.left() - args.reserve_seconds:
                    row["status"] = f"skipped: predicted {guess:.0f} s, {budget.left():.0f} s left"
                else:
                    row.update(transcribe_one(model, audio, attention, args.window, device))
                    if row["status"] == "ok":
                        finished.setdefault(kind, []).append(row)
                    elif row["status"] == "OOM":
                        failed.add(kind)
                rows.append(row)
                say(format_row(row))
    return rows, weights


def transcribe_one(model, audio: torch.Tensor, attention: str, window: int, device: torch.device) -> dict:
    model.options = replace(model.options, attention=attention, attention_window=window)
    logging.disable(logging.WARNING)  # the run itself says when auto switches
    chosen = model.attention_for([audio.numel()], ["recording"])
    logging.disable(logging.NOTSET)
    reset_peak(device)
    sync(device)
    start = time.perf_counter()
    try:
        [transcript] = model.transcribe([audio])
        sync(device)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        reset_peak(device)
        return {"status": "OOM", "error": str(err).splitlines()[0][:200]}
    seconds = time.perf_counter() - start
    if transcript.error is not None:
        status = "OOM" if "out of" in transcript.error and "memory" in transcript.error else "error"
        return {"status": status, "error": transcript.error}
    return {
        "status": "ok",
        "seconds": round(seconds, 3),
        "rtfx": round(audio.numel() / model.sample_rate / seconds, 1),
        "tokens": len(transcript.token_ids),
        "ran": "full" if chosen is None else f"local {list(chosen)}",
        "auto_switched": attention == "auto" and chosen is not None,
        **peak(device),
    }


def format_row(row: dict) -> str:
    head = f"{row['dtype']:>8} {row['minutes']:>6g} min {row['attention']:>5}"
    if row["status"] != "ok":
        return f"{head}: {row['status']}"
    return (
        f"{head}: {row['seconds']:8.2f} s  RTFx {row['rtfx']:8.1f}  tokens {row['tokens']:6d}  "
        f"{row['ran']:<14} peak {row['peak_allocated_gib']} / {row['peak_reserved_gib']} GiB"
    )


def encoder_table(args, device: torch.device, budget: Budget) -> list[dict]:
    rows = []
    source = speech(SAMPLE_RATE)
    for dtype in args.dtypes:
        say(f"\n== encoder only, full attention, {dtype}")
        model = load_model(args.model, device=args.device, dtype=dtype, attention="full")
        for clip_seconds in args.clip_seconds:
            clip = recording(source, clip_seconds, model.sample_rate)
            for batch in args.batch_sizes:
                if budget.left() < args.reserve_seconds:
                    rows.append(
                        {"dtype": dtype, "clip_seconds": clip_seconds, "batch": batch, "status": "skipped: budget"}
                    )
                    say(f"{dtype:>8} {clip_seconds:g} s x {batch}: skipped (budget)")
                    continue
                features, lengths = model.features([clip] * batch)
                features = features.to(model.dtype)
                row = {"dtype": dtype, "clip_seconds": clip_seconds, "batch": batch, "status": "ok"}
                outputs = {}
                for name, attend in (
                    ("einsum", encoder_module._full_attention_nemo),
                    ("sdpa", encoder_module.full_attention),
                ):
                    timing = time_encoder(model, features, lengths, attend, args.reps, device)
                    row.update({f"{name}_{k}": v for k, v in timing.items() if k != "output"})
                    outputs[name] = timing.get("output")
                if outputs["einsum"] is not None and outputs["sdpa"] is not None:
                    row["max_abs_diff"] = float((outputs["einsum"].float() - outputs["sdpa"].float()).abs().max())
                if row.get("einsum_ms") and row.get("sdpa_ms"):
                    row["speedup"] = round(row["einsum_ms"] / row["sdpa_ms"], 2)
                rows.append(row)
                say(
                    f"{dtype:>8} {clip_seconds:g} s x {batch:3d}: einsum {row.get('einsum_ms', row.get('einsum_status'))} ms "
                    f"(peak {row.get('einsum_peak_allocated_gib')} GiB), sdpa {row.get('sdpa_ms', row.get('sdpa_status'))} "
                    f"ms (peak {row.get('sdpa_peak_allocated_gib')} GiB), speedup {row.get('speedup')}, "
                    f"max diff {row.get('max_abs_diff')}"
                )
                del features
        del model
        reset_peak(device)
    return rows


@torch.inference_mode()
def time_encoder(model, features, lengths, attend, reps: int, device: torch.device) -> dict:
    """Median milliseconds of the encoder with `attend` as its full attention (warm-up first)."""
    saved = encoder_module.full_attention
    encoder_module.full_attention = attend
    try:
        reset_peak(device)
        output, _ = model.module.encoder(features, lengths)  # warm-up
        times = []
        for _ in range(reps):
            sync(device)
            start = time.perf_counter()
            output, _ = model.module.encoder(features, lengths)
            sync(device)
            times.append((time.perf_counter() - start) * 1000)
        return {
            "ms": round(statistics.median(times), 2),
            "min_ms": round(min(times), 2),
            "max_ms": round(max(times), 2),
            **{f"{k}": v for k, v in peak(device).items()},
            "output": output,
        }
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        reset_peak(device)
        return {"status": "OOM"}
    finally:
        encoder_module.full_attention = saved


def markdown(report: dict) -> str:
    lines = [
        f"# Long audio and the full-attention encoder: {report['device']}",
        "",
        f"`{report['command']}`",
        "",
        f"model `{report['model']}`, torch {report['torch']}, graphscribe {report['graphscribe']} "
        f"({report['commit']}), {report['total_seconds']} s in all.",
        "",
        "## Long recordings, end to end",
        "",
        f"Peaks include the weights of all dtypes' models, loaded together: {report['weights_gib']} GiB.",
        "",
        "| dtype | minutes | --attention | ran | seconds | RTFx | tokens | peak allocated GiB | peak reserved GiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["long_audio"]:
        if r["status"] == "ok":
            lines.append(
                f"| {r['dtype']} | {r['minutes']:g} | {r['attention']} | {r['ran']} | {r['seconds']} | "
                f"{r['rtfx']} | {r['tokens']} | {r['peak_allocated_gib']} | {r['peak_reserved_gib']} |"
            )
        else:
            lines.append(f"| {r['dtype']} | {r['minutes']:g} | {r['attention']} | {r['status']} | | | | | |")
    lines += [
        "",
        "## Encoder only, full attention: NeMo's formulation (einsum) vs SDPA with the position bias",
        "",
        "| dtype | clip s | batch | einsum ms | SDPA ms | speedup | einsum peak GiB | SDPA peak GiB | max abs diff |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["encoder"]:
        if r["status"] != "ok":
            lines.append(f"| {r['dtype']} | {r['clip_seconds']:g} | {r['batch']} | {r['status']} | | | | | |")
            continue
        lines.append(
            f"| {r['dtype']} | {r['clip_seconds']:g} | {r['batch']} | {r.get('einsum_ms', 'OOM')} | "
            f"{r.get('sdpa_ms', 'OOM')} | {r.get('speedup', '')} | {r.get('einsum_peak_allocated_gib')} | "
            f"{r.get('sdpa_peak_allocated_gib')} | {r.get('max_abs_diff', '')} |"
        )
    return "\n".join(lines) + "\n"


def _numbers(text: str, kind=float) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help=".nemo file, folder, Hugging Face id or demo")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--minutes", type=_numbers, default=_numbers("10,30,60,180"))
    parser.add_argument("--attention", type=lambda s: s.split(","), default=["local", "auto", "full"])
    parser.add_argument("--window", type=int, default=256, help="local attention: frames each side")
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=["bfloat16", "float32"])
    parser.add_argument("--batch-sizes", type=lambda s: _numbers(s, int), default=[1, 8, 32, 128])
    parser.add_argument("--clip-seconds", type=_numbers, default=[7.4, 20.0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--budget-seconds", type=float, default=400.0)
    parser.add_argument("--reserve-seconds", type=float, default=10.0, help="kept back for writing the results")
    parser.add_argument("--skip-encoder", action="store_true")
    parser.add_argument("--skip-long", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA here (use --device cpu for a quick check)")
    budget = Budget(args.budget_seconds)
    start = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    say(f"device {name}, torch {torch.__version__}, budget {args.budget_seconds:.0f} s")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = "?"
    report = {
        "device": name,
        "torch": torch.__version__,
        "graphscribe": graphscribe.__version__ if hasattr(graphscribe, "__version__") else "?",
        "commit": commit or "?",
        "model": str(args.model),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "long_audio": [],
        "encoder": [],
        "weights_gib": None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    budget_encoder = Budget(min(args.budget_seconds * 0.3, budget.left()))  # part 2 first, at most 30% of the time
    if not args.skip_encoder:
        report["encoder"] = encoder_table(args, device, budget_encoder)
    if not args.skip_long:
        report["long_audio"], report["weights_gib"] = long_audio(args, device, budget)
    report["total_seconds"] = round(time.perf_counter() - start, 1)
    (args.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(report))
    say(f"\nwrote {args.out / 'results.json'} and {args.out / 'results.md'} ({report['total_seconds']} s)")


if __name__ == "__main__":
    main()
