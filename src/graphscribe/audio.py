"""Audio in: any file soundfile reads (WAV, FLAC, OGG, MP3), any channels and rate -> mono float32 at the model's rate.

Reading is safe from several threads at once (the pipeline's readers): libsndfile and torch release the GIL.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import threading
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

# libsndfile trims a chunk that claims more bytes than the file holds, and notes it in its log.
_TRUNCATED_CHUNK = re.compile(r"^\s*data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
_STREAMED_SIZES = (0, 0xFFFFFFFF, 0x7FFFFFFF)  # sizes written by streaming tools that never seek back: valid files
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".w64", ".caf")
# libsndfile errors that say nothing true about a file that exists: SFE_BAD_OPEN_FORMAT, SFE_BAD_FILE ("does not
# exist or is not a regular file (possibly a pipe?)", for an .mp3 of random bytes), SFE_INTERNAL (a corrupt mp3)
_UNHELPFUL_CODES = (1, 7, 29)
NOT_AUDIO = "unknown format or corrupt data"


class AudioError(ValueError):
    """A file that cannot be transcribed; the message names the file and the problem."""


def load_audio(path: str | os.PathLike, sample_rate: int) -> torch.Tensor:
    """Read `path` as (L,) float32 mono at `sample_rate`; channels are averaged."""
    path = Path(path)
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: is a folder, not an audio file")
    if not path.is_file():
        raise AudioError(f"{path}: not a regular file")  # a pipe would block the reader
    try:
        with NATIVE_STDERR.quiet(), sf.SoundFile(str(path)) as f:
            rate = f.samplerate
            data = f.read(dtype="float32", always_2d=True)  # (L, C), integer PCM scaled to [-1, 1)
            header_log = f.extra_info
    except sf.LibsndfileError as err:
        raise AudioError(f"{path}: not a readable audio file ({_reason(err)})") from None
    except (RuntimeError, TypeError, ValueError) as err:
        raise AudioError(f"{path}: not a readable audio file ({_first_line(err)})") from None
    except OSError as err:
        raise AudioError(f"{path}: cannot be read ({_first_line(err)})") from None
    truncated = _TRUNCATED_CHUNK.search(header_log)
    if (
        truncated
        and int(truncated.group(1)) not in _STREAMED_SIZES
        and int(truncated.group(1)) > int(truncated.group(2))
    ):
        raise AudioError(
            f"{path}: truncated (the header promises {truncated.group(1)} bytes of audio, "
            f"the file holds {truncated.group(2)})"
        )
    return prepare_audio(data, rate, sample_rate, name=str(path))


def prepare_audio(data, rate: int, sample_rate: int, name: str = "<array>") -> torch.Tensor:
    """Samples (L,) or (L, C) at `rate` -> (L',) float32 mono at `sample_rate`, checked for bad values."""
    samples = torch.as_tensor(np.asarray(data, dtype=np.float32))
    if samples.ndim == 2:  # one channel: itself (its mean is the same numbers, at a cost)
        samples = samples[:, 0] if samples.shape[1] == 1 else samples.mean(dim=1)
    elif samples.ndim != 1:
        raise AudioError(f"{name}: audio must be (samples,) or (samples, channels), got shape {tuple(samples.shape)}")
    if samples.numel() == 0:
        raise AudioError(f"{name}: has no samples")
    if not np.isfinite(samples.numpy()).all():  # NumPy's check: ~100x faster than torch's on the CPU
        raise AudioError(f"{name}: contains NaN or infinite samples")
    if rate != sample_rate:
        import torchaudio.functional as AF  # here: its import takes ~0.2 s that inputs at the model's rate never need

        samples = AF.resample(samples, int(rate), sample_rate)
    return samples.contiguous()


def read_input(item, sample_rate: int) -> torch.Tensor:
    """A path, or samples already at `sample_rate` -> (L,) float32 mono at `sample_rate`; AudioError for bad input.

    Any length from one sample on: as in NeMo, a clip shorter than one feature frame (10 ms) has no encoder
    frames and an empty transcript, one shorter than 80 ms has one encoder frame."""
    if isinstance(item, (str, os.PathLike)):
        return load_audio(item, sample_rate)
    return prepare_audio(item.cpu().numpy() if isinstance(item, torch.Tensor) else item, sample_rate, sample_rate)


def audio_seconds(path: str | os.PathLike) -> float | None:
    """A file's length from its header (cheap), or None when it cannot be inspected (reading it says why)."""
    if not Path(path).is_file():  # a pipe would block
        return None
    try:
        with NATIVE_STDERR.quiet():
            return sf.info(str(path)).duration
    except (sf.LibsndfileError, RuntimeError, OSError, TypeError, ValueError):
        return None


def find_audio_files(folder: str | os.PathLike) -> list[Path]:
    """Audio files under `folder`, recursively, in sorted order."""
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)


def _reason(err: sf.LibsndfileError) -> str:
    """libsndfile's complaint without its "Error opening 'PATH': " prefix, or a plain one where it misleads."""
    detail = _first_line(err).split("': ", 1)[-1].strip()
    if err.code in _UNHELPFUL_CODES or "unknown error" in detail.lower() or not detail:
        return NOT_AUDIO
    return detail.rstrip(".")


class NativeStderr:
    """Keeps native libraries' chatter off stderr while files are read.

    libmpg123 prints "Note: Illegal Audio-MPEG-Header ..." and the like on file descriptor 2 for odd mp3s, and
    libsndfile offers no way to pass it MPG123_QUIET. Once `installed` (the CLI does it; a library must not hide
    its host's stderr), fd 2 points to /dev/null while any reader is inside `quiet()`, and Python's own stderr
    writes (sys.stderr, so our error lines, logging and tracebacks) wait until it points back: readers share the
    silence, a waiting writer lets no new reader in, so a line waits at most one file read.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0  # threads inside quiet()
        self._writers = 0  # threads writing, or waiting to
        self._saved_fd: int | None = None  # the real fd 2 while silenced
        self._local = threading.local()  # whether this thread is inside quiet()
        self._installed = False

    @contextlib.contextmanager
    def quiet(self):
        """Silence fd 2 around native calls (no-op unless installed)."""
        if not self._installed or getattr(self._local, "inside", False):
            yield
            return
        with self._cond:
            while self._writers:
                self._cond.wait()
            if self._readers == 0:
                sys.__stderr__.flush()
                self._saved_fd = os.dup(2)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                os.close(devnull)
            self._readers += 1
        self._local.inside = True
        try:
            yield
        finally:
            self._local.inside = False
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    os.dup2(self._saved_fd, 2)
                    os.close(self._saved_fd)
                    self._saved_fd = None
                    self._cond.notify_all()

    @contextlib.contextmanager
    def loud(self):
        """Wait until fd 2 is the real stderr again, and keep it so while writing."""
        if getattr(self._local, "inside", False):  # a write from inside a read (a warning): it is lost, not deadlocked
            yield
            return
        with self._cond:
            self._writers += 1
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._writers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def installed(self):
        """Route sys.stderr through `loud` and silence fd 2 during reads, for the duration of the block."""
        stream = sys.stderr
        sys.stderr = _GatedStream(stream, self)
        self._installed = True
        try:
            yield
        finally:
            self._installed = False
            sys.stderr = stream


class _GatedStream:
    """sys.stderr, each write and flush made while fd 2 is the real stderr."""

    def __init__(self, stream, gate: NativeStderr):
        self._stream, self._gate = stream, gate

    def write(self, text: str) -> int:
        with self._gate.loud():
            written = self._stream.write(text)
            self._stream.flush()
        return written

    def flush(self) -> None:
        with self._gate.loud():
            self._stream.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding, ...
        return getattr(self._stream, name)


NATIVE_STDERR = NativeStderr()


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_bytes(data: bytes, sample_rate: int, name: str = "<bytes>") -> torch.Tensor:
    """An audio file's bytes (an upload; any format soundfile reads) -> (L,) float32 mono at `sample_rate`;
    AudioError naming `name` and the problem. Nothing touches the disk."""
    if not data:
        raise AudioError(f"{name}: empty file")
    try:
        with NATIVE_STDERR.quiet(), sf.SoundFile(io.BytesIO(data)) as f:
            rate = f.samplerate
            samples = f.read(dtype="float32", always_2d=True)  # (L, C)
    except sf.LibsndfileError as err:
        raise AudioError(f"{name}: not a readable audio file ({_reason(err)})") from None
    except (RuntimeError, TypeError, ValueError) as err:
        raise AudioError(f"{name}: not a readable audio file ({_first_line(err)})") from None
    return prepare_audio(samples, rate, sample_rate, name=name)
