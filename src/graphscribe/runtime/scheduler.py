"""Which inputs run together: the one batching rule of the folder job, the server and the device workers.

Inputs wait with their lengths in seconds; `take` hands out the next batch: the longest input waiting, then the
next longest while the batch has fewer than `rows` inputs and `seconds` of padded audio (inputs x the longest
one's length). Taking every batch of a closed scheduler gives the same plan as sorting all inputs longest first
and cutting greedily (`plan_batches`); inputs that arrive over time (requests, a worker asking for more) are
batched by the same rule among those waiting at that moment.

    folder job:  put every file, close, take until None      (pipeline.ReadAhead's feeding thread)
    devices:     one scheduler in the parent; each worker takes its next batch when it frees up
    server:      put each request as its audio is decoded; the batching thread takes with `wait` (float32: by `cost`)
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
COMPANY_POLL_SECONDS = 0.001  # how often a wait for company asks whether any is still coming


class Scheduler(Generic[K]):
    """Keys waiting with their lengths, taken as batches longest first. Safe to use from several threads.

    rows: inputs per batch at most. seconds: padded seconds per batch at most (0 or None: no cap); an input
    longer than the cap gets a batch alone. alone_over: inputs longer than this (seconds) always run alone
    (hours of audio with local attention do not share a batch's memory).
    cost: (fixed, extra): while more than `cost_over` inputs wait (None: a batch's rows), a batch is the run of the
    waiting inputs (sorted by length) with the most audio per cost, where n inputs whose longest lasts T seconds
    cost `fixed + (extra + n) * T` padded seconds (None: longest first, greedily). Inputs that arrive over time come
    in every length at once: batched whole, 32 requests of LibriSpeech lengths are padded to 2.9 times their audio,
    and the encoder computes every padded frame. With few waiting, whole batches: one batch's fixed costs then
    weigh more than the padding.
    overdue: seconds after which the oldest input waiting heads the next batch, however short it is (with `cost`,
    an input far from the others' lengths would otherwise wait for as long as others keep coming).
    """

    def __init__(
        self,
        rows: int,
        seconds: float | None = None,
        alone_over: float | None = None,
        overdue: float | None = None,
        cost: tuple[float, float] | None = None,
        cost_over: int | None = None,
    ):
        if rows < 1:
            raise ValueError(f"rows {rows}: use 1 or more")
        self.rows, self.seconds, self.alone_over = rows, seconds or None, alone_over
        self.overdue, self.cost = overdue, cost
        self.cost_over = rows if cost_over is None else cost_over
        self._waiting: list[tuple[float, int, K]] = []  # (-seconds, arrival number, key): longest, then oldest first
        self._arrived: dict[int, float] = {}  # arrival number -> monotonic time it was put
        self._count = itertools.count()
        self._closed = False
        self._nudged = False
        self._changed = threading.Condition()

    def put(self, key: K, seconds: float) -> None:
        """`key` waits to be transcribed; `seconds` is its length (0 when unknown: it sorts last)."""
        with self._changed:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            n = next(self._count)
            bisect.insort(self._waiting, (-float(seconds), n, key))
            self._arrived[n] = time.monotonic()
            self._changed.notify_all()

    def close(self) -> None:
        """No more inputs: `take` empties what waits, then returns None."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def nudge(self) -> None:
        """Wake a `take` that waits with nothing waiting: it returns None as if its timeout had passed (the server's
        live streams have work for the batching thread that waits here)."""
        with self._changed:
            self._nudged = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def take(
        self, wait: float = 0.0, timeout: float | None = None, company: Callable[[], int] | None = None
    ) -> list[K] | None:
        """The next batch of keys, longest first; None once closed and empty, after `timeout` seconds with
        nothing waiting, or when nudged with nothing waiting.

        wait: seconds a batch that is not full may wait for company, counted from the arrival of the oldest input
        waiting (a server's --max-wait-ms); it is cut short by closing or by the batch filling up, and, with
        `company` (inputs on their way: a server's requests admitted and not put yet), once none is coming.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._waiting:
                if self._closed or self._nudged:
                    self._nudged = False
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._changed.wait(left)
            if wait > 0:
                oldest = min(self._arrived.values())
                while not self._closed and not self._full():
                    left = oldest + wait - time.monotonic()
                    if left <= 0 or (company is not None and company() <= 0):
                        break
                    self._changed.wait(left if company is None else min(left, COMPANY_POLL_SECONDS))
            self._nudged = False
            return self._cut()

    def _full(self) -> bool:
        return len(self._plan()) < len(self._waiting) or len(self._waiting) >= self.rows

    def _plan(self) -> list[int]:
        """Positions in `_waiting` of the batch `take` would hand out now: a run of the sorted list, from the
        longest input (or the overdue oldest one) down."""
        overdue = self._overdue_position()
        if self.cost is not None and len(self._waiting) > self.cost_over:
            return self._window(range(len(self._waiting)) if overdue is None else [overdue])
        start = overdue or 0
        longest = -self._waiting[start][0]
        if self.alone_over is not None and longest > self.alone_over:
            return [start]
        chosen = [start]
        for k in range(start + 1, len(self._waiting)):
            if len(chosen) >= self.rows:
                break
            if self.seconds is not None and (len(chosen) + 1) * longest > self.seconds:
                break
            chosen.append(k)
        return chosen

    def _window(self, starts) -> list[int]:
        """The run of the waiting list, starting at one of `starts`, with the most audio per cost: a batch of n rows
        whose longest input lasts T seconds costs `fixed + (extra + n) * T` padded seconds (`cost`)."""
        import numpy as np

        fixed, extra = self.cost
        lengths = np.maximum([-entry[0] for entry in self._waiting], 0.01)  # unknown lengths: all alike
        total = np.concatenate(([0.0], np.cumsum(lengths)))
        first = np.asarray(starts)[:, None]  # (S, 1)
        n = np.arange(1, self.rows + 1)  # (rows,)
        end = first + n  # (S, rows), exclusive
        longest = lengths[first]
        valid = end <= len(lengths)
        if self.seconds is not None:
            valid &= (n * longest <= self.seconds) | (n == 1)
        if self.alone_over is not None:
            valid &= (longest <= self.alone_over) | (n == 1)
        audio = total[np.minimum(end, len(lengths))] - total[first]
        value = np.where(valid, audio / (fixed + (extra + n) * longest), -1.0)
        s, m = np.unravel_index(int(np.argmax(value)), value.shape)
        return list(range(int(first[s, 0]), int(first[s, 0]) + int(m) + 1))

    def _overdue_position(self) -> int | None:
        """The position of the oldest input waiting once it has waited past `overdue`; None while none has."""
        if self.overdue is None or not self._arrived:
            return None
        oldest = min(self._arrived, key=self._arrived.__getitem__)
        if time.monotonic() - self._arrived[oldest] <= self.overdue:
            return None
        return next(k for k, entry in enumerate(self._waiting) if entry[1] == oldest)

    def _cut(self) -> list[K]:
        chosen = self._plan()  # a run of the waiting list: from the longest (or the overdue) input down
        batch = self._waiting[chosen[0] : chosen[-1] + 1]
        del self._waiting[chosen[0] : chosen[-1] + 1]
        for _, n, _ in batch:
            del self._arrived[n]
        return [key for _, _, key in batch]


def plan_batches(seconds: list[float], batch_size: int, batch_seconds: float | None) -> list[list[int]]:
    """Input indices, longest first, cut into batches of at most `batch_size` inputs and `batch_seconds` of
    padded audio (0 or None: no cap), as a `Scheduler` given them all at once hands them out."""
    scheduler: Scheduler[int] = Scheduler(batch_size, batch_seconds)
    for i, s in enumerate(seconds):
        scheduler.put(i, s)
    scheduler.close()
    return list(iter(scheduler.take, None))
