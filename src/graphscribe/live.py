"""`transcribe FILE_OR_- --stream` and `transcribe listen`: live transcription on the command line.

Audio is read as it arrives (a file as fast as it goes or at real-time pace; standard input in any format
FFmpeg reads, or raw 16-bit PCM; a microphone through the optional `sounddevice`), fed to one stream
(`Model.stream`) a piece at a time, and its events printed as they come: on a terminal the open utterance's text
rewritten in place and one line per final; elsewhere one line per final; with `-f jsonl` one JSON object per
event for programs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import typer

from graphscribe.console import (
    DEVICE_HELP,
    DTYPE_HELP,
    MODEL_DEFAULT,
    MODEL_HELP,
    err_console,
    fail_usage,
    load_or_exit,
    setup_logging,
)
from graphscribe.io.config import CHUNK_SECONDS, LEFT_SECONDS, RIGHT_SECONDS
from graphscribe.io.options import RunOptions

PIECE_SECONDS = 0.02  # audio fed at a time: a real-time source's pace, and a file's pieces
RAW_BYTES = 4096  # bytes read from raw PCM at a time
MIN_RATE, MAX_RATE = 1000, 384000  # Hz a raw stream may be given at
STREAM_FORMATS = ("txt", "jsonl")


def check_stream_options(inputs: list[Path], fmt: str, output_dir, raw_rate: Optional[int]) -> str:
    """One input and a format a stream prints: the format, or exit 2 with one line."""
    if len(inputs) != 1:
        fail_usage(f"--stream takes one input (a file or - for standard input), got {len(inputs)}")
    if output_dir is not None:
        fail_usage("--stream prints its events: leave out --output-dir")
    fmt = fmt.strip().lower()
    if fmt not in STREAM_FORMATS:
        fail_usage(f"--format {fmt}: --stream prints txt or jsonl")
    if raw_rate is not None and not MIN_RATE <= raw_rate <= MAX_RATE:
        fail_usage(f"--raw-rate {raw_rate}: give the raw audio's sample rate in Hz ({MIN_RATE}-{MAX_RATE})")
    if raw_rate is None and str(inputs[0]) != "-" and inputs[0].is_dir():
        fail_usage(f"{inputs[0]}: --stream reads one file, not a folder")
    return fmt


def pieces(source: str, rate: int, raw_rate: Optional[int]) -> Iterator[np.ndarray]:
    """The input's audio at `rate` Hz, mono float32, a piece at a time as it is read (AudioError on bad input)."""
    from graphscribe.io.audio import AudioError, read_input
    from graphscribe.io.resample import StreamResampler

    if raw_rate is not None:
        resampler = StreamResampler(raw_rate, rate)
        reader = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115 (closed below)
        try:
            odd = b""
            while True:
                data = odd + reader.read1(RAW_BYTES)  # what has arrived, up to RAW_BYTES: no wait for more
                if len(data) == len(odd):
                    break
                whole = len(data) // 2 * 2
                odd = data[whole:]
                samples = np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / 32768.0
                yield resampler.push(samples)
            yield resampler.flush()
        finally:
            if reader is not sys.stdin.buffer:
                reader.close()
        return
    if source == "-":
        yield from _ffmpeg_pieces(rate)
        return
    audio = read_input(source, rate).numpy()  # a file: read whole, then fed as it would arrive
    if audio.size == 0:
        raise AudioError(f"{source}: no audio")
    yield audio


def paced(chunks: Iterator[np.ndarray], rate: int, realtime: bool) -> Iterator[np.ndarray]:
    """The audio again in pieces of PIECE_SECONDS, each given no earlier than its time with `realtime`."""
    step = max(1, int(PIECE_SECONDS * rate))
    start, given = time.perf_counter(), 0
    for chunk in chunks:
        for i in range(0, len(chunk), step):
            piece = chunk[i : i + step]
            given += len(piece)
            wait = start + given / rate - time.perf_counter()
            if realtime and wait > 0:
                time.sleep(wait)
            yield piece


def _ffmpeg_pieces(rate: int) -> Iterator[np.ndarray]:
    """Standard input in any format FFmpeg reads, decoded as it arrives."""
    import av

    from graphscribe.io.audio import AudioError

    try:
        container = av.open(sys.stdin.buffer, mode="r")
    except (av.error.FFmpegError, OSError) as err:
        raise AudioError(f"-: standard input is not audio FFmpeg can read ({_first_line(err)})") from None
    with container:
        if not container.streams.audio:
            raise AudioError("-: standard input holds no audio track")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        try:
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    yield out.to_ndarray().reshape(-1).astype(np.float32)
            for out in resampler.resample(None):
                yield out.to_ndarray().reshape(-1).astype(np.float32)
        except av.error.FFmpegError as err:
            raise AudioError(f"-: standard input is not audio FFmpeg can read ({_first_line(err)})") from None


def _first_line(err: Exception) -> str:
    """The reason alone: FFmpeg's message without its errno and file name."""
    reason = getattr(err, "strerror", None) or str(err).strip()
    return reason.splitlines()[0] if reason else type(err).__name__


class Printer:
    """Events to stdout: jsonl objects, or text (on a terminal the partial rewritten in place)."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.tty = fmt == "txt" and sys.stdout.isatty()
        self._shown = 0  # characters of the partial on screen

    def __call__(self, events) -> None:
        for event in events:
            if self.fmt == "jsonl":
                print(json.dumps(event_json(event), ensure_ascii=False), flush=True)
            elif event.type == "final":
                self._clear()
                print(event.text, flush=True)
            elif event.type == "partial" and self.tty:
                self._clear()
                sys.stdout.write(event.text)
                sys.stdout.flush()
                self._shown = len(event.text)
        if self.fmt == "txt" and any(e.type == "done" for e in events):
            self._clear()

    def _clear(self) -> None:
        if self._shown:
            sys.stdout.write("\r\033[K")
            self._shown = 0


def event_json(event) -> dict:
    """A stream event as the JSON lines (and the realtime server) give it."""
    return {
        "type": event.type,
        "text": event.text,
        "start": round(event.start, 3),
        "end": round(event.end, 3),
        "token_ids": event.token_ids,
        "words": [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)} for w in event.words],
    }


def run_stream(model, source: str, fmt: str, raw_rate, realtime: bool, chunk: float, left: float, right: float) -> int:
    """Stream one input through `model`, printing events; the exit code (1 when the input was bad)."""
    from graphscribe.io.audio import AudioError

    try:
        stream = model.stream(chunk, left, right)
    except ValueError as err:
        fail_usage(str(err))
    printer = Printer(fmt)
    try:
        for piece in paced(pieces(source, model.sample_rate, raw_rate), model.sample_rate, realtime):
            printer(stream.feed(piece))
    except AudioError as err:
        err_console.print(f"[red]error:[/red] {err}", markup=True, highlight=False)
        printer(stream.finish())
        return 1
    except KeyboardInterrupt:
        printer(stream.finish())  # what was heard is kept
        raise
    printer(stream.finish())
    return 0


def listen(model, fmt: str, chunk: float, left: float, right: float, device: Optional[str] = None) -> int:
    """The default microphone (or `device`) through sounddevice until Ctrl-C."""
    import queue

    try:
        import sounddevice
    except (ImportError, OSError) as err:
        fail_usage(f"transcribe listen needs sounddevice and PortAudio: pip install sounddevice ({_first_line(err)})")
    heard: queue.Queue = queue.Queue()
    stream = model.stream(chunk, left, right)
    printer = Printer(fmt)
    rate = model.sample_rate

    def callback(data, frames, when, status):  # sounddevice's thread: only hand the samples over
        heard.put(data[:, 0].copy())

    err_console.print("listening (Ctrl-C to stop)")
    try:
        with sounddevice.InputStream(samplerate=rate, channels=1, dtype="float32", callback=callback, device=device):
            while True:
                printer(stream.feed(heard.get()))
    except KeyboardInterrupt:
        printer(stream.finish())
    return 0


def stream_command(
    inputs, model, device, dtype, graphs, fmt, output_dir, realtime, raw_rate, chunk, left, right
) -> None:
    """`transcribe INPUT --stream`: load the model and stream the input (exits with the run's code)."""
    fmt = check_stream_options(inputs, fmt, output_dir, raw_rate)
    loaded = load_or_exit(model, RunOptions(device=device, dtype=dtype, graphs=graphs is not False))
    raise typer.Exit(run_stream(loaded, str(inputs[0]), fmt, raw_rate, realtime, chunk, left, right))


def listen_command(
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT, help=MODEL_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda|cuda:N", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", metavar="auto|float32|bfloat16|float16", help=DTYPE_HELP),
    fmt: str = typer.Option("txt", "--format", "-f", metavar="txt|jsonl", help="Text lines, or JSON events."),
    microphone: Optional[str] = typer.Option(None, "--input", metavar="NAME", help="sounddevice's input device."),
    chunk: float = typer.Option(CHUNK_SECONDS, "--chunk", metavar="S", help="Seconds per step."),
    left: float = typer.Option(LEFT_SECONDS, "--left", metavar="S", help="Seconds of left context."),
    right: float = typer.Option(RIGHT_SECONDS, "--right", metavar="S", help="Seconds of right context (the delay)."),
) -> None:
    """Transcribe the microphone live until Ctrl-C (needs the optional sounddevice package)."""
    setup_logging()
    if fmt not in STREAM_FORMATS:
        fail_usage(f"--format {fmt}: listen prints txt or jsonl")
    loaded = load_or_exit(model, RunOptions(device=device, dtype=dtype))
    raise typer.Exit(listen(loaded, fmt, chunk, left, right, microphone))


listen_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
listen_app.command()(listen_command)
