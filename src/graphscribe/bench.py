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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from rich.console import Console
from rich.table import Table

from graphscribe import __version__
from graphscribe.io.audio import AudioError, load_audio, speech_path
from graphscribe.model.decoding import default_window, size_class
from graphscribe.output.writers import WRITERS
from graphscribe.runtime.pipeline import StageClock, default_batching, default_workers

TIER_SECONDS = (7.4, 23.0, 77.0)
SPEECH = ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac")  # shipped in graphscribe/data
FOLDER_RATE = 16000  # Hz, the generated files'
FOLDER_SECONDS = (1.5, 30.0)  # LibriSpeech-like file lengths: 1.5 to 30 s, ...
FOLDER_MEAN_SECONDS = 7.45  # ... 7.45 s on average (test-clean: 2620 files, 5.4 h), gamma-distributed
FOLDER_SHAPE = 2.0  # gamma shape: most files 2-12 s, a tail to 30 s
SHORT_SECONDS = (1.0, 3.0)  # `short`: uniform lengths, for the host-memory test
GAIN = (0.5, 1.0)  # random gain per file
STAGES = ("read", "wait", "features", "encoder", "decode", "text", "write")


@dataclass
class Tier:
    name: str
    audio: torch.Tensor  # (L,) at the model's rate


def tier_clips(model, clips: list[Path] | None = None) -> list[Tier]:
    """The given clips, or real speech joined to about 7.4 s, 23 s and 77 s."""
    if clips:
        return [Tier(Path(c).name, model.read(c)) for c in clips]
    parts = [model.read(speech_path(name)) for name in SPEECH]
    tiers = []
    for seconds in TIER_SECONDS:
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


def _timed(fn, device: torch.device, reps: int) -> tuple[list[float], object]:
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


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def run_bench(
    model, tiers: list[Tier], batch_sizes: list[int], reps: int, modes: list[bool], announce=lambda row: None
) -> dict:
    """Measure every (tier, batch size, mode); returns a JSON-ready report. `announce` gets a line naming each
    row as it starts."""
    device = model.device
    report = {**_header(model, reps), "tiers": []}
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
                announce(f"{tier.name}: decode, batch {n}, {_graphs_name(graphs)}, {reps} reps")
                model.use_graphs(graphs)  # a fresh decoder: its capture is timed in the warm-up
                decoder = model.decoder
                _reset_peak(device)
                times, hyps = _timed(lambda: model.decode(batch, batch_lengths), device, reps)
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
                    "peak_mb": _peak_mb(device),
                    "tokens": len(hyps[0].token_ids),
                }
                entry["rows"].append(row)
                texts[("decode", n, graphs)] = [(h.token_ids, h.frames) for h in hyps]
                entry.setdefault("token_ids", hyps[0].token_ids)
        for graphs in modes:
            announce(f"{tier.name}: end to end, batch 1, {_graphs_name(graphs)}, {reps} reps")
            model.use_graphs(graphs)
            _reset_peak(device)
            times, transcripts = _timed(lambda: model.transcribe([tier.audio]), device, reps)
            entry["rows"].append(
                {
                    "what": "end-to-end",
                    "batch": 1,
                    "graphs": graphs,
                    **_stats(times),
                    "capture_ms": model.decoder.capture_seconds * 1e3,
                    "peak_mb": _peak_mb(device),
                    "tokens": len(transcripts[0].token_ids),
                }
            )
            texts[("e2e", 1, graphs)] = [transcripts[0].text]
        entry["identical"] = _identical(texts)
        entry["emission"] = _emission(entry)
        report["tiers"].append(entry)
    model.use_graphs(graphs_before)
    return report


def _graphs_name(graphs: bool) -> str:
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


def make_folder(out_dir: str | Path, files: int = 256, seed: int = 0, short: bool = False) -> list[Path]:
    """Write `files` FLAC files (16 kHz mono, 16-bit) of real speech into `out_dir`: LibriSpeech-like lengths
    (1.5-30 s, 7.5 s on average), or 1-3 s with `short`. Each is cut from the shipped speech, joined and
    cycled, at a random offset and with a random gain, so files differ; the same seed gives the same files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if short:
        seconds = rng.uniform(*SHORT_SECONDS, files)
    else:
        seconds = rng.gamma(FOLDER_SHAPE, FOLDER_MEAN_SECONDS / FOLDER_SHAPE, files)
        seconds = np.clip(
            seconds * FOLDER_MEAN_SECONDS / seconds.mean(), *FOLDER_SECONDS
        )  # the mean, whatever the draw
    speech = torch.cat([load_audio(speech_path(name), FOLDER_RATE) for name in SPEECH]).numpy()  # (L,)
    digits = len(str(max(files - 1, 1)))
    paths = []
    for k, length in enumerate(seconds):
        n = round(float(length) * FOLDER_RATE)
        start = int(rng.integers(len(speech)))
        clip = speech[(start + np.arange(n)) % len(speech)] * rng.uniform(*GAIN)
        paths.append(out_dir / f"clip_{k:0{digits}d}.flac")
        sf.write(paths[-1], clip, FOLDER_RATE, subtype="PCM_16")
    return paths


def run_throughput(
    model,
    files: list[Path],
    batch_sizes: list[int],
    reps: int,
    modes: list[bool],
    batch_seconds: float | None = None,
    announce=lambda row: None,
) -> dict:
    """RTFx end to end (files in, text files out, the pipeline `transcribe` uses) for every (batch size, graph
    mode), with seconds per stage, peak GPU memory and peak host RSS; and from memory (`transcribe` of the
    same clips already read). Median of `reps` timed passes after a warm-up pass (captures, compiles, and
    the OS's file cache: files are read from memory, not from the disk). `announce` gets a line naming each row as
    it starts."""
    device = model.device
    if batch_seconds is None:
        batch_seconds = model.options.batch_seconds
    if batch_seconds is None:
        batch_seconds = default_batching(device)[1]
    audios = {}  # path -> samples, for the rows from memory (unreadable files are left out there)
    for f in files:
        try:
            audios[str(f)] = model.read(f)
        except AudioError:
            pass
    total = sum(a.numel() for a in audios.values()) / model.sample_rate
    report = {
        **_header(model, reps),
        "files": len(files),
        "audio_seconds": total,
        "batch_seconds": batch_seconds,
        "readers": default_workers(device),
        "throughput": [],
    }
    graphs_before = model.options.graphs
    with tempfile.TemporaryDirectory(prefix="graphscribe-bench-") as out_dir:
        for n in batch_sizes:
            texts = {}
            for graphs in modes:
                announce(f"{len(files)} files: batch {n}, {_graphs_name(graphs)}, a warm-up and {reps} passes")
                model.use_graphs(graphs)  # a fresh decoder: captures happen in the warm-up pass
                start = time.perf_counter()
                _pass(model, files, n, batch_seconds, Path(out_dir))
                warmup = time.perf_counter() - start
                passes = [_pass(model, files, n, batch_seconds, Path(out_dir)) for _ in range(reps)]
                median = sorted(passes, key=lambda p: p["seconds"])[(len(passes) - 1) // 2]
                arrays = list(audios.values())
                memory_times, from_memory = _timed(lambda: model.transcribe(arrays, n, batch_seconds), device, reps)
                in_memory = statistics.median(memory_times)
                texts[graphs] = median["texts"]
                texts[("memory", graphs)] = dict(zip(audios, (t.text for t in from_memory)))
                seconds = [p["seconds"] for p in passes]
                report["throughput"].append(
                    {
                        "batch": n,
                        "graphs": graphs,
                        "rtfx": total / median["seconds"],
                        "rtfx_min": total / max(seconds),
                        "rtfx_max": total / min(seconds),
                        "seconds": median["seconds"],
                        "warmup_seconds": warmup,
                        "capture_ms": model.decoder.capture_seconds * 1e3,
                        "compile_ms": model.decoder.compile_seconds * 1e3,
                        "stages": median["stages"],
                        "gpu_busy_seconds": median["gpu_busy"],
                        "peak_gpu_mb": median["peak_gpu_mb"],
                        "peak_rss_mb": median["peak_rss_mb"],
                        "in_memory_rtfx": total / in_memory,
                        "in_memory_seconds": in_memory,
                        "failed": median["failed"],
                    }
                )
            same = all(v == texts[modes[0]] for v in texts.values())
            for row in report["throughput"]:
                if row["batch"] == n:
                    row["identical"] = same
    model.use_graphs(graphs_before)
    return report


def _pass(model, files: list[Path], batch: int, batch_seconds: float, out_dir: Path) -> dict:
    """One timed pass over the files, writing a text file each; stages from a fresh clock."""
    device = model.device
    clock = StageClock(device)
    _reset_peak(device)
    _reset_peak_rss()
    texts: dict[str, str] = {}  # path -> text
    failed = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for i, transcript in model.transcribe_iter(
        files, batch, batch_seconds, clock=clock, timings=False
    ):  # txt, as the CLI
        if transcript.error is not None:
            failed += 1
            continue
        texts[str(files[i])] = transcript.text
        with clock.host("write"):
            (out_dir / f"{i}.txt").write_text(WRITERS["txt"](transcript), encoding="utf-8")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    stages = clock.seconds()
    return {
        "seconds": seconds,
        "texts": texts,
        "failed": failed,
        "stages": {stage: stages.get(stage, 0.0) for stage in STAGES},
        "gpu_busy": sum(stages.get(s, 0.0) for s in ("features", "encoder", "decode"))
        if device.type == "cuda"
        else None,
        "peak_gpu_mb": _peak_mb(device),
        "peak_rss_mb": _peak_rss_mb(),
    }


def _header(model, reps: int) -> dict:
    device = model.device
    return {
        "model": model.source,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(model.dtype).removeprefix("torch."),
        "step": "fused (Triton)" if device.type == "cuda" and model.decoder.fused is not False else "PyTorch",
        "torch": torch.__version__,
        "graphscribe": __version__,
        "reps": reps,
    }


def _reset_peak_rss() -> None:
    """Linux: restart the process's peak resident set size (VmHWM) from its current size."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # the peak then counts from the process's start; reported as such in print_throughput


def _peak_rss_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def print_throughput(report: dict, console: Console) -> None:
    table = Table(
        title=f"graphscribe bench throughput: {report['files']} files, {report['audio_seconds']:.0f} s of "
        f"audio; {report['device']}, {report['dtype']}, median of {report['reps']}"
    )
    columns = [
        "B",
        "graphs",
        "RTFx (min-max)",
        "from memory",
        *[f"{s} s" for s in STAGES],
        "GPU busy s",
        "peak GPU MB",
        "peak RSS MB",
        "same",
    ]
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    for row in report["throughput"]:
        table.add_row(
            str(row["batch"]),
            "on" if row["graphs"] else "off",
            f"{row['rtfx']:.0f} ({row['rtfx_min']:.0f}-{row['rtfx_max']:.0f})",
            f"{row['in_memory_rtfx']:.0f}",
            *[f"{row['stages'][s]:.2f}" for s in STAGES],
            _seconds(row["gpu_busy_seconds"]),
            _mb(row["peak_gpu_mb"]),
            _mb(row["peak_rss_mb"]),
            "yes" if row["identical"] else "NO",
        )
    console.print(table)
    console.print(
        "read: summed over the reader threads; wait: the main thread waiting for reads; features, encoder, "
        "decode: GPU time between CUDA events around each stage (CPU: wall time); text: tokens to words; "
        "write: output files. from memory: RTFx of transcribe() on the clips already read."
    )


def _seconds(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _mb(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "-"


# ---------------------------------------------------------------------------- several devices


def run_device_scaling(
    source: str,
    devices: list[str],
    files: list[Path],
    options,
    batch_size: int | None,
    batch_seconds: float | None,
    reps: int,
) -> dict:
    """RTFx on the first 1, 2, ... n of `devices` (`devices.DevicePool`: one worker process and model each, one
    shared plan): files in, transcripts back in the parent (text only, no output files). Per device count: a
    warm-up pass (the new worker's model load, its captures, the OS's file cache), then the median of `reps`
    timed passes, with each device's files, audio seconds and busy seconds in the median pass."""
    from graphscribe.devices import DevicePool

    pool = DevicePool(source, devices, options)
    report = {
        "model": source,
        "devices": devices,
        "device": [torch.cuda.get_device_name(torch.device(d)) if d != "cpu" else "cpu" for d in devices],
        "dtype": options.dtype,
        "torch": torch.__version__,
        "graphscribe": __version__,
        "reps": reps,
        "files": len(files),
        "batch": batch_size,
        "batch_seconds": batch_seconds,
        "scaling": [],
    }
    try:
        texts_one = None
        for n in range(1, len(devices) + 1):
            start = time.perf_counter()
            list(pool.transcribe(files, batch_size, batch_seconds, timings=False, workers=n))
            warmup = time.perf_counter() - start
            passes = []
            for _ in range(reps):
                start = time.perf_counter()
                run = pool.transcribe(files, batch_size, batch_seconds, timings=False, workers=n)
                results = list(run)
                passes.append((time.perf_counter() - start, run, results))
            seconds, run, results = sorted(passes, key=lambda p: p[0])[(len(passes) - 1) // 2]
            audio = sum(t.audio_seconds for _, t in results if t.error is None)
            texts = {i: t.text for i, t in results if t.error is None}
            texts_one = texts_one or texts
            report["audio_seconds"] = audio
            report["scaling"].append(
                {
                    "devices": n,
                    "rtfx": audio / seconds,
                    "rtfx_min": audio / max(p[0] for p in passes),
                    "rtfx_max": audio / min(p[0] for p in passes),
                    "seconds": seconds,
                    "warmup_seconds": warmup,
                    "failed": sum(t.error is not None for _, t in results),
                    "identical": texts == texts_one,
                    "per_device": [s.to_json() for s in run.device_stats],
                }
            )
    finally:
        pool.close()
    return report


def print_device_scaling(report: dict, console: Console) -> None:
    table = Table(
        title=f"graphscribe bench devices: {report['files']} files, {report.get('audio_seconds', 0):.0f} s of audio; "
        f"{', '.join(report['device'])}; {report['dtype']}, median of {report['reps']}"
    )
    for column in ("devices", "RTFx (min-max)", "s", "warm-up s", "per device: files / busy s", "same"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in report["scaling"]:
        table.add_row(
            str(row["devices"]),
            f"{row['rtfx']:.0f} ({row['rtfx_min']:.0f}-{row['rtfx_max']:.0f})",
            f"{row['seconds']:.2f}",
            f"{row['warmup_seconds']:.2f}",
            "  ".join(f"{d['device']} {d['files']}/{d['busy_seconds']:.2f}" for d in row["per_device"]),
            "yes" if row["identical"] else "NO",
        )
    console.print(table)
    console.print(
        "s: wall time of a pass, files in to transcripts back in the parent (text only); busy s: from a worker's "
        "first batch to its last result; same: every file's text as on one device."
    )
