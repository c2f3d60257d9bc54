"""The scheduling core, driven synchronously with an explicit clock, and the
float-rounding regression on both the core and the shell."""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio

from sheetplane import OversizedValueError
from sheetplane.batching import BoundedBatchFunction, SchedulingCore
from sheetplane.batching._core import EXPIRED, QUEUED, RUNNING, WITHDRAWN

INF = math.inf


def core(**overrides: Any) -> SchedulingCore[Any, Any]:
    limits: dict[str, Any] = {
        "max_batch_items": 4,
        "max_batch_bytes": 100,
        "max_retained_items": 10,
        "max_retained_bytes": 1_000,
        "max_in_flight_batches": 2,
        "flush_seconds": 1.0,
    }
    return SchedulingCore(**{**limits, **overrides})


def test_flush_deadline_float_rounding() -> None:
    # 0.1 + 0.2 is 0.30000000000000004; adding 0.1 gives exactly 0.4, and
    # 0.4 - 0.30000000000000004 is 0.09999999999999998: a lane checked with
    # `now - start >= flush` is never ready at the instant next_wakeup names,
    # so a scheduler sleeping until that instant would wake and sleep again forever.
    start, flush = 0.1 + 0.2, 0.1
    scheduler = core(flush_seconds=flush)
    scheduler.submit("lane", "key", "value", 1, start, INF)
    wakeup = scheduler.next_wakeup(start)
    assert wakeup == start + flush
    assert wakeup - start < flush  # the rounding bites at exactly this instant
    batch = scheduler.dispatch(wakeup)
    assert batch is not None and batch.values == ("value",)
    assert scheduler.next_wakeup(wakeup) == INF


async def test_flush_deadline_float_rounding_in_the_shell(autojump_clock: Any) -> None:
    start, flush = 0.1 + 0.2, 0.1

    async def execute(batch: Any) -> list[Any]:
        return list(batch.values)

    batcher: BoundedBatchFunction[str, int, int] = BoundedBatchFunction(
        execute,
        max_batch_items=4,
        max_batch_bytes=100,
        max_retained_items=10,
        max_retained_bytes=100,
        max_in_flight_batches=1,
        flush_seconds=flush,
    )
    async with batcher:
        await trio.sleep_until(start)
        assert await batcher.submit("lane", 7) == 7
        assert trio.current_time() == start + flush


def test_value_deadline_compares_with_the_expression_that_set_it() -> None:
    start, max_wait = 0.1 + 0.2, 0.1
    scheduler = core(max_batch_items=1, max_in_flight_batches=1)
    scheduler.submit("busy", "k", "v", 1, 0.0, INF)
    assert scheduler.dispatch(0.0) is not None
    entry = scheduler.submit("lane", "k", "late", 1, start, start + max_wait)
    assert scheduler.dispatch(start) is None  # the in-flight cap is reached
    wakeup = scheduler.next_wakeup(start)
    assert wakeup == start + max_wait
    assert scheduler.expire(wakeup) == [entry]
    assert entry.state == EXPIRED


def test_next_wakeup_ignores_flush_deadlines_while_the_in_flight_cap_is_reached() -> None:
    scheduler = core(max_batch_items=1, max_in_flight_batches=1)
    scheduler.submit("a", "k", 1, 1, 0.0, INF)
    running = scheduler.dispatch(0.0)
    assert running is not None
    scheduler.submit("b", "k", 2, 1, 0.0, INF)
    scheduler.take_wakeup_hint()
    assert scheduler.next_wakeup(0.0) == INF
    scheduler.finish(running)
    assert scheduler.take_wakeup_hint() == 1.0  # finishing re-arms the waiting lane's flush
    assert scheduler.dispatch(0.5) is not None  # b is closed (one item): ready at once


def test_dispatch_takes_the_greedy_prefix_within_both_caps() -> None:
    scheduler = core(max_batch_items=3, max_batch_bytes=10)
    for value, size in (("a", 4), ("b", 4), ("c", 3), ("d", 1)):
        scheduler.submit("lane", "k", value, size, 0.0, INF)
    first = scheduler.dispatch(0.0)
    assert first is not None and first.values == ("a", "b")
    assert scheduler.dispatch(0.0) is None  # c, d: 4 bytes, 2 items, lingering
    second = scheduler.dispatch(1.0)
    assert second is not None and second.values == ("c", "d")


def test_expire_frees_room_for_admission_in_deadline_order() -> None:
    scheduler = core(max_retained_items=2)
    early = scheduler.submit("a", "k", 1, 1, 0.0, 2.0)
    late = scheduler.submit("a", "k", 2, 1, 0.0, 1.0)  # out of order: goes on the heap
    waiting = scheduler.submit("a", "k", 3, 1, 0.0, INF)
    assert scheduler.statistics().waiting_for_admission == 1
    assert scheduler.expire(0.5) == []
    assert scheduler.expire(1.0) == [late]
    assert waiting.state == QUEUED
    assert scheduler.expire(5.0) == [early]
    stats = scheduler.statistics()
    assert (stats.wedged, stats.retained_items, stats.queued) == (2, 1, 1)


def test_withdraw_and_abandon_only_apply_to_their_states() -> None:
    scheduler = core(max_batch_items=2)
    first = scheduler.submit("a", "k", 1, 1, 0.0, INF)
    second = scheduler.submit("a", "k", 2, 1, 0.0, INF)
    with pytest.raises(ValueError):
        scheduler.abandon(first)
    batch = scheduler.dispatch(0.0)
    assert batch is not None and first.state == RUNNING
    with pytest.raises(ValueError):
        scheduler.withdraw(first)
    assert scheduler.abandon(first) is False
    assert scheduler.abandon(second) is True
    third = scheduler.submit("a", "k", 3, 1, 0.0, INF)
    scheduler.withdraw(third)
    assert third.state == WITHDRAWN
    assert scheduler.statistics().abandoned_batches == 1


def test_submit_rejects_an_oversized_or_unhashable_value_without_a_trace() -> None:
    scheduler = core(max_retained_bytes=10)
    with pytest.raises(OversizedValueError):
        scheduler.submit("a", "k", "v", 11, 0.0, INF)
    with pytest.raises(TypeError):
        scheduler.submit(["unhashable"], "k", "v", 1, 0.0, INF)
    stats = scheduler.statistics()
    assert (stats.retained_items, stats.lanes, stats.waiting_for_admission) == (0, 0, 0)


def test_bookkeeping_stays_bounded_over_many_lanes_and_values() -> None:
    scheduler = core(max_batch_items=2, max_retained_items=10_000, max_in_flight_batches=4)
    now = 0.0
    for round_ in range(200):
        now += 0.01
        for lane in range(25):
            scheduler.submit((round_ % 7, lane), "k", lane, 1, now, now + 60.0)
        while (batch := scheduler.dispatch(now)) is not None:
            scheduler.finish(batch)
    stats = scheduler.statistics()
    assert stats.values + stats.queued == 200 * 25
    waiting = stats.queued + stats.waiting_for_admission
    assert len(scheduler._heads) <= 2 * stats.lanes + 64
    assert len(scheduler._closed) <= 2 * stats.lanes + 64
    assert len(scheduler._timeline) + len(scheduler._deadlines) <= 2 * waiting + 64


def test_drain_makes_every_lane_ready() -> None:
    scheduler = core()
    scheduler.submit("a", "k", 1, 1, 0.0, INF)
    assert scheduler.dispatch(0.0) is None
    scheduler.drain()
    batch = scheduler.dispatch(0.0)
    assert batch is not None and batch.values == (1,)
    assert not scheduler.idle
    scheduler.finish(batch)
    assert scheduler.idle


def test_close_returns_every_waiting_caller_once() -> None:
    scheduler = core(max_batch_items=2, max_retained_items=3)
    entries = [scheduler.submit("a", "k", v, 1, 0.0, INF) for v in range(4)]
    batch = scheduler.dispatch(0.0)
    assert batch is not None
    scheduler.abandon(entries[0])
    closed = scheduler.close()
    assert sorted(e.seq for e in closed) == [e.seq for e in entries[1:]]
    scheduler.finish(batch)
    assert scheduler.statistics().retained_items == 0


def test_lane_that_stays_closed_and_then_opens_still_flushes_by_time() -> None:
    # A lane holding more than a batch stays closed across a dispatch, so its new
    # head is ranked on the closed heap only. When a withdrawal opens the lane
    # again, that head must join the flush-deadline ranking: otherwise the rest
    # would sit until max_wait instead of flushing after flush_seconds.
    scheduler = core(max_batch_items=2, max_in_flight_batches=1)
    entries = [scheduler.submit("a", "k", v, 1, 0.0, INF) for v in range(4)]
    first = scheduler.dispatch(0.0)
    assert first is not None and first.values == (0, 1)
    scheduler.withdraw(entries[3])  # "a" now holds one value: open again
    scheduler.finish(first)
    assert scheduler.dispatch(0.5) is None
    assert scheduler.next_wakeup(0.5) == 1.0  # value 2's flush deadline (submitted at 0.0)
    second = scheduler.dispatch(1.0)
    assert second is not None and second.values == (2,)
    assert scheduler.idle is False
    scheduler.finish(second)
    assert scheduler.idle


def test_next_batch_expires_first_and_more_ready_agrees_with_has_ready() -> None:
    scheduler = core(max_batch_items=2, max_in_flight_batches=3)
    late = scheduler.submit("a", "k", "late", 1, 0.0, 0.5)
    for index in range(5):
        scheduler.submit("b", "k", index, 1, 0.0, INF)
    # At 0.5 the value of lane "a" has expired: it comes back in `expired`, never in a batch.
    batch = scheduler.next_batch(0.5)
    assert scheduler.expired == [late] and late is not None and late.state == EXPIRED
    assert batch is not None and batch.values == (0, 1)
    assert scheduler.more_ready == scheduler.has_ready(0.5) is True  # 2 and 3 still fill one
    batch = scheduler.next_batch(0.5)
    assert scheduler.expired == []
    assert batch is not None and batch.values == (2, 3)
    assert scheduler.more_ready == scheduler.has_ready(0.5) is False  # 4 lingers until 1.0
    assert scheduler.next_batch(0.5) is None and scheduler.more_ready is False
    batch = scheduler.next_batch(1.0)
    assert batch is not None and batch.values == (4,)
    assert scheduler.more_ready == scheduler.has_ready(1.0) is False  # the in-flight cap
