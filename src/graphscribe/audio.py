"""Audio in: any file soundfile reads (WAV, FLAC, OGG, MP3), any channels and rate -> mono float32 at the model's rate."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

# libsndfile trims a chunk that claims more bytes than the file holds, and notes it in its log.
_TRUNCATED_CHUNK = re.compile(r"^\s*data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
_STREAMED_SIZES = (0, 0xFFFFFFFF, 0x7FFFFFFF)  # sizes written by streaming tools that never seek back: valid files
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".w64", ".caf")


class AudioError(ValueError):
    """A file that cannot be transcribed; the message names the file and the problem."""


def load_audio(path: str | os.PathLike, sample_rate: int) -> torch.Tensor:
    """Read `path` as (L,) float32 mono at `sample_rate`; channels are averaged."""
    path = Path(path)
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: is a folder, not an audio file")
    try:
        with sf.SoundFile(str(path)) as f:
            rate = f.samplerate
            data = f.read(dtype="float32", always_2d=True)  # (L, C), integer PCM scaled to [-1, 1)
            header_log = f.extra_info
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as err:
        raise AudioError(f"{path}: not a readable audio file ({_first_line(err)})") from None
    except OSError as err:
        raise AudioError(f"{path}: cannot be read ({_first_line(err)})") from None
    truncated = _TRUNCATED_CHUNK.search(header_log)
    if truncated and int(truncated.group(1)) not in _STREAMED_SIZES and int(truncated.group(1)) > int(truncated.group(2)):
        raise AudioError(f"{path}: truncated (the header promises {truncated.group(1)} bytes of audio, "
                         f"the file holds {truncated.group(2)})")
    return prepare_audio(data, rate, sample_rate, name=str(path))


def prepare_audio(data, rate: int, sample_rate: int, name: str = "<array>") -> torch.Tensor:
    """Samples (L,) or (L, C) at `rate` -> (L',) float32 mono at `sample_rate`, checked for bad values."""
    samples = torch.as_tensor(np.asarray(data, dtype=np.float32))
    if samples.ndim == 2:
        samples = samples.mean(dim=1)
    elif samples.ndim != 1:
        raise AudioError(f"{name}: audio must be (samples,) or (samples, channels), got shape {tuple(samples.shape)}")
    if samples.numel() == 0:
        raise AudioError(f"{name}: has no samples")
    if not torch.isfinite(samples).all():
        raise AudioError(f"{name}: contains NaN or infinite samples")
    if rate != sample_rate:
        samples = AF.resample(samples, int(rate), sample_rate)
    return samples.contiguous()


def find_audio_files(folder: str | os.PathLike) -> list[Path]:
    """Audio files under `folder`, recursively, in sorted order."""
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
