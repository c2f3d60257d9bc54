"""BoundedBatchFunction, rules 5 and 7 of docs/batching.md: cancellation at every point, and
leaving the ``async with`` block normally (drain) or by an exception."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from _batching_helpers import Outcomes, Recorder, make, start_cancellable, start_in_order, submitter
from sheetplane import BatcherClosedError
from sheetplane.batching import Batch


async def release_after(delay: float, gate: trio.Event) -> None:
    await trio.sleep(delay)
    gate.set()


# --- rule 5: cancellation -------------------------------------------------------------


async def test_a_caller_cancelled_while_queued_withdraws_its_value(
    autojump_clock: Any, entry_point: str
) -> None:
    execute = Recorder()
    batcher = make(execute)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1)])
        with trio.move_on_after(0.125):
            await outcomes.call(batcher, "a", 2)
        await start_in_order(nursery, outcomes, batcher, [("a", 3)])
    assert outcomes[2] == ("cancelled", None, 0.125)
    assert execute.batches == [(0.25, "a", (1, 3))]
    assert batcher.stats().withdrawn == 1


async def test_a_withdrawn_value_no_longer_counts_toward_closing_its_lane(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    batcher = make(execute, max_batch_items=3)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1)])
        with trio.move_on_after(0.125):
            await outcomes.call(batcher, "a", 2)
        # The lane holds one value again: a second one does not close it, a third does.
        await start_in_order(nursery, outcomes, batcher, [("a", 3)])
        assert execute.batches == []
        await start_in_order(nursery, outcomes, batcher, [("a", 4)])
        assert execute.batches == [(0.125, "a", (1, 3, 4))]
    assert outcomes[3] == ("ok", ("r", 3), 0.125)


async def test_a_caller_cancelled_while_waiting_for_admission_lets_the_next_in(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=1, max_retained_items=1)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1)])
        waiting = await start_cancellable(nursery, outcomes, batcher, "a", 2)
        await start_in_order(nursery, outcomes, batcher, [("a", 3)])
        assert batcher.stats().waiting_for_admission == 2
        await trio.sleep(1)
        waiting.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert batcher.stats().waiting_for_admission == 1
        await trio.sleep(1)
        gate.set()
    assert outcomes[2] == ("cancelled", None, 1.0)
    assert execute.batches == [(0.0, "a", (1,)), (2.0, "a", (3,))]
    assert batcher.stats().withdrawn == 1


async def test_cancelling_the_head_of_the_admission_queue_admits_the_rest(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold("big")
    batcher = make(execute, estimate_bytes=len, max_batch_items=1, max_retained_bytes=5)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", "big")])  # 3 bytes, running
        head = await start_cancellable(nursery, outcomes, batcher, "a", "four")  # 4 bytes: waits
        await start_in_order(nursery, outcomes, batcher, [("a", "x")])  # fits, but waits behind
        assert batcher.stats().waiting_for_admission == 2
        await trio.sleep(1)
        head.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes["x"] == ("ok", ("r", "x"), 1.0)
        gate.set()
    assert execute.executed == [("big",), ("x",)]


async def test_a_caller_cancelled_while_its_batch_runs_stops_waiting_and_the_batch_goes_on(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=2)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        leaving = await start_cancellable(nursery, outcomes, batcher, "a", 1)
        await start_in_order(nursery, outcomes, batcher, [("a", 2)])
        await trio.sleep(1)
        leaving.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes[1] == ("cancelled", None, 1.0)
        await trio.sleep(1)
        gate.set()
    assert outcomes[2] == ("ok", ("r", 2), 2.0)
    assert execute.finished == [(2.0, (1, 2))]
    assert execute.cancelled == []
    assert batcher.stats().abandoned_batches == 0


async def test_when_every_caller_has_gone_the_batch_scope_is_cancelled(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    execute.hold(1)
    other_gate = execute.hold(3)
    batcher = make(execute, max_batch_items=2)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        scopes = [await start_cancellable(nursery, outcomes, batcher, "a", v) for v in (1, 2)]
        await start_in_order(nursery, outcomes, batcher, [("b", 3), ("b", 4)])
        await trio.sleep(1)
        scopes[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert execute.cancelled == []
        await trio.sleep(1)
        scopes[1].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert execute.cancelled == [(2.0, (1, 2))]
        # The other lane's batch is unaffected and the batcher keeps serving.
        other_gate.set()
        await start_in_order(nursery, outcomes, batcher, [("c", 5), ("c", 6)])
    assert outcomes[3] == ("ok", ("r", 3), 2.0)
    assert outcomes[6] == ("ok", ("r", 6), 2.0)
    stats = batcher.stats()
    assert (stats.abandoned_batches, stats.in_flight, stats.retained_items) == (1, 0, 0)


async def test_an_abandoned_batch_frees_its_slot_for_the_next_ready_lane(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    execute.hold(1)
    batcher = make(execute, max_batch_items=1, max_in_flight_batches=1)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        scope = await start_cancellable(nursery, outcomes, batcher, "a", 1)
        await start_in_order(nursery, outcomes, batcher, [("b", 2)])
        await trio.sleep(1)
        scope.cancel()
    assert execute.cancelled == [(1.0, (1,))]
    assert execute.batches[1] == (1.0, "b", (2,))
    assert outcomes[2] == ("ok", ("r", 2), 1.0)


async def test_a_caller_already_cancelled_before_submit_withdraws_at_once(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    batcher = make(execute, max_batch_items=1)
    async with batcher:
        with trio.CancelScope() as scope:
            scope.cancel()
            await batcher.submit("a", 1)
        assert scope.cancelled_caught
        await trio.testing.wait_all_tasks_blocked()
    assert execute.executed == []
    assert batcher.stats().withdrawn == 1


# --- rule 7: leaving the block ---------------------------------------------------------


async def test_leaving_normally_drains_queued_values_at_once_and_lets_batches_finish(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=2, flush_seconds=10.0)
    outcomes = Outcomes(entry_point)
    async with trio.open_nursery() as nursery:
        async with batcher:
            await start_in_order(
                nursery, outcomes, batcher, [("a", 1), ("a", 2), ("b", 3), ("a", 4)]
            )
            await trio.sleep(1)
            nursery.start_soon(release_after, 1, gate)
        left_at = trio.current_time()
    # (3,) and (4,) did not wait for their 10 s linger; the block left once (1, 2) finished.
    assert sorted(execute.batches) == [(0.0, "a", (1, 2)), (1.0, "a", (4,)), (1.0, "b", (3,))]
    assert left_at == 2.0
    assert [outcomes[v][0] for v in (1, 2, 3, 4)] == ["ok"] * 4
    assert outcomes[1][2] == 2.0


async def test_submit_while_draining_or_after_the_block_raises_closed(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    submit = submitter(entry_point)
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=1)
    late: list[BaseException] = []

    async def late_submitter() -> None:
        await trio.sleep(1)
        try:
            await submit(batcher, "a", 2)
        except BatcherClosedError as exc:
            late.append(exc)
        gate.set()

    async with trio.open_nursery() as nursery, batcher:
        nursery.start_soon(submit, batcher, "a", 1)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(late_submitter)
    assert len(late) == 1
    with pytest.raises(BatcherClosedError):
        await submit(batcher, "a", 3)
    assert execute.executed == [(1,)]


async def test_submit_before_the_block_raises_closed(entry_point: str) -> None:
    submit = submitter(entry_point)
    batcher = make(Recorder())
    with pytest.raises(BatcherClosedError):
        await submit(batcher, "a", 1)


async def test_a_batcher_is_entered_once() -> None:
    batcher = make(Recorder())
    async with batcher:
        pass
    with pytest.raises(RuntimeError):
        async with batcher:
            pass


async def test_leaving_by_an_exception_cancels_batches_and_closes_waiters(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    execute.hold(1)
    batcher = make(execute, max_batch_items=2, max_retained_items=3, flush_seconds=10.0)
    outcomes = Outcomes()
    async with trio.open_nursery() as nursery:
        with pytest.raises(KeyError) as raised:
            async with batcher:
                await start_in_order(
                    nursery, outcomes, batcher, [("a", 1), ("a", 2), ("b", 3), ("b", 4)]
                )
                await trio.sleep(1)
                raise KeyError("body failed")
    # The body's own exception, not wrapped in a group by the batcher's nursery.
    assert type(raised.value) is KeyError
    assert execute.cancelled == [(1.0, (1, 2))]
    for value in (1, 2, 3, 4):  # running, running, queued, waiting for admission
        kind, error, at = outcomes[value]
        assert (kind, type(error), at) == ("error", BatcherClosedError, 1.0)
    with pytest.raises(BatcherClosedError):
        await batcher.submit("a", 5)


async def test_leaving_by_cancellation_closes_waiters_outside_the_scope(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    execute.hold(1)
    batcher = make(execute, max_batch_items=1, max_in_flight_batches=1)
    outcomes = Outcomes(entry_point)
    async with trio.open_nursery() as nursery:
        with trio.move_on_after(1):
            async with batcher:
                await start_in_order(nursery, outcomes, batcher, [("a", 1), ("a", 2)])
                await trio.sleep_forever()
    assert execute.cancelled == [(1.0, (1,))]
    assert [outcomes[v][:1] + outcomes[v][2:] for v in (1, 2)] == [("error", 1.0)] * 2
    assert all(isinstance(outcomes[v][1], BatcherClosedError) for v in (1, 2))


async def test_cancelled_while_draining_tears_down(autojump_clock: Any, entry_point: str) -> None:
    execute = Recorder()
    execute.hold(1)
    batcher = make(execute, max_batch_items=1)
    outcomes = Outcomes(entry_point)
    async with trio.open_nursery() as nursery:
        with trio.move_on_after(3) as scope:
            async with batcher:
                await start_in_order(nursery, outcomes, batcher, [("a", 1)])
    assert scope.cancelled_caught
    assert execute.cancelled == [(3.0, (1,))]
    assert outcomes[1][0] == "error" and isinstance(outcomes[1][1], BatcherClosedError)


async def test_a_base_exception_from_execute_leaves_the_block_unwrapped_and_closes_callers(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    class Stop(BaseException):
        pass

    async def execute(batch: Batch[Any, Any]) -> list[Any]:
        raise Stop

    batcher = make(execute, max_batch_items=1)
    outcomes = Outcomes(entry_point)
    with pytest.raises(Stop):
        async with batcher, trio.open_nursery() as nursery:
            await start_in_order(nursery, outcomes, batcher, [("a", 1)])
            await trio.sleep_forever()
    assert outcomes[1][0] == "error" and isinstance(outcomes[1][1], BatcherClosedError)


# --- a randomized run: every caller settles exactly once -------------------------------


@pytest.mark.parametrize("seed", range(8))
async def test_random_cancellations_settle_every_caller_once(
    autojump_clock: Any, seed: int, entry_point: str
) -> None:
    submit = submitter(entry_point)
    import random

    rng = random.Random(seed)  # the seed is the test id: a failure replays from it
    executed: list[Any] = []
    cancelled_batches: list[tuple[Any, ...]] = []

    async def execute(batch: Batch[Any, Any]) -> list[Any]:
        executed.extend(batch.values)
        try:
            await trio.sleep(rng.choice([0, 0, 0.01, 0.05, 0.2]))
        except trio.Cancelled:
            cancelled_batches.append(batch.values)
            raise
        if rng.random() < 0.1:
            raise RuntimeError("execute failed")
        return [("r", value) for value in batch.values]

    batcher = make(
        execute,
        max_batch_items=rng.randint(1, 4),
        max_retained_items=rng.randint(1, 6),
        max_in_flight_batches=rng.randint(1, 3),
        flush_seconds=rng.choice([0, 0.01, 0.03]),
    )
    settled: dict[int, str] = {}

    async def caller(value: int) -> None:
        with trio.move_on_after(rng.choice([0.001, 0.02, 0.1, 1.0, 10.0])):
            try:
                result = await submit(
                    batcher, rng.choice("ab"), value, max_wait=rng.choice([None, 0.05, 0.5])
                )
            except Exception as exc:
                assert value not in settled
                settled[value] = type(exc).__name__
                return
            assert value not in settled
            assert result == ("r", value)
            settled[value] = "ok"
            return
        settled[value] = "cancelled"

    async with batcher, trio.open_nursery() as nursery:
        for value in range(120):
            nursery.start_soon(caller, value)
            if rng.random() < 0.3:
                await trio.sleep(rng.choice([0.001, 0.01, 0.05]))
    assert sorted(settled) == list(range(120))
    assert len(executed) == len(set(executed))  # no value ran twice
    for value, how in settled.items():
        if how in ("LaneWedgedError",):
            assert value not in executed  # wedged values never run
        if how == "ok":
            assert value in executed
    stats = batcher.stats()
    assert (stats.retained_items, stats.retained_bytes, stats.in_flight, stats.queued) == (
        0,
        0,
        0,
        0,
    )
    assert stats.waiting_for_admission == 0
    assert stats.values == len(executed)
