"""Several devices on one host: one worker process per device, each with its own model, pulling batches from one
longest-first plan held by the parent.

    parent:  file headers -> Scheduler (closed, so it hands out `plan_batches`' plan) -> the next batch to whichever
             worker asks -> finished batches put back in plan order -> (index, Transcript), as one device yields them
    worker:  load_model (its readers start at the config) -> ReadAhead(batches=asked of the parent)
             -> transcribe_stream -> each batch's transcripts to the parent in one message

A worker asks for its next batch when its readers have room (WORKER_READ_AHEAD), so the devices finish together
without a static split. This module imports no torch when imported: on Linux the parent starts multiprocessing's
fork server, which imports torch once for every worker while the parent imports its own, and forks the workers
from there (`_worker_context`); elsewhere it spawns its workers before it imports torch itself, so their imports
and its own run side by side, not one after the other. Every worker talks to the parent over a pipe of its own:
one killed mid-message breaks only its own pipe. A worker that dies (a signal, the OOM killer) or raises loses
nothing done elsewhere: the batches it held go to another worker, once; a batch whose second worker dies too, or
that no worker is left for, yields one error per file ("FILE: lost: the worker on cuda:1 died (signal 9)").
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Iterator

from graphscribe.device_worker import work
from graphscribe.io.audio import audio_seconds
from graphscribe.io.options import RunOptions
from graphscribe.output.transcript import Transcript
from graphscribe.runtime.scheduler import Scheduler

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

ATTEMPTS = 2  # workers a batch may go to: a second death sends no batch to a third


class LoadError(ValueError):
    """No worker could load the model; the message is the first worker's reason."""


@dataclass
class DeviceStats:
    """One worker's figures over a run (`DeviceRun.stats`)."""

    device: str
    files: int = 0  # transcribed
    audio_seconds: float = 0.0
    busy_seconds: float = 0.0  # from its first batch taken to its last result sent (summed over its jobs)
    load_seconds: float | None = None
    ended: str | None = None  # why the worker ended early: died, failed, could not load
    # seconds from the run's start (`DeviceRun` made) to the worker's start-up phases and to its last batch's
    # results: a worker ready ("warmed") later than the first, or done well before the last, is a device idle while
    # the clock runs. perf_counter is the host's monotonic clock in every process, so the worker's own marks serve:
    # "started" (its main running), "torch" (imported), "cuda" (its device set: CUDA started), "job" (the first job
    # received), "loaded" (`load_model` returned), "warmed" (`warm_up_run` done: ready)
    phases: dict[str, float] | None = None
    done_at: float | None = None

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "files": self.files,
            "audio_seconds": round(self.audio_seconds, 3),
            "busy_seconds": round(self.busy_seconds, 3),
            "load_seconds": None if self.load_seconds is None else round(self.load_seconds, 3),
            "ended": self.ended,
            "phases": self.phases,
            "done_at": None if self.done_at is None else round(self.done_at, 3),
        }


class _Worker:
    """The parent's side of one worker process."""

    def __init__(self, context, device: str, source: str, options: RunOptions, share: int):
        self.device = device
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=work,
            args=(child, source, replace(options, device=device), share),
            name=f"graphscribe-{device}",
        )
        self.process.start()
        child.close()  # the worker's end lives in the worker only: its death is our EOF
        self.alive = True
        self.loaded = False
        self.load_seconds: float | None = None
        self.warm_up_seconds = 0.0
        self.reason: str | None = None  # a worker's own account of its end (crash, load error)
        self.held: set[int] = set()  # batches handed to it and not yet back

    def send(self, message) -> None:
        try:
            self.conn.send(message)
        except OSError:  # it died: its sentinel tells the dispatcher
            pass

    def ended(self) -> str:
        if self.reason is not None:
            return self.reason
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"the worker on {self.device} died (signal {-code})"
        return f"the worker on {self.device} died (exit code {code})"


def _worker_context() -> multiprocessing.context.BaseContext:
    """How workers start. On Linux, forked by multiprocessing's fork server, started here at once, which imports
    torch (not CUDA: a forked child could not use it) while the parent imports its own: every worker is forked
    with torch imported, at the same moment. A spawned worker imports torch itself, side by side with the others,
    and that is the most variable step of its start-up (2.5-4.6 s on the lent 2-GPU machines): spawned workers
    come ready up to 1.2 s apart, forked ones 0.02-0.03 s, and a run pays about half that gap. Elsewhere each
    worker is spawned."""
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")  # no fork server (Windows), or forking unsafe (macOS)
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "torch"])
    forkserver.ensure_running()  # starts it, and its imports, without waiting for them
    return context


class DevicePool:
    """Worker processes, one per device, each loading its own model (all at once, at the first `transcribe`).

    source: the checkpoint (`load_model`'s source); options: how every worker runs its model (`load_model`'s; its
    device is its own) and the batching of each `transcribe` that gives none. Use `transcribe` for each set of
    files, then `close`.
    """

    def __init__(self, source: str, devices: list[str], options: RunOptions = RunOptions()):
        self.devices = list(devices)
        self.options = options
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        share = max(1, cores // len(self.devices))  # each worker's torch threads at most (`limit_host_threads`)
        context = _worker_context()
        if context.get_start_method() == "forkserver":
            import torch  # noqa: F401 - the parent's own (`default_batching`), beside the fork server's
        self.workers = [_Worker(context, d, str(source), options, share) for d in self.devices]
        self._seen_logs: set[str] = set()
        self._batching: list[tuple[int, float]] | None = None

    def default_batching(self) -> list[tuple[int, float]]:
        """Each device's (files, padded seconds) per batch when not given (`pipeline.default_batching`): asked once
        the workers are started, as it imports torch here (and makes CUDA's runtime ask the devices)."""
        if self._batching is None:
            import torch

            from graphscribe.model.transducer import resolve_dtype  # here: loading a model is the workers' business
            from graphscribe.runtime.defaults import default_batching

            targets = [torch.device(d) for d in self.devices]
            self._batching = [default_batching(t, resolve_dtype(self.options.dtype, t)) for t in targets]
        return self._batching

    def transcribe(
        self,
        files: list,
        batch_size: int | None = None,
        batch_seconds: float | None = None,
        word_times: bool = True,
        workers: int | None = None,
        render: tuple[str, ...] = (),
    ) -> DeviceRun:
        """(index, Transcript) for every file, in the order one device's `transcribe_stream` yields them, from the
        first `workers` workers (None: all). batch_size, batch_seconds: the batching rule's (None: the options',
        whose None is the devices' defaults, the smallest of them); word_times, render: `transcribe_stream`'s, run in
        each worker (so the rendering is done beside each device, and light transcripts cross the pipes)."""
        files = [str(f) for f in files]
        if batch_size is None:
            batch_size = self.options.batch_size
        if batch_seconds is None:
            batch_seconds = self.options.batch_seconds
        return DeviceRun(self, files, batch_size, batch_seconds, word_times, self.workers[:workers], tuple(render))

    def stop(self) -> None:
        """Tell the workers to end, without waiting: each leaves at once (`device_worker.work`), while the caller goes on."""
        for worker in self.workers:
            if worker.process.is_alive():
                worker.send(("stop",))

    def close(self) -> None:
        """Stop the workers and wait for them."""
        self.stop()
        for worker in self.workers:
            worker.process.join(timeout=30)
            if worker.process.is_alive():  # stuck in a job it was never told the end of
                worker.process.kill()
                worker.process.join()
            worker.conn.close()

    def _log(self, message: str) -> None:
        if message not in self._seen_logs:  # every worker warns of the same dtype fallback: said once
            self._seen_logs.add(message)
            log.warning(message)


_END = object()


class DeviceRun:
    """One set of files through a `DevicePool`: iterate for (index, Transcript); `stats` per worker, `wait_loaded`.

    A dispatcher thread answers the workers (batches to those that ask, results in), so handing out goes on while
    the consumer writes; results wait for the batches before them in the plan: at most the batches in flight.
    """

    def __init__(
        self,
        pool: DevicePool,
        files: list[str],
        batch_size: int | None,
        batch_seconds: float | None,
        word_times: bool,
        workers,
        render: tuple = (),
    ):
        self.pool, self.files, self.workers = pool, files, list(workers)
        self.stats = {w: DeviceStats(w.device, load_seconds=w.load_seconds) for w in self.workers}
        self.close_pool = False  # `transcribe_on_devices`: the pool is this run's alone
        self._batch_size, self._batch_seconds = batch_size, batch_seconds
        self._word_times, self._render = word_times, render
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._loaded = threading.Event()
        self._load_error: str | None = None
        self._cancelled = False
        # when the first worker could take a batch: the transcription's clock starts there (`transcribing_since`)
        self._first_ready: float | None = None
        self._started = time.perf_counter()
        for worker in self.workers:  # before planning: reading starts as soon as a worker has a config
            worker.send(self._job())
        if all(w.loaded for w in self.workers):  # a pool's later run: nothing to wait for
            self._first_ready = time.perf_counter()
            self._loaded.set()
        self._thread = threading.Thread(target=self._dispatch, name="graphscribe-devices", daemon=True)
        self._thread.start()

    @property
    def device_stats(self) -> list[DeviceStats]:
        return list(self.stats.values())

    @property
    def load_seconds(self) -> dict[str, float]:
        """{"total": seconds until the last worker to load had its model, warmed up; "warm_up": the longest warm-up
        (`pipeline.warm_up`)} (the CLI's summary)."""
        loads = [s.load_seconds for s in self.stats.values() if s.load_seconds is not None]
        warm = [w.warm_up_seconds for w in self.workers if w.loaded]
        return {"total": max(loads, default=0.0), "warm_up": max(warm, default=0.0)}

    @property
    def transcribing_since(self) -> float:
        """perf_counter() when the first worker had its model (warmed up) and could take a batch: the transcription's
        clock starts there, as it starts on one device when its model is loaded. Not the last worker's: a faster
        one's batches before then would be off the clock. Valid after `wait_loaded`."""
        return self._first_ready if self._first_ready is not None else time.perf_counter()

    def wait_loaded(self) -> None:
        """Return once every worker has its model (or has ended); LoadError if none could load it."""
        self._loaded.wait()
        if self._load_error is not None and not any(w.loaded for w in self.workers):
            raise LoadError(self._load_error)

    def close(self) -> None:
        """Stop early: the workers are killed (a pool of its own is closed either way)."""
        if self._thread.is_alive():
            self._cancelled = True
            for worker in self.workers:
                if worker.process.is_alive():
                    worker.process.kill()
            self._thread.join()
            self.pool.close()
        elif self.close_pool:
            self.pool.close()

    def __iter__(self) -> Iterator[tuple[int, Transcript]]:
        done = False
        try:
            while (item := self._out.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
            self._thread.join()
            done = True
        finally:
            if not done:  # the consumer stops early or fails: nothing more is wanted
                self.close()
            elif self.close_pool:  # the workers leave now; `close` waits for them (after the CLI's clock stops)
                self.pool.stop()

    def _job(self) -> tuple:
        """A worker's job message: the files, and the batching asked for (its warm-up batch's rows)."""
        return ("job", self.files, self._word_times, self._render, self._batch_size, self._batch_seconds)

    # ------------------------------------------------------------------ the dispatcher thread
    def _dispatch(self) -> None:
        try:
            try:
                self._plan()
            except ValueError as err:  # a dtype no device takes: the workers fail to load alike, and say so later
                self._load_error = self._load_error or str(err)
                raise
            self._serve()
            self._out.put(_END)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
            self._out.put(err)
        finally:
            self._loaded.set()

    def _plan(self) -> None:
        with ThreadPoolExecutor(4, thread_name_prefix="graphscribe-headers") as pool:
            reading = pool.map(audio_seconds, self.files)  # the headers are read while torch is imported here
            defaults = self.pool.default_batching()
            lengths = list(reading)
        rows = self._batch_size or min(b for b, _ in defaults)
        seconds = min(s for _, s in defaults) if self._batch_seconds is None else self._batch_seconds
        self.scheduler: Scheduler[int] = Scheduler(rows, seconds or None)
        for i, length in enumerate(lengths):
            self.scheduler.put(i, length or 0.0)  # as `pipeline._estimated_seconds` orders a path
        self.scheduler.close()
        self.batches: dict[int, list[int]] = {}  # plan position -> indices
        self.attempts: dict[int, int] = {}
        self.retry: deque[int] = deque()
        self.results: dict[int, list[tuple[int, Transcript]]] = {}  # back, waiting for the batches before them
        self.next_out = 0
        self.yielded = 0
        self.idle: set[_Worker] = set()  # told the end of the job and done with it

    def _serve(self) -> None:
        while not self._cancelled:
            busy = [w for w in self.workers if w.alive and w not in self.idle]
            if not busy:
                if self.yielded == len(self.files):
                    return
                self._lose_the_rest()  # no worker is left (idle ones were given the batches to redo)
                continue
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
            for worker in busy:
                if worker.conn in ready or worker.process.sentinel in ready:
                    self._receive(worker)

    def _receive(self, worker: _Worker) -> None:
        """Every message waiting from `worker`; then, if its process has ended, its batches go elsewhere."""
        try:
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv())
        except (EOFError, OSError):
            worker.process.join()
        if worker.process.exitcode is not None and worker.alive:
            self._died(worker)

    def _handle(self, worker: _Worker, message: tuple) -> None:
        kind = message[0]
        stats = self.stats[worker]
        if kind == "want":
            self._hand_out(worker)
        elif kind == "batch":
            _, seq, results = message
            worker.held.discard(seq)
            stats.files += sum(t.error is None for _, t in results)
            stats.audio_seconds += sum(t.audio_seconds for _, t in results)
            stats.done_at = time.perf_counter() - self._started
            self._finished(seq, results)
        elif kind == "job_done":
            stats.busy_seconds += message[1]
            self.idle.add(worker)
            self._redo_on_idle()
        elif kind == "ready":
            worker.loaded = True
            worker.load_seconds = stats.load_seconds = message[1]
            worker.warm_up_seconds = message[2]
            stats.phases = {name: round(t - self._started, 3) for name, t in message[3].items()}
            if self._first_ready is None:
                self._first_ready = time.perf_counter()
            self._check_loaded()
        elif kind == "log":
            self.pool._log(message[1])
        elif kind == "load_error":
            worker.reason = f"the worker on {worker.device} could not load the model ({message[1]})"
            if self._load_error is None:
                self._load_error = message[1]
        elif kind == "crash":
            worker.reason = f"the worker on {worker.device} failed ({message[1]})"

    def _hand_out(self, worker: _Worker) -> None:
        """A batch to redo, else the plan's next, else the end of the job: a worker's pipeline wants its next batch
        (or the end) before it finishes the one on its device, so nobody is kept waiting."""
        if self.retry:
            seq = self.retry.popleft()
        else:
            indices = self.scheduler.take()
            if indices is None:
                worker.send(("end",))
                return
            seq = len(self.batches)
            self.batches[seq] = indices
        self.attempts[seq] = self.attempts.get(seq, 0) + 1
        worker.held.add(seq)
        worker.send(("batch", seq, self.batches[seq]))

    def _redo_on_idle(self) -> None:
        """Batches to redo with no worker left in the job: idle workers start it again (they are asked for them)."""
        for worker in list(self.idle):
            if self.retry and worker.alive:
                self.idle.discard(worker)
                worker.send(self._job())

    def _died(self, worker: _Worker) -> None:
        worker.alive = False
        self.idle.discard(worker)
        reason = worker.ended()
        self.stats[worker].ended = reason
        if not self._cancelled:
            if not worker.loaded:  # the batches never ran on it
                for seq in worker.held:
                    self.attempts[seq] -= 1
            others = any(w.alive for w in self.workers)
            redo = sorted(seq for seq in worker.held if others and self.attempts[seq] < ATTEMPTS)
            if worker.loaded or worker.held:
                where = "go to another worker" if others else "are lost: no worker is left"
                self.pool._log(f"{reason}; {len(redo) if others else len(worker.held)} of its batches {where}")
            self.retry.extend(redo)
            for seq in sorted(worker.held - set(redo)):
                self._lose(seq, reason)
            self._redo_on_idle()
        worker.held.clear()
        self._check_loaded()

    def _check_loaded(self) -> None:
        if all(w.loaded or not w.alive for w in self.workers):
            self._loaded.set()

    def _lose_the_rest(self) -> None:
        why = next((w.ended() for w in reversed(self.workers) if not w.alive), "no worker is left")
        while self.retry:
            self._lose(self.retry.popleft(), why)
        while (indices := self.scheduler.take()) is not None:
            seq = len(self.batches)
            self.batches[seq] = indices
            self._lose(seq, why)

    def _lose(self, seq: int, reason: str) -> None:
        lost = [
            (i, Transcript(source=self.files[i], error=f"{self.files[i]}: lost: {reason}")) for i in self.batches[seq]
        ]
        self._finished(seq, lost)

    def _finished(self, seq: int, results: list[tuple[int, Transcript]]) -> None:
        self.results[seq] = results
        while self.next_out in self.results:  # plan order: a batch waits for those before it
            for item in self.results.pop(self.next_out):
                self._out.put(item)
                self.yielded += 1
            self.next_out += 1


def transcribe_on_devices(
    files: list,
    devices: list[str],
    source: str,
    options: RunOptions = RunOptions(),
    word_times: bool = True,
    render: tuple[str, ...] = (),
) -> DeviceRun:
    """Transcribe `files` on several devices of this host: (index, Transcript) in the order one device yields them,
    each file once. One worker process per device loads its own model from `source` to run with `options` (its
    device its own; see `load_model`), batched by the options' batch_size and batch_seconds. The run's `stats`
    give each device's files, audio and busy seconds; `wait_loaded()` raises LoadError if no worker could load
    the model. The workers end with the run."""
    run = DevicePool(source, devices, options).transcribe(files, word_times=word_times, render=render)
    run.close_pool = True
    return run


# ---------------------------------------------------------------------------- the worker process
