"""`transcribe serve`'s command line: its options, checked before anything starts, then the engine (server.py)
started with the model they ask for, on one device or an engine process each (engines.py).

A request's own decoding choices (its `beam`, its `hotwords`) are form fields (openai_api.py); the options here are
the process's: the default beam, and the LM and phrases fused into every request's decoding as the one-shot CLI
fuses them (the same options, console.py).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Optional

import torch
import typer
from rich.markup import escape

from graphscribe.console import (
    BATCH_DEFAULT,
    BOOST_OPTION,
    DEVICE_HELP,
    DTYPE_HELP,
    HOTWORDS_FILE_OPTION,
    HOTWORDS_OPTION,
    LM_OPTION,
    LM_WEIGHT_OPTION,
    MAX_AUDIO_HELP,
    MAX_AUDIO_HOURS,
    MODEL_DEFAULT,
    MODEL_ENV,
    MODEL_HELP,
    PROMPT_HOTWORDS_HELP,
    devices_or_exit,
    err_console,
    fusion_options,
    load_or_exit,
    setup_logging,
)
from graphscribe.io.checkpoint import DEMO_NAME
from graphscribe.io.options import RunOptions
from graphscribe.serve.engines import DeviceEngines
from graphscribe.serve.ipc import UPLOAD_STALL_SECONDS, FrontSettings
from graphscribe.serve.server import QUEUE_PER_ROW, Engine, Stop, run, serve_until
from graphscribe.serve.sockets import is_loopback, listen

API_KEY_ENV = "GRAPHSCRIBE_API_KEY"
MAX_UPLOAD_MB = 100  # about 50 minutes of 16 kHz 16-bit WAV
_WORKER_CORES = 4  # beside a GPU, one HTTP worker per this many cores (at most MAX_HTTP_WORKERS a GPU)
MAX_HTTP_WORKERS = 4
GPU_SESSIONS, CPU_SESSIONS = 1024, 16  # realtime sessions at once by default
SESSION_IDLE_SECONDS = 60.0


def vad_available() -> bool:
    """Whether server_vad can run: Silero's model and onnxruntime installed (the serve extra has them)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("silero_vad", "onnxruntime"))


def default_http_workers(device: str, gpus: int = 1) -> int:
    """HTTP worker processes when not given: beside `gpus` GPUs, one per 4 cores up to 4 a GPU (uploads are decoded
    there, and several GPUs answer as many more requests a second); with the model on the CPU, one (the model wants
    the cores)."""
    if device == "cpu" or not torch.cuda.is_available():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_HTTP_WORKERS * max(1, gpus), cores // _WORKER_CORES))


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
        show_default="one per 4 cores up to 4 a GPU beside GPUs, 1 on the CPU",
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
        1,
        "--beam",
        min=1,
        metavar="N",
        help="Beam search of N hypotheses for uploads that do not send their own `beam` (realtime sessions: greedy).",
    ),
    lm: Optional[Path] = LM_OPTION,
    lm_weight: float = LM_WEIGHT_OPTION,
    hotwords: Optional[str] = HOTWORDS_OPTION,
    hotwords_file: Optional[Path] = HOTWORDS_FILE_OPTION,
    boost: float = BOOST_OPTION,
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
    fusion = fusion_options(lm, lm_weight, hotwords, hotwords_file, boost)  # a bad hotwords file: before listening
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
    engine = Engine(listening, settings, http_workers or default_http_workers(device, max(1, len(names))))
    with Stop() as stop:
        try:
            engine.start_workers()  # their imports overlap the model's loading; they answer 503 until it is warm
        except OSError as err:  # a worker's socket
            engine.stop_workers()
            err_console.print(f"error: cannot start the HTTP workers on {host}:{port} ({err.strerror or err})")
            raise typer.Exit(1) from None
        options = RunOptions(
            device=device, dtype=dtype, batch_size=max_batch, beam_size=beam, confidence=confidence, **fusion
        )
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
