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

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from graphscribe.console import DEVICE_HELP as _DEVICE_HELP
from graphscribe.console import DTYPE_HELP as _DTYPE_HELP
from graphscribe.console import MODEL_DEFAULT as _MODEL_DEFAULT
from graphscribe.console import MODEL_HELP as _MODEL_HELP
from graphscribe.console import err_console, load_or_exit, model_source
from graphscribe.console import fail_usage as _fail_usage
from graphscribe.console import setup_logging as _setup_logging
from graphscribe.output.writers import FORMATS, LINE_FORMATS, WRITERS, cannot_write, render, stdout_text, write_file

if TYPE_CHECKING:
    from graphscribe.output.transcript import Transcript

# Files from which the outputs with times are rendered in worker processes: starting them costs about half a
# second (overlapped with the first batch), and rendering in this process about a millisecond a file.
RENDER_POOL_MIN_FILES = 256
STDIN = "-"  # the input that reads standard input (audio.STDIN; audio.py imports torch)


class Interrupted(BaseException):
    """SIGINT or SIGTERM, raised in the main thread by `_Signals`; a BaseException, so that no `except Exception`
    on its way out swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class _Signals:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread wherever it is (importing torch, loading the
    model, waiting for a batch), except inside `held()`, which writes one result's files and stdout line: the
    signal is raised when it ends, so a result is written whole or not at all. A second signal while the first
    one is being handled ends the process at once: every output is complete by then and stdout flushed."""

    def __init__(self):
        self.holding = False
        self.pending: Optional[int] = None
        self.stopping = False

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.stopping:
            os._exit(128 + signum)
        if self.holding:
            self.pending = signum
            return
        if _drops_exceptions(frame):  # raised here, it would be printed and dropped: the signal comes again soon
            threading.Timer(REDELIVER_SECONDS, os.kill, (os.getpid(), signum)).start()
            return
        self.stopping = True
        raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            self.stopping = True
            raise Interrupted(self.pending)


REDELIVER_SECONDS = 0.01


def _drops_exceptions(frame) -> bool:
    """Whether Python drops (and prints) an exception raised in `frame`: finalisers and weakref callbacks run
    there, importlib's module-lock callbacks among them."""
    code = frame.f_code if frame is not None else None
    return code is not None and (code.co_filename.startswith("<frozen importlib") or code.co_name == "__del__")


_SIGNALS = _Signals()  # installed by `entry` only: in-process callers of `main` keep their own handlers


def find_audio_files(folder: Path) -> list[Path]:
    """`audio.find_audio_files`, imported on first use (audio.py imports torch)."""
    from graphscribe.io.audio import find_audio_files as find

    return find(folder)


def expand_inputs(inputs: list[Path]) -> tuple[list[Path], list[str]]:
    """Files as given, audio files found under folders, and `-` (standard input, its transcript named `-`); plus one
    error line per input that yields nothing."""
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
            found = find_audio_files(path)
            if not found:
                errors.append(f"{path}: folder has no audio files")
            files.extend(found)
        else:
            files.append(path)  # missing or unreadable files, and URLs, are reported when read
    return files, errors


def output_paths(output_dir: Path, files: list[Path], roots: list[Path], suffix: str) -> list[Path]:
    """Each input's output file, in input order, kept under the folder input it was found in, and named by the
    input alone (standard input: stdin.txt): NAME.txt, or NAME.wav.txt where another audio file in the input's own
    folder has its stem
    (a.wav and a.flac: a.wav.txt and a.flac.txt). Other inputs, and other files in either folder, never move a
    name, so a rerun with files added or left out writes (and skips) the same files."""
    from graphscribe.io.audio import AUDIO_SUFFIXES

    stems: dict[Path, dict[str, int]] = {}  # folder -> stem -> audio files with it

    def shared(source: Path) -> bool:
        if source.parent not in stems:
            counts: dict[str, int] = {}
            with contextlib.suppress(OSError):  # an unreadable folder: its inputs fail when read
                for entry in os.scandir(source.parent):
                    if Path(entry.name).suffix.lower() in AUDIO_SUFFIXES:
                        stem = Path(entry.name).stem
                        counts[stem] = counts.get(stem, 0) + 1
            stems[source.parent] = counts
        return stems[source.parent].get(source.stem, 0) > 1

    paths = []
    for source in files:
        if str(source) == STDIN:  # "-" would name a file that commands take for an option
            paths.append(output_dir / f"stdin{suffix}")
            continue
        name = (source.name if shared(source) else source.stem) + suffix
        place = next((source.relative_to(r).parent for r in roots if r.is_dir() and source.is_relative_to(r)), None)
        paths.append(output_dir / place / name if place is not None else output_dir / name)
    return paths


def check_outputs(files: list[Path], targets: dict[str, list[Path]]) -> None:
    """Exit 2 with one line where two different inputs would write one output file, or an output would replace
    an input. The same file given twice writes the same outputs (the same bytes)."""
    inputs = {f.resolve() for f in files}
    for paths in targets.values():
        writers: dict[Path, Path] = {}
        for source, target in zip(files, paths):
            if target.resolve() in inputs:
                _fail_usage(f"{target}: is an input; outputs never replace an input")
            other = writers.setdefault(target, source)
            if other.resolve() != source.resolve():
                _fail_usage(
                    f"{other} and {source} would both be written to {target}: "
                    "transcribe them into separate --output-dir folders"
                )


def check_output_dir(folder: Path) -> None:
    """Exit 2 with one line unless `folder` is a folder this process can write in (made if missing): checked by
    writing and removing a probe file, before the model loads."""
    if folder.exists() and not folder.is_dir():
        _fail_usage(f"--output-dir {folder}: is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _SIGNALS.held():  # a signal waits: the probe file is never left behind
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".graphscribe-probe.", suffix=".tmp")
            try:
                os.write(fd, b"\n")
            finally:
                os.close(fd)
                os.unlink(probe)
    except OSError as err:
        _fail_usage(f"--output-dir {folder}: cannot write there ({err.strerror or err})")


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


_DEVICES_HELP = (
    "Several devices of this host, one worker process and model each, sharing one longest-first plan: "
    "all (every CUDA GPU) or a comma list (cuda:0,cuda:1; cpu,cpu for many cores). Output as with one device."
)
_ATTENTION_HELP = (
    "Encoder attention. auto: full attention (NeMo's default) unless an input is over 24 min or full "
    "attention would not fit in free memory, then local (one note on stderr). full: always full. "
    "local: NeMo's rel_pos_local_attn, linear in length. A checkpoint trained with local attention "
    "uses its own window (full still forces full)."
)
_BATCH_HELP = "Files per batch (longest first)."
_BATCH_DEFAULT = "32 on CUDA in float32, 64 in 16 bits, 8 on the CPU"
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
  transcribe meeting-3h.flac --attention local        # hours of audio: local attention, memory linear in length
  cat talk.m4a | transcribe -                         # standard input, any format

Other commands (each with --help):

  transcribe serve    an OpenAI-compatible transcription server (pip install 'graphscribe\\[serve]')
  transcribe ray      a Ray Data job over a cluster (pip install 'graphscribe\\[ray]')
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
        None, "--model", "-m", metavar="MODEL", show_default=_MODEL_DEFAULT, help=_MODEL_HELP
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", "-b", min=1, metavar="N", show_default=_BATCH_DEFAULT, help=_BATCH_HELP
    ),
    batch_seconds: Optional[float] = typer.Option(
        None, "--batch-seconds", min=0, metavar="S", show_default=_BATCH_SECONDS_DEFAULT, help=_BATCH_SECONDS_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda|cuda:N", help=_DEVICE_HELP),
    devices: Optional[str] = typer.Option(
        None, metavar="all|cuda:0,cuda:1,...", show_default=False, help=_DEVICES_HELP
    ),
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
    skip_existing: bool = typer.Option(
        False,
        "--skip-existing",
        help="With --output-dir: leave out (and do not read) every input whose output files all exist already.",
    ),
) -> None:
    """Transcribe audio files with a Parakeet TDT or RNN-T checkpoint: text, JSON with word times, or subtitles.

    Results come as their batch is done, batches longest first: without --output-dir each file's line is
    printed then (txt: PATH: text; json: one object with its path), in that order, not the inputs' order.
    Output files are written whole (a temporary name, renamed when complete) and named by their input alone:
    NAME.txt, or NAME.wav.txt where NAME.flac sits beside NAME.wav. Ctrl-C keeps every finished result."""
    _setup_logging()
    files, input_errors = expand_inputs(inputs)
    for line in input_errors:
        err_console.print(f"[red]error:[/red] {escape(line)}")
    if not files:
        raise typer.Exit(1)
    formats = parse_formats(fmt, output_dir, len(files))
    several = _devices_or_exit(devices, device)
    if len(several) == 1:  # one device: this process, as with --device
        device = several[0]
    targets: dict[str, list[Path]] = {}
    if output_dir is not None:
        check_output_dir(output_dir)
        targets = {f: output_paths(output_dir, files, inputs, "." + f) for f in formats}
        check_outputs(files, targets)
    elif skip_existing:
        _fail_usage("--skip-existing needs --output-dir (it skips inputs whose output files exist)")
    todo = [i for i in range(len(files)) if not (skip_existing and all(p[i].exists() for p in targets.values()))]
    skipped = len(files) - len(todo)
    files = [files[i] for i in todo]  # what is skipped is not read
    targets = {f: [paths[i] for i in todo] for f, paths in targets.items()}
    loaded, tally, elapsed = None, _Tally(), 0.0
    if files:
        choice = _ModelChoice(model, device, dtype, graphs, batch, batch_seconds, attention, attention_window)
        loaded, tally, elapsed = _load_and_transcribe(files, formats, targets, several, choice)

    tally.failed += len(input_errors)
    total = len(files) + skipped + len(input_errors)
    counts = ", ".join(f"{n} {what}" for n, what in ((tally.failed, "failed"), (skipped, "skipped")) if n)
    counts = f" ({counts})" if counts else ""
    if tally.stopped is not None:
        err_console.print(escape(f"interrupted: {tally.done} of {total} files done{counts}"))
        raise typer.Exit(tally.stopped.code)
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


@dataclass
class _Tally:
    """What became of the inputs so far."""

    done: int = 0
    failed: int = 0
    audio: float = 0.0  # seconds of audio transcribed
    stopped: Optional[Interrupted] = None  # the signal that stopped the run


@dataclass(frozen=True)
class _ModelChoice:
    """The model and how to run it, as the options gave them (None: the defaults)."""

    model: Optional[str]
    device: str
    dtype: str
    graphs: Optional[bool]
    batch: Optional[int]
    batch_seconds: Optional[float]
    attention: str
    attention_window: int


def _load_and_transcribe(files, formats, targets, devices: list[str], choice: _ModelChoice):
    """Load the model (reading starts meanwhile), or start a worker per device, and transcribe `files` ->
    (model, or the run on several devices, or None; tally; seconds). The seconds run from the moment a device
    could take its first batch (its model loaded and warmed up: `pipeline.warm_up`), on one device or several, to
    the last result written; starting and stopping the worker processes is off the clock, as loading and leaving
    are on one device."""
    from graphscribe.io.audio import NATIVE_STDERR

    running: list = []  # what to close: the readers, or the device workers
    # txt needs the text alone: the token, word and segment times are left out (host work a file)
    timings = any(f != "txt" for f in formats)
    loaded = None
    try:
        with NATIVE_STDERR.installed(), _Status(files) as status:  # libmpg123's notes on odd mp3s stay off stderr
            loaded, results, start, writer = _results(
                files, formats, targets, devices, choice, timings, running, status
            )
            tally = write_results(results, files, formats, targets, status, written=writer is not None)
            if writer is not None and tally.stopped is not None:
                tally.done = writer.written  # the batch in flight at the signal was written whole too, never seen
            return loaded, tally, time.perf_counter() - start
    except Interrupted as stop:  # while loading: nothing was written yet
        return loaded, _Tally(stopped=stop), 0.0
    finally:
        for r in running:
            r.close()


def _devices_or_exit(devices: Optional[str], device: str) -> list[str]:
    """--devices as device names ([] when not given); a bad value exits 2 with one line, before any loading."""
    if devices is None:
        return []
    if device != "auto":
        _fail_usage(f"--device {device} --devices {devices}: give one of them")
    from graphscribe.devices import parse_devices

    try:
        return parse_devices(devices)
    except ValueError as err:
        _fail_usage(str(err))


def _results(files, formats, targets, devices: list[str], c: _ModelChoice, timings: bool, running: list, status):
    """-> (the model, or the run on several devices: the summary reads its `load_seconds`; an iterator of (index,
    Transcript) in plan order; perf_counter() when the first device could take a batch; the RenderPool that writes
    the output files, or None). One device: this process, reading while the weights load and the model warms up;
    several: a worker process per device (`devices.transcribe_on_devices`), each warming up alike. What it starts is
    put in `running`, for the caller to close.
    With timings and many files the outputs come rendered by worker processes of the process that feeds the device
    (`finishing.RenderPool`): each file's timing and formatting would take its GIL from the GPU's launches. With one
    device and `targets`, those workers write the files too: writing them here took the thread that launches the
    GPU's work 0.2 ms a file or more."""
    render = tuple(formats) if timings and len(files) >= RENDER_POOL_MIN_FILES else ()
    if len(devices) > 1:
        from graphscribe.devices import LoadError, transcribe_on_devices
        from graphscribe.io.config import RunOptions

        options = RunOptions(
            dtype=c.dtype, graphs=c.graphs is not False, attention=c.attention, attention_window=c.attention_window
        )
        run = transcribe_on_devices(
            files, devices, model_source(c.model), options, c.batch, c.batch_seconds, timings, render
        )
        running.append(run)
        try:
            run.wait_loaded()
        except LoadError as err:
            _fail_usage(str(err))
        return run, iter(run), run.transcribing_since, None
    from graphscribe.output.finishing import RenderPool
    from graphscribe.runtime.pipeline import read_ahead, transcribe_stream, warm_up_run

    reads: list = []

    def start_reading(cfg, target, target_dtype) -> None:  # the first batches are read while the weights load
        reads.append(read_ahead(files, cfg.features.sample_rate, target, c.batch, c.batch_seconds, dtype=target_dtype))
        running.append(reads[-1])

    loaded = load_or_exit(c.model, c.device, c.dtype, c.graphs, c.batch, c.attention, c.attention_window, start_reading)
    warm = warm_up_run(loaded, len(files), c.batch, c.batch_seconds)  # first uses off the transcription's clock
    if warm:
        loaded.load_seconds = {**loaded.load_seconds, "warm_up": warm, "total": loaded.load_seconds["total"] + warm}
    writer = None
    if render and targets:  # per input, its files' paths in `formats`' order (targets' own)
        writer = RenderPool(loaded.finishing, render, outputs=[tuple(map(str, p)) for p in zip(*targets.values())])
        running.append(writer)
    results = transcribe_stream(status.watch(loaded), reads[0], timings=timings, render=render, renderer=writer)
    return loaded, results, time.perf_counter(), writer


def write_results(
    results: Iterator[tuple[int, Transcript]],
    files: list[Path],
    formats: list[str],
    targets: dict[str, list[Path]],
    status: Optional[_Status] = None,
    written: bool = False,
) -> _Tally:
    """Write each (index into `files`, Transcript) of `results` as it comes: its files (`targets[format][index]`,
    each whole or not at all) or, without targets, its stdout line, flushed at once; errors one line each on
    stderr. written: the files come written already (by `finishing.RenderPool`'s workers), a Transcript's
    `write_error` naming one that could not be. SIGINT or SIGTERM stops it between two results (the tally keeps the
    signal) and closes `results`."""
    tally = _Tally()
    several = len(files) > 1
    try:
        for i, transcript in results:
            with _SIGNALS.held():
                if status is not None:
                    status.advance()
                if transcript.error is not None or transcript.write_error is not None:
                    tally.failed += 1
                    _print_error(escape(transcript.error or transcript.write_error), status)
                elif written or _write_one(transcript, i, formats, targets, several, status):
                    tally.done += 1
                    tally.audio += transcript.audio_seconds
                else:
                    tally.failed += 1
    except Interrupted as stop:
        tally.stopped = stop
    except BrokenPipeError:  # stdout's reader left (transcribe ... | head): nobody reads what comes next
        tally.failed += 1
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # a generator's finally stops its readers
    return tally


def _write_one(transcript, i: int, formats, targets, several: bool, status) -> bool:
    """One result's output files, or its stdout text; False (after one error line) if a file cannot be written."""
    if not targets:
        with status.paused() if status is not None else contextlib.nullcontext():
            sys.stdout.write(stdout_text(transcript, formats[0], several=several))
            sys.stdout.flush()
        return True
    return all(_write(paths[i], render(transcript, f), status) for f, paths in targets.items())


def _write(target: Path, content: str, status: Optional[_Status] = None) -> bool:
    """Write one output file whole; False (after one error line) if it cannot be written."""
    try:
        write_file(target, content)
    except OSError as err:
        _print_error(escape(cannot_write(target, err)), status)
        return False
    return True


def _print_error(line: str, status: Optional[_Status]) -> None:
    (status.progress.console if status is not None else err_console).print(f"[red]error:[/red] {line}")


class _Status:
    """stderr on a terminal while results come: a bar for several files; for one file a spinner with its length
    and the stage it is in (an hour of audio takes a while). Nothing elsewhere."""

    def __init__(self, files: list[Path]):
        self.one = len(files) == 1
        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if not self.one:
            columns += [BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
        self.progress = Progress(
            *columns,
            console=err_console,
            disable=not sys.stderr.isatty(),
            transient=True,
            redirect_stdout=False,  # results go to stdout itself, wherever it leads (`paused` where it is the terminal)
        )
        self.label = f"transcribing {files[0].name}{_length(files[0])}" if self.one else "transcribing"
        self.task = self.progress.add_task(self.label, total=len(files))

    def __enter__(self) -> _Status:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def advance(self) -> None:
        self.progress.advance(self.task)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The status line taken off the terminal while stdout writes there too."""
        if self.progress.disable or not sys.stdout.isatty():
            yield
            return
        self.progress.stop()
        try:
            yield
        finally:
            self.progress.start()

    def stage(self, name: str) -> None:
        self.progress.update(self.task, description=f"{self.label}: {name}…")
        self.progress.refresh()

    def watch(self, model):
        """`model`, or for one file on a terminal the model naming its stages on the status line."""
        return _Staged(model, self.stage) if self.one and not self.progress.disable else model


def _length(path: Path) -> str:
    from graphscribe.io.audio import audio_seconds

    seconds = audio_seconds(path)
    if not seconds:
        return ""
    return f" ({seconds:.0f} s of audio)" if seconds < 60 else f" ({seconds / 60:.1f} min of audio)"


class _Staged:
    """A model as `transcribe_stream` uses it, calling `on_stage` as its encoder and its decoding start."""

    def __init__(self, model, on_stage: Callable[[str], None]):
        self._model, self._on_stage = model, on_stage

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def encoder_output(self, *args, **kwargs):
        self._on_stage("encoder")
        return self._model.encoder_output(*args, **kwargs)

    def decode(self, *args, **kwargs):
        self._on_stage("decoding")
        return self._model.decode(*args, **kwargs)


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
        None, "--api-key", envvar="GRAPHSCRIBE_API_KEY", metavar="KEY", help="--serve: the server's API key."
    ),
    response_format: str = typer.Option("json", metavar="FORMAT", help="--serve: the response_format asked for."),
    client_processes: Optional[int] = typer.Option(
        None,
        "--client-processes",
        metavar="P",
        show_default=False,
        help="--serve: processes the clients are spread over (default: one).",
    ),
) -> None:
    """A/B benchmark: decoding with and without CUDA graphs, serial and batched, and end to end; with --folder or
    --throughput, files per second through the whole pipeline instead; with --serve URL --folder DIR, a load test of
    a running server."""
    _setup_logging()
    if serve is not None:  # a load test of a running server: no model here
        from graphscribe.serve.loadtest import bench_server, print_report

        try:
            report = bench_server(serve, folder, concurrency, api_key, response_format, client_processes)
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
    if devices is not None:
        if not folder_mode:
            _fail_usage("bench --devices: with --folder or --throughput")
        from graphscribe.io.audio import NATIVE_STDERR

        several = _devices_or_exit(devices, device)
        with NATIVE_STDERR.installed():
            batch = max(sizes) if batch_sizes else None  # None: the devices' default
            report = _bench_devices(several, model, dtype, graphs, folder, files, batch, reps, batch_seconds)
        _write_report(report, json_path)
        return
    loaded = load_or_exit(model, device, dtype, graphs=False)
    want_graphs = graphs is not False
    modes = [False, True] if want_graphs and loaded.device.type == "cuda" else [False]
    if loaded.device.type != "cuda":
        err_console.print("note: CUDA graphs need a CUDA device; benchmarking the eager rows only")
    console = Console(width=None if sys.stdout.isatty() else 240)
    if folder_mode:
        report = _bench_folder(loaded, folder, files, sizes, reps, modes, batch_seconds, console)
    else:
        from graphscribe.bench import print_table, run_bench, tier_clips

        try:
            tiers = tier_clips(loaded, clips or None)
        except ValueError as err:
            _fail_usage(str(err))
        report = run_bench(loaded, tiers, sizes, reps, modes, announce=_announce)
        print_table(report, console)
    _write_report(report, json_path)


def _write_report(report: dict, json_path: Optional[Path]) -> None:
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _bench_devices(devices, model, dtype, graphs, folder, files, batch, reps, batch_seconds) -> dict:
    """`bench --devices`: RTFx per device count on the folder (or a generated one), at --batch-sizes' largest."""
    import tempfile

    from graphscribe.bench import make_folder, print_device_scaling, run_device_scaling
    from graphscribe.io.config import RunOptions

    with tempfile.TemporaryDirectory(prefix="graphscribe-folder-") as generated:
        paths = make_folder(generated, files) if folder is None else find_audio_files(folder) if folder.is_dir() else []
        if not paths:
            _fail_usage(f"--folder {folder}: no audio files there")
        options = RunOptions(dtype=dtype, graphs=graphs is not False)
        report = run_device_scaling(model_source(model), devices, paths, options, batch, batch_seconds, reps)
    print_device_scaling(report, Console(width=None if sys.stdout.isatty() else 240))
    return report


def _announce(row: str) -> None:
    """What a benchmark is running now, one stderr line per row as it starts (rows take seconds to minutes)."""
    err_console.print(f"running: {escape(row)}")


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
    from graphscribe.bench import make_folder, print_throughput, run_throughput
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
                _fail_usage(f"--folder {folder}: no audio files there")
        report = run_throughput(loaded, paths, sizes, reps, modes, batch_seconds, announce=_announce)
        report["folder"] = str(folder) if folder is not None else f"generated: {len(paths)} clips (make_folder, seed 0)"
    print_throughput(report, console)
    return report


def ray_command(
    source: str = typer.Argument(
        ..., metavar="INPUT", help="A folder, a text file of paths or URIs (one a line), or Parquet with a path column."
    ),
    output_dir: str = typer.Argument(
        ..., metavar="OUTPUT_DIR", help="Parquet parts go here; inputs with a row without error there are skipped."
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=_MODEL_DEFAULT, help=_MODEL_HELP
    ),
    gpus_per_actor: float = typer.Option(1.0, min=0, metavar="G", help="GPUs per model actor (0.5: two share one)."),
    actors: Optional[int] = typer.Option(
        None, min=1, metavar="N", show_default="the cluster's GPUs / G; 1 on CPUs", help="Model actors."
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", "-b", min=1, metavar="N", show_default=_BATCH_DEFAULT, help=_BATCH_HELP
    ),
    batch_seconds: Optional[float] = typer.Option(
        None, "--batch-seconds", min=0, metavar="S", show_default=_BATCH_SECONDS_DEFAULT, help=_BATCH_SECONDS_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda", help="auto: CUDA where the cluster has GPUs."),
    dtype: str = typer.Option("auto", metavar="auto|float32|bfloat16|float16", help=_DTYPE_HELP),
) -> None:
    """Transcribe with Ray Data on the cluster ray.init() finds (local when there is none): Parquet rows of path,
    text, token_ids, words, segments, audio_seconds, error."""
    _setup_logging()
    try:
        import ray  # noqa: F401

        from graphscribe.ray_data import transcribe_ray
    except ImportError:
        _fail_usage("transcribe ray needs Ray: pip install 'graphscribe[ray]'")
    try:
        skipped, written = transcribe_ray(
            source, output_dir, model_source(model), device, actors, gpus_per_actor, dtype, batch, batch_seconds
        )
    except (ValueError, OSError) as err:
        _fail_usage(str(err))
    if skipped:
        err_console.print(f"skipped {skipped} inputs done in {escape(output_dir)} already")
    err_console.print(f"wrote {written} rows to {escape(output_dir)}")


transcribe_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
transcribe_app.command(epilog=_EXAMPLES)(transcribe_command)
bench_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
bench_app.command()(bench_command)
ray_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
ray_app.command()(ray_command)


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
        ray_app(args[1:], prog_name="transcribe ray")
    elif args and args[0] == "serve":
        try:
            from graphscribe.serve.server import serve_app  # here: starlette and uvicorn are for the server only
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
    SIGINT and SIGTERM are handled from here on (`_Signals`): before torch is imported, so a Ctrl-C while it
    loads ends in one line too.
    """
    _SIGNALS.install()
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
