"""Audio and video files in FFmpeg's containers, written by PyAV from samples: the inputs libsndfile cannot read."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

FRAME = 1024  # samples handed to the encoder at a time
FPS = 10  # video frames per second: a few small frames are enough to make a real video track


def write_media(
    path: Path,
    samples: np.ndarray | None,
    rate: int,
    codec: str | None,
    codec_rate: int | None = None,
    layout: str = "mono",
    video: str | None = None,
    seconds: float | None = None,
    live_format: str | None = None,
) -> Path:
    """Write (L,) float32 `samples` at `rate` to `path` as `codec` at `codec_rate` Hz in `layout`, beside a `video`
    track of 64x64 frames (codec name) if given; samples None: video only, `seconds` long. live_format: written
    in that format as a live stream (no seeking back), so its header holds no duration."""
    seconds = len(samples) / rate if samples is not None else seconds
    target = _Unseekable(path) if live_format else str(path)
    with av.open(target, "w", format=live_format) as container:
        picture = container.add_stream(video, rate=FPS) if video else None
        if picture is not None:
            picture.width, picture.height, picture.pix_fmt = 64, 64, "yuv420p"
        if samples is not None:
            sound = container.add_stream(codec, rate=codec_rate or rate, layout=layout)
            convert = av.AudioResampler(format=sound.format, layout=sound.layout, rate=codec_rate or rate)
            for start in range(0, len(samples), FRAME):
                frame = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(samples[None, start : start + FRAME], dtype=np.float32),
                    format="flt",
                    layout="mono",
                )
                frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
                for converted in convert.resample(frame):
                    container.mux(sound.encode(converted))
            for converted in convert.resample(None):
                container.mux(sound.encode(converted))
            container.mux(sound.encode(None))
        if picture is not None:
            for k in range(max(1, int(seconds * FPS))):
                image = np.full((64, 64, 3), 4 * k % 256, np.uint8)
                container.mux(picture.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
            container.mux(picture.encode(None))
    if live_format:
        target.close()
    return path


class _Unseekable(io.RawIOBase):
    """A file that can only be appended to, as a pipe or a live stream."""

    def __init__(self, path: Path):
        self._raw = open(path, "wb")  # closed with this object

    def close(self) -> None:
        self._raw.close()
        super().close()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data) -> int:
        return self._raw.write(data)
