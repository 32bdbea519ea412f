"""`transcribe serve`: OpenAI's transcription API over HTTP, batching concurrent requests through one model.

    POST /v1/audio/transcriptions  multipart: file; response_format json | text | srt | vtt | verbose_json;
                                   stream; timestamp_granularities[]; model, language, prompt, temperature
                                   (accepted, unused: one model answers, greedy decoding, no prompting)
    GET  /v1/models                the loaded model
    GET  /health                   200 when warm, 503 while warming up or stopping
    GET  /metrics                  Prometheus text (metrics.py)

A transcription request: key checked (Bearer) -> admitted (at most max_queue at once, else 503 with Retry-After)
-> the body read into memory as it arrives, at most max_upload bytes (413 past it; nothing is written to disk),
and split into its fields (openai_api.py) -> the file decoded and resampled in a reader thread (400 if it is not
audio) -> `Service.submit` (service.py: batching across requests) -> awaited on the event loop -> answered in
OpenAI's shape (openai_api.py). Starlette on uvicorn, one process; uvicorn's access log is off, this module writes
one line per request instead. SIGTERM or SIGINT: new requests get 503, admitted ones are answered, then the process
exits 0.

Threads: the event loop (HTTP, uploads, answers), the upload readers, the batching thread (the model). They share
the GIL: the event loop's work per request is kept small (bytes.find for multipart, httptools and uvloop when
installed), since every moment it holds the GIL the batching thread waits to launch GPU work.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import math
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .audio import AudioError, read_bytes
from .checkpoint import DEMO_NAME
from .console import DEVICE_HELP as _DEVICE_HELP
from .console import DTYPE_HELP as _DTYPE_HELP
from .console import MODEL_DEFAULT as _MODEL_DEFAULT
from .console import MODEL_ENV, err_console, load_or_exit
from .console import MODEL_HELP as _MODEL_HELP
from .console import setup_logging as _setup_logging
from .metrics import Metrics
from .openai_api import RETRY_AFTER, UPLOAD_STALL_SECONDS, ApiError, answer, drain, parse_options, read_form
from .pipeline import default_workers
from .service import Service
from .transcript import Transcript

if TYPE_CHECKING:
    from .model import Model

API_KEY_ENV = "GRAPHSCRIBE_API_KEY"
QUEUE_PER_ROW = 4  # requests admitted at once per batch row: a batch running, one forming, two more uploading
MAX_UPLOAD_MB = 100  # about 50 minutes of 16 kHz 16-bit WAV
DRAIN_UPLOADS = 2  # a refused body up to this many upload limits is read (and dropped) before the answer
_PATHS = ("/v1/audio/transcriptions", "/v1/models", "/health", "/metrics")  # metric labels; anything else: other


# ------------------------------------------------------------------ the app
class Server:
    """The HTTP side: routes, admission, uploads, answers; transcription itself is the `Service`'s."""

    def __init__(
        self,
        service: Service,
        metrics: Metrics,
        model_name: str,
        api_key: str | None,
        max_upload: int,
        max_queue: int,
        upload_stall: float = UPLOAD_STALL_SECONDS,
    ):
        self.service, self.metrics, self.model_name, self.api_key = service, metrics, model_name, api_key
        self.max_upload, self.max_queue, self.upload_stall = max_upload, max_queue, upload_stall
        # uploads are decoded here, off the event loop: libsndfile and resampling release the GIL
        self.readers = ThreadPoolExecutor(
            default_workers(service.model.device), thread_name_prefix="graphscribe-upload"
        )
        self.admitted = 0  # transcription requests admitted and not answered (touched on the event loop only)
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
        if self.api_key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def transcriptions(self, request: Request) -> Response:
        try:
            if self.stopping:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if not self.authorized(request):
                raise _unauthorized()
            if not self.service.ready:
                raise ApiError(503, "the server is warming up", code="warming_up")
            if self.admitted >= self.max_queue:
                raise ApiError(503, f"the server is busy ({self.max_queue} requests queued)", code="queue_full")
        except ApiError as err:
            return await self._refuse(request, err)
        self.admitted += 1
        try:
            return await self._transcribe(request)
        except ApiError as err:
            return await self._refuse(request, err)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody reads it: the access log's "client closed the request"
        finally:
            self.admitted -= 1

    async def _transcribe(self, request: Request) -> Response:
        form = await read_form(request, self.max_upload, self.upload_stall)
        if form.file is None:
            raise ApiError(400, "no audio: send the file in the multipart field 'file'", "file")
        options = parse_options(form)
        loop = asyncio.get_running_loop()
        rate = self.service.model.sample_rate
        try:
            audio = await loop.run_in_executor(self.readers, read_bytes, form.file, rate, form.filename)
        except AudioError as err:
            raise ApiError(400, str(err), "file") from None
        form.file = None  # the upload's bytes are not needed any more
        future = loop.create_future()
        try:
            queued = self.service.submit(
                audio, options.timings, lambda t: loop.call_soon_threadsafe(_settle, future, t), form.filename
            )
        except RuntimeError:  # closed: the server is stopping
            raise ApiError(503, "the server is shutting down", code="shutting_down") from None
        transcript: Transcript = await future
        request.scope["graphscribe"] = (transcript.audio_seconds, queued.queue_seconds)
        if transcript.error is not None:
            raise ApiError(500, transcript.error)
        return answer(transcript, options)

    async def _refuse(self, request: Request, err: ApiError) -> Response:
        response = err.response()
        if not await drain(request, DRAIN_UPLOADS * self.max_upload, self.upload_stall):
            response.headers["Connection"] = "close"
        return response

    async def models(self, request: Request) -> Response:
        if not self.authorized(request):
            return _unauthorized().response()
        model = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "graphscribe"}
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, request: Request) -> Response:
        if self.stopping:
            return JSONResponse({"status": "stopping"}, 503)
        if not self.service.ready:
            return JSONResponse({"status": "warming up"}, 503, {"Retry-After": RETRY_AFTER})
        model = self.service.model
        return JSONResponse(
            {
                "status": "ok",
                "model": self.model_name,
                "device": str(model.device),
                "dtype": str(model.dtype).removeprefix("torch."),
                "max_batch": self.service.max_batch,
            }
        )

    async def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")


def _unauthorized() -> ApiError:
    return ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")


def _settle(future: asyncio.Future, transcript: Transcript) -> None:
    if not future.done():  # a cancelled request's answer is dropped
        future.set_result(transcript)


class AccessLog:
    """ASGI middleware: one stderr line per request (method path status, audio seconds, queue ms, total ms) and the
    request counters of /metrics."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

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
            path = scope["path"] if scope["path"] in _PATHS else "other"
            transcribed = scope.get("graphscribe")  # (audio seconds, queue seconds) of a transcription
            self.metrics.answered(path, status, elapsed, transcribed[0] if transcribed else 0.0)
            line = f"{scope['method']} {ascii(scope['path'][:200])[1:-1]} {status}"  # no control characters
            if transcribed:
                line += f" audio {transcribed[0]:.2f} s, queue {1000 * transcribed[1]:.0f} ms,"
            sys.stderr.write(f"{line} total {1000 * elapsed:.0f} ms\n")


# ------------------------------------------------------------------ the process
class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling the app when a signal asks it to stop; it exits 0 once the requests it admitted are
    answered (uvicorn would raise the signal again after shutting down, ending the process by it)."""

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


def run(
    model: Model,
    model_name: str,
    host: str,
    port: int,
    api_key: str | None,
    max_batch: int | None,
    max_wait: float,
    max_upload: int,
    max_queue: int | None,
    upload_stall: float = UPLOAD_STALL_SECONDS,
) -> int:
    """Serve `model` until SIGTERM or SIGINT; the exit code (0, or 1 if warming up failed). max_wait: seconds;
    max_upload: bytes; max_queue None: QUEUE_PER_ROW x the batch size; upload_stall: seconds an upload may send
    nothing before it is refused (408)."""
    server: Server | None = None
    metrics = Metrics(lambda: server.admitted if server is not None else 0)
    service = Service(model, max_batch, max_wait, on_batch=metrics.batch_rows.observe)
    max_queue = max_queue or QUEUE_PER_ROW * service.max_batch
    server = Server(service, metrics, model_name, api_key, max_upload, max_queue, upload_stall)
    failed = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        announcing = asyncio.create_task(announce())
        yield
        announcing.cancel()
        await asyncio.get_running_loop().run_in_executor(None, service.close)
        server.readers.shutdown()

    async def announce() -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, service.wait_ready)
        except Exception as err:  # noqa: BLE001 - said in one line, then the server stops
            sys.stderr.write(f"error: warming up failed: {err}\n")
            failed.append(err)
            uvicorn_server.should_exit = True
            return
        while not uvicorn_server.started:
            await asyncio.sleep(0.01)
        bound = uvicorn_server.servers[0].sockets[0].getsockname()
        device = f"{service.model.device} {str(service.model.dtype).removeprefix('torch.')}"
        sys.stderr.write(
            f"serving {model_name} on http://{_host(bound[0])}:{bound[1]} ({device}, batches of up to "
            f"{service.max_batch}; warmed up in {service.warm_up_seconds:.1f} s)\n"
        )

    server.app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        AccessLog(server.app, server.metrics),
        host=host,
        port=port,
        access_log=False,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=None,  # admitted requests are answered, however long they take
        server_header=False,
    )
    uvicorn_server = _Uvicorn(config, on_stop=lambda: setattr(server, "stopping", True))
    service.start()
    uvicorn_server.run()
    return 1 if failed or not uvicorn_server.started else 0


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_command(
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=_MODEL_DEFAULT, help=_MODEL_HELP
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
        None,
        "--max-batch",
        min=1,
        metavar="N",
        show_default="64 on CUDA, 8 on the CPU",
        help="Requests per batch at most.",
    ),
    max_wait_ms: float = typer.Option(
        5.0,
        "--max-wait-ms",
        min=0,
        metavar="MS",
        help="How long a batch formed on an idle GPU waits for more requests.",
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
    device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda|cuda:N", help=_DEVICE_HELP),
    dtype: str = typer.Option("auto", "--dtype", metavar="auto|float32|bfloat16|float16", help=_DTYPE_HELP),
) -> None:
    """Serve OpenAI's transcription API (POST /v1/audio/transcriptions), batching concurrent requests on one model."""
    _setup_logging()
    if not _loopback(host) and api_key is None:
        err_console.print(
            f"warning: listening on {host} without --api-key: anyone who can reach this port can use the server"
        )
    source = model or os.environ.get(MODEL_ENV) or DEMO_NAME
    loaded = load_or_exit(model, device, dtype, graphs=None, batch=max_batch)
    name = Path(source).stem if Path(source).exists() else source  # not the server's paths
    upload = math.floor(max_upload_mb * 2**20)
    raise typer.Exit(
        run(loaded, name, host, port, api_key, max_batch, max_wait_ms / 1000, upload, max_queue, upload_timeout)
    )


serve_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
serve_app.command()(serve_command)
