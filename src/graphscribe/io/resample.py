"""Audio that arrives in pieces at another rate, resampled to the model's as it comes.

torchaudio's resampler is a windowed-sinc filter: an output sample depends on the input within the filter's
reach. A block of input resampled with that reach of context on both sides gives, inside the block, what the
whole signal resampled at once gives (up to float rounding), so the pieces are resampled in blocks aligned to
the rates' ratio, each with its context, and the output trails the input by one context.
"""

from __future__ import annotations

import math

import numpy as np
import torch

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
        piece = torch.from_numpy(self._pending[: span + 2 * self.context])
        out = self._resample_piece(piece)
        first = self.context * self.up // self.down
        result = out[first : first + span * self.up // self.down].numpy()
        self._pending = self._pending[span:]
        self._done += span
        return result

    def _resample_piece(self, piece: torch.Tensor) -> torch.Tensor:
        """torchaudio's `resample` of `piece` (its windowed-sinc filter, made once per resampler), applied as a
        polyphase product in NumPy: each output period is one input window times the filter's phases. torchaudio
        makes the filter on every call and applies it with a strided convolution, 0.26-0.37 ms for a live
        session's 60 ms append against ~0.04 ms here; the two agree to float rounding (3e-8)."""
        try:
            from torchaudio.functional.functional import _get_sinc_resample_kernel
        except ImportError:  # another torchaudio's layout: the public call
            import torchaudio.functional as AF

            return AF.resample(piece, self.source, self.target)
        if self._kernel is None:
            gcd = math.gcd(self.source, self.target)
            kernel, width = _get_sinc_resample_kernel(
                self.source,
                self.target,
                gcd,
                LOWPASS_WIDTH,
                ROLLOFF,
                "sinc_interp_hann",
                None,
                piece.device,
                piece.dtype,
            )
            self._kernel = (np.ascontiguousarray(kernel[:, 0, :].numpy().T), width)  # (taps, up)
        phases, width = self._kernel
        x = piece.numpy()
        padded = np.concatenate([np.zeros(width, np.float32), x, np.zeros(width + self.down, np.float32)])
        taps = phases.shape[0]
        periods = (padded.size - taps) // self.down + 1
        step = padded.strides[0]
        windows = np.lib.stride_tricks.as_strided(padded, (periods, taps), (step * self.down, step), writeable=False)
        out = np.dot(windows, phases).reshape(-1)[: math.ceil(self.up * x.size / self.down)]
        return torch.from_numpy(out)
