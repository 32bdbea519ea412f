"""The command's status on stderr while results come, where stderr is a terminal: a bar for several files; for one
file a spinner with its length and the stage it is in."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from graphscribe.console import err_console


class Status:
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
        self.label = f"transcribing {files[0].name}{_audio_length(files[0])}" if self.one else "transcribing"
        self.task = self.progress.add_task(self.label, total=len(files))

    def __enter__(self) -> Status:
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


def _audio_length(path: Path) -> str:
    """The file's length for its label, as its header says (" (7 s of audio)"); "" where it does not."""
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
