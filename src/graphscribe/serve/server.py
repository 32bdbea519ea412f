"""`transcribe serve`: OpenAI's transcription API over HTTP, batching concurrent requests through one model.

    POST /v1/audio/transcriptions  multipart: file; response_format json | text | srt | vtt | verbose_json;
                                   stream; timestamp_granularities[]; include[]; hotwords (this request's phrases);
                                   beam (this request's beam size; 1: greedy; default --beam);
                                   model, language, prompt (hotwords with --prompt-as-hotwords), temperature: unused
    GET  /v1/realtime              ?intent=transcription: OpenAI's Realtime transcription sessions over a WebSocket
                                   (realtime.py); `--max-sessions` at once, `--session-idle` seconds without an event
    GET  /v1/models                the loaded model
    GET  /health                   200 when warm, 503 while loading, warming up or stopping
    GET  /metrics                  Prometheus text (metrics.py); with --api-key it needs the key (--metrics-public: not)

Processes: this one, the engine, binds the server's port, starts the HTTP workers (http_front.py: Starlette on
uvicorn, `--http-workers` of them, each accepting on a socket of its own on that port, which the kernel spreads the
connections over, reading and decoding uploads), loads the model and warms it up; then one intake thread a worker
hands that worker's decoded uploads to the `Service` (service.py: batching across every worker's requests), counts
/metrics and writes the access log, and one writer thread a worker sends it its answers (queued by the batching
thread, which never waits on a worker's pipe). The engine owns the admission counts (ipc.Admission: a slot a worker,
the requests it holds). SIGTERM or SIGINT: the workers refuse new requests with 503 and answer those they admitted
(the engine keeps transcribing for them; an upload that sends nothing is cut after a second), then exit; the engine
exits 0 after them. A worker that dies is replaced, and the places it held in the counts are freed. `--devices` with
several devices: this process loads no model; an engine process per device runs a `Service` each, and
`engines.DeviceEngines` stands for the `Service` here, sending each request to the one with the least audio queued.
The command line that starts it all: command.py.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from graphscribe.console import err_console
from graphscribe.serve.ipc import (
    AUDIO,
    DONE,
    LOG,
    METRICS,
    READY,
    REFUSED,
    SAID,
    SUBMIT,
    TURNS,
    UP,
    Admission,
    FrontSettings,
    receive_samples,
    send,
)
from graphscribe.serve.metrics import Metrics
from graphscribe.serve.service import Service, warm_up_plans
from graphscribe.serve.sockets import host_text, worker_socket

if TYPE_CHECKING:
    from graphscribe.api import Model

QUEUE_PER_ROW = 4  # requests admitted at once per batch row: a batch running, one forming, two more uploading
STARTUP_SECONDS = 10.0  # a worker that exits sooner than this after its start failed to start: the server stops


@dataclass(eq=False)
class _Worker:
    """The engine's view of one HTTP worker process. Messages to it go through `outbox`, written to its pipe by a
    thread of its own: the batching thread only queues its answers (a worker slow to read, or stopped, never holds
    up the model), and the pickling is off that thread too."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    slot: int  # its place in the admission counts
    started: float
    up: bool = False
    gone: bool = False  # dead: what is sent to it is dropped
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    def send(self, message: tuple) -> None:
        if not self.gone:
            self.outbox.put(message)

    def write(self) -> None:
        """The outbox to the pipe, until None, then the pipe closed (here: no other thread is writing to it then);
        once the worker is gone, what is left is dropped."""
        gone = False
        while (message := self.outbox.get()) is not None:
            if gone:
                continue
            try:
                send(self.conn, message)
            except OSError:
                gone = True  # the worker is gone: its clients' connections went with it
        self.conn.close()


class Engine:
    """The model's side of the server: HTTP workers, their intake threads, the service, /metrics, the access log."""

    def __init__(self, listening: socket.socket, settings: FrontSettings, workers: int):
        self.listening, self.settings, self.count = listening, settings, workers
        self._context = multiprocessing.get_context("spawn")  # no CUDA state or threads copied into a worker
        self.admission = Admission(workers)  # requests each worker admitted and has not answered, a slot a worker
        self.sessions = Admission(workers)  # realtime sessions each worker holds open
        self.metrics = Metrics(lambda: self.admitted_count, lambda: self.sessions.total)
        self.workers: list[_Worker] = []
        self.service: Service | None = None
        self.ready: tuple | None = None  # the READY message once the service is warm
        self._lock = threading.Lock()  # the workers list, `ready`, and the workers' `up`
        self._log_lock = threading.Lock()

    @property
    def admitted_count(self) -> int:
        """Requests admitted by the workers and not answered yet."""
        return self.admission.total

    def start_workers(self) -> None:
        for slot in range(self.count):
            self._start_worker(slot)

    def _start_worker(self, slot: int) -> None:
        from graphscribe.serve.http_front import worker_main  # the serve extra: imported once the server runs

        mine, theirs = self._context.Pipe()
        accepting = worker_socket(self.listening)  # connections queue on it from here on
        with self._lock:
            ready = self.ready  # a warm engine's, given at the start: its first connections are served
        process = self._context.Process(
            target=worker_main,
            args=(accepting, theirs, self.admission, self.sessions, slot, self.settings, ready),
            name="graphscribe-http",
            daemon=True,
        )
        process.start()
        theirs.close()
        if accepting is not self.listening:  # the worker's own: gone with it, and its waiting connections with it
            accepting.close()
        worker = _Worker(process, mine, slot, time.monotonic())
        with self._lock:
            self.workers.append(worker)
        threading.Thread(target=self._intake, args=(worker,), name="graphscribe-intake", daemon=True).start()
        threading.Thread(target=worker.write, name="graphscribe-answers", daemon=True).start()

    def serve(self, service: Service, model_name: str, max_queue: int) -> None:
        """Hand the workers' requests to `service` once it is warm (called when it is)."""
        model = service.model
        health = {
            "status": "ok",
            "model": model_name,
            "device": str(model.device),
            "dtype": str(model.dtype).removeprefix("torch."),
            "max_batch": service.max_batch,
        }
        self.metrics.capture_seconds = lambda: model.capture_seconds
        with self._lock:
            self.service = service
            chunk = service.live.chunk_samples if service.live is not None else 0
            self.ready = (READY, health, max_queue, model.sample_rate, chunk)
            for worker in self.workers:
                if worker.up:
                    worker.send(self.ready)

    @property
    def all_up(self) -> bool:
        with self._lock:
            return all(w.up for w in self.workers)

    def _intake(self, worker: _Worker) -> None:
        """A worker's messages, until its pipe closes."""
        while True:
            try:
                message = pickle.loads(worker.conn.recv_bytes())
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == SUBMIT:
                _, n, nbytes, word_times, name, confidence, hotwords, beam = message
                try:
                    if nbytes < 0:  # receive_samples checks the rest against the message itself
                        raise ValueError(f"{nbytes} bytes announced")
                    samples = self.service.samples_buffer(nbytes // 4)  # pinned beside a GPU: no copy on the host
                    receive_samples(worker.conn, nbytes, samples.numpy())
                except (EOFError, OSError):
                    return
                except ValueError as err:  # the pipe is out of step: nothing more from it can be trusted
                    err_console.print(f"error: an HTTP worker's message was malformed ({err}); stopping it")
                    worker.process.kill()  # check_workers starts another; its clients' connections close
                    return
                try:
                    done = _answer_to(worker, n)
                    self.service.submit(samples, word_times, done, name, confidence, hotwords, beam)
                except RuntimeError:  # closed: the server is stopping
                    worker.send((REFUSED, n))
            elif kind == TURNS:
                if not self._turns(worker, message):
                    return
            elif kind == LOG:
                _, path, status, seconds, audio_seconds, line = message
                self.metrics.answered(path, status, seconds, audio_seconds)
                with self._log_lock:
                    sys.stderr.write(line + "\n")
            elif kind == METRICS:
                worker.send((METRICS, message[1], self.metrics.text()))
            elif kind == UP:
                with self._lock:
                    worker.up = True
                    if self.ready is not None:
                        worker.send(self.ready)

    def _turns(self, worker: _Worker, message: tuple) -> bool:
        """A burst of realtime turns' operations to the live sessions; False when the pipe closed or is out of
        step."""
        _, ops, nbytes = message
        try:
            if nbytes < 0 or nbytes % 4 or sum(op[2] for op in ops) != nbytes:
                raise ValueError(f"{nbytes} bytes announced")
            samples = receive_samples(worker.conn, nbytes) if nbytes else None
        except (EOFError, OSError):
            return False
        except ValueError as err:
            err_console.print(f"error: an HTTP worker's message was malformed ({err}); stopping it")
            worker.process.kill()
            return False
        applied, at = [], 0
        for kind, n, size, *opened in ops:
            part = opened[0] if opened else None  # an OPEN's turn's own phrases, if any
            if kind == AUDIO:
                part, at = samples[at // 4 : (at + size) // 4], at + size
            applied.append((kind, (worker, n), part))
        self.service.live.apply(applied)
        return True

    def said(self, said: list) -> None:
        """On the batching thread: what a step's turns said, to their workers (one message a worker)."""
        by_worker: dict[_Worker, list] = {}
        for (worker, n), what in said:
            by_worker.setdefault(worker, []).append((n, what))
        for worker, items in by_worker.items():
            worker.send((SAID, items))

    def check_workers(self) -> str | None:
        """Replace a worker that died, its places in the admission counts freed (its clients' connections went with
        it; what the engine still transcribes for it is dropped); a reason to stop the server if one died at its
        start."""
        with self._lock:
            dead = [w for w in self.workers if not w.process.is_alive()]
            for w in dead:
                self.workers.remove(w)
        for w in dead:
            w.gone = True
            w.outbox.put(None)
            held = self.admission.clear(w.slot)
            self.sessions.clear(w.slot)
            if self.service is not None and self.service.live is not None:
                self.service.live.drop_all(lambda turn, gone=w: turn[0] is gone)
            code = w.process.exitcode
            how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            if time.monotonic() - w.started < STARTUP_SECONDS and not w.up:
                return f"an HTTP worker {how} at its start"
            lost = f" (the {held} request{'s' if held != 1 else ''} it held dropped)" if held else ""
            err_console.print(f"error: an HTTP worker {how}; starting another{lost}")
            try:
                self._start_worker(w.slot)
            except OSError as err:  # its socket (out of file descriptors): no worker to take its place
                return f"cannot start another HTTP worker ({err.strerror or err})"
        return None

    def stop_workers(self) -> None:
        """SIGTERM to every worker, then wait for each: they answer what they admitted first."""
        with self._lock:
            workers = list(self.workers)
        for w in workers:
            if w.process.is_alive():
                os.kill(w.process.pid, signal.SIGTERM)
        for w in workers:
            w.process.join()
            w.outbox.put(None)
            self.admission.clear(w.slot)  # nothing is coming from a worker that is gone
            self.sessions.clear(w.slot)


def _answer_to(worker: _Worker, n: int):
    def done(transcript, times: tuple[float, float]) -> None:  # on the batching thread
        worker.send((DONE, n, transcript, times))

    return done


class Stop:
    """SIGTERM and SIGINT set `requested`, which the main thread polls (`wait`); the handlers before are put back on
    exit. The handler takes no lock: it runs in the main thread between two bytecodes, possibly while that thread
    holds the very lock it would take (a `threading.Event.set` there deadlocks when the signal lands inside
    `Event.wait`, and the server never stops)."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        handled = (signal.SIGINT, signal.SIGTERM)
        self._previous = {sig: signal.signal(sig, self._handle) for sig in handled}
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def wait(self, seconds: float) -> bool:
        """Sleep `seconds` unless a stop was asked for already; whether one was."""
        if not self.requested:
            time.sleep(seconds)
        return self.requested

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run(
    engine: Engine,
    model: Model,
    model_name: str,
    max_batch: int | None,
    max_wait: float,
    max_queue: int | None,
    stop: Stop,
) -> int:
    """Warm `model` up and serve it through `engine`'s workers until `stop`; the exit code (0, or 1 if warming up
    failed or a worker could not start). max_wait: seconds; max_queue None: QUEUE_PER_ROW x the batch size."""
    sessions = engine.settings.max_sessions
    service = Service(
        model,
        max_batch,
        max_wait,
        on_batch=engine.metrics.batch,
        # admitted by a worker, not submitted yet (uploading, decoding; or answered, its worker not yet told)
        coming=lambda: engine.admitted_count - service.in_flight,
        on_said=engine.said,  # the realtime sessions' turns, and uploads with stream=true
        live_streams=max(sessions, 1),
        on_live_step=engine.metrics.live_step,
    )
    device = f"{model.device} {str(model.dtype).removeprefix('torch.')}"
    # on a GPU this lasts seconds (a fresh machine's Triton compiles: half a minute): say what the wait is
    sys.stderr.write(f"warming up {model_name} on {device}: {_warm_up_work(service)}\n")
    return serve_until(engine, service, model_name, max_queue, stop)


def serve_until(engine: Engine, service, model_name: str, max_queue: int | None, stop: Stop) -> int:
    """Start `service` (a `Service`, or engines.DeviceEngines) and serve it through `engine`'s workers until `stop`;
    the exit code. max_queue None: QUEUE_PER_ROW x the batch size, for each device."""
    service.start()
    failed, announced = None, False
    while not stop.wait(0.05):
        failed = engine.check_workers()
        if failed:
            break
        if service.error is not None:
            failed = f"{'warming up failed: ' if not service.ready else ''}{service.error}"
            break
        if announced or not service.ready:
            continue
        if engine.ready is None:
            devices = len(getattr(service, "devices", [None]))
            engine.serve(service, model_name, max_queue or QUEUE_PER_ROW * service.max_batch * devices)
        if engine.all_up:
            host, port = engine.listening.getsockname()[:2]
            workers = f"{engine.count} HTTP worker{'s' if engine.count > 1 else ''}"
            device = f"{service.model.device} {str(service.model.dtype).removeprefix('torch.')}"
            sys.stderr.write(
                f"serving {model_name} on http://{host_text(host)}:{port} ({device}, batches of up to {service.max_batch}, "
                f"{workers}; warmed up in {service.warm_up_seconds:.1f} s)\n"
            )
            announced = True
    engine.stop_workers()
    service.close()
    if failed:
        sys.stderr.write(f"error: {failed}\n")
    return 1 if failed else 0


def _warm_up_work(service: Service) -> str:
    """What the warm-up does, in words: on CUDA graphs are captured and kernels compiled; on the CPU nothing is
    captured, and one short clip goes through every stage once (its first calls' allocations and kernel choices)."""
    if service.model.device.type == "cuda":
        return "its batch shapes' graphs and kernels"
    (seconds,) = warm_up_plans(service.model, service.max_batch, service.batch_seconds)[0]
    return f"one {seconds:g} s clip through every stage"
