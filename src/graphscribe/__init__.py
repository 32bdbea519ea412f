"""graphscribe: NVIDIA Parakeet transducers (TDT, RNN-T) with greedy decoding replayed from CUDA graphs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphscribe.api import Model, load_model
    from graphscribe.io.audio import AudioError
    from graphscribe.io.checkpoint import CheckpointError
    from graphscribe.io.config import UnsupportedModelError
    from graphscribe.io.options import ConfidenceMethod, RunOptions
    from graphscribe.output.timestamps import Segment, Word
    from graphscribe.output.transcript import Transcript

# name -> module: imported on first use, so that `transcribe` imports torch only after its signal handlers are in
# place (`cli.entry`) and `transcribe --help` not at all
_EXPORTS = {
    "AudioError": "io.audio",
    "CheckpointError": "io.checkpoint",
    "ConfidenceMethod": "io.options",
    "Model": "api",
    "RunOptions": "io.options",
    "Segment": "output.timestamps",
    "Transcript": "output.transcript",
    "UnsupportedModelError": "io.config",
    "Word": "output.timestamps",
    "load_model": "api",
}
__all__ = [
    "AudioError",
    "CheckpointError",
    "ConfidenceMethod",
    "Model",
    "RunOptions",
    "Segment",
    "Transcript",
    "UnsupportedModelError",
    "Word",
    "load_model",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
