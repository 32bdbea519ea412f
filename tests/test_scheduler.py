"""The one batching rule: longest first, at most N inputs and S padded seconds, for inputs given at once or over time."""

from __future__ import annotations

import threading
import time

import pytest

from graphscribe.model.decoding import size_class
from graphscribe.runtime.scheduler import Scheduler, plan_batches
from graphscribe.runtime.streaming import warm_up_rows


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


def test_a_batch_is_the_run_with_the_most_audio_for_its_cost():
    """n inputs whose longest lasts T cost fixed + (extra + n) T. With fixed 10: [30] alone 30/40 = 0.75, the four
    10 s ones 40/50 = 0.8, with the 11 s one too 51/65 = 0.78, all six 81/190: the four 10 s ones go first; then of
    [30, 11], 30 alone (0.75) beats both (41/70) and 11 alone (11/21)."""
    scheduler: Scheduler[str] = Scheduler(rows=8, cost=(10.0, 0.0), cost_over=0)
    for key, seconds in [("a", 10.0), ("long", 30.0), ("b", 10.0), ("eleven", 11.0), ("c", 10.0), ("d", 10.0)]:
        scheduler.put(key, seconds)
    assert scheduler.take() == ["a", "b", "c", "d"]  # equal lengths: oldest first
    assert scheduler.take() == ["long"]
    assert scheduler.take() == ["eleven"]


def test_a_large_fixed_cost_makes_whole_batches_and_extra_favours_short_runs():
    scheduler: Scheduler[str] = Scheduler(rows=8, cost=(1000.0, 0.0), cost_over=0)
    for key, seconds in [("a", 10.0), ("long", 30.0), ("b", 10.0), ("eleven", 11.0)]:
        scheduler.put(key, seconds)
    assert scheduler.take() == ["long", "eleven", "a", "b"]  # 61/1120 against 30/1030 alone or 31/1033 for the rest
    # extra 100: [30] alone 30/(101 x 30) = 0.0099; [10, 10] 20/(102 x 10) = 0.0196; [30, 10, 10] 50/(103 x 30)
    scheduler = Scheduler(rows=8, cost=(0.0, 100.0), cost_over=0)
    for key, seconds in [("a", 10.0), ("long", 30.0), ("b", 10.0)]:
        scheduler.put(key, seconds)
    assert scheduler.take() == ["a", "b"]


def test_an_overdue_input_heads_the_next_batch():
    scheduler: Scheduler[str] = Scheduler(rows=2, overdue=0.05, cost=(10.0, 0.0), cost_over=0)
    scheduler.put("short", 1.0)
    scheduler.put("shorter", 0.75)
    scheduler.put("long", 10.0)
    assert scheduler.take() == ["long"]  # nobody overdue: 10/20 alone against 11/30 with "short", 1.75/12 for the rest
    time.sleep(0.1)
    scheduler.put("longer", 12.0)
    scheduler.put("long2", 12.0)
    assert scheduler.take() == ["short", "shorter"]  # waited past `overdue`: heads the batch before the longer ones
    assert scheduler.take() == ["longer", "long2"]


def test_an_overdue_longest_input_is_in_the_next_batch():
    """Overdue and the longest: [old 12, 10, 10, 10] with fixed 10 and 3 rows. By cost alone the three 10 s ones
    (30/40) beat any run with the 12 s one (32/46 at best), but it heads the batch: [12, 10, 10] (32/46) over
    [12, 10] (22/34) and [12] (12/22)."""
    scheduler: Scheduler[str] = Scheduler(rows=3, overdue=0.05, cost=(10.0, 0.0), cost_over=0)
    scheduler.put("old", 12.0)
    time.sleep(0.1)
    for key in "abc":
        scheduler.put(key, 10.0)
    assert scheduler.take() == ["old", "a", "b"]
    assert scheduler.take() == ["c"]


def test_the_cost_rule_starts_past_cost_over_waiting():
    scheduler: Scheduler[str] = Scheduler(rows=8, cost=(10.0, 0.0), cost_over=3)
    for key, seconds in [("a", 10.0), ("b", 1.0), ("c", 10.0)]:
        scheduler.put(key, seconds)
    assert scheduler.take() == ["a", "c", "b"]  # 3 wait, not more than 3: one whole batch, longest first
    for key, seconds in [("a", 10.0), ("b", 1.0), ("c", 10.0), ("d", 10.0)]:
        scheduler.put(key, seconds)
    assert scheduler.take() == ["a", "c", "d"]  # 4 wait: 30/40 without the 1 s one, 31/50 with it


def test_a_wait_for_company_ends_when_none_is_coming():
    scheduler: Scheduler[str] = Scheduler(rows=4)
    scheduler.put("a", 1.0)
    assert scheduler.take(wait=60.0, company=lambda: 0) == ["a"]  # at once, not after a minute
    coming = [1]
    scheduler.put("b", 1.0)

    def arrive() -> None:
        scheduler.put("c", 2.0)
        coming[0] = 0

    threading.Timer(0.05, arrive).start()
    assert scheduler.take(wait=60.0, company=lambda: coming[0]) == ["c", "b"]  # waited for the one on its way


@pytest.mark.parametrize("most,rows", [(1024, 1024), (1000, 1024), (300, 256), (5, 256), (129, 256)])
def test_a_live_warm_up_meets_every_rows_class_a_step_can_use(most, rows):
    """Each rows class a step of up to `most` streams can fall in (`size_class`: its encoder and decode graphs)
    is stepped once at the warm-up on CUDA, so that no live step stops to capture one; nothing past it."""
    warmed = warm_up_rows("cuda", most, rows)
    assert {size_class(n) for n in warmed} == {size_class(n) for n in range(1, min(most, rows) + 1)}
    assert max(warmed) == min(most, rows)
    assert warm_up_rows("cpu", most, rows) == [1]
