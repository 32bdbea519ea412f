"""Capturing decode steps in CUDA graphs and replaying them.

`CapturedSteps` records `steps` consecutive calls of a step function (which reads and
writes only static buffers) into one `torch.cuda.CUDAGraph`, after a warm-up on a side
stream. Replaying it launches the whole sequence of kernels with one call, instead of a
few dozen launches per step. The graphs of one decoder share one memory pool.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

_WARMUP_CALLS = 2  # eager calls on a side stream before capture (cuBLAS/cuDNN workspaces, lazy init)


def pool_of(live: list["CapturedSteps"]):
    """The memory pool of a live graph, or a new one: a pool dies with the last graph that uses it."""
    return live[0].graph.pool() if live else torch.cuda.graph_pool_handle()


class CapturedSteps:
    """`steps` calls of `step()` captured once; `replay()` runs them again on the current stream."""

    def __init__(self, step: Callable[[], None], steps: int, pool, before_capture: Callable[[], None] | None = None,
                 warm_up: bool = True):
        start = time.perf_counter()
        if warm_up:  # not needed again once the step ran in this process (capturing runs nothing)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_CALLS):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            if before_capture is not None:
                before_capture()  # the warm-up wrote to the buffers: let the owner put them back
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            for _ in range(steps):
                step()
        torch.cuda.synchronize()
        self.steps = steps
        self.capture_seconds = time.perf_counter() - start

    def replay(self) -> None:
        self.graph.replay()
