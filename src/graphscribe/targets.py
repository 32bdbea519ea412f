"""Where a folder job's outputs go: one file per input and format under the output folder, mirroring the inputs'
own folders, checked before any model work."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Optional

import typer

from graphscribe.console import fail_usage
from graphscribe.output.writers import FORMATS, LINE_FORMATS, WRITERS
from graphscribe.signals import SIGNALS


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
        if str(source) == "-":  # standard input (audio.STDIN)  # "-" would name a file that commands take for an option
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
                fail_usage(f"{target}: is an input; outputs never replace an input")
            other = writers.setdefault(target, source)
            if other.resolve() != source.resolve():
                fail_usage(
                    f"{other} and {source} would both be written to {target}: "
                    "transcribe them into separate --output-dir folders"
                )


def output_dir_arg(value: str) -> Path:
    """--output-dir's value as a Path: "" (an unset shell variable) would be the current folder, so it is bad usage."""
    if not value:
        raise typer.BadParameter("an empty folder name (for the current folder: -o .)")
    return Path(value)


def check_output_dir(folder: Path) -> None:
    """Exit 2 with one line unless `folder` is a folder this process can write in (made if missing): checked by
    writing and removing a probe file, before the model loads."""
    if folder.exists() and not folder.is_dir():
        fail_usage(f"--output-dir {folder}: is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with SIGNALS.held():  # a signal waits: the probe file is never left behind
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".graphscribe-probe.", suffix=".tmp")
            try:
                os.write(fd, b"\n")
            finally:
                os.close(fd)
                os.unlink(probe)
    except OSError as err:
        fail_usage(f"--output-dir {folder}: cannot write there ({err.strerror or err})")


def parse_formats(value: str, output_dir: Optional[Path], n_files: int) -> list[str]:
    """`--format` as a list of format names; a bad list exits 2 with one line."""
    formats = list(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    unknown = [f for f in formats if f not in WRITERS]
    if unknown or not formats:
        fail_usage(f"--format {value}: use {', '.join(FORMATS)} (several, comma-separated, with --output-dir)")
    if output_dir is None and len(formats) > 1:
        fail_usage(f"--format {value}: several formats need --output-dir (one file per input and format)")
    if output_dir is None and formats[0] not in LINE_FORMATS and n_files > 1:
        fail_usage(f"--format {value} prints one file's subtitles: for {n_files} files use --output-dir")
    return formats
