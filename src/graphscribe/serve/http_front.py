"""The server's HTTP workers: processes that take requests, read and decode the uploads, and hand the samples to the
engine (server.py), which batches them through the model and hands back transcripts.

    client -> [HTTP worker process: its head whole within HEADERS_SECONDS -> key checked -> admitted (counts the
               engine owns, ipc.Admission: at most max_queue requests at once over every worker, else 503 with
               Retry-After) -> the body read into memory as it arrives (at most max_upload bytes, 413 past it; 408
               when it sends nothing for --upload-timeout; nothing is written to disk) and split into its fields
               (openai_api.py)
               -> the file decoded and resampled in an upload thread (400 if it is not audio)]
           -> samples over the worker's pipe -> [engine: Service.submit, batching across every worker's requests]
           -> transcript over the pipe -> [HTTP worker: answered in OpenAI's shape (openai_api.py)]

Every worker accepts on a socket of its own on the server's port (`sockets.worker_socket`), so the kernel spreads
connections over them evenly.
They run apart from the engine because of the GIL: an upload's HTTP parsing, multipart splitting and decoding
hold it for about a millisecond a request, and in one process that time is taken from the thread that launches
the GPU's work (on 2 cores, the HTTP side alone managed ~300 requests a second). A worker imports torch only for
resampling, with one thread.

The messages on a worker's pipe, its settings and the admission counts are ipc.py's. Every error is answered in
OpenAI's shape, Starlette's 404 and 405 and uvicorn's 400 included.
Workers start before the model loads (their imports overlap its loading) and answer 503 until READY.
The engine keeps the counters and writes the access log: one writer for stderr and for /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import os
import pickle
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from graphscribe.io.audio import AudioError, read_bytes
from graphscribe.serve.ipc import (
    LOG,
    METRICS,
    READY,
    REFUSED,
    SAID,
    SUBMIT,
    UP,
    Admission,
    BadRequest,
    EngineLost,
    FrontSettings,
)
from graphscribe.serve.openai_api import (
    ApiError,
    Upload,
    answer,
    drain,
    parse_options,
    read_form,
    shutting_down,
)
from graphscribe.serve.realtime import Realtime
from graphscribe.serve.realtime_api import RATE, SUBPROTOCOL_KEY
from graphscribe.serve.streamed import UploadStream

PATHS = ("/v1/audio/transcriptions", "/v1/models", "/health", "/metrics")  # metric labels; anything else: other
UPLOAD_THREADS = 4  # decoding threads a worker: libsndfile and resampling release the GIL
WS_MAX_BYTES = 4 << 20  # a realtime event at most (about 65 s of 24 kHz audio in one append); 1009 past it
HEADERS_SECONDS = 10.0  # a connection's request head must be whole this long after it opened or its last answer


class Link:
    """A worker's end of its pipe to the engine: requests out (from any thread), answers in on a thread of its own,
    each handed to the asyncio future waiting for it."""

    def __init__(self, conn: Connection, ready: tuple | None = None):
        self.conn = conn
        self._lock = threading.Lock()
        self._waiting: dict[int, asyncio.Future] = {}  # id -> future, touched on the event loop only
        self._ids = itertools.count()
        self.health: dict | None = None  # the engine's /health body once it is warm
        self.max_queue = 0  # requests admitted at once over every worker, and the model's sample rate: from READY
        self.sample_rate = 0
        self.chunk_samples = 0  # samples a live step takes of a stream (from READY)
        self.lost = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_lost = lambda: None
        self.on_said = lambda number, said: None  # a realtime turn's text (realtime.Realtime.said)
        if ready is not None:  # a worker started for a warm engine (one replacing a dead worker)
            self._settle(ready)

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

    def submit(
        self,
        n: int,
        samples: np.ndarray,
        word_times: bool,
        name: str,
        confidence: bool = False,
        hotwords: tuple = (),
        beam: int | None = None,
    ) -> None:
        """(SUBMIT, n, bytes, word_times, name, confidence, hotwords, beam), then the float32 samples themselves, raw
        (`receive_samples`)."""
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        self.send((SUBMIT, n, samples.nbytes, word_times, name, confidence, hotwords, beam), samples)

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
            _, health, self.max_queue, self.sample_rate, self.chunk_samples = message
            self.health = health
            return
        if kind == SAID:
            for n, said in message[1]:
                self.on_said(n, said)
            return
        future = self._waiting.pop(message[1], None)
        if future is None or future.done():  # its client went away
            return
        if kind == REFUSED:
            future.set_exception(shutting_down())
        else:
            future.set_result(message[2:])

    def _lose(self) -> None:
        self.lost = True
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(shutting_down())
        self._waiting.clear()
        self._on_lost()


class Front:
    """One worker's routes: admission, uploads, answers. Transcription is the engine's, through `link`."""

    def __init__(self, settings: FrontSettings, link: Link, admission: Admission, sessions: Admission, slot: int):
        self.settings, self.link = settings, link
        self.admission, self.slot = admission, slot  # the engine's counts, and this worker's place in them
        self.sessions = sessions  # realtime sessions open, counted as the requests are
        self.realtime = Realtime(self, settings.vad)
        link.on_said = self.realtime.said
        self.uploads = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="graphscribe-upload")
        self.stopping = False
        self.created = int(time.time())
        self.app = Starlette(
            routes=[
                Route("/v1/audio/transcriptions", self.transcriptions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics_text, methods=["GET"]),
                WebSocketRoute("/v1/realtime", self.realtime.endpoint),
            ],
            exception_handlers={HTTPException: _route_error, Exception: _internal_error},
        )

    def authorized(self, request: Request | WebSocket) -> bool:
        """The API key in the Authorization header (Bearer), or for a WebSocket in the subprotocol browsers send it
        in (`openai-insecure-api-key.KEY`)."""
        key = self.settings.api_key
        if key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
            return True
        offered = request.scope.get("subprotocols", ()) if request.scope["type"] == "websocket" else ()
        keys = [p[len(SUBPROTOCOL_KEY) :] for p in offered if p.startswith(SUBPROTOCOL_KEY)]
        return any(hmac.compare_digest(k.encode(), key.encode()) for k in keys)

    def admit_session(self, ws: WebSocket) -> ApiError | None:
        """A place among --max-sessions for a realtime session, before its upgrade; else why not."""
        if self.stopping:
            return shutting_down()
        if not self.authorized(ws):
            return _unauthorized()
        if self.link.health is None:
            return ApiError(503, "the server is warming up", code="warming_up")
        if self.link.sample_rate != RATE:
            return ApiError(503, f"realtime sessions need a {RATE} Hz model", code="sessions_off")
        limit = self.settings.max_sessions
        if limit <= 0:
            return ApiError(503, "realtime sessions are off on this server (--max-sessions 0)", code="sessions_off")
        if not self.sessions.admit(self.slot, limit):
            return ApiError(503, f"the server is busy ({limit} realtime sessions open)", code="sessions_full")
        return None

    async def transcriptions(self, request: Request) -> Response:
        upload = Upload(request, self.settings.upload_stall, lambda: self.stopping)
        try:
            self._admit(request)
        except ApiError as err:
            return await self._refuse(upload, err)
        held = True
        try:
            response = await self._transcribe(request, upload)
            held = not isinstance(response, StreamingResponse)  # a stream gives its place back when it ends
            return response
        except ApiError as err:
            refused = err
        except ClientDisconnect:
            return Response(status_code=499)  # nobody reads it: the access log's "client closed the request"
        finally:
            if held:
                self.admission.release(self.slot)
        return await self._refuse(upload, refused)  # its place freed first: a drain holds none

    def _admit(self, request: Request) -> None:
        """A place among the requests the workers hold, or ApiError."""
        if self.stopping:
            raise shutting_down()
        if not self.authorized(request):
            raise _unauthorized()
        if self.link.health is None:
            raise ApiError(503, "the server is warming up", code="warming_up")
        if not self.admission.admit(self.slot, self.link.max_queue):
            raise ApiError(503, f"the server is busy ({self.link.max_queue} requests queued)", code="queue_full")

    async def _transcribe(self, request: Request, upload: Upload) -> Response:
        start = time.perf_counter()
        form = await read_form(upload, self.settings.max_upload)
        received = time.perf_counter()
        if form.file is None:
            raise ApiError(400, "no audio: send the file in the multipart field 'file'", "file")
        options = parse_options(form, self.settings.prompt_as_hotwords)
        if options.stream:
            return await self._stream(request, form, options.hotwords)
        n, future = self.link.expect()
        try:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self.uploads, self._submit, n, form.file, form.filename, options
                )
            except AudioError as err:
                raise ApiError(400, str(err), "file") from None
            except EngineLost:
                raise shutting_down() from None
            finally:
                form.file = None  # the upload's bytes are not needed any more
            submitted = time.perf_counter()
            transcript, (queue, batch) = await future
        finally:
            self.link.forget(n)
        if isinstance(transcript, BadRequest):  # refused by the engine for a field (a phrase it cannot boost)
            raise ApiError(400, transcript.error, transcript.param)
        # the log line's stages: receiving the form, decoding the audio and sending it to the engine, the queue there,
        # its batch from forming to its answer (the rest of `total` is the way to the engine and back)
        stages = (received - start, submitted - received, queue, batch)
        request.scope["graphscribe"] = (transcript.audio_seconds, *stages)
        if transcript.error is not None:
            raise ApiError(500, transcript.error)
        return answer(transcript, options)

    async def _stream(self, request: Request, form, hotwords: tuple) -> Response:
        """stream=true: the upload decoded, then transcribed by the live engine, its deltas sent as they come."""
        stream = UploadStream(self.realtime, hotwords)
        rate = self.link.sample_rate
        try:
            samples = await asyncio.get_running_loop().run_in_executor(
                self.uploads, self._start_stream, stream, form.file, form.filename
            )
        except AudioError as err:
            raise ApiError(400, str(err), "file") from None
        except EngineLost:
            raise shutting_down() from None
        finally:
            form.file = None
        request.scope["graphscribe"] = (samples / rate, 0.0, 0.0, 0.0, 0.0)
        events = stream.events(lambda: self.admission.release(self.slot))
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def _start_stream(self, stream: UploadStream, data: memoryview, name: str) -> int:
        audio = read_bytes(data, self.link.sample_rate, name, self.settings.max_audio_seconds).numpy()
        stream.start(audio)
        return audio.size

    def _submit(self, n: int, data: memoryview, name: str, options) -> None:
        """On an upload thread: decode, resample, send to the engine."""
        audio = read_bytes(data, self.link.sample_rate, name, self.settings.max_audio_seconds)
        o = options
        self.link.submit(n, audio.numpy(), o.word_times, name, o.confidence, o.hotwords, o.beam)

    async def _refuse(self, upload: Upload, err: ApiError) -> Response:
        if await drain(upload):
            return err.response()
        return err.response({"Connection": "close"})

    async def models(self, request: Request) -> Response:
        if not self.authorized(request):
            return _unauthorized().response()
        model = {"id": self.settings.model_name, "object": "model", "created": self.created, "owned_by": "graphscribe"}
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, request: Request) -> Response:
        if self.stopping or self.link.lost:
            return shutting_down().response(status="stopping")
        if self.link.health is None:
            return ApiError(503, "the server is warming up", code="warming_up").response(status="warming up")
        return JSONResponse(self.link.health)

    async def metrics_text(self, request: Request) -> Response:
        if not (self.settings.metrics_public or self.authorized(request)):
            return _unauthorized().response()
        n, future = self.link.expect()
        try:
            self.link.send((METRICS, n))
            (text,) = await future
        except EngineLost:
            return shutting_down().response()
        finally:
            self.link.forget(n)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def _unauthorized() -> ApiError:
    return ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")


async def _route_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such path, a method the path does not take) in OpenAI's shape, as OpenAI words
    the first."""
    what = f"{request.method} {ascii(request.url.path[:200])[1:-1]}"
    if exc.status_code == 404:
        err = ApiError(404, f"Invalid URL ({what})", code="unknown_url")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        err = ApiError(405, f"Method not allowed ({what}); this path takes {allowed}", code="method_not_allowed")
    else:
        err = ApiError(exc.status_code, exc.detail)
    return err.response(dict(exc.headers or {}))


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug's answer (Starlette logs its traceback after it)."""
    return ApiError(500, f"internal error: {type(exc).__name__}").response()


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
            transcribed = scope.get("graphscribe")  # a transcription's audio seconds and stages (`_transcribe`)
            line = f"{scope['method']} {ascii(scope['path'][:200])[1:-1]} {status}"  # no control characters
            if transcribed:
                audio, upload, decode, queue, batch = transcribed
                line += f" audio {audio:.2f} s, upload {1000 * upload:.0f} ms, decode {1000 * decode:.0f} ms,"
                line += f" queue {1000 * queue:.0f} ms, batch {1000 * batch:.0f} ms,"
            line += f" total {1000 * elapsed:.0f} ms"
            with contextlib.suppress(EngineLost):
                self.link.send((LOG, path, status, elapsed, transcribed[0] if transcribed else 0.0, line))


class _Protocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol (httptools) with a clock on request heads: a connection whose head is not whole
    HEADERS_SECONDS after it opened, or after its last answer, is closed (uvicorn times only idle keep-alive
    connections: a client that opened connections and sent part of a head, or nothing, kept them for good); and its
    400 for a request it cannot parse in OpenAI's error shape."""

    _headers_clock: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._start_headers_clock()

    def connection_lost(self, exc) -> None:
        self._stop_headers_clock()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._stop_headers_clock()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._start_headers_clock()  # the next request's head, unless one pipelined behind it is running

    def _start_headers_clock(self) -> None:
        self._stop_headers_clock()
        self._headers_clock = self.loop.call_later(HEADERS_SECONDS, self._headers_late)

    def _stop_headers_clock(self) -> None:
        if self._headers_clock is not None:
            self._headers_clock.cancel()
            self._headers_clock = None

    def _headers_late(self) -> None:
        self._headers_clock = None
        if not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(ApiError(400, msg, code="invalid_http").body()).encode()
        head = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join([*head, body]))
        self.transport.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling the worker when a signal asks it to stop; it exits 0 once the requests it admitted
    are answered (uvicorn would raise the signal again after shutting down, ending the process by it)."""

    def __init__(self, config: uvicorn.Config, on_stop, before_shutdown):
        super().__init__(config)
        self.on_stop, self.before_shutdown = on_stop, before_shutdown

    def handle_exit(self, sig, frame) -> None:
        self.on_stop()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        """The realtime sessions' open turns answered and their sockets closed first: uvicorn's own shutdown fails
        every WebSocket at once (close code 1012)."""
        await self.before_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def worker_main(
    listening: socket.socket,
    conn: Connection,
    admission: Admission,
    sessions: Admission,
    slot: int,
    settings: FrontSettings,
    ready: tuple | None = None,
) -> None:
    """An HTTP worker process: serve on `listening` until SIGTERM or SIGINT (or the engine goes), then exit 0 once
    its admitted requests are answered (an upload that sends nothing is cut after STOP_STALL_SECONDS then). It
    counts its requests in `admission`'s `slot`. `ready`: the engine's READY, when it is warm already (a worker
    replacing one that died), so that the connections queued on `listening` meanwhile are served, not told 503."""
    import torch

    torch.set_num_threads(1)  # resampling only; the upload threads are the parallelism
    link = Link(conn, ready)
    front = Front(settings, link, admission, sessions, slot)

    def stop() -> None:
        front.stopping = True

    def lost() -> None:
        stop()
        front.realtime.lost()
        server.should_exit = True

    @contextlib.asynccontextmanager
    async def lifespan(app):
        front.realtime.start(asyncio.get_running_loop())
        link.start(asyncio.get_running_loop(), lost)
        with contextlib.suppress(EngineLost):
            link.send((UP,))
        yield
        front.uploads.shutdown()

    front.app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        AccessLog(front.app, link),
        http=_Protocol,
        access_log=False,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=None,  # admitted requests are answered, however long they take
        server_header=False,
        ws_max_size=WS_MAX_BYTES,
        ws_ping_interval=None,  # a session's liveness is its events (--session-idle)
    )
    server = _Uvicorn(config, on_stop=stop, before_shutdown=front.realtime.wind_down)
    try:
        server.run(sockets=[listening])
    except KeyboardInterrupt:
        pass
    sys.stderr.flush()
    os._exit(0)  # not interpreter shutdown: the pipe's and the upload threads' teardown has nothing left to do
