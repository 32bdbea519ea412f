"""What the commands share: stderr, one-line usage errors, logging, the model's source and its loading.

The `transcribe` command (cli.py) and `transcribe serve` (server.py) both build on it. Like cli.py, it imports no
torch: the model's modules are imported when a model is loaded.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from graphscribe.io.config import (
    BATCH_FILES,
    CPU_BATCH_SECONDS,
    DEMO_NAME,
    MAX_AUDIO_SECONDS,
    SECONDS_PER_GIB,
    UnsupportedModelError,
)
from graphscribe.io.hotwords import HotwordError, read_hotwords_file
from graphscribe.io.options import RunOptions
from graphscribe.io.tokenizer import TokenizerError
from graphscribe.runtime.device_names import parse_devices

MODEL_ENV = "GRAPHSCRIBE_MODEL"  # default for --model
err_console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)  # "cuda:x" is no emoji


def fail_usage(message: str) -> None:
    err_console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(2)


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record comes (transcribing routes it around libmpg123's chatter)."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def setup_logging() -> None:
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    root = logging.getLogger("graphscribe")
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    root.propagate = False


def model_source(model: Optional[str]) -> str:
    """--model, else $GRAPHSCRIBE_MODEL, else the demo model (with a note saying so: `-m demo` chose it)."""
    source = model or os.environ.get(MODEL_ENV) or DEMO_NAME
    if not (model or os.environ.get(MODEL_ENV)):
        err_console.print(
            "note: using the bundled demo model (14 M parameters, trained on synthetic espeak-ng speech; "
            "poor on real voices): for real transcripts pass --model nvidia/parakeet-tdt-0.6b-v3 "
            f"or a .nemo file, or set {MODEL_ENV}"
        )
    return source


def load_or_exit(model: Optional[str], options: RunOptions, on_config=None):
    """Load the model a command's --model names (`model_source`) to run with `options`, or print one line and exit 2.
    on_config: see `load_model`."""
    from graphscribe.api import load_model
    from graphscribe.io.checkpoint import CheckpointError
    from graphscribe.runtime.defaults import limit_host_threads
    from graphscribe.runtime.priming import prime

    primer = prime(options.device, options.dtype)  # CUDA's libraries load while the checkpoint does
    source = model_source(model)
    try:
        limit_host_threads(options.device)
        loaded = load_model(source, options, on_config=on_config)
    except (CheckpointError, UnsupportedModelError, TokenizerError, ValueError) as err:
        if primer is not None:
            primer.join()  # not exiting while it is inside a CUDA library
        message = str(err)
        if isinstance(err, UnsupportedModelError):
            message = f"{source}: {message}"
        fail_usage(message)
    return loaded  # the primer may still be at work: what it loads is locked, the first use waits for it


MODEL_HELP = ".nemo file, extracted checkpoint folder, Hugging Face repo id (nvidia/parakeet-tdt-0.6b-v3), or demo."
MODEL_DEFAULT = f"${MODEL_ENV}, else demo"
DEVICE_HELP = "auto: CUDA when present, else the CPU. cuda without CUDA: bad usage (exit 2)."
DTYPE_HELP = (
    "auto: bfloat16 on CUDA GPUs that have it (same word error rate, about twice as fast), float32 elsewhere. "
    "float32 gives NeMo's exact token ids. On the CPU, float16 falls back to float32."
)


MAX_AUDIO_HOURS = MAX_AUDIO_SECONDS / 3600
MAX_AUDIO_HELP = (
    "A file of more audio is refused with one line, from its header where that gives the length, else once "
    "decoding passes it: a file's samples are held in memory (6 h at 48 kHz: 4 GB)."
)
CONFIDENCE_HELP = (
    "Token and word confidence as NeMo computes it (entropy, Tsallis, alpha 0.33, exp norm; a word its tokens' "
    "minimum), in 0..1: json tokens[].confidence and words[].confidence, a tsv confidence column (a cue's least "
    "confident word). Computed after decoding; off, nothing is."
)
DEVICES_HELP = (
    "Several devices of this host, one worker process and model each, sharing one longest-first plan: "
    "all (every CUDA GPU) or a comma list (cuda:0,cuda:1; cpu,cpu for many cores). Output as with one device."
)
LM_HELP = (
    "A token-level n-gram LM over the model's pieces, fused into decoding on the GPU as NeMo's NGPU-LM: an ARPA file "
    "(scripts/build_lm.py makes one from text) or NeMo's NGPU-LM saved as .nemo (loads faster)."
)
HOT_HELP = (
    "Phrases to boost, comma-separated, as the model writes them (capitalisation too); PHRASE:S gives one its own "
    "score per token (default 1.0). NeMo's GPU phrase boosting."
)


def hotwords_or_exit(hotwords: str | None, path: Path | None) -> tuple[str, ...]:
    """--hotwords (comma-separated) and --hotwords-file (one phrase a line) as one tuple of phrases, or one line and
    exit 2 for a file that cannot be read."""
    items = [item.strip() for item in hotwords.split(",")] if hotwords and hotwords.strip() else []
    if path is None:
        return tuple(items)
    try:
        lines = read_hotwords_file(str(path))
    except HotwordError as err:
        fail_usage(str(err))
    return (*items, *(f"{p}:{s}" if s else p for p, s in lines))


# The token models fused into decoding, as `transcribe` and `transcribe serve` take them (`fusion_options`)
LM_OPTION = typer.Option(None, "--lm", metavar="FILE", show_default=False, help=LM_HELP)
LM_WEIGHT_OPTION = typer.Option(0.5, "--lm-weight", metavar="W", help="The --lm's weight (NeMo's ngram_lm_alpha).")
HOTWORDS_OPTION = typer.Option(None, "--hotwords", metavar='"A, B:2.0"', show_default=False, help=HOT_HELP)
HOTWORDS_FILE_OPTION = typer.Option(
    None, "--hotwords-file", metavar="FILE", show_default=False, help="Phrases to boost, one a line (A:2.0 too)."
)
BOOST_OPTION = typer.Option(1.0, "--boost", metavar="W", help="The hotwords' weight (NeMo's boosting_tree_alpha).")


def fusion_options(
    lm: Path | None, lm_weight: float, hotwords: str | None, hotwords_file: Path | None, boost: float
) -> dict:
    """--lm, --lm-weight, --hotwords, --hotwords-file and --boost as `RunOptions` fields; one line and exit 2 for
    a hotwords file that cannot be read (`hotwords_or_exit`). A malformed LM file is found as the model loads
    (`load_or_exit`)."""
    phrases = hotwords_or_exit(hotwords, hotwords_file)
    return {"lm": str(lm) if lm is not None else None, "lm_weight": lm_weight, "hotwords": phrases, "boost": boost}


PROMPT_HOTWORDS_HELP = (
    "Boost a request's `prompt` (a realtime session's transcription prompt) as hotwords: comma-separated phrases, "
    "A:2.0 with a score, as the `hotwords` field takes them."
)
ATTENTION_HELP = (
    "Encoder attention. auto: full attention (NeMo's default) unless an input is over 24 min or full "
    "attention would not fit in free memory, then local (one note on stderr). full: always full. "
    "local: NeMo's rel_pos_local_attn, linear in length. A checkpoint trained with local attention "
    "uses its own window (full still forces full)."
)
BATCH_HELP = "Files per batch (longest first)."
BATCH_DEFAULT = f"{BATCH_FILES['cuda-float32']} on CUDA in float32, {BATCH_FILES['cuda-16bit']} in 16 bits, {BATCH_FILES['cpu']} on the CPU"
BATCH_SECONDS_HELP = (
    "Seconds of padded audio per batch at most: files x the longest one's length, so long files "
    "batch narrowly and short ones widely; 0: no cap."
)
BATCH_SECONDS_DEFAULT = (
    f"{SECONDS_PER_GIB:g} per GiB of GPU memory ({SECONDS_PER_GIB * 80:g} on 80 GB), {CPU_BATCH_SECONDS:g} on the CPU"
)


def find_audio_files(folder: Path) -> list[Path]:
    """`audio.find_audio_files`, imported on first use (audio.py imports torch)."""
    from graphscribe.io.audio import find_audio_files as find

    return find(folder)


def devices_or_exit(devices: Optional[str], device: str) -> list[str]:
    """--devices as device names ([] when not given); a bad value exits 2 with one line, before any loading."""
    if devices is None:
        return []
    if device != "auto":
        fail_usage(f"--device {device} --devices {devices}: give one of them")
    try:
        return parse_devices(devices)
    except ValueError as err:
        fail_usage(str(err))
