"""Voice activity for the realtime sessions' `server_vad`: Silero VAD (its ONNX model, from the `silero-vad` package,
run by onnxruntime), every session's next window in one call.

Silero's model takes windows of 512 samples at 16 kHz (32 ms), each with the 64 samples before it, and carries an
LSTM state from window to window; it says how likely the window is speech. A turn starts at the first window at or
above `threshold` and ends once the windows have stayed below `threshold - 0.15` for `silence_ms` (Silero's own
`VADIterator` rule, with OpenAI's names for the settings).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

import numpy as np

RATE = 16000
WINDOW = 512  # samples a window at 16 kHz
CONTEXT = 64  # samples before each window the model also takes
STATE = (2, 128)  # the LSTM state of a session: (2, B, 128) for a batch
NEGATIVE_MARGIN = 0.15  # below threshold - this, a window is silence (Silero's neg_threshold)
MODEL_FILE = "silero_vad_16k_op15.onnx"


class VadMissing(RuntimeError):
    """The VAD's packages are not installed."""


def model_path() -> str:
    """Silero's 16 kHz ONNX model, found in the `silero-vad` package without importing it (it imports torchaudio)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise VadMissing("server_vad needs silero-vad and onnxruntime: pip install 'graphscribe[serve]'")
    return os.path.join(spec.submodule_search_locations[0], "data", MODEL_FILE)


class Silero:
    """Silero's model, one inference session for a worker; `probabilities` runs a batch of windows."""

    def __init__(self, threads: int = 1):
        try:
            import onnxruntime
        except ImportError:
            raise VadMissing("server_vad needs onnxruntime: pip install 'graphscribe[serve]'") from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(model_path(), options, providers=["CPUExecutionProvider"])
        self._rate = np.array(RATE, dtype=np.int64)

    def probabilities(self, windows: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, CONTEXT + WINDOW) float32 windows and (2, B, 128) states -> (B,) speech probabilities, new states."""
        out, state = self.session.run(None, {"input": windows, "state": states, "sr": self._rate})
        return out[:, 0], state


@dataclass(eq=False)
class Detector:
    """One session's voice activity: the model's state, the samples not yet judged, and where speech is. Positions
    are samples since the session's first audio."""

    threshold: float = 0.5
    silence_ms: int = 500
    state: np.ndarray = field(default_factory=lambda: np.zeros(STATE, dtype=np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, dtype=np.float32))
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    judged: int = 0  # samples judged so far
    speaking: bool = False
    quiet_since: int | None = None  # where the silence after speech began

    def push(self, samples: np.ndarray) -> None:
        self.pending = np.concatenate([self.pending, samples]) if self.pending.size else samples

    @property
    def has_window(self) -> bool:
        return self.pending.size >= WINDOW

    def next_window(self) -> np.ndarray:
        """The next window with its context (the model's input row); the state advances with `judge`."""
        window = self.pending[:WINDOW]
        return np.concatenate([self.context, window])

    def judge(self, probability: float, state: np.ndarray) -> tuple[str, int] | None:
        """The model's word on the next window -> ("start", sample) where speech starts, ("stop", sample) where a
        turn's silence has lasted long enough (the sample where the silence ran out), or None."""
        window = self.pending[:WINDOW]
        self.pending = self.pending[WINDOW:]
        self.context = window[-CONTEXT:].copy()
        self.state = state
        start = self.judged
        self.judged += WINDOW
        if probability >= self.threshold:
            self.quiet_since = None
            if not self.speaking:
                self.speaking = True
                return "start", start
            return None
        if self.speaking and probability < max(self.threshold - NEGATIVE_MARGIN, 0.01):
            if self.quiet_since is None:  # from the end of the first quiet window, as Silero's VADIterator counts
                self.quiet_since = self.judged
            if self.judged - self.quiet_since >= self.silence_ms * RATE // 1000:
                self.speaking, self.quiet_since = False, None
                return "stop", self.judged
        return None


def judge_all(model: Silero, detectors: list[Detector]) -> list[tuple[Detector, tuple[str, int]]]:
    """Every detector's windows judged, one window of each per call, until none has a whole window; the turns'
    starts and stops, in order."""
    said = []
    while True:
        ready = [d for d in detectors if d.has_window]
        if not ready:
            return said
        windows = np.stack([d.next_window() for d in ready])
        states = np.ascontiguousarray(np.stack([d.state for d in ready], axis=1))
        probabilities, new_states = model.probabilities(windows, states)
        for i, d in enumerate(ready):
            change = d.judge(float(probabilities[i]), np.ascontiguousarray(new_states[:, i]))
            if change is not None:
                said.append((d, change))
