"""Folder throughput: generated LibriSpeech-like folders transcribed end to end, and the same over several devices."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from rich.console import Console
from rich.table import Table

from graphscribe import __version__
from graphscribe.bench.decode import SPEECH, graphs_name, header, peak_mb, reset_peak, timed
from graphscribe.io.audio import AudioError, load_audio, speech_path
from graphscribe.io.options import RunOptions
from graphscribe.output.writers import render
from graphscribe.runtime.clock import StageClock
from graphscribe.runtime.defaults import default_batching, default_workers

FOLDER_RATE = 16000  # Hz, the generated files'


FOLDER_SECONDS = (1.5, 30.0)  # LibriSpeech-like file lengths: 1.5 to 30 s, ...


FOLDER_MEAN_SECONDS = 7.45  # ... 7.45 s on average (test-clean: 2620 files, 5.4 h), gamma-distributed


FOLDER_SHAPE = 2.0  # gamma shape: most files 2-12 s, a tail to 30 s


SHORT_SECONDS = (1.0, 3.0)  # `short`: uniform lengths, for the host-memory test


GAIN = (0.5, 1.0)  # random gain per file


STAGES = ("read", "wait", "features", "encoder", "decode", "text", "write")


def _stages(confidence: bool) -> tuple[str, ...]:
    """The stages of a row: with confidences, their replay after the decode too."""
    return (*STAGES[:5], "confidence", *STAGES[5:]) if confidence else STAGES


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
    output_format: str = "txt",
) -> dict:
    """RTFx end to end (files in, `output_format` files out, txt or json, the pipeline `transcribe` uses) for every
    (batch size, graph mode), with seconds per stage, peak GPU memory and peak host RSS; and from memory
    (`transcribe` of the same clips already read). Median of `reps` timed passes after a warm-up pass (captures,
    compiles, and the OS's file cache: files are read from memory, not from the disk). `announce` gets a line naming
    each row as it starts. The model's options say whether confidences are computed (json only)."""
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
        **header(model, reps),
        "files": len(files),
        "audio_seconds": total,
        "batch_seconds": batch_seconds,
        "readers": default_workers(device),
        "format": output_format,
        "confidence": model.options.confidence,
        "throughput": [],
    }
    graphs_before = model.options.graphs
    with tempfile.TemporaryDirectory(prefix="graphscribe-bench-") as out_dir:
        for n in batch_sizes:
            texts = {}
            for graphs in modes:
                announce(f"{len(files)} files: batch {n}, {graphs_name(graphs)}, a warm-up and {reps} passes")
                model.use_graphs(graphs)  # a fresh decoder: captures happen in the warm-up pass
                start = time.perf_counter()
                _pass(model, files, n, batch_seconds, Path(out_dir), output_format)
                warmup = time.perf_counter() - start
                passes = [_pass(model, files, n, batch_seconds, Path(out_dir), output_format) for _ in range(reps)]
                median = sorted(passes, key=lambda p: p["seconds"])[(len(passes) - 1) // 2]
                arrays = list(audios.values())
                memory_times, from_memory = timed(lambda: model.transcribe(arrays, n, batch_seconds), device, reps)
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


def _pass(model, files: list[Path], batch: int, batch_seconds: float, out_dir: Path, fmt: str = "txt") -> dict:
    """One timed pass over the files, writing a `fmt` file each (json: rendered by worker processes, as the CLI's);
    stages from a fresh clock."""
    device = model.device
    clock = StageClock(device)
    reset_peak(device)
    _reset_peak_rss()
    texts: dict[str, str] = {}  # path -> text
    failed = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    words = fmt == "json"
    for i, transcript in model.transcribe_iter(
        files, batch, batch_seconds, clock=clock, word_times=words, render=(fmt,) if words else ()
    ):  # as the CLI
        if transcript.error is not None:
            failed += 1
            continue
        texts[str(files[i])] = transcript.text
        with clock.host("write"):
            (out_dir / f"{i}.{fmt}").write_text(render(transcript, fmt), encoding="utf-8")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    stages = clock.seconds()
    return {
        "seconds": seconds,
        "texts": texts,
        "failed": failed,
        "stages": {stage: stages.get(stage, 0.0) for stage in _stages(model.options.confidence)},
        "gpu_busy": sum(stages.get(s, 0.0) for s in ("features", "encoder", "decode", "confidence"))
        if device.type == "cuda"
        else None,
        "peak_gpu_mb": peak_mb(device),
        "peak_rss_mb": _peak_rss_mb(),
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
        f"audio; {report['device']}, {report['dtype']}, median of {report['reps']}; "
        f"{report.get('format', 'txt')} out{', confidence on' if report.get('confidence') else ''}"
    )
    columns = [
        "B",
        "graphs",
        "RTFx (min-max)",
        "from memory",
        *[f"{s} s" for s in _stages(report.get("confidence", False))],
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
            *[f"{row['stages'][s]:.2f}" for s in _stages(report.get("confidence", False))],
            _seconds(row["gpu_busy_seconds"]),
            _mb(row["peak_gpu_mb"]),
            _mb(row["peak_rss_mb"]),
            "yes" if row["identical"] else "NO",
        )
    console.print(table)
    console.print(
        "read: summed over the reader threads; wait: the main thread waiting for reads; features, encoder, "
        "decode, confidence (the replay of --confidence): GPU time between CUDA events around each stage (CPU: wall "
        "time); text: tokens to words; "
        "write: output files. from memory: RTFx of transcribe() on the clips already read."
    )


def _seconds(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _mb(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "-"


def run_device_scaling(
    source: str,
    devices: list[str],
    files: list[Path],
    options: RunOptions,
    reps: int,
) -> dict:
    """RTFx on the first 1, 2, ... n of `devices` (`devices.DevicePool`: one worker process and model each, one
    shared plan, the batching of `options`): files in, transcripts back in the parent (text only, no output files).
    Per device count: a
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
        "batch": options.batch_size,
        "batch_seconds": options.batch_seconds,
        "scaling": [],
    }
    try:
        texts_one = None
        for n in range(1, len(devices) + 1):
            start = time.perf_counter()
            list(pool.transcribe(files, word_times=False, workers=n))
            warmup = time.perf_counter() - start
            passes = []
            for _ in range(reps):
                start = time.perf_counter()
                run = pool.transcribe(files, word_times=False, workers=n)
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
