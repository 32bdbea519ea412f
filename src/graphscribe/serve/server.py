"""`transcribe serve`: OpenAI's transcription API over HTTP, batching concurrent requests through one model.

    POST /v1/audio/transcriptions  multipart: file; response_format json | text | srt | vtt | verbose_json;
                                   stream; timestamp_granularities[]; include[]; hotwords (this request's phrases);
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
"""

from __future__ import annotations

import math
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
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
import typer
from rich.markup import escape

from graphscribe.console import (
    BATCH_DEFAULT,
    DEVICE_HELP,
    DTYPE_HELP,
    MAX_AUDIO_HELP,
    MAX_AUDIO_HOURS,
    MODEL_DEFAULT,
    MODEL_ENV,
    MODEL_HELP,
    PROMPT_HOTWORDS_HELP,
    devices_or_exit,
    err_console,
    load_or_exit,
    setup_logging,
)
from graphscribe.io.checkpoint import DEMO_NAME
from graphscribe.io.options import RunOptions
from graphscribe.serve.engines import DeviceEngines
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
    UPLOAD_STALL_SECONDS,
    Admission,
    FrontSettings,
    receive_samples,
    send,
)
from graphscribe.serve.metrics import Metrics
from graphscribe.serve.service import Service, warm_up_plans
from graphscribe.serve.sockets import host_text, is_loopback, listen, worker_socket

if TYPE_CHECKING:
    from graphscribe.api import Model

API_KEY_ENV = "GRAPHSCRIBE_API_KEY"
QUEUE_PER_ROW = 4  # requests admitted at once per batch row: a batch running, one forming, two more uploading
MAX_UPLOAD_MB = 100  # about 50 minutes of 16 kHz 16-bit WAV
STARTUP_SECONDS = 10.0  # a worker that exits sooner than this after its start failed to start: the server stops
_WORKER_CORES = 4  # beside a GPU, one HTTP worker per this many cores (at most MAX_HTTP_WORKERS)
MAX_HTTP_WORKERS = 4
GPU_SESSIONS, CPU_SESSIONS = 1024, 16  # realtime sessions at once by default
SESSION_IDLE_SECONDS = 60.0


def vad_available() -> bool:
    """Whether server_vad can run: Silero's model and onnxruntime installed (the serve extra has them)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("silero_vad", "onnxruntime"))


def default_http_workers(device: str) -> int:
    """HTTP worker processes when not given: beside a GPU, one per 4 cores up to 4 (uploads are decoded there);
    with the model on the CPU, one (the model wants the cores)."""
    if device == "cpu" or not torch.cuda.is_available():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_HTTP_WORKERS, cores // _WORKER_CORES))


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
                _, n, nbytes, word_times, name, confidence, hotwords = message
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
                    self.service.submit(samples, word_times, _answer_to(worker, n), name, confidence, hotwords)
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
    def done(transcript, queue_seconds: float) -> None:  # on the batching thread
        worker.send((DONE, n, transcript, queue_seconds))

    return done


class _Stop:
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
    stop: _Stop,
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


def serve_until(engine: Engine, service, model_name: str, max_queue: int | None, stop: _Stop) -> int:
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


def serve_command(
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT, help=MODEL_HELP
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", metavar="ADDRESS", help="Address to listen on (0.0.0.0: every interface)."
    ),
    port: int = typer.Option(
        8000, "--port", min=0, max=65535, metavar="PORT", help="Port to listen on (0: any free one)."
    ),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar=API_KEY_ENV, metavar="KEY", help="Requests must send Authorization: Bearer KEY."
    ),
    max_batch: Optional[int] = typer.Option(
        None, "--max-batch", min=1, metavar="N", show_default=BATCH_DEFAULT, help="Requests per batch at most."
    ),
    max_wait_ms: float = typer.Option(
        5.0,
        "--max-wait-ms",
        min=0,
        metavar="MS",
        help="How long a batch formed on an idle GPU waits for more requests (while some are still arriving).",
    ),
    max_upload_mb: float = typer.Option(
        MAX_UPLOAD_MB, "--max-upload-mb", min=0.01, metavar="MB", help="Largest request body accepted (413 past it)."
    ),
    max_queue: Optional[int] = typer.Option(
        None,
        "--max-queue",
        min=1,
        metavar="N",
        show_default=f"{QUEUE_PER_ROW} x --max-batch",
        help="Transcription requests admitted at once (uploading, waiting or running); past it 503 with Retry-After.",
    ),
    upload_timeout: float = typer.Option(
        UPLOAD_STALL_SECONDS,
        "--upload-timeout",
        min=0.1,
        metavar="S",
        help="Seconds an upload may send nothing before it is refused (408): a stuck client frees its place.",
    ),
    metrics_public: bool = typer.Option(
        False,
        "--metrics-public",
        help="Answer GET /metrics without the API key (for a scraper that sends none); by default it needs --api-key.",
    ),
    http_workers: Optional[int] = typer.Option(
        None,
        "--http-workers",
        min=1,
        metavar="N",
        show_default="one per 4 cores up to 4 beside a GPU, 1 on the CPU",
        help="HTTP worker processes: they take the requests and decode the uploads, apart from the model's process.",
    ),
    device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda|cuda:N", help=DEVICE_HELP),
    devices: Optional[str] = typer.Option(
        None,
        "--devices",
        metavar="all|cuda:0,cuda:1|cpu,cpu",
        help="One engine process per device, each request sent to the one with the least audio queued.",
    ),
    dtype: str = typer.Option("auto", "--dtype", metavar="auto|float32|bfloat16|float16", help=DTYPE_HELP),
    beam: int = typer.Option(
        1, "--beam", min=1, metavar="N", help="Beam search of N hypotheses for uploads (realtime sessions: greedy)."
    ),
    max_audio_hours: float = typer.Option(
        MAX_AUDIO_HOURS, "--max-audio-hours", min=0.001, metavar="H", help=MAX_AUDIO_HELP + " 400 past it."
    ),
    max_sessions: Optional[int] = typer.Option(
        None,
        "--max-sessions",
        min=0,
        metavar="N",
        show_default=f"{GPU_SESSIONS} beside a GPU, {CPU_SESSIONS} on the CPU",
        help="Realtime sessions (WebSocket /v1/realtime) open at once; past it the upgrade is refused (503). 0: off.",
    ),
    session_idle: float = typer.Option(
        SESSION_IDLE_SECONDS,
        "--session-idle",
        min=1,
        metavar="S",
        help="Seconds a realtime session may send no event before it is ended (its open turn answered).",
    ),
    confidence: bool = typer.Option(False, "--confidence", help="verbose_json words[].confidence for every request."),
    prompt_as_hotwords: bool = typer.Option(False, "--prompt-as-hotwords", help=PROMPT_HOTWORDS_HELP),
) -> None:
    """Serve OpenAI's transcription API (POST /v1/audio/transcriptions), batching concurrent requests on one model.
    Needs the serve extra: pip install 'graphscribe\\[serve]'."""
    _check_the_extra()
    setup_logging()
    names = devices_or_exit(devices, device)
    device = names[0] if names else device
    if not is_loopback(host) and api_key is None:
        err_console.print(
            f"warning: listening on {host} without --api-key: anyone who can reach this port can use the server"
        )
    source = model or os.environ.get(MODEL_ENV) or DEMO_NAME
    name = Path(source).stem if Path(source).exists() else source  # not the server's paths
    try:
        listening = listen(host, port)
    except OSError as err:
        err_console.print(f"error: cannot listen on {host}:{port} ({err.strerror or err})")
        raise typer.Exit(1) from None
    if max_sessions is None:
        on_gpu = device != "cpu" and torch.cuda.is_available()
        max_sessions = GPU_SESSIONS if on_gpu else CPU_SESSIONS
    settings = FrontSettings(
        name,
        api_key,
        math.floor(max_upload_mb * 2**20),
        upload_timeout,
        metrics_public,
        max_audio_hours * 3600,
        max_sessions,
        session_idle,
        vad_available(),
        prompt_as_hotwords,
    )
    engine = Engine(listening, settings, http_workers or default_http_workers(device))
    with _Stop() as stop:
        try:
            engine.start_workers()  # their imports overlap the model's loading; they answer 503 until it is warm
        except OSError as err:  # a worker's socket
            engine.stop_workers()
            err_console.print(f"error: cannot start the HTTP workers on {host}:{port} ({err.strerror or err})")
            raise typer.Exit(1) from None
        options = RunOptions(device=device, dtype=dtype, batch_size=max_batch, beam_size=beam, confidence=confidence)
        if len(names) > 1:
            code = _serve_on_devices(engine, source, names, options, name, max_wait_ms, max_queue, stop)
            raise typer.Exit(code)
        try:
            loaded = load_or_exit(model, options)
        except BaseException:
            engine.stop_workers()
            raise
        code = run(engine, loaded, name, max_batch, max_wait_ms / 1000, max_queue, stop)
    raise typer.Exit(code)


def _serve_on_devices(engine, source, names, options, model_name, max_wait_ms, max_queue, stop) -> int:
    """--devices with several: an engine process each (engines.py), which the HTTP workers' requests are spread over."""
    service = DeviceEngines.behind(engine, source, names, options, max_wait_ms / 1000)
    sys.stderr.write(f"warming up {model_name} on {', '.join(service.labels)}: an engine process each\n")
    return serve_until(engine, service, model_name, max_queue, stop)


SERVE_EXTRA = ("starlette", "uvicorn", "httptools")  # what the HTTP workers import (uvloop: uvicorn's, if present)


def _check_the_extra() -> None:
    """Exit 2 with one line naming the serve extra when its packages are missing: the engine imports none of them
    (ipc.py), so --help prints without them, and this says why the server cannot run before anything starts."""
    try:
        import graphscribe.serve.http_front  # noqa: F401
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in SERVE_EXTRA:
            raise
        err_console.print(escape(f"error: transcribe serve needs {missing}: pip install 'graphscribe[serve]'"))
        raise typer.Exit(2) from None


serve_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
serve_app.command()(serve_command)
