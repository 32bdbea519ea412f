"""The server's counters in Prometheus' text format (version 0.0.4), written by hand: no client library needed.

graphscribe_requests_total{path,status}    counter    requests answered
graphscribe_audio_seconds_total            counter    seconds of audio transcribed
graphscribe_queue_depth                    gauge      requests admitted and not answered
graphscribe_batch_rows                     histogram  requests per batch
graphscribe_padded_seconds_total           counter    seconds of audio run through the model, padding included
graphscribe_request_seconds                histogram  time from the request's headers to its answer
graphscribe_graph_capture_seconds_total    counter    time spent capturing CUDA graphs (new batch shapes)
graphscribe_realtime_sessions              gauge      realtime WebSocket sessions open
graphscribe_live_step_rows                 histogram  live streams (realtime turns, stream=true uploads) per step
graphscribe_live_step_seconds_total        counter    the batching thread's time in live steps (operations included)
graphscribe_device_*{device}                           with --devices: each device's engine (engines.DEVICE_METRICS)
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from typing import Callable

BATCH_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # histogram buckets: the decoder's size classes
LATENCY_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Cumulative buckets (upper bounds `le`), a sum and a count; safe to observe from several threads."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += 1
            self._sum += value

    def lines(self, name: str) -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        lines, running = [], 0
        for bound, count in zip([*map(_number, self.bounds), "+Inf"], counts):
            running += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        return [*lines, f"{name}_sum {_number(total)}", f"{name}_count {running}"]


class Metrics:
    """What /metrics reports. `queue_depth` is read when the text is made."""

    def __init__(self, queue_depth: Callable[[], int], sessions: Callable[[], int] = lambda: 0):
        self.queue_depth, self.sessions = queue_depth, sessions
        self.capture_seconds: Callable[[], float] = lambda: 0.0  # the model's, once it is loaded
        self.device_lines: Callable[[], list[str]] = lambda: []  # with --devices: each device's (engines.py)
        self.requests: Counter[tuple[str, int]] = Counter()  # (path, status) -> answered
        self.audio_seconds = 0.0
        self.padded_seconds = 0.0
        self.batch_rows = Histogram(BATCH_ROWS)
        self.latency = Histogram(LATENCY_SECONDS)
        self.live_rows = Histogram(BATCH_ROWS)
        self.live_seconds = 0.0
        self._lock = threading.Lock()

    def live_step(self, rows: int, seconds: float) -> None:
        """A live step: the streams it stepped (0: operations only) and the batching thread's seconds in it."""
        if rows:
            self.live_rows.observe(rows)
        with self._lock:
            self.live_seconds += seconds

    def answered(self, path: str, status: int, seconds: float, audio_seconds: float = 0.0) -> None:
        with self._lock:
            self.requests[(path, status)] += 1
            self.audio_seconds += audio_seconds
        self.latency.observe(seconds)

    def batch(self, rows: int, padded_seconds: float) -> None:
        """A batch formed: its requests, and its padded seconds (rows x the longest one's, rounded up)."""
        self.batch_rows.observe(rows)
        with self._lock:
            self.padded_seconds += padded_seconds

    def text(self) -> str:
        with self._lock:
            requests, audio, padded = sorted(self.requests.items()), self.audio_seconds, self.padded_seconds
            live_seconds = self.live_seconds
        lines = [
            "# HELP graphscribe_requests_total Requests answered, by path and HTTP status.",
            "# TYPE graphscribe_requests_total counter",
            *(f'graphscribe_requests_total{{path="{p}",status="{s}"}} {n}' for (p, s), n in requests),
            "# HELP graphscribe_audio_seconds_total Seconds of audio transcribed.",
            "# TYPE graphscribe_audio_seconds_total counter",
            f"graphscribe_audio_seconds_total {_number(audio)}",
            "# HELP graphscribe_padded_seconds_total Seconds of audio run through the model, padding included.",
            "# TYPE graphscribe_padded_seconds_total counter",
            f"graphscribe_padded_seconds_total {_number(padded)}",
            "# HELP graphscribe_queue_depth Transcription requests admitted and not yet answered.",
            "# TYPE graphscribe_queue_depth gauge",
            f"graphscribe_queue_depth {self.queue_depth()}",
            "# HELP graphscribe_batch_rows Requests per batch run through the model.",
            "# TYPE graphscribe_batch_rows histogram",
            *self.batch_rows.lines("graphscribe_batch_rows"),
            "# HELP graphscribe_request_seconds Seconds from a request's headers to its answer.",
            "# TYPE graphscribe_request_seconds histogram",
            *self.latency.lines("graphscribe_request_seconds"),
            "# HELP graphscribe_graph_capture_seconds_total Seconds spent capturing CUDA graphs for new batch shapes.",
            "# TYPE graphscribe_graph_capture_seconds_total counter",
            f"graphscribe_graph_capture_seconds_total {_number(self.capture_seconds())}",
            "# HELP graphscribe_realtime_sessions Realtime WebSocket sessions open.",
            "# TYPE graphscribe_realtime_sessions gauge",
            f"graphscribe_realtime_sessions {self.sessions()}",
            "# HELP graphscribe_live_step_rows Live streams (realtime turns, streamed uploads) stepped together.",
            "# TYPE graphscribe_live_step_rows histogram",
            *self.live_rows.lines("graphscribe_live_step_rows"),
            "# HELP graphscribe_live_step_seconds_total Seconds the batching thread spent in live steps.",
            "# TYPE graphscribe_live_step_seconds_total counter",
            f"graphscribe_live_step_seconds_total {_number(live_seconds)}",
            *self.device_lines(),
        ]
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))
