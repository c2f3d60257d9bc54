"""``submit_nowait`` and ``Pending``: what only the non-waiting entry point has.

The rules both entry points share are tested through both in
``test_batching_rules.py`` and ``test_batching_lifecycle.py``. Here: where
``submit`` would wait for room, ``submit_nowait`` raises ``trio.WouldBlock``;
a value settles whether or not anybody waits for it; ``Pending``'s fields,
``wait`` and ``cancel``.
"""

from __future__ import annotations

from typing import Any

import outcome
import pytest
import trio
import trio.testing

from _batching_helpers import Outcomes, Recorder, make, start_in_order
from sheetplane import (
    BatcherClosedError,
    InvalidInputError,
    LaneWedgedError,
    OversizedValueError,
    ValueCancelledError,
)

# --- rule 3: where submit would wait for room --------------------------------------------


async def test_submit_nowait_raises_would_block_at_the_retained_items_cap_and_keeps_nothing(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=2, max_retained_items=3)
    async with batcher:
        pendings = [batcher.submit_nowait("a", value) for value in (1, 2, 3)]
        before = batcher.stats()
        with pytest.raises(trio.WouldBlock):
            batcher.submit_nowait("a", 4)
        assert batcher.stats() == before
        await trio.sleep(1)
        gate.set()
        assert [await pending.wait() for pending in pendings] == [("r", v) for v in (1, 2, 3)]
        # Room freed: the same value is taken now.
        assert await batcher.submit_nowait("a", 4).wait() == ("r", 4)
    assert execute.executed == [(1, 2), (3,), (4,)]


async def test_submit_nowait_raises_would_block_at_the_retained_bytes_cap(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold("aaaaaaaa")
    batcher = make(execute, estimate_bytes=len, max_batch_bytes=8, max_retained_bytes=10)
    async with batcher:
        first = batcher.submit_nowait("a", "aaaaaaaa")
        with pytest.raises(trio.WouldBlock):
            batcher.submit_nowait("a", "bbb")
        assert await batcher.submit_nowait("a", "cc").wait() == ("r", "cc")
        gate.set()
        assert await first.wait() == ("r", "aaaaaaaa")
    assert sorted(execute.executed) == [("aaaaaaaa",), ("cc",)]


async def test_submit_nowait_does_not_pass_a_submit_already_waiting_for_room(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold("aaaaaaaa")
    batcher = make(execute, estimate_bytes=len, max_batch_bytes=8, max_retained_bytes=10)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", "aaaaaaaa"), ("a", "bbbbb")])
        assert batcher.stats().waiting_for_admission == 1
        # "c" alone fits in the 2 free bytes, but "bbbbb" waits first: submit would wait.
        with pytest.raises(trio.WouldBlock):
            batcher.submit_nowait("a", "c")
        gate.set()
    assert execute.executed == [("aaaaaaaa",), ("bbbbb",)]


async def test_submit_nowait_raises_at_once_what_submit_raises_at_once() -> None:
    execute = Recorder()
    batcher = make(execute, estimate_bytes=len, max_retained_bytes=10)
    with pytest.raises(BatcherClosedError):
        batcher.submit_nowait("a", "x")
    async with batcher:
        with pytest.raises(OversizedValueError):
            batcher.submit_nowait("a", "x" * 11)
        with pytest.raises(InvalidInputError):
            batcher.submit_nowait("a", "x", max_wait=-1.0)
        with pytest.raises(TypeError):
            batcher.submit_nowait(["unhashable"], "x")
        assert batcher.stats().retained_items == 0
        assert await batcher.submit_nowait("a", "x").wait() == ("r", "x")
    with pytest.raises(BatcherClosedError):
        batcher.submit_nowait("a", "x")


# --- rule 4: a deadline with nobody waiting ----------------------------------------------


async def test_a_queue_wait_deadline_hit_by_a_value_nobody_awaits_settles_it_wedged(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=1, max_in_flight_batches=1)
    async with batcher:
        running = batcher.submit_nowait("a", 1)
        wedged = batcher.submit_nowait("a", 2, max_wait=2.0)
        later = batcher.submit_nowait("a", 3)
        await trio.sleep(1.999)
        assert not wedged.done and wedged.outcome is None
        await trio.sleep(0.001)
        await trio.testing.wait_all_tasks_blocked()
        # Settled at its deadline, though no task waits for it.
        assert wedged.done
        assert isinstance(wedged.outcome, outcome.Error)
        assert type(wedged.outcome.error) is LaneWedgedError
        assert batcher.stats().wedged == 1
        await trio.sleep(3)
        gate.set()
        with pytest.raises(LaneWedgedError):
            await wedged.wait()
        assert await later.wait() == ("r", 3)
        assert running.outcome == outcome.Value(("r", 1))
    assert execute.executed == [(1,), (3,)]


async def test_max_wait_zero_settles_a_pending_wedged_without_running_it(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    batcher = make(execute, max_batch_items=1)
    async with batcher:
        pending = batcher.submit_nowait("a", 1, max_wait=0)
        await trio.testing.wait_all_tasks_blocked()
        assert pending.done and trio.current_time() == 0.0
        with pytest.raises(LaneWedgedError):
            await pending.wait()
    assert execute.executed == []


# --- Pending -------------------------------------------------------------------------------


async def test_a_pending_is_done_with_its_result_without_anybody_waiting(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    batcher = make(execute)
    async with batcher:
        pendings = [batcher.submit_nowait("a", value) for value in range(6)]
        assert not any(p.done for p in pendings)
        assert all(p.outcome is None for p in pendings)
        await trio.sleep(1)
        assert all(p.done for p in pendings)
        assert [p.outcome for p in pendings] == [outcome.Value(("r", v)) for v in range(6)]
    assert execute.batches == [(0.0, "a", (0, 1, 2, 3)), (0.25, "a", (4, 5))]


async def test_result_reads_a_settled_value_without_waiting_and_would_block_before(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    batcher = make(execute)
    async with batcher:
        pendings = [batcher.submit_nowait("a", value) for value in range(6)]
        for pending in pendings:
            with pytest.raises(trio.WouldBlock):
                pending.result()
        await trio.sleep(1)
        assert [p.result() for p in pendings] == [("r", v) for v in range(6)]
        assert [p.result() for p in pendings] == [("r", v) for v in range(6)]  # read again
        wedged = batcher.submit_nowait("a", 9, max_wait=0)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(LaneWedgedError):
            wedged.result()


async def test_every_value_of_a_failed_batch_settles_with_its_exception(
    autojump_clock: Any,
) -> None:
    boom = RuntimeError("boom")

    async def execute(batch: Any) -> list[Any]:
        raise boom

    batcher = make(execute)
    async with batcher:
        pendings = [batcher.submit_nowait("a", value) for value in range(2)]
        await trio.sleep(1)
        for pending in pendings:
            assert isinstance(pending.outcome, outcome.Error)
            assert pending.outcome.error is boom
            with pytest.raises(RuntimeError) as raised:
                await pending.wait()
            assert raised.value is boom
            with pytest.raises(RuntimeError) as read:
                pending.result()
            assert read.value is boom


async def test_cancelling_a_wait_does_not_withdraw_the_value(autojump_clock: Any) -> None:
    execute = Recorder()
    batcher = make(execute)
    async with batcher:
        pending = batcher.submit_nowait("a", 1)
        with trio.move_on_after(0.125):
            await pending.wait()
        assert not pending.done
        assert await pending.wait() == ("r", 1)
        assert trio.current_time() == 0.25
    assert execute.executed == [(1,)]


async def test_cancel_withdraws_a_queued_value_before_any_checkpoint(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    batcher = make(execute, max_batch_items=1)
    async with batcher:
        pending = batcher.submit_nowait("a", 1)
        pending.cancel()
        assert pending.done
        with pytest.raises(ValueCancelledError):
            await pending.wait()
        pending.cancel()  # settled: nothing more happens
        await trio.testing.wait_all_tasks_blocked()
    assert execute.executed == []
    assert batcher.stats().withdrawn == 1


async def test_cancel_wakes_a_task_waiting_for_the_value(autojump_clock: Any) -> None:
    execute = Recorder()
    batcher = make(execute)
    seen: list[Any] = []

    async def waiter(pending: Any) -> None:
        try:
            await pending.wait()
        except ValueCancelledError as exc:
            seen.append((type(exc), trio.current_time()))

    async with batcher, trio.open_nursery() as nursery:
        pending = batcher.submit_nowait("a", 1)
        nursery.start_soon(waiter, pending)
        await trio.sleep(0.125)
        pending.cancel()
    assert seen == [(ValueCancelledError, 0.125)]
    assert execute.executed == []


async def test_cancelling_every_value_of_a_running_batch_cancels_it_and_spares_others(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    execute.hold(1)
    batcher = make(execute, max_batch_items=2)
    async with batcher:
        first, second = batcher.submit_nowait("a", 1), batcher.submit_nowait("a", 2)
        other = batcher.submit_nowait("b", 3)
        await trio.sleep(0.5)
        first.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert execute.cancelled == []  # 2 is still waited for
        second.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert execute.cancelled == [(0.5, (1, 2))]
        assert await other.wait() == ("r", 3)
    assert isinstance(first.outcome, outcome.Error)
    assert type(first.outcome.error) is ValueCancelledError
    assert batcher.stats().abandoned_batches == 1


async def test_a_second_task_waiting_for_one_pending_is_refused(autojump_clock: Any) -> None:
    execute = Recorder()
    batcher = make(execute)
    async with batcher, trio.open_nursery() as nursery:
        pending = batcher.submit_nowait("a", 1)
        nursery.start_soon(pending.wait)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await pending.wait()
    assert pending.outcome == outcome.Value(("r", 1))


# --- rule 7: leaving the block -------------------------------------------------------------


async def test_leaving_normally_drains_values_nobody_awaits(autojump_clock: Any) -> None:
    execute = Recorder()
    batcher = make(execute, flush_seconds=10.0)
    async with batcher:
        pendings = [batcher.submit_nowait("a", value) for value in (1, 2)]
    assert trio.current_time() == 0.0
    assert [p.outcome for p in pendings] == [outcome.Value(("r", 1)), outcome.Value(("r", 2))]


async def test_leaving_by_an_exception_settles_values_nobody_awaits_closed(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    execute.hold(1)
    batcher = make(execute, max_batch_items=2, flush_seconds=10.0)
    with pytest.raises(KeyError):
        async with batcher:
            running = [batcher.submit_nowait("a", value) for value in (1, 2)]
            queued = batcher.submit_nowait("b", 3)
            await trio.sleep(1)
            raise KeyError("body failed")
    for pending in (*running, queued):
        assert isinstance(pending.outcome, outcome.Error)
        assert type(pending.outcome.error) is BatcherClosedError
    assert execute.cancelled == [(1.0, (1, 2))]
