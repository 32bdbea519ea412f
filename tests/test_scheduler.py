"""The one batching rule: longest first, at most N inputs and S padded seconds, for inputs given at once or over time."""

from __future__ import annotations

import threading
import time

import pytest

from graphscribe.scheduler import Scheduler, plan_batches


def test_inputs_given_at_once_are_cut_longest_first():
    seconds = [30.0, 5.0, 30.0, 1.0, 12.0, 40.0]
    # by hand: order 5 (40), 0 (30), 2 (30), 4 (12), 1 (5), 3 (1); 3 rows a batch, at most 90 padded seconds
    # [5, 0] (3 x 40 = 120 > 90 stops the third), [2, 4, 1] (3 x 30 = 90), [3]
    assert plan_batches(seconds, 3, 90.0) == [[5, 0], [2, 4, 1], [3]]
    assert plan_batches(seconds, 3, None) == [[5, 0, 2], [4, 1, 3]]
    assert plan_batches([100.0, 1.0], 8, 50.0) == [[0], [1]]  # longer than the cap: a batch alone


def test_inputs_that_arrive_later_join_the_waiting_ones_by_length():
    scheduler: Scheduler[str] = Scheduler(rows=2)
    scheduler.put("a", 3.0)
    scheduler.put("b", 9.0)
    scheduler.put("c", 5.0)
    assert scheduler.take() == ["b", "c"]
    scheduler.put("d", 4.0)
    assert scheduler.take() == ["d", "a"]
    assert scheduler.take(timeout=0.01) is None  # nothing waits: no batch after the timeout
    scheduler.close()
    assert scheduler.take() is None


def test_long_inputs_run_alone():
    scheduler: Scheduler[int] = Scheduler(rows=8, alone_over=60.0)
    for key, seconds in enumerate([3600.0, 10.0, 20.0]):
        scheduler.put(key, seconds)
    scheduler.close()
    assert list(iter(scheduler.take, None)) == [[0], [2, 1]]


def test_a_batch_waits_for_company_at_most_wait_seconds():
    scheduler: Scheduler[str] = Scheduler(rows=3)
    scheduler.put("first", 2.0)
    threading.Timer(0.05, scheduler.put, ("second", 1.0)).start()
    start = time.monotonic()
    assert scheduler.take(wait=0.5) == ["first", "second"]  # the wait ran out with two waiting
    assert 0.4 <= time.monotonic() - start
    scheduler.put("x", 1.0)
    scheduler.put("y", 1.0)
    scheduler.put("z", 1.0)
    start = time.monotonic()
    assert scheduler.take(wait=5.0) == ["x", "y", "z"]  # full: no wait
    assert time.monotonic() - start < 2.0


def test_closing_cuts_a_wait_short():
    scheduler: Scheduler[str] = Scheduler(rows=4)
    scheduler.put("only", 1.0)
    threading.Timer(0.05, scheduler.close).start()
    assert scheduler.take(wait=30.0) == ["only"]
    with pytest.raises(RuntimeError):
        scheduler.put("late", 1.0)


def test_a_busy_take_waits_for_inputs_on_their_way():
    """The server's busy GPU: a batch waits for the requests it knows are coming, up to a full batch, and gives up
    on the ones that do not come."""
    scheduler: Scheduler[str] = Scheduler(rows=3)
    scheduler.put("a", 9.0)
    later = threading.Timer(0.05, lambda: [scheduler.put(k, 2.0) for k in ("b", "c", "d")])
    later.start()
    assert scheduler.take(timeout=0.0, fill=5, fill_wait=60.0) == ["a", "b", "c"]  # full at 3 rows: no more waiting
    later.join()
    assert scheduler.take(timeout=0.0, fill=2, fill_wait=0.05) == ["d"]  # the second one never comes
    assert scheduler.take(timeout=0.0, fill=1, fill_wait=0.05) is None  # nothing came: no batch
