"""The server's HTTP workers: processes that take requests, read and decode the uploads, and hand the samples to the
engine (server.py), which batches them through the model and hands back transcripts.

    client -> [HTTP worker process: key checked -> admitted (one count shared by the workers: at most max_queue
               requests at once, else 503 with Retry-After) -> the body read into memory as it arrives (at most
               max_upload bytes, 413 past it; nothing is written to disk) and split into its fields (openai_api.py)
               -> the file decoded and resampled in an upload thread (400 if it is not audio)]
           -> samples over the worker's pipe -> [engine: Service.submit, batching across every worker's requests]
           -> transcript over the pipe -> [HTTP worker: answered in OpenAI's shape (openai_api.py)]

Every worker accepts on a socket of its own on the server's port (`server.worker_socket`), so the kernel spreads
connections over them evenly.
They run apart from the engine because of the GIL: an upload's HTTP parsing, multipart splitting and decoding
hold it for about a millisecond a request, and in one process that time is taken from the thread that launches
the GPU's work (on 2 cores, the HTTP side alone managed ~300 requests a second). A worker imports torch only for
resampling, with one thread.

Messages on a worker's pipe are pickled tuples:
    worker -> engine   (UP,)   (SUBMIT, id, bytes, timings, name) + the samples, raw   (METRICS, id)
                       (LOG, path, status, seconds, audio seconds, access-log line)
    engine -> worker   (READY, health, max_queue, sample_rate)   (DONE, id, transcript, queue seconds)
                       (REFUSED, id)   (METRICS, id, text)
A SUBMIT's samples follow it as a message of their own, raw float32 bytes, which the engine reads straight into an
array (`receive_samples`): pickled with it, they would be copied four times over in the engine, each copy holding
the GIL that its batching thread launches the GPU's work with (~0.7 ms a 7.5 s request on a 2-core machine against
~0.15 ms raw, most of it in the kernel; bench/2026-11-server/run15-run16).
Workers start before the model loads (their imports overlap its loading) and answer 503 until READY.
The engine keeps the counters and writes the access log: one writer for stderr and for /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from graphscribe.io.audio import AudioError, read_bytes
from graphscribe.io.config import MAX_AUDIO_SECONDS
from graphscribe.serve.openai_api import (
    RETRY_AFTER,
    UPLOAD_STALL_SECONDS,
    ApiError,
    answer,
    drain,
    parse_options,
    read_form,
)

SUBMIT, LOG, METRICS, UP, READY, DONE, REFUSED = "submit", "log", "metrics", "up", "ready", "done", "refused"
DRAIN_UPLOADS = 2  # a refused body up to this many upload limits is read (and dropped) before the answer
PATHS = ("/v1/audio/transcriptions", "/v1/models", "/health", "/metrics")  # metric labels; anything else: other
UPLOAD_THREADS = 4  # decoding threads a worker: libsndfile and resampling release the GIL


@dataclass
class FrontSettings:
    """What every HTTP worker is told at its start."""

    model_name: str
    api_key: str | None
    max_upload: int  # bytes
    upload_stall: float = UPLOAD_STALL_SECONDS
    max_audio_seconds: float = MAX_AUDIO_SECONDS  # an upload of more audio is refused (400)


def send(conn: Connection, message: tuple) -> None:
    """One message on a pipe; the caller makes sure one thread writes at a time."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive_samples(conn: Connection, nbytes: int, into: np.ndarray | None = None) -> np.ndarray:
    """The raw message of `nbytes` that follows a SUBMIT, as float32 samples: read from the pipe straight into
    `into` (float32, nbytes of it; None: a new array; the kernel copies, with the GIL released), in the framing
    `Connection.send_bytes` wrote it with."""
    fd = conn.fileno()
    (size,) = struct.unpack("!i", _read_exactly(fd, 4))
    if size == -1:  # past 2 GiB
        (size,) = struct.unpack("!Q", _read_exactly(fd, 8))
    if size != nbytes:  # a bug on one side of the pipe, never an upload's doing
        raise ValueError(f"the samples' message has {size} bytes, not the {nbytes} announced")
    samples = np.empty(nbytes // 4, dtype=np.float32) if into is None else into
    if samples.nbytes != nbytes:
        raise ValueError(f"the samples' message has {nbytes} bytes, not the {samples.nbytes} made room for")
    _read_exactly(fd, nbytes, memoryview(samples).cast("B"))
    return samples


def _read_exactly(fd: int, n: int, into: memoryview | None = None) -> memoryview:
    """n bytes from `fd`. From a socket (a duplex Connection's) in one call that waits for all of them: the engine's
    batching thread holds the GIL nearly all the time, and a reader that wakes for each part of a message waits for
    the GIL each time (up to the switch interval, 5 ms)."""
    into = memoryview(bytearray(n)) if into is None else into
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # a pipe
        sock = None
    got = 0
    try:
        while got < n:
            if sock is not None:
                k = sock.recv_into(into[got:n], n - got, socket.MSG_WAITALL)
            else:
                k = os.readv(fd, [into[got:n]])
            if k == 0:
                raise EOFError
            got += k
    finally:
        if sock is not None:
            sock.detach()  # the fd stays the Connection's
    return into


class EngineLost(Exception):
    """The engine's end of the pipe closed: nothing more will be transcribed."""


class Link:
    """A worker's end of its pipe to the engine: requests out (from any thread), answers in on a thread of its own,
    each handed to the asyncio future waiting for it."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()
        self._waiting: dict[int, asyncio.Future] = {}  # id -> future, touched on the event loop only
        self._ids = itertools.count()
        self.health: dict | None = None  # the engine's /health body once it is warm
        self.max_queue = 0  # requests admitted at once over every worker, and the model's sample rate: from READY
        self.sample_rate = 0
        self.lost = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_lost = lambda: None

    def start(self, loop: asyncio.AbstractEventLoop, on_lost) -> None:
        self._loop, self._on_lost = loop, on_lost
        threading.Thread(target=self._receive, name="graphscribe-link", daemon=True).start()

    def send(self, message: tuple, raw: np.ndarray | None = None) -> None:
        """One pickled message and, right after it on the pipe, `raw`'s bytes as a message of their own."""
        if self.lost:
            raise EngineLost
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)  # outside the lock
        try:
            with self._lock:
                self.conn.send_bytes(data)
                if raw is not None:
                    self.conn.send_bytes(memoryview(raw).cast("B"))
        except OSError:
            raise EngineLost from None

    def submit(self, n: int, samples: np.ndarray, timings: bool, name: str) -> None:
        """(SUBMIT, n, bytes, timings, name), then the float32 samples themselves, raw (`receive_samples`)."""
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        self.send((SUBMIT, n, samples.nbytes, timings, name), samples)

    def expect(self) -> tuple[int, asyncio.Future]:
        """A new id and the future its answer will settle (on the event loop)."""
        n = next(self._ids)
        future = self._loop.create_future()
        self._waiting[n] = future
        return n, future

    def forget(self, n: int) -> None:
        self._waiting.pop(n, None)

    def _receive(self) -> None:
        while True:
            try:
                message = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                self._loop.call_soon_threadsafe(self._lose)
                return
            self._loop.call_soon_threadsafe(self._settle, message)

    def _settle(self, message: tuple) -> None:
        kind = message[0]
        if kind == READY:
            _, health, self.max_queue, self.sample_rate = message
            self.health = health
            return
        future = self._waiting.pop(message[1], None)
        if future is None or future.done():  # its client went away
            return
        if kind == REFUSED:
            future.set_exception(_shutting_down())
        else:
            future.set_result(message[2:])

    def _lose(self) -> None:
        self.lost = True
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(_shutting_down())
        self._waiting.clear()
        self._on_lost()


class Front:
    """One worker's routes: admission, uploads, answers. Transcription is the engine's, through `link`."""

    def __init__(self, settings: FrontSettings, link: Link, admitted):
        self.settings, self.link = settings, link
        self.admitted = admitted  # multiprocessing.Value: requests admitted and not answered, over every worker
        self.uploads = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="graphscribe-upload")
        self.stopping = False
        self.created = int(time.time())
        self.app = Starlette(
            routes=[
                Route("/v1/audio/transcriptions", self.transcriptions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics_text, methods=["GET"]),
            ],
        )

    def authorized(self, request: Request) -> bool:
        key = self.settings.api_key
        if key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())

    async def transcriptions(self, request: Request) -> Response:
        try:
            if self.stopping:
                raise _shutting_down()
            if not self.authorized(request):
                raise _unauthorized()
            if self.link.health is None:
                raise ApiError(503, "the server is warming up", code="warming_up")
            with self.admitted.get_lock():
                if self.admitted.value >= self.link.max_queue:
                    raise ApiError(
                        503, f"the server is busy ({self.link.max_queue} requests queued)", code="queue_full"
                    )
                self.admitted.value += 1
        except ApiError as err:
            return await self._refuse(request, err)
        try:
            return await self._transcribe(request)
        except ApiError as err:
            return await self._refuse(request, err)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody reads it: the access log's "client closed the request"
        finally:
            with self.admitted.get_lock():
                self.admitted.value -= 1

    async def _transcribe(self, request: Request) -> Response:
        settings = self.settings
        form = await read_form(request, settings.max_upload, settings.upload_stall)
        if form.file is None:
            raise ApiError(400, "no audio: send the file in the multipart field 'file'", "file")
        options = parse_options(form)
        n, future = self.link.expect()
        try:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self.uploads, self._submit, n, form.file, form.filename, options.timings
                )
            except AudioError as err:
                raise ApiError(400, str(err), "file") from None
            except EngineLost:
                raise _shutting_down() from None
            finally:
                form.file = None  # the upload's bytes are not needed any more
            transcript, queue_seconds = await future
        finally:
            self.link.forget(n)
        request.scope["graphscribe"] = (transcript.audio_seconds, queue_seconds)
        if transcript.error is not None:
            raise ApiError(500, transcript.error)
        return answer(transcript, options)

    def _submit(self, n: int, data: memoryview, name: str, timings: bool) -> None:
        """On an upload thread: decode, resample, send to the engine."""
        audio = read_bytes(data, self.link.sample_rate, name, self.settings.max_audio_seconds)
        self.link.submit(n, audio.numpy(), timings, name)

    async def _refuse(self, request: Request, err: ApiError) -> Response:
        response = err.response()
        if not await drain(request, DRAIN_UPLOADS * self.settings.max_upload, self.settings.upload_stall):
            response.headers["Connection"] = "close"
        return response

    async def models(self, request: Request) -> Response:
        if not self.authorized(request):
            return _unauthorized().response()
        model = {"id": self.settings.model_name, "object": "model", "created": self.created, "owned_by": "graphscribe"}
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, request: Request) -> Response:
        if self.stopping or self.link.lost:
            return JSONResponse({"status": "stopping"}, 503)
        if self.link.health is None:
            return JSONResponse({"status": "warming up"}, 503, {"Retry-After": RETRY_AFTER})
        return JSONResponse(self.link.health)

    async def metrics_text(self, request: Request) -> Response:
        n, future = self.link.expect()
        try:
            self.link.send((METRICS, n))
            (text,) = await future
        except EngineLost:
            return JSONResponse({"status": "stopping"}, 503)
        finally:
            self.link.forget(n)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def _shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", code="shutting_down")


def _unauthorized() -> ApiError:
    return ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")


class AccessLog:
    """ASGI middleware: every answered request's path, status, seconds and audio seconds, and its access-log line
    (method path status, audio seconds, queue ms, total ms), to the engine."""

    def __init__(self, app, link: Link):
        self.app, self.link = app, link

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500  # if the app fails before answering

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            elapsed = time.perf_counter() - start
            path = scope["path"] if scope["path"] in PATHS else "other"
            transcribed = scope.get("graphscribe")  # (audio seconds, queue seconds) of a transcription
            line = f"{scope['method']} {ascii(scope['path'][:200])[1:-1]} {status}"  # no control characters
            if transcribed:
                line += f" audio {transcribed[0]:.2f} s, queue {1000 * transcribed[1]:.0f} ms,"
            line += f" total {1000 * elapsed:.0f} ms"
            with contextlib.suppress(EngineLost):
                self.link.send((LOG, path, status, elapsed, transcribed[0] if transcribed else 0.0, line))


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling the worker when a signal asks it to stop; it exits 0 once the requests it admitted
    are answered (uvicorn would raise the signal again after shutting down, ending the process by it)."""

    def __init__(self, config: uvicorn.Config, on_stop):
        super().__init__(config)
        self.on_stop = on_stop

    def handle_exit(self, sig, frame) -> None:
        self.on_stop()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def worker_main(listening: socket.socket, conn: Connection, admitted, settings: FrontSettings) -> None:
    """An HTTP worker process: serve on `listening` until SIGTERM or SIGINT (or the engine goes), then exit 0 once
    its admitted requests are answered."""
    import torch

    torch.set_num_threads(1)  # resampling only; the upload threads are the parallelism
    link = Link(conn)
    front = Front(settings, link, admitted)

    def stop() -> None:
        front.stopping = True

    def lost() -> None:
        stop()
        server.should_exit = True

    @contextlib.asynccontextmanager
    async def lifespan(app):
        link.start(asyncio.get_running_loop(), lost)
        with contextlib.suppress(EngineLost):
            link.send((UP,))
        yield
        front.uploads.shutdown()

    front.app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        AccessLog(front.app, link),
        access_log=False,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=None,  # admitted requests are answered, however long they take
        server_header=False,
    )
    server = _Uvicorn(config, on_stop=stop)
    try:
        server.run(sockets=[listening])
    except KeyboardInterrupt:
        pass
    sys.stderr.flush()
    os._exit(0)  # not interpreter shutdown: the pipe's and the upload threads' teardown has nothing left to do
