"""`transcribe serve --devices`: one engine process per device, each running the server's batching engine (`Service`)
on a model of its own; the server's process sends each request, and each realtime turn, to the engine with the
least audio queued.

    HTTP worker -> [server process: its intake thread (server.Engine) -> `DeviceEngines.submit`: of the warm
    engines, the one with the fewest seconds of audio submitted and not answered] -> SUBMIT and the raw samples over
    that engine's pipe -> [engine process (`engine_main`): Service.submit -> batches -> done]
    -> DONE over the pipe -> [server process: the request's answer to its HTTP worker]

`DeviceEngines` stands where one device's `Service` stands in the server's process (the same `submit`,
`samples_buffer`, `live.apply`, `ready`, `error`, `close`): HTTP workers, admission, /metrics and the access log
are server.py's as with one device, and one device runs no engine process at all.

An engine process that dies (a signal, the OOM killer, a fault in a CUDA kernel): the requests it held are answered
at once with an error (HTTP 500, which OpenAI's clients retry), its realtime turns fail
(`transcription_failed`), the other engines take the new requests, and another engine process starts on its
device (graphscribe_device_restarts_total). An engine that reports a failure of its own (the model cannot load or
warm up there) stops the server with its reason.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Callable, Hashable

import numpy as np
import torch

from graphscribe.io.options import RunOptions
from graphscribe.output.transcript import Transcript
from graphscribe.serve.ipc import (
    AUDIO,
    DONE,
    DROP,
    OPEN,
    READY,
    SAID,
    SUBMIT,
    TURNS,
    Admission,
    receive_samples,
    send,
)
from graphscribe.serve.sessions import Said

BATCH, LIVE, FAILED, STOP = "batch", "live", "failed", "stop"  # engine -> server, and the server's last word
CHECK_SECONDS = 0.05  # how often the server looks for an engine process that died
DEVICE_METRICS = (  # /metrics for each device: name, type, help
    ("up", "gauge", "1 while the device's engine is warm and running."),
    ("queued_audio_seconds", "gauge", "Seconds of audio sent to the device's engine and not answered (routing)."),
    ("in_flight", "gauge", "Requests sent to the device's engine and not answered."),
    ("requests_total", "counter", "Requests the device's engines answered."),
    ("padded_seconds_total", "counter", "Seconds run through the device's model, padding included."),
    ("restarts_total", "counter", "Engine processes started again on the device after one died."),
    ("realtime_turns_total", "counter", "Realtime turns (and stream=true uploads) sent to the device's engines."),
)


# ---------------------------------------------------------------------------- the engine process


def engine_main(
    conn: Connection,
    source: str,
    options: RunOptions,
    max_wait: float,
    live_streams: int,
    share: int,
    counts: tuple[Admission, Admission, int] | None = None,
):
    """An engine process: load the model on `options.device`, warm a `Service` up, then transcribe what the server
    sends until it says STOP or its pipe closes; exit 0 once every request is answered. counts: the server's
    admission counts, the requests it sent each engine and not yet saw answered, and this engine's place there: a
    batch formed while the device is idle waits for company only while requests are coming (admitted and not sent
    anywhere yet, or sent here and still in the pipe), as one device's server does.

    Messages (pickled tuples; raw float32 samples follow SUBMIT and TURNS as in ipc.py):
        server -> engine  (SUBMIT, n, bytes, word_times, name, confidence, hotwords, beam)  (TURNS, [(OPEN | AUDIO | FINISH | DROP, turn, bytes)],
                          bytes)  (STOP,)
        engine -> server  (READY, facts)  (FAILED, reason)  (DONE, n, transcript, times)
                          (BATCH, rows, padded seconds, capture seconds)  (SAID, [(turn, Said), ...])
                          (LIVE, rows, seconds)
    """
    from graphscribe.api import load_model
    from graphscribe.runtime.defaults import limit_host_threads
    from graphscribe.serve.service import Service

    for sig in (signal.SIGINT, signal.SIGTERM):  # sent to the whole process group (Ctrl-C, systemd): the server decides
        signal.signal(sig, signal.SIG_IGN)
    limit_host_threads(options.device, share)
    if torch.device(options.device).index is not None:  # cuda:N ("cuda" alone is the current one already)
        torch.cuda.set_device(torch.device(options.device))
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    writer = threading.Thread(target=_write, args=(conn, outbox), name="graphscribe-answers", daemon=True)
    writer.start()
    try:
        model = load_model(source, options)
        service = Service(
            model,
            options.batch_size,
            max_wait,
            on_batch=lambda rows, padded: outbox.put(((BATCH, rows, padded, model.capture_seconds), None)),
            coming=None if counts is None else lambda: _coming(counts, service.in_flight),
            on_said=lambda said: outbox.put(((SAID, said), None)),
            live_streams=live_streams,
            on_live_step=lambda rows, seconds: outbox.put(((LIVE, rows, seconds), None)),
        )
        service.start()
        service.wait_ready()
    except Exception as err:  # noqa: BLE001 - told to the server, which stops with it
        text = str(err).strip().splitlines()
        outbox.put(((FAILED, f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")), None))
        outbox.put(None)
        writer.join()
        os._exit(1)
    facts = {
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "sample_rate": model.sample_rate,
        "max_batch": service.max_batch,
        "chunk": service.live.chunk_samples if live_streams else 0,
        "warm_up_seconds": service.warm_up_seconds,
        "pid": os.getpid(),
    }
    outbox.put(((READY, facts), None))
    _intake(conn, service, outbox)
    service.close()  # what is waiting is transcribed and answered first
    outbox.put(None)
    writer.join()
    sys.stderr.flush()
    os._exit(0)  # no teardown of the model and its graphs: nobody waits for it


def _coming(counts: tuple[Admission, Admission, int], in_flight: int) -> int:
    admitted, sent, index = counts
    return max(0, admitted.total - sent.total) + max(0, sent.counts[index] - in_flight)


def _intake(conn: Connection, service, outbox: queue.SimpleQueue) -> None:
    """The server's messages, until STOP or the pipe closes."""
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
            if message[0] == SUBMIT:
                _, n, nbytes, word_times, name, confidence, hotwords, beam = message
                samples = service.samples_buffer(nbytes // 4)
                receive_samples(conn, nbytes, samples.numpy())
                service.submit(samples, word_times, _answer(outbox, n), name, confidence, hotwords, beam)
            elif message[0] == TURNS:
                _, ops, nbytes = message
                samples = receive_samples(conn, nbytes) if nbytes else None
                applied, at = [], 0
                for kind, turn, size, *opened in ops:
                    part = opened[0] if opened else None  # an OPEN's turn's own phrases, if any
                    if kind == AUDIO:
                        part, at = samples[at // 4 : (at + size) // 4], at + size
                    applied.append((kind, turn, part))
                service.live.apply(applied)
            else:  # STOP
                return
        except (EOFError, OSError):
            return


def _answer(outbox: queue.SimpleQueue, n: int):
    def done(transcript: Transcript, times: tuple[float, float]) -> None:  # on the batching thread
        outbox.put(((DONE, n, transcript, times), None))

    return done


def _write(conn: Connection, outbox: queue.SimpleQueue, close: bool = True) -> None:
    """(message, raw samples or None) from `outbox` to the pipe until None, then the pipe closed (`close`: the
    server's side leaves that to its reader thread): the batching thread never waits on the pipe. Once the other end
    is gone, what is left is dropped (the reader on that side saw the end)."""
    gone = False
    while (item := outbox.get()) is not None:
        if gone:
            continue
        message, raw = item
        try:
            send(conn, message)
            if raw is not None:
                conn.send_bytes(memoryview(raw).cast("B"))
        except OSError:
            gone = True
    if close:
        conn.close()


# ---------------------------------------------------------------------------- the server's side


@dataclass
class _Counts:
    """One device's figures for /metrics, kept across its engine's restarts."""

    answered: int = 0  # requests its engines answered
    padded: float = 0.0  # seconds run through the model, padding included
    capture: float = 0.0  # CUDA graph capture seconds of its engine now running
    restarts: int = 0
    turns: int = 0  # realtime turns sent to its engines


@dataclass(eq=False)
class _Engine:
    """The server's view of one engine process."""

    index: int  # its place in --devices
    process: multiprocessing.process.BaseProcess
    conn: Connection
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    requests: dict = field(default_factory=dict)  # n -> (samples, done, name): sent, not answered
    turns: set = field(default_factory=set)  # turn numbers open on it
    queued: int = 0  # samples of `requests`' audio (whole numbers: no drift over a day of requests)
    facts: dict | None = None  # its READY's, once warm
    failed: str | None = None  # its own account of a failure
    gone: bool = False  # its pipe closed: nothing more comes from it
    reader: threading.Thread | None = None


@dataclass
class Facts:
    """What server.Engine reads of a `Service`'s model, for several engines: /health's device and dtype, the rate
    uploads are resampled to, and the graph capture seconds of every engine."""

    device: str
    dtype: str
    sample_rate: int
    counts: list[_Counts]

    @property
    def capture_seconds(self) -> float:
        return sum(c.capture for c in self.counts)


class DeviceEngines:
    """One engine process per device of `devices`, each loading `source` with `options` (its device its own); used by
    the server's process as one `Service` is (module docstring). on_batch(rows, padded seconds), on_said([(turn key,
    Said), ...]), on_live_step(rows, seconds): as `Service`'s, called on the engines' reader threads."""

    def __init__(
        self,
        source: str,
        devices: list[str],
        options: RunOptions,
        max_wait: float,
        live_streams: int,
        on_batch: Callable[[int, float], None],
        on_said: Callable[[list], None],
        on_live_step: Callable[[int, float], None],
        admission: Admission | None = None,
    ):
        self.source, self.devices, self.options = source, list(devices), options
        self.admission = admission  # the server's: requests admitted by its HTTP workers
        self.sent = Admission(len(devices))  # requests sent to each engine and not answered, for the engines to read
        self.max_wait, self.live_streams = max_wait, live_streams
        self.on_batch, self.on_said, self.on_live_step = on_batch, on_said, on_live_step
        self.labels = device_labels(devices)
        self.counts = [_Counts() for _ in devices]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._share = max(1, cores // len(devices))  # each engine's torch threads at most, beside a CPU model
        self._context = multiprocessing.get_context("spawn")  # CUDA in each engine: nothing of ours forked
        self._lock = threading.Lock()  # the engines list, their requests, turns and `queued`
        self._numbers = itertools.count()
        self._turns: dict[Hashable, tuple[int, _Engine]] = {}  # a turn's key (worker, number) -> its number, engine
        self._turn_keys: dict[int, Hashable] = {}
        self.engines: list[_Engine] = []
        self.model: Facts | None = None  # once every engine is warm
        self.max_batch = 0
        self.warm_up_seconds = 0.0
        self.ready = False
        self.error: str | None = None  # why the server stops: an engine failed
        self.closed = False
        self.live = _Live(self)
        self._monitor = threading.Thread(target=self._watch, name="graphscribe-engines", daemon=True)

    @classmethod
    def behind(cls, server, source: str, devices: list[str], options: RunOptions, max_wait: float) -> DeviceEngines:
        """The engines behind `server` (a server.Engine): its /metrics count their batches and show each device,
        its workers are told what their turns said."""
        metrics = server.metrics
        engines = cls(
            source, devices, options, max_wait, max(server.settings.max_sessions, 1), metrics.batch, server.said,
            metrics.live_step, server.admission,
        )  # fmt: skip
        metrics.device_lines = engines.metric_lines
        return engines

    def start(self) -> None:
        """Start every engine process (they load and warm up side by side); `ready` once all are warm."""
        with self._lock:
            self.engines = [self._start(i) for i in range(len(self.devices))]
        self._monitor.start()

    def _start(self, index: int) -> _Engine:
        mine, theirs = self._context.Pipe()
        options = replace(self.options, device=self.devices[index])
        counts = None if self.admission is None else (self.admission, self.sent, index)
        process = self._context.Process(
            target=engine_main,
            args=(theirs, self.source, options, self.max_wait, self.live_streams, self._share, counts),
            name=f"graphscribe-engine-{self.labels[index]}",
            daemon=True,
        )
        process.start()
        theirs.close()  # the engine's end lives in the engine only: its death is our EOF
        engine = _Engine(index, process, mine)
        engine.reader = threading.Thread(target=self._read, args=(engine,), name="graphscribe-engine-in", daemon=True)
        engine.reader.start()
        threading.Thread(
            target=_write, args=(mine, engine.outbox, False), name="graphscribe-engine-out", daemon=True
        ).start()
        return engine

    def samples_buffer(self, n: int) -> torch.Tensor:
        """An empty (n,) float32 tensor to receive a request's samples into (they go on to an engine's pipe)."""
        return torch.empty(n, dtype=torch.float32)

    def _pick(self) -> _Engine | None:
        """Under the lock: the warm engine with the least audio queued (then the fewest requests and turns)."""
        warm = [e for e in self.engines if e.facts is not None and not e.gone]
        return min(warm, key=lambda e: (e.queued, len(e.requests) + len(e.turns)), default=None)

    def submit(
        self,
        audio: torch.Tensor,
        word_times: bool,
        done: Callable[[Transcript, float], None],
        name: str,
        confidence: bool = False,
        hotwords: tuple = (),
        beam: int | None = None,
    ):
        """Send (L,) samples to the engine with the least audio queued; `done(transcript, times)` is called
        on its reader thread (with `transcript.error` if no engine could transcribe it). RuntimeError once closed."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the engines are stopping")
            engine = self._pick()
            if engine is not None:
                n = next(self._numbers)
                engine.requests[n] = (audio.numel(), done, name)
                engine.queued += audio.numel()
                self.sent.counts[engine.index] += 1
        if engine is None:  # every engine is starting again
            done(Transcript(source=name, error="no engine is running (they are restarting): try again"), (0.0, 0.0))
            return
        message = (SUBMIT, n, audio.numel() * 4, word_times, name, confidence, hotwords, beam)
        engine.outbox.put((message, audio.numpy()))

    @property
    def in_flight(self) -> int:
        with self._lock:
            return sum(len(e.requests) for e in self.engines)

    def close(self) -> None:
        """Every engine finishes what it was sent, answers it and exits."""
        with self._lock:
            self.closed = True
            engines = list(self.engines)
        for engine in engines:
            engine.outbox.put(((STOP,), None))
        for engine in engines:
            engine.process.join()
            engine.reader.join()

    # ------------------------------------------------------------------ the engines' reader threads
    def _read(self, engine: _Engine) -> None:
        while True:
            try:
                message = pickle.loads(engine.conn.recv_bytes())
            except (EOFError, OSError):
                break
            self._handle(engine, message)
        engine.outbox.put(None)  # its writer thread ends
        self._lost(engine)
        engine.conn.close()

    def _handle(self, engine: _Engine, message: tuple) -> None:
        kind, counts = message[0], self.counts[engine.index]
        if kind == DONE:
            _, n, transcript, times = message
            with self._lock:
                samples, done, _ = engine.requests.pop(n)
                engine.queued -= samples
                self.sent.counts[engine.index] -= 1
                counts.answered += 1
            done(transcript, times)
        elif kind == SAID:
            self._said(engine, message[1])
        elif kind == BATCH:
            _, rows, padded, counts.capture = message
            counts.padded += padded
            self.on_batch(rows, padded)
        elif kind == LIVE:
            self.on_live_step(message[1], message[2])
        elif kind == READY:
            with self._lock:
                engine.facts = facts = message[1]
            sys.stderr.write(
                f"the engine on {self.labels[engine.index]} is warm (pid {facts['pid']}, "
                f"{facts['warm_up_seconds']:.1f} s)\n"
            )
            self._check_ready()
        elif kind == FAILED:
            engine.failed = message[1]

    def _said(self, engine: _Engine, said: list[tuple[int, Said]]) -> None:
        keyed = []
        with self._lock:
            for turn, what in said:
                key = self._turn_keys.get(turn)
                if key is None:
                    continue
                if what.done is not None:
                    self._forget_turn(turn)
                keyed.append((key, what))
        if keyed:
            self.on_said(keyed)

    def _forget_turn(self, turn: int) -> None:
        """Under the lock."""
        key = self._turn_keys.pop(turn, None)
        found = self._turns.pop(key, None) if key is not None else None
        if found is not None:
            found[1].turns.discard(turn)

    def _lost(self, engine: _Engine) -> None:
        """Its pipe closed: its requests answered with an error, its turns failed (the server starts another)."""
        engine.process.join()
        how = _ended(engine.process.exitcode)
        label = self.labels[engine.index]
        with self._lock:
            engine.gone = True
            requests, engine.requests, engine.queued = engine.requests, {}, 0
            self.sent.counts[engine.index] = 0
            turns = [(self._turn_keys[t], t) for t in engine.turns if t in self._turn_keys]
            for _, turn in turns:
                self._forget_turn(turn)
        if self.closed and engine.process.exitcode == 0:
            return
        message = f"the engine on {label} {how} while transcribing this; the server starts another: try again"
        for _, done, name in requests.values():
            done(Transcript(source=name, error=message), (0.0, 0.0))
        if turns:
            self.on_said([(key, Said("", 0, error=message)) for key, _ in turns])
        if not self.closed:
            lost = f" ({len(requests)} request{'s' if len(requests) != 1 else ''} answered with an error)"
            sys.stderr.write(f"error: the engine on {label} {how}{lost if requests else ''}\n")

    # ------------------------------------------------------------------ the monitor thread
    def _watch(self) -> None:
        """Start another engine where one died; a failure an engine reports stops the server."""
        while not self.closed:
            time.sleep(CHECK_SECONDS)
            with self._lock:
                dead = [e for e in self.engines if e.gone and not self.closed]
            for engine in dead:
                label = self.labels[engine.index]
                if engine.failed is not None or engine.facts is None:  # not a death to restart after: a failure
                    why = engine.failed or f"{_ended(engine.process.exitcode)} at its start"
                    self.error = f"the engine on {label}: {why}"
                    return
                with self._lock:
                    if self.closed:
                        return
                    self.counts[engine.index].restarts += 1
                    self.engines[engine.index] = self._start(engine.index)
                sys.stderr.write(f"starting another engine on {label}\n")

    def _check_ready(self) -> None:
        with self._lock:
            if self.ready or any(e.facts is None for e in self.engines):
                return
            facts = [e.facts for e in self.engines]
        first = facts[0]
        self.model = Facts(",".join(self.labels), first["dtype"], first["sample_rate"], self.counts)
        self.max_batch = first["max_batch"]
        self.live.chunk_samples = first["chunk"]
        self.warm_up_seconds = max(f["warm_up_seconds"] for f in facts)
        self.ready = True

    def metric_lines(self) -> list[str]:
        """/metrics' lines for each device (label `device`)."""
        rate = self.model.sample_rate if self.model is not None else 1
        with self._lock:
            rows = [
                (self.labels[e.index], int(e.facts is not None and not e.gone), e.queued / rate, len(e.requests), c)
                for e, c in ((e, self.counts[e.index]) for e in self.engines)
            ]
        lines = []
        for at, (name, kind, text) in enumerate(DEVICE_METRICS):
            metric = f"graphscribe_device_{name}"
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
            for label, up, queued, requests, c in rows:
                value = (up, queued, requests, c.answered, c.padded, c.restarts, c.turns)[at]
                lines.append(f'{metric}{{device="{label}"}} {_number(value)}')
        return lines


class _Live:
    """`Service.live` for several engines: each realtime turn goes to the engine with the least audio queued when it
    opens, and its operations after it to the same engine."""

    def __init__(self, engines: DeviceEngines):
        self.engines = engines
        self.chunk_samples = 0  # from the engines' READY

    def apply(self, ops: list[tuple]) -> None:
        """Operations (OPEN | AUDIO | FINISH | DROP, key, samples or None), each sent on to its turn's engine."""
        pool, sent, failed = self.engines, {}, []
        with pool._lock:
            for kind, key, part in ops:
                if kind == DROP and callable(key):  # every turn of a worker that died
                    for k in [k for k in pool._turns if key(k)]:
                        turn, engine = pool._turns[k]
                        sent.setdefault(engine, []).append((DROP, turn, None))
                        pool._forget_turn(turn)
                    continue
                if kind == OPEN:
                    engine = pool._pick()
                    if engine is None:
                        failed.append(key)
                        continue
                    turn = next(pool._numbers)
                    pool._turns[key], pool._turn_keys[turn] = (turn, engine), key
                    engine.turns.add(turn)
                    pool.counts[engine.index].turns += 1
                elif key in pool._turns:
                    turn, engine = pool._turns[key]
                else:
                    continue  # its engine died: the turn has failed already
                sent.setdefault(engine, []).append((kind, turn, part))
                if kind == DROP:
                    pool._forget_turn(turn)
        for engine, engine_ops in sent.items():
            parts = [p for _, _, p in engine_ops if p is not None]
            raw = np.concatenate(parts).astype(np.float32, copy=False) if parts else None
            sizes = [(kind, turn, 0 if p is None else p.nbytes) for kind, turn, p in engine_ops]
            engine.outbox.put(((TURNS, sizes, 0 if raw is None else raw.nbytes), raw))
        if failed:
            message = "no engine is running (they are restarting): try again"
            pool.on_said([(key, Said("", 0, error=message)) for key in failed])

    def drop_all(self, owner: Callable[[Hashable], bool]) -> None:
        self.apply([(DROP, owner, None)])


def device_labels(devices: list[str]) -> list[str]:
    """/metrics' names of the engines: the device's, cpu:0, cpu:1... where the CPU is listed more than once."""
    cpus = devices.count("cpu")
    numbers = itertools.count()
    return [f"cpu:{next(numbers)}" if d == "cpu" and cpus > 1 else d for d in devices]


def _ended(code: int | None) -> str:
    return f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))
