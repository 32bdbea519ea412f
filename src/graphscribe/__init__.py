"""graphscribe: NVIDIA Parakeet transducers (TDT, RNN-T) with greedy decoding replayed from CUDA graphs."""

from .audio import AudioError
from .checkpoint import CheckpointError
from .config import UnsupportedModelError
from .model import Model, Transcript, load_model
from .timestamps import Segment, Word

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
