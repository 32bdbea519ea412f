"""A `--devices` worker process: its own model, batches asked of the parent (`devices.py`) one at a time,
transcripts sent back a batch per message over its own pipe."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from graphscribe.io.options import RunOptions
from graphscribe.output.transcript import Transcript

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Batches a worker's readers run ahead of the one on its device: as many as one process's (pipeline.READ_AHEAD),
# as a worker's batch waits for a round trip to the parent besides its reading, and the parent's threads share one
# GIL with its writing; the tail of a longest-first plan is its shortest batches, so the few more a worker holds
# at the end (this + 1 not yet on its device) keep the devices finishing together.
WORKER_READ_AHEAD = 2


class _Sender:
    """The worker's end of its pipe, shared by its threads (readers log, the feeder asks, the main thread sends)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message) -> None:
        with self._lock:
            self.conn.send(message)


class _PipeLog(logging.Handler):
    """A worker's warnings go to the parent, which prints each distinct one once, between its own lines."""

    def __init__(self, sender: _Sender):
        super().__init__(logging.WARNING)
        self.sender = sender

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sender.send(("log", record.getMessage()))
        except OSError:
            pass  # the parent is gone: there is nobody to tell


def work(conn: Connection, source: str, options: RunOptions, share: int) -> None:
    """A worker's main: load the model at the first job, then transcribe the batches the parent hands out; leave
    at once when told to stop."""
    marks = {"started": time.perf_counter()}  # start-up phases (`DeviceStats.phases`)
    import torch

    from graphscribe.runtime.defaults import limit_host_threads

    marks["torch"] = time.perf_counter()
    limit_host_threads(options.device, share)
    device = torch.device(options.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # streams and events made without a device land on this one
    marks["cuda"] = time.perf_counter()
    sender = _Sender(conn)
    logger = logging.getLogger("graphscribe")
    logger.handlers[:] = [_PipeLog(sender)]
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    model = None
    try:
        while (message := conn.recv())[0] == "job":
            marks.setdefault("job", time.perf_counter())
            model = _job(conn, sender, model, source, options, marks, *message[1:])
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone
    except BaseException as err:  # noqa: BLE001 - told to the parent, which redoes this worker's batches
        text = str(err).strip().splitlines()
        sender.send(("crash", f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")))
        sys.stderr.flush()
        os._exit(1)
    # Python's teardown (the model, the CUDA context, its graphs) takes the best part of a second that nobody
    # needs: every result is with the parent, which waits for this process to end (as `cli.entry` leaves).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _job(
    conn: Connection,
    sender: _Sender,
    model,
    source: str,
    options: RunOptions,
    marks: dict[str, float],
    files: list[str],
    word_times: bool,
    render: tuple[str, ...],
    batch_size: int | None,
    batch_seconds: float | None,
):
    from graphscribe.api import load_model
    from graphscribe.io.audio import read_input
    from graphscribe.io.checkpoint import CheckpointError
    from graphscribe.io.config import UnsupportedModelError
    from graphscribe.io.tokenizer import TokenizerError
    from graphscribe.runtime.pipeline import transcribe_stream, warm_up_run
    from graphscribe.runtime.priming import prime
    from graphscribe.runtime.reading import read_ahead

    owner: dict[int, int] = {}  # file index -> its batch's plan position
    sizes: dict[int, int] = {}  # plan position -> files
    first: list[float] = []  # when the first batch came

    def batches() -> Iterator[list[int]]:  # ReadAhead's feeder thread asks when its readers have room
        while True:
            sender.send(("want",))
            message = conn.recv()
            if message[0] != "batch":
                return
            _, seq, indices = message
            if not first:
                first.append(time.perf_counter())
            sizes[seq] = len(indices)
            owner.update(dict.fromkeys(indices, seq))
            yield indices

    def start(sample_rate: int, device: torch.device, dtype: torch.dtype):
        paths = [Path(f) for f in files]
        read = functools.partial(read_input, sample_rate=sample_rate, max_seconds=options.max_audio_seconds)
        return read_ahead(
            paths, sample_rate, device, read=read, dtype=dtype, batches=batches(), ahead=WORKER_READ_AHEAD
        )

    reads = []
    if model is None:
        prime(options.device, options.dtype)
        try:
            model = load_model(
                source,
                options,
                on_config=lambda cfg, device, dtype: reads.append(start(cfg.features.sample_rate, device, dtype)),
            )
        except (CheckpointError, UnsupportedModelError, TokenizerError, ValueError) as err:
            sender.send(("load_error", f"{source}: {err}" if isinstance(err, UnsupportedModelError) else str(err)))
            os._exit(2)  # not closing the readers: their feeder may be waiting for the parent's answer
        marks["loaded"] = time.perf_counter()
        warm = warm_up_run(model, len(files), batch_size, batch_seconds)  # as one device: its first uses off the clock
        marks["warmed"] = time.perf_counter()
        sender.send(("ready", model.load_seconds["total"] + warm, warm, marks))
    else:
        reads.append(start(model.sample_rate, model.device, model.dtype))
    groups: dict[int, list[tuple[int, Transcript]]] = {}
    for i, transcript in transcribe_stream(model, reads[0], word_times=word_times, render=render):
        seq = owner.pop(i)
        group = groups.setdefault(seq, [])
        group.append((i, transcript))
        if len(group) == sizes[seq]:  # whole batches travel: a death mid-batch leaves nothing half done
            del sizes[seq], groups[seq]
            sender.send(("batch", seq, group))
    sender.send(("job_done", time.perf_counter() - first[0] if first else 0.0))
    return model
