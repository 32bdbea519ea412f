"""graphscribe: NVIDIA Parakeet transducers (TDT, RNN-T) with greedy decoding replayed from CUDA graphs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .audio import AudioError
    from .checkpoint import CheckpointError
    from .config import UnsupportedModelError
    from .model import Model, Transcript, load_model
    from .timestamps import Segment, Word

# name -> module: imported on first use, so that `transcribe` imports torch only after its signal handlers are in
# place (`cli.entry`) and `transcribe --help` not at all
_EXPORTS = {
    "AudioError": "audio",
    "CheckpointError": "checkpoint",
    "Model": "model",
    "Segment": "timestamps",
    "Transcript": "model",
    "UnsupportedModelError": "config",
    "Word": "timestamps",
    "load_model": "model",
}
__all__ = [
    "AudioError",
    "CheckpointError",
    "Model",
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
