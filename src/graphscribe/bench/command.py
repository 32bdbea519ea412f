"""The `transcribe bench` command: decode rows, folder throughput, device scaling, or the server's load test."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from graphscribe.console import (
    BATCH_SECONDS_DEFAULT,
    BOOST_OPTION,
    DEVICE_HELP,
    DTYPE_HELP,
    HOTWORDS_FILE_OPTION,
    HOTWORDS_OPTION,
    LM_OPTION,
    LM_WEIGHT_OPTION,
    MODEL_DEFAULT,
    MODEL_HELP,
    devices_or_exit,
    err_console,
    fail_usage,
    find_audio_files,
    fusion_options,
    load_or_exit,
    model_source,
    setup_logging,
)
from graphscribe.io.config import CHUNK_SECONDS, LEFT_SECONDS, RIGHT_SECONDS
from graphscribe.io.options import RunOptions

if TYPE_CHECKING:
    pass

# Batch sizes and timed runs a row, by default. The decode rows on the CPU, where a step takes ~1000x a GPU's, are
# the first tier alone, batch 1, 3 reps: the GPU's defaults (three tiers up to 77 s, batches 1 and 8, 5 reps) ran
# 777 s with the demo model on a 2-core host (issue 46).
DECODE_DEFAULTS = {"cuda": ("1,8", 5), "cpu": ("1", 3)}
THROUGHPUT_DEFAULTS = ("8,32,128", 3)


def bench_command(
    clips: List[Path] = typer.Argument(
        None,
        metavar="CLIPS",
        show_default="7.4 s, 23 s and 77 s of real speech; 7.4 s on the CPU",
        help="Audio clips to benchmark.",
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT, help=MODEL_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda|cuda:N", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", metavar="auto|float32|bfloat16|float16", help=DTYPE_HELP),
    reps: Optional[int] = typer.Option(
        None,
        min=1,
        metavar="N",
        show_default="5; 3 on the CPU and for throughput",
        help="Timed repetitions per row (the median is reported).",
    ),
    batch_sizes: Optional[str] = typer.Option(
        None,
        metavar="N,N,...",
        show_default="1,8; 1 on the CPU; 8,32,128 for throughput",
        help="Batch sizes, comma-separated.",
    ),
    graphs: Optional[bool] = typer.Option(
        None,
        "--graphs/--no-graphs",
        show_default="both rows with CUDA",
        help="--graphs: the CUDA-graph rows only; --no-graphs: the eager rows only; neither: both.",
    ),
    json_path: Optional[Path] = typer.Option(
        None, "--json", metavar="FILE", help="Also write the results as JSON here."
    ),
    folder: Optional[Path] = typer.Option(
        None, "--folder", metavar="DIR", help="Throughput instead: transcribe the audio files under DIR end to end."
    ),
    throughput: bool = typer.Option(
        False, "--throughput", help="Throughput on a generated folder of real speech (LibriSpeech-like lengths)."
    ),
    files: int = typer.Option(256, "--files", min=1, metavar="N", help="Files in the generated folder (--throughput)."),
    batch_seconds: Optional[float] = typer.Option(
        None,
        "--batch-seconds",
        min=0,
        metavar="S",
        show_default=BATCH_SECONDS_DEFAULT,
        help="Throughput rows: seconds of padded audio per batch at most (see transcribe --help).",
    ),
    devices: Optional[str] = typer.Option(
        None,
        metavar="all|cuda:0,cuda:1,...",
        show_default=False,
        help="Throughput on the first 1, 2, ... n of these devices (see transcribe --help), with --folder or --throughput.",
    ),
    serve: Optional[str] = typer.Option(
        None, "--serve", metavar="URL", help="Load-test a running `transcribe serve` with the files under --folder."
    ),
    concurrency: str = typer.Option("1,8,32,128", metavar="N,N,...", help="--serve: clients at once, a row each."),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        envvar="GRAPHSCRIBE_API_KEY",
        metavar="KEY",
        help="--serve, --realtime: the server's API key.",
    ),
    response_format: str = typer.Option("json", metavar="FORMAT", help="--serve: the response_format asked for."),
    client_processes: Optional[int] = typer.Option(
        None,
        "--client-processes",
        metavar="P",
        show_default=False,
        help="--serve, --realtime: processes the clients are spread over (default: --serve one; --realtime one "
        "per 144 sessions, up to half the cores).",
    ),
    realtime: Optional[str] = typer.Option(
        None,
        "--realtime",
        metavar="ws://HOST:PORT",
        help="Load-test a running server's /v1/realtime sessions with the files under --folder, sent at real-time pace.",
    ),
    sessions: str = typer.Option("1,64,256", metavar="N,N,...", help="--realtime: sessions at once, a row each."),
    turns: str = typer.Option(
        "vad",
        metavar="vad|commit",
        help="--realtime: turns by the server's VAD, or one turn a session, committed after its last audio.",
    ),
    streams: Optional[str] = typer.Option(
        None, "--streams", metavar="N,N,...", help="Live streams instead: each file under --folder a stream, N at once."
    ),
    pace: str = typer.Option(
        "realtime", metavar="realtime|max", help="--streams: audio at real-time pace (latency), or all at once (RTFx)."
    ),
    chunk: float = typer.Option(
        CHUNK_SECONDS,
        "--chunk",
        metavar="S",
        help="--streams: seconds per step (a cache-aware model: one of its chunks).",
    ),
    left: float = typer.Option(LEFT_SECONDS, "--left", metavar="S", help="--streams: seconds of left context."),
    right: float = typer.Option(RIGHT_SECONDS, "--right", metavar="S", help="--streams: seconds of right context."),
    profile: bool = typer.Option(False, "--profile", help="--streams: once more, seconds per stage of the steps."),
    output_format: str = typer.Option(
        "txt", "--format", metavar="txt|json", help="Throughput rows: the files written (json: with word times)."
    ),
    confidence: bool = typer.Option(
        False, "--confidence", help="Throughput rows: token and word confidence on (see transcribe --help); with json."
    ),
    beam: int = typer.Option(
        1, "--beam", min=1, metavar="N", help="--folder, --throughput: decode with a beam search of N (1: greedy)."
    ),
    lm: Optional[Path] = LM_OPTION,
    lm_weight: float = LM_WEIGHT_OPTION,
    hotwords: Optional[str] = HOTWORDS_OPTION,
    hotwords_file: Optional[Path] = HOTWORDS_FILE_OPTION,
    boost: float = BOOST_OPTION,
) -> None:
    """A/B benchmark: decoding with and without CUDA graphs, serial and batched, and end to end; with --folder or
    --throughput, files per second through the whole pipeline instead; with --serve URL --folder DIR, a load test of
    a running server."""
    setup_logging()
    if serve is not None:  # a load test of a running server: no model here
        from graphscribe.serve.loadtest import bench_server, print_report

        try:
            report = bench_server(serve, folder, concurrency, api_key, response_format, client_processes)
        except ValueError as err:
            fail_usage(str(err))
        print_report(report, Console(width=None if sys.stdout.isatty() else 240))
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        return
    if realtime is not None:
        from graphscribe.serve.realtime_load import bench_realtime, print_realtime_report

        try:
            report = bench_realtime(realtime, folder, sessions, api_key, client_processes, turns)
        except ValueError as err:
            fail_usage(str(err))
        print_realtime_report(report, Console(width=None if sys.stdout.isatty() else 240))
        _write_report(report, json_path)
        return
    if streams is not None:
        _bench_streams(streams, folder, pace, model, device, dtype, graphs, chunk, left, right, profile, json_path)
        return
    folder_mode = folder is not None or throughput
    if folder_mode and clips:
        fail_usage("bench: give CLIPS, or --folder / --throughput, not both")
    fused = fusion_options(lm, lm_weight, hotwords, hotwords_file, boost)
    if (beam > 1 or fused["lm"] or fused["hotwords"]) and not folder_mode:
        fail_usage("bench --beam, --lm, --hotwords: with --folder or --throughput")
    given_sizes = _batch_sizes(batch_sizes) if batch_sizes else None  # checked before the model loads
    if devices is not None:
        sizes, reps = given_sizes or _batch_sizes(THROUGHPUT_DEFAULTS[0]), reps or THROUGHPUT_DEFAULTS[1]
        if not folder_mode:
            fail_usage("bench --devices: with --folder or --throughput")
        from graphscribe.io.audio import NATIVE_STDERR

        several = devices_or_exit(devices, device)
        with NATIVE_STDERR.installed():
            batch = max(sizes) if batch_sizes else None  # None: the devices' default
            report = _bench_devices(
                several, model, dtype, graphs, folder, files, batch, reps, batch_seconds, beam, fused
            )
        _write_report(report, json_path)
        return
    if output_format not in ("txt", "json") or (confidence and output_format != "json"):
        fail_usage(f"bench --format {output_format}: use txt or json (--confidence: json, the output it shows in)")
    options = RunOptions(device=device, dtype=dtype, graphs=False, confidence=confidence, beam_size=beam, **fused)
    loaded = load_or_exit(model, options)  # rows set graphs on and off
    cuda = loaded.device.type == "cuda"
    want_graphs = graphs is not False
    modes = ([True] if graphs else [False, True]) if want_graphs and cuda else [False]
    if not cuda:
        err_console.print("note: CUDA graphs need a CUDA device; benchmarking the eager rows only")
    default_sizes, default_reps = THROUGHPUT_DEFAULTS if folder_mode else DECODE_DEFAULTS["cuda" if cuda else "cpu"]
    sizes, reps = given_sizes or _batch_sizes(default_sizes), reps or default_reps
    console = Console(width=None if sys.stdout.isatty() else 240)
    if folder_mode:
        report = _bench_folder(loaded, folder, files, sizes, reps, modes, batch_seconds, console, output_format)
    else:
        from graphscribe.bench.decode import TIER_SECONDS, print_table, run_bench, tier_clips

        try:  # the CPU's default: the first tier alone
            tiers = tier_clips(loaded, clips or None, TIER_SECONDS if cuda else TIER_SECONDS[:1])
        except ValueError as err:
            fail_usage(str(err))
        _announce_plan(tiers, sizes, reps, modes, loaded.device, cpu_defaults=not cuda and not (clips or batch_sizes))
        report = run_bench(loaded, tiers, sizes, reps, modes, announce=_announce)
        print_table(report, console)
    _write_report(report, json_path)


def _write_report(report: dict, json_path: Optional[Path]) -> None:
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _bench_devices(devices, model, dtype, graphs, folder, files, batch, reps, batch_seconds, beam, fused) -> dict:
    """`bench --devices`: RTFx per device count on the folder (or a generated one), at --batch-sizes' largest."""
    import tempfile

    from graphscribe.bench.folder import make_folder, print_device_scaling, run_device_scaling

    with tempfile.TemporaryDirectory(prefix="graphscribe-folder-") as generated:
        paths = make_folder(generated, files) if folder is None else find_audio_files(folder) if folder.is_dir() else []
        if not paths:
            fail_usage(f"--folder {folder}: no audio files there")
        options = RunOptions(
            dtype=dtype,
            graphs=graphs is not False,
            batch_size=batch,
            batch_seconds=batch_seconds,
            beam_size=beam,
            **fused,
        )
        report = run_device_scaling(model_source(model), devices, paths, options, reps)
    print_device_scaling(report, Console(width=None if sys.stdout.isatty() else 240))
    return report


def _announce_plan(tiers, sizes: list[int], reps: int, modes: list[bool], device, cpu_defaults: bool) -> None:
    """One line before the decode rows: what runs, so a long run is no surprise; on the CPU's defaults, how to ask
    for more."""
    runs = len(tiers) * (len(sizes) + 1) * len(modes) * (reps + 1)  # decode rows per size and one end to end
    line = (
        f"note: {len(tiers)} clip(s) ({', '.join(t.name for t in tiers)}) x batch {','.join(map(str, sizes))}, "
        f"decode and end to end, {reps} timed run{'s' if reps > 1 else ''} a row after a warm-up: {runs} runs on {device}"
    )
    if cpu_defaults:
        line += (
            " (the CPU's defaults; the GPU's, 3 clips up to 77 s x batch 1,8 x 5 reps, took 13 minutes on 2 cores: "
            "give CLIPS, --batch-sizes and --reps for more)"
        )
    err_console.print(escape(line))


def _announce(row: str) -> None:
    """What a benchmark is running now, one stderr line per row as it starts (rows take seconds to minutes)."""
    err_console.print(f"running: {escape(row)}")


def _batch_sizes(value: str) -> list[int]:
    try:
        sizes = sorted({int(s) for s in value.split(",") if s.strip()})
    except ValueError:
        fail_usage(f"--batch-sizes {value!r}: use comma-separated whole numbers such as 1,8")
    if not sizes or min(sizes) < 1:
        fail_usage(f"--batch-sizes {value!r}: sizes must be 1 or more")
    return sizes


def _bench_folder(
    loaded,
    folder: Optional[Path],
    files: int,
    sizes: list[int],
    reps: int,
    modes: list[bool],
    batch_seconds: Optional[float],
    console: Console,
    output_format: str = "txt",
) -> dict:
    """Throughput rows over the files under `folder`, or over `files` generated clips, writing `output_format`."""
    from graphscribe.bench.folder import make_folder, print_throughput, run_throughput
    from graphscribe.io.audio import NATIVE_STDERR

    with tempfile.TemporaryDirectory(prefix="graphscribe-folder-") as generated, NATIVE_STDERR.installed():
        if folder is None:
            paths = make_folder(generated, files)
            err_console.print(
                f"note: {len(paths)} clips of real speech with LibriSpeech-like lengths "
                "(scripts/make_folder.py makes the same folder)"
            )
        else:
            paths = find_audio_files(folder) if folder.is_dir() else []
            if not paths:
                fail_usage(f"--folder {folder}: no audio files there")
        report = run_throughput(loaded, paths, sizes, reps, modes, batch_seconds, _announce, output_format)
        report["folder"] = str(folder) if folder is not None else f"generated: {len(paths)} clips (make_folder, seed 0)"
    print_throughput(report, console)
    return report


def _bench_streams(levels, folder, pace, model, device, dtype, graphs, chunk, left, right, profile, json_path) -> None:
    from graphscribe.bench.streams import print_stream_report, run_stream_bench
    from graphscribe.io.audio import find_audio_files

    if pace not in ("realtime", "max"):
        fail_usage(f"--pace {pace}: use realtime or max")
    if folder is None or not folder.is_dir():
        fail_usage("bench --streams needs --folder DIR of audio files (each file a stream)")
    paths = find_audio_files(folder)
    if not paths:
        fail_usage(f"--folder {folder}: no audio files")
    loaded = load_or_exit(model, RunOptions(device=device, dtype=dtype, graphs=graphs is not False))
    try:
        report = run_stream_bench(loaded, paths, _batch_sizes(levels), pace, chunk, left, right, profile)
    except ValueError as err:
        fail_usage(str(err))
    print_stream_report(report, Console(width=None if sys.stdout.isatty() else 240))
    _write_report(report, json_path)
