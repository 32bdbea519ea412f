"""`transcribe`: audio files and folders in, transcripts out; `transcribe bench` A/B-tests the graph modes;
`transcribe serve` serves OpenAI's transcription API (server.py).

Exit codes: 0 every file done, 1 some failed (each named on stderr with its reason), 2 bad usage.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .audio import NATIVE_STDERR, find_audio_files
from .checkpoint import DEMO_NAME, CheckpointError
from .config import UnsupportedModelError
from .pipeline import ReadAhead, read_ahead, transcribe_stream
from .tokenizer import TokenizerError
from .writers import FORMATS, LINE_FORMATS, WRITERS, stdout_text

MODEL_ENV = "GRAPHSCRIBE_MODEL"  # default for --model

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def _fail_usage(message: str) -> None:
    err_console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(2)


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record comes (transcribing routes it around libmpg123's chatter)."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def _setup_logging() -> None:
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    root = logging.getLogger("graphscribe")
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    root.propagate = False


def load_or_exit(
    model: Optional[str],
    device: str,
    dtype: str,
    graphs: Optional[bool],
    batch: Optional[int] = None,
    attention: str = "auto",
    attention_window: int = 256,
    on_config=None,
):
    """Load the model for a command, or print one line and exit 2. graphs=None: on where CUDA is.
    on_config: see `load_model`."""
    from .model import load_model
    from .priming import prime

    primer = prime(device, dtype)  # CUDA's libraries load while the checkpoint does
    source = model or os.environ.get(MODEL_ENV) or DEMO_NAME
    if source == DEMO_NAME:
        err_console.print(
            "note: using the bundled demo model (14 M parameters, trained on synthetic espeak-ng speech; "
            "poor on real voices): for real transcripts pass --model nvidia/parakeet-tdt-0.6b-v3 "
            f"or a .nemo file, or set {MODEL_ENV}"
        )
    try:
        loaded = load_model(
            source,
            device=device,
            dtype=dtype,
            graphs=graphs is not False,
            batch_size=batch,
            attention=attention,
            attention_window=attention_window,
            on_config=on_config,
        )
    except (CheckpointError, UnsupportedModelError, TokenizerError, ValueError) as err:
        if primer is not None:
            primer.join()  # not exiting while it is inside a CUDA library
        message = str(err)
        if isinstance(err, UnsupportedModelError):
            message = f"{source}: {message}"
        _fail_usage(message)
    if graphs and loaded.device.type != "cuda":  # asked for explicitly
        err_console.print("note: CUDA graphs need a CUDA device; decoding eagerly on the CPU")
    return loaded  # the primer may still be at work: what it loads is locked, the first use waits for it


def expand_inputs(inputs: list[Path]) -> tuple[list[Path], list[str]]:
    """Files as given and audio files found under folders; plus one error line per input that yields nothing."""
    files, errors = [], []
    for path in inputs:
        if path.is_dir():
            found = find_audio_files(path)
            if not found:
                errors.append(f"{path}: folder has no audio files")
            files.extend(found)
        else:
            files.append(path)  # missing or unreadable files are reported when read
    return files, errors


def _output_path(output_dir: Path, source: Path, roots: list[Path], suffix: str) -> Path:
    """Output file for `source`, keeping its place under the folder it was found in."""
    for root in roots:
        if root.is_dir():
            try:
                return (output_dir / source.relative_to(root)).with_suffix(suffix)
            except ValueError:
                continue
    return (output_dir / source.name).with_suffix(suffix)


def output_paths(output_dir: Path, files: list[Path], roots: list[Path], suffix: str) -> list[Path]:
    """One distinct output file per input, in input order: a name taken already gets -2, -3, ..."""
    taken: set[Path] = set()
    paths = []
    for source in files:
        target = _output_path(output_dir, source, roots, suffix)
        n = 1
        while target in taken:
            n += 1
            target = target.with_name(f"{_output_path(output_dir, source, roots, suffix).stem}-{n}{suffix}")
        taken.add(target)
        paths.append(target)
    return paths


def parse_formats(value: str, output_dir: Optional[Path], n_files: int) -> list[str]:
    """`--format` as a list of format names; a bad list exits 2 with one line."""
    formats = list(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    unknown = [f for f in formats if f not in WRITERS]
    if unknown or not formats:
        _fail_usage(f"--format {value}: use {', '.join(FORMATS)} (several, comma-separated, with --output-dir)")
    if output_dir is None and len(formats) > 1:
        _fail_usage(f"--format {value}: several formats need --output-dir (one file per input and format)")
    if output_dir is None and formats[0] not in LINE_FORMATS and n_files > 1:
        _fail_usage(f"--format {value} prints one file's subtitles: for {n_files} files use --output-dir")
    return formats


_MODEL_HELP = ".nemo file, extracted checkpoint folder, Hugging Face repo id (nvidia/parakeet-tdt-0.6b-v3), or demo."
_MODEL_DEFAULT = f"${MODEL_ENV}, else demo"
_DEVICE_HELP = "auto: CUDA when present, else the CPU."
_DTYPE_HELP = "auto is float32, NeMo's precision. On the CPU, float16 falls back to float32."
_ATTENTION_HELP = (
    "Encoder attention. auto: full attention (NeMo's default) unless an input is over 24 min or full "
    "attention would not fit in free memory, then local (one note on stderr). full: always full. "
    "local: NeMo's rel_pos_local_attn, linear in length. A checkpoint trained with local attention "
    "uses its own window (full still forces full)."
)
_BATCH_HELP = "Files per batch (longest first)."
_BATCH_DEFAULT = "64 on CUDA, 8 on the CPU"
_BATCH_SECONDS_HELP = (
    "Seconds of padded audio per batch at most: files x the longest one's length, so long files "
    "batch narrowly and short ones widely; 0: no cap."
)
_BATCH_SECONDS_DEFAULT = "40 per GiB of GPU memory (3200 on 80 GB), 120 on the CPU"
_EXAMPLES = """Examples:

  transcribe talk.wav                                 # the text
  transcribe talk.wav -m nvidia/parakeet-tdt-0.6b-v3  # a Parakeet model (downloaded once)
  transcribe talk.wav -f srt > talk.srt               # subtitles of one file
  transcribe talks/ -f srt,json -o out/               # a folder: out/NAME.srt and out/NAME.json each
  transcribe clips/ -b 128 --dtype bfloat16 -o out/   # many short files on a large GPU
  transcribe meeting-3h.flac --attention local        # hours of audio: local attention, memory linear in length"""


def transcribe_command(
    inputs: List[Path] = typer.Argument(
        ...,
        metavar="FILES_OR_FOLDERS",
        show_default=False,
        help="Audio files (wav, flac, mp3, ...) or folders, searched recursively.",
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=_MODEL_DEFAULT, help=_MODEL_HELP
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", "-b", min=1, metavar="N", show_default=_BATCH_DEFAULT, help=_BATCH_HELP
    ),
    batch_seconds: Optional[float] = typer.Option(
        None, "--batch-seconds", min=0, metavar="S", show_default=_BATCH_SECONDS_DEFAULT, help=_BATCH_SECONDS_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda|cuda:N", help=_DEVICE_HELP),
    dtype: str = typer.Option("auto", metavar="auto|float32|bfloat16|float16", help=_DTYPE_HELP),
    graphs: Optional[bool] = typer.Option(
        None, "--graphs/--no-graphs", show_default="on with CUDA", help="Replay the decode steps from CUDA graphs."
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
        show_default="stdout",
        help="Write one file per input and format here (NAME.srt, ...), keeping the folder structure of folder inputs.",
    ),
    attention: str = typer.Option("auto", metavar="auto|full|local", help=_ATTENTION_HELP),
    attention_window: int = typer.Option(
        256,
        min=1,
        metavar="W",
        help="Local attention: encoder frames (80 ms) seen on each side (NeMo's att_context_size [W, W]).",
    ),
) -> None:
    """Transcribe audio files with a Parakeet TDT or RNN-T checkpoint: text, JSON with word times, or subtitles."""
    _setup_logging()
    files, input_errors = expand_inputs(inputs)
    for line in input_errors:
        err_console.print(f"[red]error:[/red] {escape(line)}")
    if not files:
        raise typer.Exit(1)
    formats = parse_formats(fmt, output_dir, len(files))
    reads: list[ReadAhead] = []

    def start_reading(cfg, target, target_dtype) -> None:  # the first batches are read while the weights load
        reads.append(read_ahead(files, cfg.features.sample_rate, target, batch, batch_seconds, dtype=target_dtype))

    try:
        with NATIVE_STDERR.installed():  # libmpg123's notes on odd mp3s stay off stderr
            loaded = load_or_exit(model, device, dtype, graphs, batch, attention, attention_window, start_reading)
            targets = (
                {f: output_paths(output_dir, files, inputs, "." + f) for f in formats} if output_dir is not None else {}
            )
            start = time.perf_counter()
            printed, done, audio, failed = _transcribe_files(loaded, reads[0], formats, targets)
            elapsed = time.perf_counter() - start
    finally:
        for r in reads:
            r.close()

    for text in printed:
        if text is not None:
            sys.stdout.write(text)
    failed += len(input_errors)
    total = len(files) + len(input_errors)
    summary = f"loaded in {loaded.load_seconds['total']:.2f} s; transcribed {done} of {len(files)} files"
    if failed:
        summary += f" ({failed} failed)"
    summary += f": {audio:.1f} s of audio in {elapsed:.2f} s"
    if elapsed > 0 and audio > 0:
        summary += f" (RTFx {audio / elapsed:.1f})"
    if total > 1 or failed:
        err_console.print(escape(summary))
    raise typer.Exit(1 if failed else 0)


def _transcribe_files(loaded, reads: ReadAhead, formats: list[str], targets: dict[str, list[Path]]):
    """Transcribe and write as results come; -> stdout text per file (None: written or failed), files done,
    audio seconds done, failures. Only the stdout text is kept, so memory does not grow with the outputs."""
    files = reads.items
    printed: list[Optional[str]] = [None] * len(files)
    done, audio, failed = 0, 0.0, 0
    show_progress = len(files) > 1 and sys.stderr.isatty()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=not show_progress,
        transient=True,
    ) as progress:
        task = progress.add_task("transcribing", total=len(files))
        # txt needs the text alone: the token, word and segment times are left out (host work a file)
        timings = any(f != "txt" for f in formats)
        for i, transcript in transcribe_stream(loaded, reads, timings=timings):
            progress.advance(task)
            if transcript.error is not None:
                failed += 1
                progress.console.print(f"[red]error:[/red] {escape(transcript.error)}")
                continue
            done += 1
            audio += transcript.audio_seconds
            if not targets:
                printed[i] = stdout_text(transcript, formats[0], several=len(files) > 1)
            for f, paths in targets.items():
                if not _write(paths[i], WRITERS[f](transcript), progress.console):
                    failed += 1
                    break
    return printed, done, audio, failed


def _write(target: Path, content: str, console: Console) -> bool:
    """Write one output file; False (after one error line) if it cannot be written."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    except OSError as err:
        reason = escape(str(err.strerror or err))
        console.print(f"[red]error:[/red] {escape(str(target))}: cannot write output ({reason})")
        return False
    return True


def bench_command(
    clips: List[Path] = typer.Argument(
        None, metavar="CLIPS", show_default="7.4 s, 23 s and 77 s of real speech", help="Audio clips to benchmark."
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=_MODEL_DEFAULT, help=_MODEL_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda|cuda:N", help=_DEVICE_HELP),
    dtype: str = typer.Option("auto", metavar="auto|float32|bfloat16|float16", help=_DTYPE_HELP),
    reps: Optional[int] = typer.Option(
        None,
        min=1,
        metavar="N",
        show_default="5; 3 for throughput",
        help="Timed repetitions per row (the median is reported).",
    ),
    batch_sizes: Optional[str] = typer.Option(
        None, metavar="N,N,...", show_default="1,8; 8,32,128 for throughput", help="Batch sizes, comma-separated."
    ),
    graphs: Optional[bool] = typer.Option(
        None,
        "--graphs/--no-graphs",
        show_default="on with CUDA",
        help="Include the CUDA-graph rows (--no-graphs: eager rows only).",
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
        show_default=_BATCH_SECONDS_DEFAULT,
        help="Throughput rows: seconds of padded audio per batch at most (see transcribe --help).",
    ),
    serve: Optional[str] = typer.Option(
        None, "--serve", metavar="URL", help="Load-test a running `transcribe serve` with the files under --folder."
    ),
    concurrency: str = typer.Option("1,8,32,128", metavar="N,N,...", help="--serve: clients at once, a row each."),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="GRAPHSCRIBE_API_KEY", metavar="KEY", help="--serve: the server's API key."
    ),
    response_format: str = typer.Option("json", metavar="FORMAT", help="--serve: the response_format asked for."),
) -> None:
    """A/B benchmark: decoding with and without CUDA graphs, serial and batched, and end to end; with --folder or
    --throughput, files per second through the whole pipeline instead; with --serve URL --folder DIR, a load test of
    a running server."""
    _setup_logging()
    if serve is not None:  # a load test of a running server: no model here
        from .loadtest import bench_server, print_report

        try:
            report = bench_server(serve, folder, concurrency, api_key, response_format)
        except ValueError as err:
            _fail_usage(str(err))
        print_report(report, Console(width=None if sys.stdout.isatty() else 240))
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        return
    folder_mode = folder is not None or throughput
    if folder_mode and clips:
        _fail_usage("bench: give CLIPS, or --folder / --throughput, not both")
    sizes = _batch_sizes(batch_sizes or ("8,32,128" if folder_mode else "1,8"))
    reps = reps or (3 if folder_mode else 5)
    loaded = load_or_exit(model, device, dtype, graphs=False)
    want_graphs = graphs is not False
    modes = [False, True] if want_graphs and loaded.device.type == "cuda" else [False]
    if loaded.device.type != "cuda":
        err_console.print("note: CUDA graphs need a CUDA device; benchmarking the eager rows only")
    console = Console(width=None if sys.stdout.isatty() else 240)
    if folder_mode:
        report = _bench_folder(loaded, folder, files, sizes, reps, modes, batch_seconds, console)
    else:
        from .bench import print_table, run_bench, tier_clips

        try:
            tiers = tier_clips(loaded, clips or None)
        except ValueError as err:
            _fail_usage(str(err))
        report = run_bench(loaded, tiers, sizes, reps, modes)
        print_table(report, console)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _batch_sizes(value: str) -> list[int]:
    try:
        sizes = sorted({int(s) for s in value.split(",") if s.strip()})
    except ValueError:
        _fail_usage(f"--batch-sizes {value!r}: use comma-separated whole numbers such as 1,8")
    if not sizes or min(sizes) < 1:
        _fail_usage(f"--batch-sizes {value!r}: sizes must be 1 or more")
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
) -> dict:
    """Throughput rows over the files under `folder`, or over `files` generated clips."""
    import tempfile

    from .bench import make_folder, print_throughput, run_throughput

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
                _fail_usage(f"--folder {folder}: no audio files there")
        report = run_throughput(loaded, paths, sizes, reps, modes, batch_seconds)
        report["folder"] = str(folder) if folder is not None else f"generated: {len(paths)} clips (make_folder, seed 0)"
    print_throughput(report, console)
    return report


transcribe_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
transcribe_app.command(epilog=_EXAMPLES)(transcribe_command)
bench_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
bench_app.command()(bench_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: `transcribe bench ...` runs the benchmark, `transcribe serve ...` the server, anything else
    transcribes."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        bench_app(args[1:], prog_name="transcribe bench")
    elif args and args[0] == "serve":
        try:
            from .server import serve_app  # here: starlette and uvicorn are for the server only
        except ModuleNotFoundError as err:
            missing = (err.name or "").split(".")[0]
            if missing not in ("starlette", "uvicorn"):
                raise
            message = f"transcribe serve needs {missing}: pip install 'graphscribe[serve]'"
            err_console.print(f"[red]error:[/red] {escape(message)}")
            raise SystemExit(2) from None
        serve_app(args[1:], prog_name="transcribe serve")
    else:
        transcribe_app(args, prog_name="transcribe")


def entry() -> None:
    """The `transcribe` command: `main()`, then the process ends at once.

    Python's teardown after a transcription (the model's memory, the CUDA context, the reader threads) takes
    0.5-0.7 s that nobody waits for: every output file is closed by then, so the process flushes its two
    streams and leaves without it (os._exit). In-process callers use `main()`, which returns or raises as usual.
    """
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a reader that went away (transcribe ... | head): nothing more can be said
        code = code or 1
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
