"""`transcribe bench`: decoding with and without CUDA graphs, measured side by side in one run; and
the throughput of a folder of files, end to end.

Decoding (`run_bench`): for each tier (about 7.4 s, 23 s and 77 s of real speech by default):
decode-only timings for each batch size (the clip repeated B times), and end to end (audio in,
text out, B=1), once eagerly and once replaying CUDA graphs. Each row: median of `reps` timed
runs after a warm-up (which includes capture; capture time is reported apart), min and max,
decode steps and microseconds per step, peak GPU memory, and whether the modes agree exactly.

Throughput (`run_throughput`): files in, transcripts written, through the pipeline `transcribe`
uses, for each batch size and graph mode: RTFx, seconds per stage, peak GPU memory and host RSS,
beside the same clips transcribed from memory. `make_folder` writes a folder of real speech with
LibriSpeech-like lengths for it (`scripts/make_folder.py`, `transcribe bench --throughput`).
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from graphscribe import __version__
from graphscribe.io.audio import speech_path
from graphscribe.model.decoding import default_window, size_class

TIER_SECONDS = (7.4, 23.0, 77.0)
SPEECH = ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac")  # shipped in graphscribe/data


@dataclass
class Tier:
    name: str
    audio: torch.Tensor  # (L,) at the model's rate


def tier_clips(model, clips: list[Path] | None = None, lengths: tuple[float, ...] = TIER_SECONDS) -> list[Tier]:
    """The given clips, or real speech joined to about each of `lengths` seconds (7.4 s, 23 s and 77 s)."""
    if clips:
        return [Tier(Path(c).name, model.read(c)) for c in clips]
    parts = [model.read(speech_path(name)) for name in SPEECH]
    tiers = []
    for seconds in lengths:
        want = round(seconds * model.sample_rate)
        if want <= parts[0].numel():  # the LibriSpeech clip itself (7.435 s)
            tiers.append(Tier(f"{parts[0].numel() / model.sample_rate:.1f} s", parts[0]))
            continue
        joined, i = [], 0
        while sum(p.numel() for p in joined) < want:
            joined.append(parts[i % len(parts)])
            i += 1
        tiers.append(Tier(f"{seconds:g} s", torch.cat(joined)[:want]))
    return tiers


def timed(fn, device: torch.device, reps: int) -> tuple[list[float], object]:
    """Run fn once to warm up, then `reps` times; seconds per timed run and the last result."""
    result = fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times, result


def _stats(times: list[float]) -> dict:
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3, "max_ms": max(times) * 1e3}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def run_bench(
    model, tiers: list[Tier], batch_sizes: list[int], reps: int, modes: list[bool], announce=lambda row: None
) -> dict:
    """Measure every (tier, batch size, mode); returns a JSON-ready report. `announce` gets a line naming each
    row as it starts."""
    device = model.device
    report = {**header(model, reps), "tiers": []}
    graphs_before = model.options.graphs
    for tier in tiers:
        encoded, lengths = model.encode([tier.audio])
        entry = {
            "tier": tier.name,
            "audio_seconds": tier.audio.numel() / model.sample_rate,
            "frames": int(lengths[0]),
            "rows": [],
        }
        texts = {}
        for n in batch_sizes:
            batch = encoded.expand(n, -1, -1).contiguous()
            batch_lengths = lengths.expand(n).contiguous()
            for graphs in modes:
                announce(f"{tier.name}: decode, batch {n}, {graphs_name(graphs)}, {reps} reps")
                model.use_graphs(graphs)  # a fresh decoder: its capture is timed in the warm-up
                decoder = model.decoder
                reset_peak(device)
                times, hyps = timed(lambda: model.decode(batch, batch_lengths), device, reps)
                steps = hyps[0].steps
                row = {
                    "what": "decode",
                    "batch": n,
                    "graphs": graphs,
                    **_stats(times),
                    "steps": steps,
                    "us_per_step": statistics.median(times) * 1e6 / max(steps, 1),
                    "window": default_window(size_class(n)),
                    "host_reads": decoder.host_reads,
                    "queued_steps": decoder.queued_steps,
                    "capture_ms": decoder.capture_seconds * 1e3,
                    "compile_ms": decoder.compile_seconds * 1e3,
                    "peak_mb": peak_mb(device),
                    "tokens": len(hyps[0].token_ids),
                }
                entry["rows"].append(row)
                texts[("decode", n, graphs)] = [(h.token_ids, h.frames) for h in hyps]
                entry.setdefault("token_ids", hyps[0].token_ids)
        for graphs in modes:
            announce(f"{tier.name}: end to end, batch 1, {graphs_name(graphs)}, {reps} reps")
            model.use_graphs(graphs)
            reset_peak(device)
            times, transcripts = timed(lambda: model.transcribe([tier.audio]), device, reps)
            entry["rows"].append(
                {
                    "what": "end-to-end",
                    "batch": 1,
                    "graphs": graphs,
                    **_stats(times),
                    "capture_ms": model.decoder.capture_seconds * 1e3,
                    "peak_mb": peak_mb(device),
                    "tokens": len(transcripts[0].token_ids),
                }
            )
            texts[("e2e", 1, graphs)] = [transcripts[0].text]
        entry["identical"] = _identical(texts)
        entry["emission"] = _emission(entry)
        report["tiers"].append(entry)
    model.use_graphs(graphs_before)
    return report


def graphs_name(graphs: bool) -> str:
    return "CUDA graphs" if graphs else "eager"


def _identical(texts: dict) -> bool:
    """Every mode gives the same tokens and frames for each (what, batch); every row of a batch the same."""
    groups: dict = {}
    for (what, n, _graphs), value in texts.items():
        groups.setdefault((what, n), []).append(value)
    same_modes = all(all(v == values[0] for v in values) for values in groups.values())
    same_rows = all(
        all(r == v[0] for r in v) for (what, _), values in groups.items() if what == "decode" for v in values
    )
    return same_modes and same_rows


def _emission(entry: dict) -> dict:
    serial = next((r for r in entry["rows"] if r["what"] == "decode" and r["batch"] == 1), entry["rows"][0])
    return {
        "tokens": serial["tokens"],
        "frames": entry["frames"],
        "steps": serial.get("steps"),
        "tokens_per_frame": serial["tokens"] / max(entry["frames"], 1),
    }


def print_table(report: dict, console: Console) -> None:
    graphed_rows = any(r["graphs"] for t in report["tiers"] for r in t["rows"])
    columns = ["tier", "what", "B", "eager ms (min-max)", "steps", "us/step"]
    if graphed_rows:
        columns += ["graphs ms (min-max)", "us/step", "speedup", "capture ms"]
    columns += ["peak MB", "same"]
    table = Table(
        title=f"graphscribe bench: {report['device']}, {report['dtype']}, {report['step']} decode step, "
        f"median of {report['reps']}"
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("tier", "what") else "right", no_wrap=True)
    for tier in report["tiers"]:
        pairs: dict = {}
        for row in tier["rows"]:
            pairs.setdefault((row["what"], row["batch"]), {})[row["graphs"]] = row
        for (what, n), pair in pairs.items():
            eager, graphed = pair.get(False), pair.get(True)
            cells = [
                tier["tier"],
                what,
                str(n),
                _ms(eager),
                str(eager.get("steps", "-")) if eager else "-",
                _per_step(eager),
            ]
            if graphed_rows:
                speedup = f"{eager['median_ms'] / graphed['median_ms']:.2f}x" if eager and graphed else "-"
                cells += [_ms(graphed), _per_step(graphed), speedup, f"{graphed['capture_ms']:.0f}" if graphed else "-"]
            peaks = [r["peak_mb"] for r in pair.values() if r.get("peak_mb") is not None]
            cells += [f"{max(peaks):.0f}" if peaks else "-", "yes" if tier["identical"] else "NO"]
            table.add_row(*cells)
    console.print(table)
    for tier in report["tiers"]:
        em = tier["emission"]
        console.print(
            f"{tier['tier']}: {em['frames']} encoder frames, {em['tokens']} tokens "
            f"({em['tokens_per_frame']:.2f} per frame), {em['steps']} decode steps at B=1"
        )


def _ms(row: dict | None) -> str:
    return f"{row['median_ms']:.1f} ({row['min_ms']:.1f}-{row['max_ms']:.1f})" if row else "-"


def _per_step(row: dict | None) -> str:
    return f"{row['us_per_step']:.0f}" if row and "us_per_step" in row else "-"


# ---------------------------------------------------------------------------- folder throughput


def header(model, reps: int) -> dict:
    device = model.device
    return {
        "model": model.source,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(model.dtype).removeprefix("torch."),
        "step": "fused (Triton)" if device.type == "cuda" and model.decoder.fused is not False else "PyTorch",
        "beam": model.options.beam_size,  # 1: greedy (the step above); more: the beam search's PyTorch step
        "lm": model.options.lm,  # fused into the decoding, as its weight says
        "lm_weight": model.options.lm_weight if model.options.lm else None,
        "hotwords": len(model.options.hotwords),  # phrases boosted
        "boost": model.options.boost if model.options.hotwords else None,
        "torch": torch.__version__,
        "graphscribe": __version__,
        "reps": reps,
    }


# ---------------------------------------------------------------------------- several devices
