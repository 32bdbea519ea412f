"""The one-shot command's results as they come: each file's outputs (written whole) or its stdout line, errors one
line each on stderr, and the tally the summary counts. SIGINT and SIGTERM stop it between two results."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from rich.markup import escape

from graphscribe.console import err_console
from graphscribe.output.transcript import Transcript
from graphscribe.output.writers import cannot_write, is_disk_full, one_line, render, stdout_text, write_file
from graphscribe.signals import SIGNALS, Interrupted
from graphscribe.status import Status


@dataclass
class Tally:
    """What became of the inputs so far."""

    done: int = 0
    failed: int = 0
    audio: float = 0.0  # seconds of audio transcribed
    stopped: Optional[Interrupted] = None  # the signal that stopped the run
    disk_full: Optional[str] = None  # the error line of the output that found the disk full: the run stopped there


def write_results(
    results: Iterator[tuple[int, Transcript]],
    files: list[Path],
    formats: list[str],
    targets: dict[str, list[Path]],
    status: Optional[Status] = None,
    written: bool = False,
) -> Tally:
    """Write each (index into `files`, Transcript) of `results` as it comes: its files (`targets[format][index]`,
    each whole or not at all) or, without targets, its stdout line, flushed at once; errors one line each on
    stderr. written: the files come written already (by `rendering.RenderPool`'s workers), a Transcript's
    `write_error` naming one that could not be. SIGINT or SIGTERM stops it between two results (the tally keeps the
    signal) and closes `results`."""
    tally = Tally()
    several = len(files) > 1
    try:
        for i, transcript in results:
            with SIGNALS.held():
                if status is not None:
                    status.advance()
                if transcript.disk_full:
                    raise _DiskFull(transcript.write_error)
                if transcript.error is not None or transcript.write_error is not None:
                    tally.failed += 1
                    print_error(transcript.error or transcript.write_error, status)
                    if transcript.error is not None and not targets and formats[0] == "json":
                        _to_stdout(stdout_text(transcript, "json", several), status)  # {"path", "error"}
                elif written or _write_one(transcript, i, formats, targets, several, status):
                    tally.done += 1
                    tally.audio += transcript.audio_seconds
                else:
                    tally.failed += 1
    except Interrupted as stop:
        tally.stopped = stop
    except _DiskFull as full:
        tally.failed += 1
        tally.disk_full = str(full)
    except BrokenPipeError:  # stdout's reader left (transcribe ... | head): nobody reads what comes next
        tally.failed += 1
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # a generator's finally stops its readers
    return tally


def _write_one(transcript, i: int, formats, targets, several: bool, status) -> bool:
    """One result's output files, or its stdout text; False (after one error line) if a file cannot be written.
    _DiskFull (no line) where the disk is full."""
    if not targets:
        _to_stdout(stdout_text(transcript, formats[0], several=several), status)
        return True
    return all(_write(paths[i], render(transcript, f), status) for f, paths in targets.items())


def print_text(text: str, status: Optional[Status] = None) -> None:
    """A result's stdout text, flushed at once."""
    with status.paused() if status is not None else contextlib.nullcontext():
        sys.stdout.write(text)
        sys.stdout.flush()


def _to_stdout(text: str, status: Optional[Status]) -> None:
    """`_print`; _DiskFull where stdout is a file on a full disk."""
    try:
        print_text(text, status)
    except BrokenPipeError:
        raise
    except OSError as err:
        if is_disk_full(err):
            raise _DiskFull(cannot_write("stdout", err)) from None
        raise


class _DiskFull(Exception):
    """An output could not be written for a full disk (its line is the message): nothing more is written."""


def _write(target: Path, content: str, status: Optional[Status] = None) -> bool:
    """Write one output file whole; False (after one error line) if it cannot be written; _DiskFull (no line) where
    the disk is full."""
    try:
        write_file(target, content)
    except OSError as err:
        if is_disk_full(err):
            raise _DiskFull(cannot_write(target, err)) from None
        print_error(cannot_write(target, err), status)
        return False
    return True


def print_error(line: str, status: Optional[Status] = None) -> None:
    """`error: LINE` on stderr, as one line (`one_line`: a file name may hold a newline)."""
    console = status.progress.console if status is not None else err_console
    console.print(f"[red]error:[/red] {escape(one_line(line))}")
