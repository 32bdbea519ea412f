"""`transcribe`: audio files and folders in, transcripts out; `transcribe bench` A/B-tests the graph modes;
`transcribe serve` serves OpenAI's transcription API (server.py).

Exit codes: 0 every file done (or skipped), 1 some failed (each named on stderr with its reason), 2 bad usage
(found before the model loads), 130 stopped by SIGINT (Ctrl-C), 143 stopped by SIGTERM. A stopped run keeps
every output file and stdout line it finished, says how many files were done in one line, and leaves no
partial file: outputs are written under a temporary name and renamed when complete (`writers.write_file`).

This module imports no torch: `entry` installs the signal handlers before torch loads (seconds), so a Ctrl-C
at any moment ends in one line, never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from graphscribe.bench.command import bench_command
from graphscribe.cli_results import Tally, print_error, print_text, write_results
from graphscribe.console import (
    ATTENTION_HELP,
    BATCH_DEFAULT,
    BATCH_HELP,
    BATCH_SECONDS_DEFAULT,
    BATCH_SECONDS_HELP,
    BOOST_OPTION,
    CONFIDENCE_HELP,
    DEVICE_HELP,
    DEVICES_HELP,
    DTYPE_HELP,
    HOTWORDS_FILE_OPTION,
    HOTWORDS_OPTION,
    LM_OPTION,
    LM_WEIGHT_OPTION,
    MAX_AUDIO_HELP,
    MAX_AUDIO_HOURS,
    MODEL_DEFAULT,
    MODEL_HELP,
    devices_or_exit,
    err_console,
    fail_usage,
    fusion_options,
    load_or_exit,
    model_source,
    setup_logging,
)
from graphscribe.io.config import ATTENTION_WINDOW, CHUNK_SECONDS, LEFT_SECONDS, RIGHT_SECONDS
from graphscribe.io.options import RunOptions
from graphscribe.output.transcript import Transcript
from graphscribe.output.writers import one_line, stdout_text
from graphscribe.signals import SIGNALS, Interrupted
from graphscribe.status import Status
from graphscribe.targets import check_output_dir, check_outputs, output_dir_arg, output_paths, parse_formats

# Files from which the outputs with times are rendered in worker processes: starting them costs about half a
# second (overlapped with the first batch), and rendering in this process about a millisecond a file.
RENDER_POOL_MIN_FILES = 256
STDIN = "-"  # the input that reads standard input (audio.STDIN; audio.py imports torch)
HEADER_CHECK_FILES = 64  # inputs whose headers are checked against --max-audio-hours before the model loads


def expand_inputs(inputs: list[Path]) -> tuple[list[Path], list[str]]:
    """Files as given, audio files found under folders (with broken links, which fail when read), and `-` (standard
    input, its transcript named `-`); plus one error line per input that yields nothing. A named pipe (or another
    special file) with an audio name in a folder is left out, with a note."""
    from graphscribe.io.audio import scan_folder

    files, errors = [], []
    for path in inputs:
        if str(path) == STDIN:
            if sys.stdin is None or sys.stdin.isatty():  # reading would wait for typing
                errors.append(f"{STDIN}: standard input is a terminal; pipe a file in (cat talk.m4a | transcribe -)")
            elif path in files:
                errors.append(f"{STDIN}: standard input is given twice; it is read once")
            else:
                files.append(path)
        elif path.is_dir():
            found, special = scan_folder(path)
            for other in special:
                err_console.print(f"note: {escape(one_line(str(other)))}: {_kind(other)}, not a file: skipped")
            if not found:
                errors.append(f"{path}: folder has no audio files")
            files.extend(found)
        else:
            files.append(path)  # missing or unreadable files, and URLs, are reported when read
    return files, errors


def _kind(path: Path) -> str:
    """What a special file is, for the note that skips it."""
    if path.is_fifo():
        return "a named pipe"
    if path.is_socket():
        return "a socket"
    return "a device" if path.is_char_device() or path.is_block_device() else "not a regular file"


_EXAMPLES = """Examples:

  transcribe talk.wav                                 # the text
  transcribe talk.wav -m nvidia/parakeet-tdt-0.6b-v3  # a Parakeet model (downloaded once)
  transcribe talk.wav -f srt > talk.srt               # subtitles of one file
  transcribe talks/ -f srt,json -o out/               # a folder: out/NAME.srt and out/NAME.json each
  transcribe clips/ -b 128 --dtype bfloat16 -o out/   # many short files on a large GPU
  transcribe meeting-3h.flac --attention local        # hours of audio: local attention, memory linear in length
  cat talk.m4a | transcribe -                         # standard input, any format

Other commands (each with --help):

  transcribe serve    an OpenAI-compatible transcription server (pip install 'graphscribe\\[serve]')
  transcribe ray      a Ray Data job over a cluster (pip install 'graphscribe\\[ray]')
  transcribe ray-serve  the server's API as a Ray Serve deployment on a running Ray cluster (same extra)
  transcribe bench    benchmarks: graphs on and off, a folder's throughput, a server under load
  transcribe --version"""


def transcribe_command(
    inputs: List[Path] = typer.Argument(
        ...,
        metavar="FILES_OR_FOLDERS",
        show_default=False,
        help="Audio or video files (wav, flac, mp3, m4a, mp4, webm, ...), folders (searched recursively), "
        "or - for standard input.",
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT, help=MODEL_HELP
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", "-b", min=1, metavar="N", show_default=BATCH_DEFAULT, help=BATCH_HELP
    ),
    batch_seconds: Optional[float] = typer.Option(
        None, "--batch-seconds", min=0, metavar="S", show_default=BATCH_SECONDS_DEFAULT, help=BATCH_SECONDS_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda|cuda:N", help=DEVICE_HELP),
    devices: Optional[str] = typer.Option(None, metavar="all|cuda:0,cuda:1,...", show_default=False, help=DEVICES_HELP),
    dtype: str = typer.Option("auto", metavar="auto|float32|bfloat16|float16", help=DTYPE_HELP),
    graphs: Optional[bool] = typer.Option(
        None, "--graphs/--no-graphs", show_default="on with CUDA", help="Replay the decode steps from CUDA graphs."
    ),
    beam: int = typer.Option(
        1,
        "--beam",
        min=1,
        metavar="N",
        help="Beam search of N hypotheses per file (NeMo's malsd_batch); 1: greedy. Files only, not --stream.",
    ),
    nbest: bool = typer.Option(
        False, "--nbest", help="With --beam and -f json: each file's n-best list (alternatives, with their scores)."
    ),
    fmt: str = typer.Option(
        "txt",
        "--format",
        "-f",
        metavar="txt|json|srt|vtt|tsv",
        help="Output format; several comma-separated (srt,json) with --output-dir. "
        "srt, vtt, tsv: subtitle cues from the word times.",
    ),
    output_dir: Optional[Path] = typer.Option(
        None,
        "--output-dir",
        "-o",
        metavar="DIR",
        parser=output_dir_arg,
        show_default="stdout",
        help="Write one file per input and format here (NAME.srt, ...), keeping the folder structure of folder inputs.",
    ),
    attention: str = typer.Option("auto", metavar="auto|full|local", help=ATTENTION_HELP),
    attention_window: int = typer.Option(
        ATTENTION_WINDOW,
        min=1,
        metavar="W",
        help="Local attention: encoder frames (80 ms) seen on each side (NeMo's att_context_size [W, W]).",
    ),
    skip_existing: bool = typer.Option(
        False,
        "--skip-existing",
        help="With --output-dir: leave out (and do not read) every input whose output files all exist already.",
    ),
    stream: bool = typer.Option(
        False,
        "--stream",
        help="Transcribe one input live, as it is read (a file, or - for standard input): partial text on a "
        "terminal, a line per utterance; -f jsonl: one JSON event per line.",
    ),
    realtime: bool = typer.Option(False, "--realtime", help="With --stream: feed a file at real-time pace."),
    raw_rate: Optional[int] = typer.Option(
        None, "--raw-rate", metavar="HZ", help="With --stream: the input is raw 16-bit little-endian mono PCM at HZ."
    ),
    chunk: float = typer.Option(
        CHUNK_SECONDS,
        "--chunk",
        metavar="S",
        help="With --stream: seconds per step (a cache-aware model: one of its chunks; the default is its own).",
    ),
    left: float = typer.Option(LEFT_SECONDS, "--left", metavar="S", help="With --stream: seconds of left context."),
    right: float = typer.Option(
        RIGHT_SECONDS, "--right", metavar="S", help="With --stream: seconds of right context (the delay)."
    ),
    max_audio_hours: float = typer.Option(
        MAX_AUDIO_HOURS, "--max-audio-hours", min=0.001, metavar="H", help=MAX_AUDIO_HELP
    ),
    lm: Optional[Path] = LM_OPTION,
    lm_weight: float = LM_WEIGHT_OPTION,
    hotwords: Optional[str] = HOTWORDS_OPTION,
    hotwords_file: Optional[Path] = HOTWORDS_FILE_OPTION,
    boost: float = BOOST_OPTION,
    confidence: bool = typer.Option(False, "--confidence", help=CONFIDENCE_HELP),
) -> None:
    """Transcribe audio files with a Parakeet TDT or RNN-T checkpoint: text, JSON with word times, or subtitles.

    Results come as their batch is done, batches longest first: without --output-dir each file's line is
    printed then (txt: PATH: text; json: one object with its path), in that order, not the inputs' order.
    Output files are written whole (a temporary name, renamed when complete) and named by their input alone:
    NAME.txt, or NAME.wav.txt where NAME.flac sits beside NAME.wav. Ctrl-C keeps every finished result."""
    setup_logging()
    _check_beam(beam, nbest, stream, fmt)
    if stream:
        from graphscribe.live import stream_command  # here: torch and the stream engine for --stream only

        stream_command(inputs, model, device, dtype, graphs, fmt, output_dir, realtime, raw_rate, chunk, left, right)
    files, input_errors = expand_inputs(inputs)
    for line in input_errors:
        print_error(line)
    if not files:
        raise typer.Exit(1)
    formats = parse_formats(fmt, output_dir, len(files))
    if confidence and not {"json", "tsv"} & set(formats):  # nothing to show it in: not computed
        err_console.print("note: --confidence shows in json and tsv output only; not computed for " + fmt)
        confidence = False
    several = devices_or_exit(devices, device)
    if len(several) == 1:  # one device: this process, as with --device
        device = several[0]
    targets: dict[str, list[Path]] = {}
    if output_dir is not None:
        check_output_dir(output_dir)
        targets = {f: output_paths(output_dir, files, inputs, "." + f) for f in formats}
        check_outputs(files, targets)
    elif skip_existing:
        fail_usage("--skip-existing needs --output-dir (it skips inputs whose output files exist)")
    max_seconds = max_audio_hours * 3600
    todo = [i for i in range(len(files)) if not (skip_existing and all(p[i].exists() for p in targets.values()))]
    skipped = len(files) - len(todo)
    too_long = _too_long_by_header(files, todo, max_seconds)  # what is skipped is not read
    for i, line in too_long.items():
        print_error(line)
        if not targets and formats[0] == "json":  # its record, as for a file that fails when read
            print_text(stdout_text(Transcript(str(files[i]), error=line), "json", several=True))
    todo = [i for i in todo if i not in too_long]
    files = [files[i] for i in todo]
    targets = {f: [paths[i] for i in todo] for f, paths in targets.items()}
    loaded, tally, elapsed = None, Tally(), 0.0
    if files:
        if not several and device != "auto":  # --devices checked its own (and its parent imports no torch)
            _device_or_exit(device)
        options = RunOptions(
            device=device,
            dtype=dtype,
            graphs=graphs is not False,
            batch_size=batch,
            batch_seconds=batch_seconds,
            attention=attention,
            attention_window=attention_window,
            max_audio_seconds=max_seconds,
            **fusion_options(lm, lm_weight, hotwords, hotwords_file, boost),
            beam_size=beam,
            nbest=nbest,
            confidence=confidence,
        )
        loaded, tally, elapsed = _load_and_transcribe(files, formats, targets, several, model, options, graphs is True)

    tally.failed += len(input_errors) + len(too_long)
    total = len(files) + skipped + len(input_errors) + len(too_long)
    counts = ", ".join(f"{n} {what}" for n, what in ((tally.failed, "failed"), (skipped, "skipped")) if n)
    counts = f" ({counts})" if counts else ""
    if tally.stopped is not None:
        err_console.print(escape(f"interrupted: {tally.done} of {total} files done{counts}"))
        raise typer.Exit(tally.stopped.code)
    if tally.disk_full is not None:  # one line, not one per file left
        stop = f"{tally.disk_full}; stopped with {tally.done} of {total} files done: make room, then rerun"
        print_error(stop + (" with --skip-existing" if targets else ""))
        raise typer.Exit(1)
    summary = ""
    if loaded is not None:
        warm = loaded.load_seconds.get("warm_up", 0.0)
        summary = f"loaded in {loaded.load_seconds['total']:.2f} s"
        summary += f" ({warm:.2f} s of it warming up); " if warm else "; "
    summary += f"transcribed {tally.done} of {total} files{counts}"
    if loaded is not None:
        summary += f": {tally.audio:.1f} s of audio in {elapsed:.2f} s"
    if elapsed > 0 and tally.audio > 0:
        summary += f" (RTFx {tally.audio / elapsed:.1f})"
    if total > 1 or tally.failed:
        err_console.print(escape(summary))
        for line in _device_lines(loaded):
            err_console.print(escape(line))
    raise typer.Exit(1 if tally.failed else 0)


def _device_or_exit(device: str) -> None:
    """--device as one line and exit 2 where it names no device of this machine (cuda without CUDA), before the
    model (or its note) loads."""
    from graphscribe.model.transducer import resolve_device  # torch: the model's loading imports it next anyway

    try:
        resolve_device(device)
    except ValueError as err:
        fail_usage(str(err))


def _too_long_by_header(files: list[Path], todo: list[int], max_seconds: float) -> dict[int, str]:
    """Index -> error line of each of `files[todo]` whose header says it holds over `max_seconds` of audio, read
    before the model loads for up to HEADER_CHECK_FILES inputs: a run of only such files ends in a second, without
    loading torch. Past that the readers refuse them from their headers as the model loads, and reading every
    header first would delay a folder's start (0.1-0.5 ms a file)."""
    if len(todo) > HEADER_CHECK_FILES:
        return {}
    from graphscribe.io.audio import NATIVE_STDERR, length_problem

    with NATIVE_STDERR.installed():  # libmpg123's notes on odd mp3s stay off stderr, as when they are read
        problems = {i: length_problem(files[i], max_seconds) for i in todo}
    return {i: line for i, line in problems.items() if line is not None}


def _device_lines(loaded) -> list[str]:
    """Under the summary of a run on several devices, a line per device: how its share went and when, in seconds
    from the start of the run, it was ready and done. A device ready late or done early was idle on the clock."""
    lines = []
    for stats in getattr(loaded, "device_stats", None) or []:
        line = f"  {stats.device}: {stats.files} files, {stats.audio_seconds:.1f} s of audio"
        line += f", busy {stats.busy_seconds:.2f} s"
        ready = (stats.phases or {}).get("warmed")
        if ready is not None:
            line += f", ready at {ready:.2f} s"
        if stats.done_at is not None:
            line += f", done at {stats.done_at:.2f} s"
        lines.append(line + (f" ({stats.ended})" if stats.ended else ""))
    return lines


def _check_beam(beam: int, nbest: bool, stream: bool, fmt: str) -> None:
    if beam > 1 and stream:
        fail_usage("--beam decodes files; --stream decodes greedily")
    if nbest and beam < 2:
        fail_usage("--nbest lists a beam's hypotheses: add --beam N (2 or more)")
    if nbest and "json" not in fmt.split(","):
        fail_usage("--nbest lists the alternatives in JSON output: add -f json")


def _load_and_transcribe(files, formats, targets, devices: list[str], model, options: RunOptions, graphs_asked: bool):
    """Load --model to run with `options` (reading starts meanwhile), or start a worker per device, and transcribe
    `files` -> (model, or the run on several devices, or None; tally; seconds). The seconds run from the moment a device
    could take its first batch (its model loaded and warmed up: `pipeline.warm_up`), on one device or several, to
    the last result written; starting and stopping the worker processes is off the clock, as loading and leaving
    are on one device. graphs_asked: --graphs given, noted where there is no CUDA."""
    from graphscribe.io.audio import NATIVE_STDERR

    running: list = []  # what to close: the readers, or the device workers
    # txt needs the text alone: the token, word and segment times are left out (host work a file)
    word_times = any(f != "txt" for f in formats)
    loaded = None
    try:
        with NATIVE_STDERR.installed(), Status(files) as status:  # libmpg123's notes on odd mp3s stay off stderr
            loaded, results, start, writer = _results(
                files, formats, targets, devices, model, options, graphs_asked, word_times, running, status
            )
            tally = write_results(results, files, formats, targets, status, written=writer is not None)
            if writer is not None and (tally.stopped is not None or tally.disk_full is not None):
                tally.done = writer.settle()  # the batch in flight at the stop was written whole too, never seen
            return loaded, tally, time.perf_counter() - start
    except Interrupted as stop:  # while loading: nothing was written yet
        return loaded, Tally(stopped=stop), 0.0
    finally:
        for r in running:
            r.close()


def _results(files, formats, targets, devices, model, options: RunOptions, graphs_asked, word_times, running, status):
    """-> (the model, or the run on several devices: the summary reads its `load_seconds`; an iterator of (index,
    Transcript) in plan order; perf_counter() when the first device could take a batch; the RenderPool that writes
    the output files, or None). One device: this process, reading while the weights load and the model warms up;
    several: a worker process per device (`devices.transcribe_on_devices`), each warming up alike. What it starts is
    put in `running`, for the caller to close.
    With word times and many files the outputs come rendered by worker processes of the process that feeds the device
    (`rendering.RenderPool`): each file's timing and formatting would take its GIL from the GPU's launches. With one
    device and `targets`, those workers write the files too: writing them here took the thread that launches the
    GPU's work 0.2 ms a file or more."""
    render = tuple(formats) if word_times and len(files) >= RENDER_POOL_MIN_FILES else ()
    if len(devices) > 1:
        from graphscribe.devices import LoadError, transcribe_on_devices

        run = transcribe_on_devices(files, devices, model_source(model), options, word_times, render)
        running.append(run)
        try:
            run.wait_loaded()
        except LoadError as err:
            fail_usage(str(err))
        return run, iter(run), run.transcribing_since, None
    from graphscribe.io.audio import read_input
    from graphscribe.output.rendering import RenderPool
    from graphscribe.runtime.pipeline import transcribe_stream, warm_up_run
    from graphscribe.runtime.reading import read_ahead

    reads: list = []

    def start_reading(cfg, target, target_dtype) -> None:  # the first batches are read while the weights load
        if graphs_asked and target.type != "cuda":
            err_console.print("note: CUDA graphs need a CUDA device; decoding eagerly on the CPU")
        rate, rows, seconds = cfg.features.sample_rate, options.batch_size, options.batch_seconds
        read = functools.partial(read_input, sample_rate=rate, max_seconds=options.max_audio_seconds)
        reads.append(read_ahead(files, rate, target, rows, seconds, read=read, dtype=target_dtype))
        running.append(reads[-1])

    loaded = load_or_exit(model, options, start_reading)
    warm = warm_up_run(loaded, len(files), options.batch_size, options.batch_seconds)  # first uses off the clock
    if warm:
        loaded.load_seconds = {**loaded.load_seconds, "warm_up": warm, "total": loaded.load_seconds["total"] + warm}
    writer = None
    if render and targets:  # per input, its files' paths in `formats`' order (targets' own)
        writer = RenderPool(
            loaded.transcript_maker, render, outputs=[tuple(map(str, p)) for p in zip(*targets.values())]
        )
        running.append(writer)
    results = transcribe_stream(status.watch(loaded), reads[0], word_times=word_times, render=render, renderer=writer)
    return loaded, results, time.perf_counter(), writer


transcribe_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
transcribe_app.command(epilog=_EXAMPLES)(transcribe_command)
bench_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
bench_app.command()(bench_command)


# The packages each extra brings: a command whose extra is missing says which to install, in one line.
EXTRAS = {"serve": ("starlette", "uvicorn", "httptools", "uvloop"), "ray": ("ray", "pyarrow", "starlette")}


def missing_extra(command: str, extra: str, err: ModuleNotFoundError) -> None:
    """Exit 2 with one line naming the extra to install, if `err` is a package of that extra; else re-raise."""
    missing = (err.name or "").split(".")[0]
    if missing not in EXTRAS[extra]:
        raise err
    err_console.print(f"[red]error:[/red] {escape(f'{command} needs {missing}: pip install graphscribe[{extra}]')}")
    raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    """Entry point: `transcribe bench ...` runs the benchmark, `transcribe serve ...` the server, `transcribe ray ...`
    a Ray Data job, anything else transcribes."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        from graphscribe import __version__

        print(f"graphscribe {__version__}")
        return
    if args and args[0] == "bench":
        bench_app(args[1:], prog_name="transcribe bench")
    elif args and args[0] == "ray":
        try:
            from graphscribe.ray_data import ray_app  # here: pyarrow and Ray are for `transcribe ray` only
        except ModuleNotFoundError as err:
            missing_extra("transcribe ray", "ray", err)
        ray_app(args[1:], prog_name="transcribe ray")
    elif args and args[0] == "ray-serve":
        try:
            from graphscribe.ray_serve import ray_serve_app  # the server's request parsing: starlette
        except ModuleNotFoundError as err:
            missing_extra("transcribe ray-serve", "ray", err)
        ray_serve_app(args[1:], prog_name="transcribe ray-serve")
    elif args and args[0] == "listen":
        from graphscribe.live import listen_app

        listen_app(args[1:], prog_name="transcribe listen")
    elif args and args[0] == "serve":
        try:
            from graphscribe.serve.command import serve_app  # here: starlette and uvicorn are for the server only
        except ModuleNotFoundError as err:
            missing_extra("transcribe serve", "serve", err)
        serve_app(args[1:], prog_name="transcribe serve")
    else:
        transcribe_app(args, prog_name="transcribe")


def entry() -> None:
    """The `transcribe` command: `main()`, then the process ends at once.

    Python's teardown after a transcription (the model's memory, the CUDA context, the reader threads) takes
    0.5-0.7 s that nobody waits for: every output file is closed by then, so the process flushes its two
    streams and leaves without it (os._exit). In-process callers use `main()`, which returns or raises as usual.
    SIGINT and SIGTERM are handled from here on (`_Signals`): before torch is imported, so a Ctrl-C while it
    loads ends in one line too.
    """
    SIGNALS.install()
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
    except Interrupted as stop:  # transcribe counts what it finished itself; this is anything else (bench)
        print("interrupted", file=sys.stderr)
        code = stop.code
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a reader that went away (transcribe ... | head): nothing more can be said
        code = code or 1
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
