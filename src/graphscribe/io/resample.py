"""Audio that arrives in pieces at another rate, resampled to the model's as it comes.

torchaudio's resampler is a windowed-sinc filter: an output sample depends on the input within the filter's
reach. A block of input resampled with that reach of context on both sides gives, inside the block, what the
whole signal resampled at once gives (up to float rounding), so the pieces are resampled in blocks aligned to
the rates' ratio, each with its context, and the output trails the input by one context.
"""

from __future__ import annotations

import math

import numpy as np

LOWPASS_WIDTH = 6  # torchaudio's default lowpass_filter_width
ROLLOFF = 0.99  # torchaudio's default rolloff


class StreamResampler:
    """`push(samples)` float32 at `source` Hz -> what is ready at `target` Hz; `flush()` the rest (the signal's end
    padded with zeros, as resampling it whole pads it)."""

    def __init__(self, source: int, target: int):
        if source <= 0 or target <= 0:
            raise ValueError(f"sample rates must be positive, got {source} and {target}")
        gcd = math.gcd(source, target)
        self.up, self.down = target // gcd, source // gcd  # output, input samples per period
        self.source, self.target = source, target
        reach = math.ceil(LOWPASS_WIDTH * self.down / (ROLLOFF * min(self.up, self.down))) + self.down
        self.context = -(-2 * reach // self.down) * self.down  # input samples each side, whole periods
        self.block = max(self.down, -(-source // 50 // self.down) * self.down)  # ~20 ms of input, whole periods
        self._pending = np.zeros(self.context, dtype=np.float32)  # the context before the stream: silence
        self._done = 0  # input samples (after the leading context) whose output was given
        self._kernel: tuple[np.ndarray, int] | None = None  # torchaudio's filter for these rates, as (taps, up)

    def push(self, samples: np.ndarray) -> np.ndarray:
        if self.up == self.down:
            return np.asarray(samples, dtype=np.float32)
        self._pending = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        ready = (len(self._pending) - 2 * self.context) // self.block * self.block  # input with context after it
        if ready <= 0:
            return np.zeros(0, dtype=np.float32)
        return self._resample(ready)

    def flush(self) -> np.ndarray:
        """The rest of the output: the signal's end, then zeros as context."""
        if self.up == self.down:
            return np.zeros(0, dtype=np.float32)
        rest = len(self._pending) - self.context
        if rest <= 0:
            return np.zeros(0, dtype=np.float32)
        total_in = self._done + rest
        wanted = math.ceil(self.up * total_in / self.down) - self._done * self.up // self.down
        span = -(-rest // self.down) * self.down
        self._pending = np.concatenate([self._pending, np.zeros(span - rest + self.context, dtype=np.float32)])
        return self._resample(span)[:wanted]

    def _resample(self, span: int) -> np.ndarray:
        """Output for the `span` input samples after the leading context (with the context after them)."""
        out = self._resample_piece(self._pending[: span + 2 * self.context])
        first = self.context * self.up // self.down
        result = out[first : first + span * self.up // self.down]
        self._pending = self._pending[span:]
        self._done += span
        return result

    def _resample_piece(self, x: np.ndarray) -> np.ndarray:
        """torchaudio's `resample` of `x` (its windowed-sinc filter, made once per resampler), applied as a
        polyphase product: each output period is one input window times the filter's phases. torchaudio makes the
        filter on every call and applies it with a strided convolution, 0.26-0.37 ms for a live session's 60 ms
        append against ~0.04 ms here; the two agree to float rounding (3e-8)."""
        if self._kernel is None:
            self._kernel = sinc_kernel(self.down, self.up)
        phases, width = self._kernel
        padded = np.concatenate([np.zeros(width, np.float32), x, np.zeros(width + self.down, np.float32)])
        taps = phases.shape[0]
        periods = (padded.size - taps) // self.down + 1
        step = padded.strides[0]
        windows = np.lib.stride_tricks.as_strided(padded, (periods, taps), (step * self.down, step), writeable=False)
        return np.dot(windows, phases).reshape(-1)[: math.ceil(self.up * x.size / self.down)]


def sinc_kernel(down: int, up: int) -> tuple[np.ndarray, int]:
    """torchaudio's Hann-windowed sinc filter (`_get_sinc_resample_kernel`, float32 as `resample` makes it for
    float32 audio) from `down` input to `up` output samples a period (the rates over their gcd), in NumPy, so
    that the HTTP workers that resample live sessions do not import torch: its phases as (taps, up), and its
    half width in input samples."""
    base = min(down, up) * ROLLOFF
    width = math.ceil(LOWPASS_WIDTH * down / base)
    idx = np.arange(-width, width + down, dtype=np.float32)[None, :] / np.float32(down)
    t = np.arange(0, -up, -1, dtype=np.float32)[:, None] / np.float32(up) + idx  # (up, taps)
    t = np.clip(t * np.float32(base), -LOWPASS_WIDTH, LOWPASS_WIDTH).astype(np.float32)
    window = np.cos(t * np.float32(math.pi / LOWPASS_WIDTH / 2), dtype=np.float32) ** 2
    t = t * np.float32(math.pi)
    with np.errstate(divide="ignore", invalid="ignore"):
        kernels = np.where(t == 0, np.float32(1.0), np.sin(t) / t).astype(np.float32)
    kernels = kernels * (window * np.float32(base / down))
    return np.ascontiguousarray(kernels.T, dtype=np.float32), width
