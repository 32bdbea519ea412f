"""StageClock: seconds per stage of a run (host time, or GPU time between CUDA events), for the benchmark and loading."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    pass


class StageClock:
    """Seconds spent per stage of the pipeline.

    GPU stages (features, encoder, decode) are timed with CUDA events recorded around them: no
    synchronisation while running; they are read in `seconds()`. Host stages (read: summed over the reader
    threads; wait: the main thread waiting for a batch to be read; text; write) with perf_counter. On the
    CPU everything runs synchronously, so perf_counter times every stage. A disabled clock does nothing.
    """

    def __init__(self, device: torch.device, enabled: bool = True):
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self._seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def gpu(self, stage: str):
        if not self.cuda:
            with self.host(stage):
                yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._events.append((stage, start, end))

    @contextlib.contextmanager
    def host(self, stage: str):
        start = time.perf_counter()
        yield
        self.add(stage, time.perf_counter() - start)

    def add(self, stage: str, seconds: float) -> None:
        if self.enabled:
            self._seconds[stage] += seconds

    def seconds(self) -> dict[str, float]:
        """Stage -> seconds so far (waits for the GPU once)."""
        totals = dict(self._seconds)
        if self._events:
            torch.cuda.synchronize()
            for stage, start, end in self._events:
                totals[stage] = totals.get(stage, 0.0) + start.elapsed_time(end) / 1e3
        return totals
