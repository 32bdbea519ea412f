"""Capturing decode steps in CUDA graphs and replaying them.

`CapturedSteps` records `steps` consecutive calls of a step function (which reads and
writes only static buffers) into one `torch.cuda.CUDAGraph`, after a warm-up on a side
stream. Every graph of a process shares one memory pool. Replaying it launches the whole
sequence of kernels with one call, instead of a few dozen launches per step.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

_WARMUP_CALLS = 2  # eager calls on a side stream before capture (cuBLAS/cuDNN workspaces, lazy init)
_pool = None


def shared_pool():
    """One memory pool for every captured graph of this process."""
    global _pool
    if _pool is None:
        _pool = torch.cuda.graph_pool_handle()
    return _pool


class CapturedSteps:
    """`steps` calls of `step()` captured once; `replay()` runs them again on the current stream."""

    def __init__(self, step: Callable[[], None], steps: int, before_capture: Callable[[], None] | None = None):
        start = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_CALLS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        if before_capture is not None:
            before_capture()  # the warm-up wrote to the buffers: let the owner put them back
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=shared_pool()):
            for _ in range(steps):
                step()
        torch.cuda.synchronize()
        self.steps = steps
        self.capture_seconds = time.perf_counter() - start

    def replay(self) -> None:
        self.graph.replay()
