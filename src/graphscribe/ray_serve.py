"""A cluster behind one endpoint: OpenAI's transcription API as a Ray Serve deployment (`transcribe ray-serve`, or
`serve run graphscribe.ray_serve:app`; the `graphscribe[ray]` extra).

    client -> Ray Serve's HTTP proxy (every node, port 8000) -> a `Transcriber` replica (an actor with its GPU,
    `ray_actor_options={"num_gpus": G}`): the upload read and its fields checked, as `transcribe serve` does
    (serve/openai_api.py), decoded on a thread -> the replica's `Service` (serve/service.py: the server's batching
    engine, batching the replica's concurrent requests) -> the answer in OpenAI's shape (openai_api.answer)

Ray Serve spreads the requests over the replicas, up to `max_ongoing_requests` at once each: enough for the
replica's batches to fill (QUEUE_PER_ROW x its batch). POST /v1/audio/transcriptions takes `transcribe serve`'s
fields and formats but stream=true (the live streams are `transcribe serve`'s); GET /v1/models and /health answer
too. Ray is imported only by `build_app` and the command: a replica imports this module for `Transcriber`.
"""

from __future__ import annotations

import asyncio
import hmac
import signal
import time
from dataclasses import replace
from typing import Optional

import typer

from graphscribe.console import DTYPE_HELP, MODEL_DEFAULT, MODEL_HELP, err_console, fail_usage, model_source
from graphscribe.io.audio import AudioError, read_bytes
from graphscribe.io.config import MAX_AUDIO_SECONDS, default_batch_files
from graphscribe.io.options import RunOptions
from graphscribe.serve.ipc import UPLOAD_STALL_SECONDS
from graphscribe.serve.openai_api import ApiError, Upload, answer, parse_options, read_form

APP_NAME = "graphscribe"
QUEUE_PER_ROW = 4  # requests a replica takes at once per batch row, as `transcribe serve` admits (server.py)
MAX_UPLOAD_BYTES = 100 << 20  # as `transcribe serve --max-upload-mb`'s default


class Transcriber:
    """One replica: a model on the replica's device (its GPU where Ray gave it one) behind a `Service`.

    source, options: `load_model`'s (options.device: cuda where the replica has a GPU, else cpu). model_name: the
    id /v1/models answers. api_key: requests must send `Authorization: Bearer KEY` (None: anyone)."""

    def __init__(self, source: str, options: RunOptions, model_name: str, api_key: str | None = None):
        from graphscribe.api import load_model
        from graphscribe.serve.service import Service

        model = load_model(source, options)
        self.coming = 0  # requests taken and not submitted yet (uploading, decoding): a batch waits only for them
        self.service = Service(model, options.batch_size, 0.005, coming=lambda: self.coming)
        self.service.start()
        self.service.wait_ready()
        self.model_name, self.api_key = model_name, api_key
        dtype = str(model.dtype).removeprefix("torch.")
        self.health = {"status": "ok", "model": model_name, "device": str(model.device), "dtype": dtype}

    async def __call__(self, request):
        """Every path under the deployment's route (Ray Serve hands over Starlette's request)."""
        what = f"{request.method} {request.url.path}"
        try:
            if not self._authorized(request):
                raise ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key")
            if what == "POST /v1/audio/transcriptions":
                return await self._transcribe(request)
            if what == "GET /v1/models":
                from starlette.responses import JSONResponse

                model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "graphscribe"}
                return JSONResponse({"object": "list", "data": [model]})
            if what == "GET /health":
                from starlette.responses import JSONResponse

                return JSONResponse(self.health)
            raise ApiError(404, f"Invalid URL ({ascii(what[:200])[1:-1]})", code="unknown_url")
        except ApiError as err:
            return err.response()

    def _authorized(self, request) -> bool:
        if self.api_key is None or request.url.path == "/health":
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def _transcribe(self, request):
        self.coming += 1
        try:
            audio, options, name = await self._read(request)
        finally:
            self.coming -= 1
        loop = asyncio.get_running_loop()
        answered = loop.create_future()

        def done(transcript, times: tuple[float, float]) -> None:  # on the batching thread
            loop.call_soon_threadsafe(answered.set_result, transcript)

        self.service.submit(audio, options.word_times, done, name, beam=options.beam)
        transcript = await answered
        if transcript.error is not None:
            raise ApiError(500, transcript.error)
        return answer(transcript, options)

    async def _read(self, request):
        """The upload's samples at the model's rate, its options and its file name; ApiError for a bad one."""
        form = await read_form(Upload(request, UPLOAD_STALL_SECONDS), MAX_UPLOAD_BYTES)
        if form.file is None:
            raise ApiError(400, "no audio: send the file in the multipart field 'file'", "file")
        options = parse_options(form)
        if options.stream:
            raise ApiError(400, "stream=true: served by `transcribe serve`, not by the Ray Serve deployment", "stream")
        rate = self.service.model.sample_rate
        try:
            audio = await asyncio.to_thread(read_bytes, form.file, rate, form.filename, MAX_AUDIO_SECONDS)
        except AudioError as err:
            raise ApiError(400, str(err), "file") from None
        return audio, options, form.filename


def build_app(
    source: str,
    options: RunOptions = RunOptions(),
    replicas: int = 1,
    gpus_per_replica: float = 1.0,
    model_name: str | None = None,
    api_key: str | None = None,
):
    """The Ray Serve application: `replicas` Transcriber replicas of `gpus_per_replica` GPUs each (0: on CPUs),
    each taking up to QUEUE_PER_ROW x its batch size of requests at once."""
    from ray import serve

    device = "cuda" if gpus_per_replica > 0 else "cpu"
    options = replace(options, device=device)
    rows = options.batch_size or default_batch_files(device, sixteen_bit=options.dtype != "float32")
    deployment = serve.deployment(
        Transcriber,
        name="Transcriber",
        num_replicas=replicas,
        ray_actor_options={"num_gpus": gpus_per_replica, "num_cpus": 1},
        max_ongoing_requests=QUEUE_PER_ROW * rows,
    )
    return deployment.bind(str(source), options, model_name or _name(source), api_key)


def app(args: dict[str, str]):
    """`serve run graphscribe.ray_serve:app model=MODEL [replicas=N] [gpus_per_replica=G] [batch=N] [dtype=D]`."""
    unknown = set(args) - {"model", "replicas", "gpus_per_replica", "batch", "dtype", "api_key"}
    if unknown:
        raise ValueError(f"unknown arguments {', '.join(sorted(unknown))}: use model, replicas, gpus_per_replica, ...")
    batch = int(args["batch"]) if "batch" in args else None
    options = RunOptions(dtype=args.get("dtype", "auto"), batch_size=batch)
    replicas, gpus = int(args.get("replicas", 1)), float(args.get("gpus_per_replica", 1))
    return build_app(args.get("model") or model_source(None), options, replicas, gpus, api_key=args.get("api_key"))


def _name(source: str) -> str:
    from pathlib import Path

    return Path(source).stem if Path(source).exists() else str(source)


def ray_serve_command(
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT, help=MODEL_HELP
    ),
    replicas: Optional[int] = typer.Option(
        None, "--replicas", min=1, metavar="N", show_default="the cluster's GPUs / G; 1 on CPUs", help="Replicas."
    ),
    gpus_per_replica: float = typer.Option(
        1.0, "--gpus-per-replica", min=0, metavar="G", help="GPUs per replica (0: on CPUs)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDRESS", help="Ray Serve's HTTP address (0.0.0.0: all)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, metavar="PORT", help="Ray Serve's HTTP port."),
    address: str = typer.Option(
        "auto", "--address", metavar="ADDRESS", help="The Ray cluster (auto: the running one)."
    ),
    batch: Optional[int] = typer.Option(None, "--max-batch", min=1, metavar="N", help="Requests per batch at most."),
    dtype: str = typer.Option("auto", "--dtype", metavar="auto|float32|bfloat16|float16", help=DTYPE_HELP),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="GRAPHSCRIBE_API_KEY", metavar="KEY", help="Requests must send Bearer KEY."
    ),
) -> None:
    """Serve OpenAI's transcription API from a running Ray cluster (ray start): a replica per GPU, each batching its
    requests; until Ctrl-C or SIGTERM, which take the application down."""
    try:
        import ray
        from ray import serve
    except ImportError:
        fail_usage("transcribe ray-serve needs Ray Serve: pip install 'graphscribe[ray]'")
    try:
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as err:
        fail_usage(f"no Ray cluster at {address} ({err}): start one with `ray start --head`")
    if replicas is None:
        gpus = ray.cluster_resources().get("GPU", 0)
        replicas = max(1, int(gpus // gpus_per_replica)) if gpus_per_replica > 0 else 1
    source = model_source(model)
    serve.start(http_options={"host": host, "port": port})
    options = RunOptions(dtype=dtype, batch_size=batch)
    serve.run(build_app(source, options, replicas, gpus_per_replica, api_key=api_key), name=APP_NAME, route_prefix="/")
    err_console.print(
        f"serving {_name(source)} on http://{host}:{port} ({replicas} replicas of {gpus_per_replica:g} GPUs)"
    )
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: the application is taken down
    try:
        while True:
            time.sleep(3600)  # the replicas serve in the cluster; this process only waits to take them down
    except KeyboardInterrupt:
        pass
    serve.delete(APP_NAME)


ray_serve_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
ray_serve_app.command()(ray_serve_command)
