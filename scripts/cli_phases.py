#!/usr/bin/env python
"""The `transcribe` command with its phases marked on stderr: "mark SECONDS WHAT", seconds since this script began.

    python scripts/cli_timeline.py -- python3 scripts/cli_phases.py folder/ --model v3.nemo --batch 8

Marks: imports done, load begins and ends (`load_model`), the first batch is taken, transcription begins and
ends (`_transcribe_files`); then the command ends as `transcribe` does (`cli.entry`). cli_timeline.py adds
when each line arrived and when the process ended, so the gap before the first mark is the interpreter's start.
"""

import sys
import time

start = time.perf_counter()


def mark(what: str) -> None:
    print(f"mark {time.perf_counter() - start:.3f} {what}", file=sys.stderr, flush=True)


mark("script started")

mark("torch imported")
import graphscribe.cli as cli  # noqa: E402
import graphscribe.model as model  # noqa: E402
import graphscribe.pipeline as pipeline  # noqa: E402

mark("graphscribe imported")


def marked(module, name: str) -> None:
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        mark(f"{name} begins")
        try:
            return original(*args, **kwargs)
        finally:
            mark(f"{name} ends")

    setattr(module, name, wrapper)


marked(model, "load_model")
marked(cli, "_transcribe_files")
marked(cli, "expand_inputs")
original_iter = pipeline.ReadAhead.__iter__


def first_batch(self):
    for i, batch in enumerate(original_iter(self)):
        if i == 0:
            mark("first batch taken")
        yield batch


pipeline.ReadAhead.__iter__ = first_batch
cli.entry()
