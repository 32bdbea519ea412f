"""Audio in: any file soundfile reads (WAV, FLAC, OGG, MP3), else FFmpeg through PyAV (M4A, MP4, WebM, MKV, ... and
the audio track of a video), or standard input; any channels and rate -> mono float32 at the model's rate.

Reading is safe from several threads at once (the pipeline's readers): libsndfile, FFmpeg and torch release the GIL.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import soundfile as sf

from graphscribe.io.config import MAX_AUDIO_SECONDS

if TYPE_CHECKING:
    import torch  # imported where samples are made: `transcribe --devices` finds its files and starts its workers
    # before this process imports torch (~2 s), so the workers' own imports do not wait for it

# libsndfile trims a chunk that claims more bytes than the file holds, and notes it in its log.
_TRUNCATED_CHUNK = re.compile(r"^\s*data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
_STREAMED_SIZES = (0, 0xFFFFFFFF, 0x7FFFFFFF)  # sizes written by streaming tools that never seek back: valid files
SNDFILE_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".w64", ".caf")
# read by FFmpeg: audio, and video whose audio track is transcribed
FFMPEG_SUFFIXES = (
    ".m4a", ".m4b", ".aac", ".wma", ".mka", ".ac3", ".amr", ".3gp",
    ".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".wmv", ".flv", ".mpg", ".mpeg", ".ts",
)  # fmt: skip
AUDIO_SUFFIXES = SNDFILE_SUFFIXES + FFMPEG_SUFFIXES  # what folders are searched for
STDIN = "-"  # the input name that reads standard input
URL_SCHEMES = ("http", "https", "ftp", "ftps", "s3", "gs", "rtsp", "rtmp")  # not read: `url_of` names them
MAX_STDIN_BYTES = 2 << 30  # standard input is held in memory whole: ~3.5 h of 48 kHz stereo 16-bit WAV
SF_UNKNOWN_FRAMES = 2**63 - 1  # libsndfile's frame count where the header gives none (a FLAC written to a pipe)
READ_BLOCK_FRAMES = 1 << 18  # frames a read of several channels: averaged a block at a time, memory holds mono
# libsndfile errors that say nothing true about a file that exists: SFE_BAD_OPEN_FORMAT, SFE_BAD_FILE ("does not
# exist or is not a regular file (possibly a pipe?)", for an .mp3 of random bytes), SFE_INTERNAL (a corrupt mp3)
_UNHELPFUL_CODES = (1, 7, 29)
NOT_AUDIO = "unknown format or corrupt data"
# An array's channels are its shorter axis, up to this many: (C, L) as torchaudio.load gives, (L, C) as soundfile's
# read; a 2-D array whose shorter axis is longer is refused, not guessed at (7.1 surround is 8).
MAX_CHANNELS = 8


class AudioError(ValueError):
    """A file that cannot be transcribed; the message names the file and the problem."""


def load_audio(path: str | os.PathLike, sample_rate: int, max_seconds: float = MAX_AUDIO_SECONDS) -> torch.Tensor:
    """Read `path` as (L,) float32 mono at `sample_rate`; channels are averaged. `-` (STDIN) reads standard input.

    libsndfile reads what it can (WAV, FLAC, OGG, MP3); anything else goes to FFmpeg (PyAV), whose audio track is
    decoded. A file of over `max_seconds` is refused (AudioError), from its header where that gives the length."""
    if str(path) == STDIN:
        return decode_audio(_read_stdin(), STDIN, sample_rate, max_seconds)
    url = url_of(path)
    if url is not None:
        raise AudioError(f"{url}: URLs are not read; download the file first (or: curl -sL URL | transcribe -)")
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise AudioError(f"{path}: a broken symbolic link (to {os.readlink(path)}, which does not exist)")
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: is a folder, not an audio file")
    if not path.is_file():
        raise AudioError(f"{path}: not a regular file")  # a pipe would block the reader
    return decode_audio(path, str(path), sample_rate, max_seconds)


def decode_audio(
    source: Path | bytes, name: str, sample_rate: int, max_seconds: float = MAX_AUDIO_SECONDS
) -> torch.Tensor:
    """A file or its bytes -> (L,) float32 mono at `sample_rate`: libsndfile, else FFmpeg (also where libsndfile
    cannot tell the length). Errors name `name`; over `max_seconds` of audio is one."""
    try:
        data, rate = _read_sndfile(source, name, max_seconds)
    except sf.LibsndfileError as err:  # a format libsndfile does not know, or a broken file: FFmpeg's turn
        data, rate = _read_ffmpeg(source, name, _reason(err), max_seconds)
    except _UnknownLength:  # FFmpeg decodes it frame by frame, counting
        data, rate = _read_ffmpeg(source, name, NOT_AUDIO, max_seconds)
    return prepare_audio(data, rate, sample_rate, name=name)


class _UnknownLength(Exception):
    """libsndfile cannot tell how long the file is (nor read it: it seeks by the length)."""


def _read_sndfile(source: Path | bytes, name: str, max_seconds: float) -> tuple[np.ndarray, int]:
    """(L,) float32 mono samples and their rate, through libsndfile; LibsndfileError where it cannot read them,
    _UnknownLength where its header gives no length. The header's length is checked against `max_seconds` before
    anything is decoded."""
    try:
        with NATIVE_STDERR.quiet(), sf.SoundFile(_opened(source)) as f:
            _check_truncation(f.extra_info, name)
            if f.frames == SF_UNKNOWN_FRAMES:
                raise _UnknownLength
            if f.frames > max_seconds * f.samplerate:
                raise AudioError(f"{name}: {_too_long(max_seconds, f.frames / f.samplerate)}")
            return _read_mono(f), f.samplerate
    except (sf.LibsndfileError, AudioError, _UnknownLength):
        raise
    except (RuntimeError, TypeError, ValueError) as err:
        raise AudioError(f"{name}: not a readable audio file ({_first_line(err)})") from None
    except OSError as err:
        raise AudioError(f"{name}: cannot be read ({_first_line(err)})") from None


def _check_truncation(header_log: str, name: str) -> None:
    """AudioError where libsndfile trimmed a data chunk that claims more bytes than the file holds."""
    truncated = _TRUNCATED_CHUNK.search(header_log)
    if (
        truncated
        and int(truncated.group(1)) not in _STREAMED_SIZES
        and int(truncated.group(1)) > int(truncated.group(2))
    ):
        raise AudioError(
            f"{name}: truncated (the header promises {truncated.group(1)} bytes of audio, "
            f"the file holds {truncated.group(2)})"
        )


def _read_mono(f: sf.SoundFile) -> np.ndarray:
    """An open file's f.frames samples as (L,) float32 mono (integer PCM scaled to [-1, 1)): one channel in one
    read, several averaged a block at a time, as `prepare_audio` averages (L, C) arrays (the same numbers)."""
    if f.channels == 1:
        return f.read(f.frames, dtype="float32")  # (L,)
    import torch

    mono = np.empty(f.frames, dtype=np.float32)  # (L,)
    done = 0
    for block in f.blocks(READ_BLOCK_FRAMES, dtype="float32", always_2d=True, frames=f.frames):  # (N, C)
        mono[done : done + len(block)] = torch.from_numpy(block).mean(dim=1).numpy()
        done += len(block)
    return mono[:done]


def _read_ffmpeg(source: Path | bytes, name: str, sndfile_reason: str, max_seconds: float) -> tuple[np.ndarray, int]:
    """(L,) float32 mono samples of the main audio track and their rate, through FFmpeg; `sndfile_reason` is the
    error for what FFmpeg cannot open either (libsndfile's words, as before FFmpeg was tried). Over `max_seconds`:
    refused from the container's duration where it has one, else once decoding passes it."""
    import av  # here: its import takes ~0.2 s that WAV, FLAC and MP3 never need

    with NATIVE_STDERR.quiet():
        unreadable = AudioError(f"{name}: not a readable audio file ({sndfile_reason})")
        try:
            container = av.open(_opened(source), metadata_errors="ignore")
        except av.FFmpegError:
            raise unreadable from None
        try:
            with container:
                if container.streams and not container.streams.audio:  # a video, or subtitles alone
                    raise AudioError(f"{name}: no audio track")
                # None where no audio track has a sample rate: what FFmpeg guessed from the name alone (random
                # bytes called .flac) or a container whose index is lost
                stream = container.streams.best("audio")
                if stream is None:
                    raise unreadable
                seconds = _ffmpeg_seconds(container, stream)
                if seconds is not None and seconds > max_seconds:
                    raise AudioError(f"{name}: {_too_long(max_seconds, seconds)}")
                return _decode_track(container, stream, name, max_seconds)
        except av.FFmpegError as err:
            reason = (err.strerror or _first_line(err)).rstrip(".")
            raise AudioError(f"{name}: not a readable audio file (corrupt data: {reason})") from None


def _ffmpeg_seconds(container, stream) -> float | None:
    """The length a container or its audio track declares, in seconds; None where neither does (a live stream)."""
    import av

    if container.duration is not None:
        return container.duration / av.time_base
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return None


def _decode_track(container, stream, name: str, max_seconds: float) -> tuple[np.ndarray, int]:
    """Decode `stream` frame by frame into mono chunks, joined once at the end (no regrowing buffer); AudioError
    once they pass `max_seconds`."""
    chunks: list[np.ndarray] = []
    rate, total = None, 0
    for packet in container.demux(stream):  # the other tracks' packets are read past, not decoded
        for frame in packet.decode():
            rate = rate or frame.sample_rate
            if frame.sample_rate != rate:
                raise AudioError(f"{name}: the sample rate changes from {rate} to {frame.sample_rate} Hz mid-track")
            chunks.append(_mono(frame))
            total += len(chunks[-1])
            if total > max_seconds * rate:
                raise AudioError(f"{name}: {_too_long(max_seconds)}")
    if not chunks:
        raise AudioError(f"{name}: has no samples")
    return np.concatenate(chunks), rate


def _mono(frame) -> np.ndarray:
    """One decoded frame -> (N,) float32 mono, integer samples scaled to [-1, 1) as libsndfile scales them."""
    x = frame.to_ndarray()  # planar: (C, N); packed: (1, N * C), interleaved
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:
        x = x.reshape(-1, channels).T
    if x.dtype == np.uint8:
        x = (x.astype(np.float32) - 128) / 128
    elif np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / (np.iinfo(x.dtype).max + 1.0)
    else:
        x = x.astype(np.float32, copy=False)
    return x[0] if channels == 1 else x.mean(axis=0)  # as prepare_audio averages channels


def _too_long(limit: float, seconds: float | None = None) -> str:
    """Why a file is refused: its length where known (its header's), else that it passed `limit` seconds."""
    if seconds is None:
        return f"over {_duration(limit)} of audio, the most one file may hold (--max-audio-hours); split it"
    return f"{_duration(seconds)} of audio, over the {_duration(limit)} one file may hold (--max-audio-hours); split it"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.3g} s"


def _opened(source: Path | bytes) -> str | io.BytesIO:
    """What libsndfile and PyAV open: a path, or a fresh file object over the bytes (each reader seeks its own)."""
    return io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else str(source)


def _read_stdin() -> bytes:
    """Standard input, whole, up to MAX_STDIN_BYTES."""
    chunks, size = [], 0
    while chunk := sys.stdin.buffer.read(1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_STDIN_BYTES:
            raise AudioError(f"{STDIN}: standard input holds over {MAX_STDIN_BYTES:,} bytes; save it to a file")
    if not chunks:
        raise AudioError(f"{STDIN}: standard input is empty")
    return b"".join(chunks)


def prepare_audio(data, rate: int, sample_rate: int, name: str = "<array>") -> torch.Tensor:
    """Samples (L,), (L, C) or (C, L) at `rate` -> (L',) float32 mono at `sample_rate`, checked for bad values.
    Channels (the shorter axis, MAX_CHANNELS at most) are averaged."""
    import torch

    samples = torch.as_tensor(np.asarray(data, dtype=np.float32))
    if samples.ndim == 2:
        axis = 0 if samples.shape[0] < samples.shape[1] else 1  # (C, L), as torchaudio.load gives; or (L, C)
        if samples.shape[axis] > MAX_CHANNELS:
            raise AudioError(
                f"{name}: audio must be (samples,), (samples, channels) or (channels, samples) with at most "
                f"{MAX_CHANNELS} channels, got shape {tuple(samples.shape)}"
            )
        # one channel: itself (its mean is the same numbers, at a cost)
        samples = samples.select(axis, 0) if samples.shape[axis] == 1 else samples.mean(dim=axis)
    elif samples.ndim != 1:
        raise AudioError(
            f"{name}: audio must be (samples,), (samples, channels) or (channels, samples), "
            f"got shape {tuple(samples.shape)}"
        )
    if samples.numel() == 0:
        raise AudioError(f"{name}: has no samples")
    if not np.isfinite(samples.numpy()).all():  # NumPy's check: ~100x faster than torch's on the CPU
        raise AudioError(f"{name}: contains NaN or infinite samples")
    if rate != sample_rate:
        import torchaudio.functional as AF  # here: its import takes ~0.2 s that inputs at the model's rate never need

        samples = AF.resample(samples, int(rate), sample_rate)
    return samples.contiguous()


def read_input(item, sample_rate: int, max_seconds: float = MAX_AUDIO_SECONDS) -> torch.Tensor:
    """A path, or samples already at `sample_rate` -> (L,) float32 mono at `sample_rate`; AudioError for bad input
    (a file of over `max_seconds` among them).

    Any length from one sample on: as in NeMo, a clip shorter than one feature frame (10 ms) has no encoder
    frames and an empty transcript, one shorter than 80 ms has one encoder frame."""
    if isinstance(item, (str, os.PathLike)):
        return load_audio(item, sample_rate, max_seconds)
    import torch

    return prepare_audio(item.cpu().numpy() if isinstance(item, torch.Tensor) else item, sample_rate, sample_rate)


def url_of(path: str | os.PathLike) -> str | None:
    """The URL `path` was given as, or None. A Path made of "https://host/a.wav" reads "https:/host/a.wav": the
    slashes after the scheme are put back."""
    scheme, colon, rest = os.fspath(path).partition(":")
    if not colon or scheme.lower() not in URL_SCHEMES or not (rest == "" or rest.startswith("/")):
        return None
    return f"{scheme}://{rest.lstrip('/')}"


def audio_seconds(path: str | os.PathLike) -> float | None:
    """A file's length from its header (cheap), or None when it cannot be inspected (reading it says why) or the
    header does not say."""
    if str(path) == STDIN or not Path(path).is_file():  # a pipe would block
        return None
    try:
        with NATIVE_STDERR.quiet(), sf.SoundFile(str(path)) as f:
            return None if f.frames == SF_UNKNOWN_FRAMES else f.frames / f.samplerate
    except (sf.LibsndfileError, RuntimeError, OSError, TypeError, ValueError):
        pass
    import av

    try:
        with NATIVE_STDERR.quiet(), av.open(str(path), metadata_errors="ignore") as container:
            stream = container.streams.best("audio")
            return None if stream is None else _ffmpeg_seconds(container, stream)
    except av.FFmpegError:
        return None


def length_problem(path: str | os.PathLike, max_seconds: float) -> str | None:
    """The error line of a file whose header says it holds over `max_seconds` of audio (the reader's own), else
    None: also where the header does not say, and reading the file checks it again."""
    seconds = audio_seconds(path)
    if seconds is None or seconds <= max_seconds:
        return None
    return f"{path}: {_too_long(max_seconds, seconds)}"


def find_audio_files(folder: str | os.PathLike) -> list[Path]:
    """Audio files under `folder`, recursively, in sorted order."""
    return [p for p in scan_folder(folder)[0] if p.is_file()]


def scan_folder(folder: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """What a folder job reads under `folder`, recursively, in sorted order: audio files, and broken symbolic links
    with audio names (reading one says so); and, apart, what has an audio name but is no file and no folder (a
    named pipe, a socket, a device): never read, as a pipe would block."""
    files, others = [], []
    for path in sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES):
        if path.is_file() or (path.is_symlink() and not path.exists()):
            files.append(path)
        elif not path.is_dir():
            others.append(path)
    return files, others


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


def read_bytes(
    data: bytes, sample_rate: int, name: str = "<bytes>", max_seconds: float = MAX_AUDIO_SECONDS
) -> torch.Tensor:
    """An audio file's bytes (an upload: any format libsndfile or FFmpeg reads) -> (L,) float32 mono at
    `sample_rate`; AudioError naming `name` and the problem (over `max_seconds` of audio is one). Nothing touches
    the disk."""
    if not data:
        raise AudioError(f"{name}: empty file")
    return decode_audio(data, name, sample_rate, max_seconds)


def speech_path(name: str) -> Path:
    """A recording of real speech shipped in the package (`graphscribe/data`): warm-ups and benchmarks read it."""
    return Path(str(resources.files("graphscribe") / "data" / name))
