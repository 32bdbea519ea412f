"""Many hosts: transcription as a Ray Data pipeline (the `graphscribe[ray]` extra; `transcribe ray`).

    paths -> `decode_batch` (CPU tasks: read, decode, mix down, resample; float32 samples at the model's rate)
          -> `Transcriber` (actors holding a model each, one GPU or a share of one: sub-batches packed by padded
             seconds with the CLI's Scheduler) -> columns path, text, token_ids, words, segments, audio_seconds,
             error -> Parquet parts

A bad input is a row with `error` set, never a failed job. The module is named ray_data so that `import ray` in it
is Ray's; Ray itself is imported only by `build_pipeline` and `transcribe_ray`.
"""

from __future__ import annotations

import io
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf
import typer
from rich.markup import escape

from graphscribe.console import (
    BATCH_DEFAULT,
    BATCH_HELP,
    BATCH_SECONDS_DEFAULT,
    BATCH_SECONDS_HELP,
    DTYPE_HELP,
    MODEL_DEFAULT,
    MODEL_HELP,
    err_console,
    fail_usage,
    model_source,
    setup_logging,
)
from graphscribe.io.audio import AudioError, find_audio_files, prepare_audio, read_input
from graphscribe.io.config import default_batch_files
from graphscribe.io.options import RunOptions

DECODED = pa.schema([("path", pa.string()), ("samples", pa.binary()), ("error", pa.string())])  # samples: float32
_SPAN = pa.struct([("start", pa.float64()), ("end", pa.float64())])
RESULTS = pa.schema(
    [
        ("path", pa.string()),
        ("text", pa.string()),
        ("token_ids", pa.list_(pa.int32())),
        ("words", pa.list_(pa.struct([("word", pa.string()), *_SPAN]))),
        ("segments", pa.list_(pa.struct([("text", pa.string()), *_SPAN]))),
        ("audio_seconds", pa.float64()),
        ("error", pa.string()),  # null when transcribed
    ]
)
DECODE_ROWS = 16  # rows per decoding task's batch
ROWS_PER_MODEL_BATCH = 4  # a Ray batch to an actor holds this many of the model's batches (longest first within it)


def decode_batch(batch: pa.Table, sample_rate: int) -> pa.Table:
    """CPU stage: rows with `path` (read here: a local path or a pyarrow.fs URI such as s3://...) or with `bytes`
    too (`ray.data.read_binary_files(..., include_paths=True)`) -> `path`, `samples` (float32 bytes at
    `sample_rate`), `error` (null, or why the input cannot be transcribed)."""
    paths = batch.column("path").to_pylist()
    data = batch.column("bytes").to_pylist() if "bytes" in batch.column_names else [None] * len(paths)
    samples, errors = [], []
    for path, raw in zip(paths, data):
        try:
            audio = _decode(path, raw, sample_rate).numpy()
            samples.append(audio.astype("<f4", copy=False).tobytes())
            errors.append(None)
        except AudioError as err:
            samples.append(b"")
            errors.append(str(err))
    return pa.table([paths, samples, errors], schema=DECODED)


def _decode(path: str, raw: bytes | None, sample_rate: int):
    if raw is None and "://" not in path:
        return read_input(path, sample_rate)
    if raw is None:
        import pyarrow.fs

        try:
            filesystem, inner = pyarrow.fs.FileSystem.from_uri(path)
            with filesystem.open_input_file(inner) as f:
                raw = f.read()
        except (OSError, pa.ArrowException) as err:
            raise AudioError(f"{path}: cannot be read ({err})") from None
    try:
        data, rate = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)  # (L, C)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        raise AudioError(f"{path}: not a readable audio file (unknown format or corrupt data)") from None
    return prepare_audio(data, rate, sample_rate, name=path)


class Transcriber:
    """GPU stage, for `Dataset.map_batches` (a class: each actor loads the model once, in its constructor).

    Rows from `decode_batch` (or rows of paths, or of bytes and path, decoded here) -> RESULTS columns. Within a
    Ray batch the rows are transcribed longest first in sub-batches of at most the options' `batch_size` inputs
    and `batch_seconds` of padded audio, the CLI's rule (`Model.transcribe`). fn_constructor_kwargs: load_model's
    (model: its source; options, a RunOptions, and keywords over it).
    """

    def __init__(self, model: str, options: RunOptions | None = None, **overrides):
        from graphscribe.api import load_model

        self.model = load_model(model, options, **overrides)

    def __call__(self, batch: pa.Table) -> pa.Table:
        import torch

        if "samples" not in batch.column_names:
            batch = decode_batch(batch, self.model.sample_rate)
        paths = batch.column("path").to_pylist()
        errors = batch.column("error").to_pylist()
        rows = [k for k, e in enumerate(errors) if e is None]
        samples = batch.column("samples")
        audios = [torch.from_numpy(np.frombuffer(samples[k].as_py(), dtype="<f4").copy()) for k in rows]
        out = {name: [None] * len(paths) for name in RESULTS.names}
        out["path"], out["error"] = paths, list(errors)
        for name, empty in (("text", ""), ("token_ids", []), ("words", []), ("segments", []), ("audio_seconds", 0.0)):
            out[name] = [empty] * len(paths)
        for k, transcript in zip(rows, self.model.transcribe(audios) if audios else []):
            if transcript.error is not None:
                out["error"][k] = transcript.error.replace("<array>", paths[k])
                continue
            out["text"][k] = transcript.text
            out["token_ids"][k] = transcript.token_ids
            out["words"][k] = [{"word": w.word, "start": w.start, "end": w.end} for w in transcript.words]
            out["segments"][k] = [{"text": s.text, "start": s.start, "end": s.end} for s in transcript.segments]
            out["audio_seconds"][k] = transcript.audio_seconds
        return pa.table(out, schema=RESULTS)


def list_inputs(source: str) -> list[str]:
    """INPUT of `transcribe ray`: a folder (its audio files), a text file of paths or URIs (one a line), or Parquet
    with a `path` column -> paths, as given."""
    path = Path(source)
    if path.is_dir():
        return [str(p) for p in find_audio_files(path)]
    if source.endswith(".parquet") or (path.is_file() and path.read_bytes()[:4] == b"PAR1"):
        table = pq.read_table(source, columns=["path"])
        return [p for p in table.column("path").to_pylist() if p]
    if path.is_file():
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    raise ValueError(f"{source}: not a folder, a text file of paths or a Parquet file")


def done_paths(output_dir: str | os.PathLike) -> set[str]:
    """Inputs transcribed already: the `path` of every row without `error` in OUTPUT_DIR's Parquet parts."""
    parts = sorted(Path(output_dir).glob("*.parquet")) if Path(output_dir).is_dir() else []
    done: set[str] = set()
    for part in parts:
        table = pq.read_table(part, columns=["path", "error"])
        done.update(p for p, e in zip(table.column("path").to_pylist(), table.column("error").to_pylist()) if e is None)
    return done


def build_pipeline(
    paths: list[str], model: str, sample_rate: int, options: RunOptions, actors: int, gpus_per_actor: float
):
    """The Ray Dataset of RESULTS rows for `paths`: decoding in CPU tasks, then `actors` Transcriber actors running
    `model` with `options` (each with `gpus_per_actor` GPUs unless options.device is cpu). Nothing runs until it is
    consumed (write_parquet, take, ...)."""
    import ray.data

    on_gpu = options.device != "cpu"
    # the actors' own batches as the device's default gives them; dtype auto is bfloat16 on the GPUs that have it
    files = options.batch_size or default_batch_files("cuda" if on_gpu else "cpu", options.dtype != "float32")
    rows = files * ROWS_PER_MODEL_BATCH
    decoded = ray.data.from_items([{"path": p} for p in paths]).map_batches(
        decode_batch, fn_kwargs={"sample_rate": sample_rate}, batch_size=DECODE_ROWS, batch_format="pyarrow"
    )
    return decoded.map_batches(
        Transcriber,
        fn_constructor_kwargs=dict(model=model, options=options),
        batch_size=rows,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_gpus=gpus_per_actor if on_gpu else 0,
        num_cpus=1,
    )


def model_sample_rate(source: str) -> int:
    """The checkpoint's sample rate, from its config (the decoding stage resamples to it)."""
    from graphscribe.io.checkpoint import read_checkpoint
    from graphscribe.io.config import model_config_from_nemo

    return model_config_from_nemo(read_checkpoint(source).config).features.sample_rate


def transcribe_ray(
    source: str,
    output_dir: str,
    model: str,
    options: RunOptions = RunOptions(),
    actors: int | None = None,
    gpus_per_actor: float = 1.0,
) -> tuple[int, int]:
    """`transcribe ray`: the inputs of `source` not done in `output_dir` through `build_pipeline`, written there as
    Parquet parts, on the cluster `ray.init()` finds (a local one when there is none). -> (inputs skipped as
    done, inputs written). options.device auto: CUDA where the cluster has GPUs; actors None: GPUs /
    gpus_per_actor (1 on CPUs)."""
    import ray

    paths = list_inputs(source)
    done = done_paths(output_dir)
    todo = [p for p in paths if p not in done]
    if not todo:
        return len(paths), 0
    if not ray.is_initialized():
        ray.init()
    gpus = ray.cluster_resources().get("GPU", 0)
    if options.device == "auto":
        options = replace(options, device="cuda" if gpus else "cpu")
    if actors is None:
        actors = max(1, int(gpus / gpus_per_actor)) if options.device != "cpu" and gpus_per_actor > 0 else 1
    pipeline = build_pipeline(todo, model, model_sample_rate(model), options, actors, gpus_per_actor)
    pipeline.write_parquet(str(output_dir))
    return len(paths) - len(todo), len(todo)


def ray_command(
    source: str = typer.Argument(
        ..., metavar="INPUT", help="A folder, a text file of paths or URIs (one a line), or Parquet with a path column."
    ),
    output_dir: str = typer.Argument(
        ..., metavar="OUTPUT_DIR", help="Parquet parts go here; inputs with a row without error there are skipped."
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT, help=MODEL_HELP
    ),
    gpus_per_actor: float = typer.Option(1.0, min=0, metavar="G", help="GPUs per model actor (0.5: two share one)."),
    actors: Optional[int] = typer.Option(
        None, min=1, metavar="N", show_default="the cluster's GPUs / G; 1 on CPUs", help="Model actors."
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", "-b", min=1, metavar="N", show_default=BATCH_DEFAULT, help=BATCH_HELP
    ),
    batch_seconds: Optional[float] = typer.Option(
        None, "--batch-seconds", min=0, metavar="S", show_default=BATCH_SECONDS_DEFAULT, help=BATCH_SECONDS_HELP
    ),
    device: str = typer.Option("auto", metavar="auto|cpu|cuda", help="auto: CUDA where the cluster has GPUs."),
    dtype: str = typer.Option("auto", metavar="auto|float32|bfloat16|float16", help=DTYPE_HELP),
) -> None:
    """Transcribe with Ray Data on the cluster ray.init() finds (local when there is none): Parquet rows of path,
    text, token_ids, words, segments, audio_seconds, error."""
    setup_logging()
    try:
        import ray  # noqa: F401

        from graphscribe.ray_data import transcribe_ray
    except ImportError:
        fail_usage("transcribe ray needs Ray: pip install 'graphscribe[ray]'")
    try:
        options = RunOptions(device=device, dtype=dtype, batch_size=batch, batch_seconds=batch_seconds)
        skipped, written = transcribe_ray(source, output_dir, model_source(model), options, actors, gpus_per_actor)
    except (ValueError, OSError) as err:
        fail_usage(str(err))
    if skipped:
        err_console.print(f"skipped {skipped} inputs done in {escape(output_dir)} already")
    err_console.print(f"wrote {written} rows to {escape(output_dir)}")


ray_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
ray_app.command()(ray_command)
