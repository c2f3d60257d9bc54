"""BoundedBatchFunction, the rules 1-4, 6, 8 and 9 of docs/batching.md, on virtual time."""

from __future__ import annotations

import math
import traceback
from typing import Any

import pytest
import trio
import trio.testing

from _batching_helpers import DEFAULTS, Outcomes, Recorder, make, start_in_order, submitter
from sheetplane import (
    BatchContractError,
    BatcherStatistics,
    BoundedBatchFunction,
    InvalidInputError,
    LaneWedgedError,
    OversizedValueError,
)
from sheetplane.batching import Batch

# --- rule 1: lanes and order -----------------------------------------------------------


async def test_values_of_different_lanes_never_share_a_batch(
    autojump_clock: Any, entry_point: str
) -> None:
    execute = Recorder()
    batcher = make(execute, max_batch_items=10)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1), ("b", 2), ("a", 3), ("b", 4)])
    assert sorted(execute.batches) == [(0.25, "a", (1, 3)), (0.25, "b", (2, 4))]
    assert [outcomes[v] for v in (1, 2, 3, 4)] == [("ok", ("r", v), 0.25) for v in (1, 2, 3, 4)]


async def test_key_id_maps_keys_to_lanes_and_batch_key_is_the_first_values(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    batcher = make(execute, key_id=lambda key: key[0])
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(
            nursery, outcomes, batcher, [(("x", 1), "a"), (("y", 1), "b"), (("x", 2), "c")]
        )
    assert sorted(execute.batches) == [(0.25, ("x", 1), ("a", "c")), (0.25, ("y", 1), ("b",))]


async def test_a_lane_keeps_submission_order_inside_and_across_batches(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    batcher = make(execute, max_batch_items=3, max_in_flight_batches=1)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("lane", i) for i in range(10)])
    assert execute.executed == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9,)]
    assert [t for t, _, _ in execute.batches] == [0.0, 0.0, 0.0, 0.25]


# --- rule 2: readiness and dispatch ---------------------------------------------------


async def test_a_full_lane_dispatches_at_once(autojump_clock: Any, entry_point: str) -> None:
    execute = Recorder()
    batcher = make(execute, max_batch_items=2)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1), ("a", 2)])
    assert execute.batches == [(0.0, "a", (1, 2))]
    assert outcomes[1] == ("ok", ("r", 1), 0.0)


async def test_a_lane_lingers_flush_seconds_from_its_oldest_values_submit(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    batcher = make(execute, flush_seconds=0.5)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        nursery.start_soon(outcomes.call, batcher, "a", 1)
        await trio.sleep(0.125)
        nursery.start_soon(outcomes.call, batcher, "a", 2)
        await trio.sleep(0.125)
        nursery.start_soon(outcomes.call, batcher, "b", 3)
    assert execute.batches == [(0.5, "a", (1, 2)), (0.75, "b", (3,))]
    assert outcomes[2] == ("ok", ("r", 2), 0.5)


async def test_a_lane_is_ready_when_the_next_value_would_pass_max_batch_bytes(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    batcher = make(execute, estimate_bytes=len, max_batch_bytes=10)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", "aaaa"), ("a", "bbbb")])
        assert execute.batches == []
        await start_in_order(nursery, outcomes, batcher, [("a", "ccc")])
        assert execute.batches == [(0.0, "a", ("aaaa", "bbbb"))]
    assert execute.batches[1] == (0.25, "a", ("ccc",))


async def test_a_value_larger_than_max_batch_bytes_runs_alone_at_once(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    batcher = make(execute, estimate_bytes=len, max_batch_bytes=10)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", "x"), ("a", "y" * 15)])
    assert execute.batches == [(0.0, "a", ("x",)), (0.0, "a", ("y" * 15,))]
    assert outcomes["y" * 15] == ("ok", ("r", "y" * 15), 0.0)


async def test_the_in_flight_cap_holds_ready_lanes_until_a_batch_finishes(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=1, max_in_flight_batches=1)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1), ("b", 2), ("c", 3)])
        await trio.sleep(3)
        assert execute.executed == [(1,)]
        assert batcher.stats().in_flight == 1
        gate.set()
    assert execute.executed == [(1,), (2,), (3,)]
    assert [t for t, _, _ in execute.batches] == [0.0, 3.0, 3.0]
    assert batcher.stats().peak_in_flight == 1


async def test_among_ready_lanes_the_oldest_head_value_goes_first(
    autojump_clock: Any, entry_point: str
) -> None:
    execute = Recorder()
    gate = execute.hold("z1")
    batcher = make(execute, max_batch_items=2, max_in_flight_batches=1)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("z", "z1"), ("z", "z2")])
        # Lane a closes first, but lane b's head value is older.
        await start_in_order(
            nursery, outcomes, batcher, [("b", "b1"), ("a", "a1"), ("a", "a2"), ("b", "b2")]
        )
        gate.set()
    assert execute.executed == [("z1", "z2"), ("b1", "b2"), ("a1", "a2")]


async def test_a_flush_ready_lane_with_an_older_head_goes_before_a_full_lane(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    gate = execute.hold("z1")
    batcher = make(execute, max_batch_items=2, max_in_flight_batches=1, flush_seconds=1.0)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("z", "z1"), ("z", "z2")])
        await start_in_order(nursery, outcomes, batcher, [("old", "o1")])
        await trio.sleep(2)
        await start_in_order(nursery, outcomes, batcher, [("a", "a1"), ("a", "a2")])
        gate.set()
    assert execute.executed == [("z1", "z2"), ("o1",), ("a1", "a2")]


# --- rule 3: retention ------------------------------------------------------------------


async def test_retained_items_cap_makes_submit_wait_first_come_first_served(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=2, max_retained_items=3)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", i) for i in range(1, 6)])
        stats = batcher.stats()
        assert (stats.retained_items, stats.in_flight, stats.queued) == (3, 1, 1)
        assert stats.waiting_for_admission == 2
        await trio.sleep(1)
        gate.set()
    # 3 flushed alone at 0.25; each batch finishing there admitted the next waiter, whose
    # linger (counted from its submit) had passed, so 4 and 5 followed at once, one by one
    # (the room freed by one value admits one value).
    assert execute.batches == [
        (0.0, "a", (1, 2)),
        (0.25, "a", (3,)),
        (0.25, "a", (4,)),
        (0.25, "a", (5,)),
    ]
    assert batcher.stats().peak_retained_items == 3


async def test_retained_bytes_cap_admits_in_order_even_when_a_later_value_fits(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold("aaaaaaaa")
    batcher = make(execute, estimate_bytes=len, max_batch_bytes=8, max_retained_bytes=10)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", "aaaaaaaa")])
        await start_in_order(nursery, outcomes, batcher, [("a", "bbbbb"), ("a", "c")])
        # "c" alone would fit in the 2 free bytes, but "bbbbb" came first.
        assert batcher.stats().waiting_for_admission == 2
        await trio.sleep(1)
        gate.set()
    assert execute.batches == [(0.25, "a", ("aaaaaaaa",)), (1.0, "a", ("bbbbb", "c"))]
    assert batcher.stats().peak_retained_bytes == 8


async def test_a_value_whose_estimate_exceeds_max_retained_bytes_fails_at_once(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    submit = submitter(entry_point)
    execute = Recorder()
    batcher = make(execute, estimate_bytes=len, max_retained_bytes=10)
    async with batcher:
        with pytest.raises(OversizedValueError):
            await submit(batcher, "a", "x" * 11)
        assert trio.current_time() == 0.0
        assert await submit(batcher, "a", "x" * 10) == ("r", "x" * 10)
    assert execute.executed == [("x" * 10,)]


# --- rule 4: max_wait -------------------------------------------------------------------


async def test_max_wait_raises_lane_wedged_while_queued_and_the_value_never_runs(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=1, max_in_flight_batches=1)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1)])
        await start_in_order(nursery, outcomes, batcher, [("a", 2)], max_wait=2.0)
        await start_in_order(nursery, outcomes, batcher, [("a", 3)])
        await trio.sleep(5)
        gate.set()
    kind, error, at = outcomes[2]
    assert (kind, type(error), at) == ("error", LaneWedgedError, 2.0)
    assert execute.executed == [(1,), (3,)]
    assert batcher.stats().wedged == 1


async def test_max_wait_counts_the_admission_wait_too(autojump_clock: Any) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_batch_items=1, max_retained_items=1, max_in_flight_batches=1)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1)])
        await start_in_order(nursery, outcomes, batcher, [("a", 2)], max_wait=1.5)
        await start_in_order(nursery, outcomes, batcher, [("a", 3)])
        assert batcher.stats().waiting_for_admission == 2
        await trio.sleep(1.5)
        await trio.testing.wait_all_tasks_blocked()
        # 2 left the admission queue; 3 still waits behind the running batch.
        assert batcher.stats().waiting_for_admission == 1
        await trio.sleep(1)
        gate.set()
    assert outcomes[2][0] == "error" and isinstance(outcomes[2][1], LaneWedgedError)
    assert outcomes[2][2] == 1.5
    assert execute.executed == [(1,), (3,)]


async def test_max_wait_spans_admission_and_queue(autojump_clock: Any) -> None:
    execute = Recorder()
    gate_1, gate_2 = execute.hold(1), execute.hold(2)
    batcher = make(execute, max_batch_items=1, max_retained_items=2, max_in_flight_batches=1)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1), ("b", 2)])
        await start_in_order(nursery, outcomes, batcher, [("c", 3)], max_wait=3.0)
        await trio.sleep(2)
        gate_1.set()  # 1 finishes; 3 is admitted but queues behind 2, which now runs
        await trio.testing.wait_all_tasks_blocked()
        assert batcher.stats().queued == 1
        await trio.sleep(2)
        gate_2.set()
    assert outcomes[3][0] == "error" and isinstance(outcomes[3][1], LaneWedgedError)
    assert outcomes[3][2] == 3.0
    assert execute.executed == [(1,), (2,)]


async def test_the_linger_counts_from_submit_so_a_late_admission_dispatches_at_once(
    autojump_clock: Any,
) -> None:
    execute = Recorder()
    gate = execute.hold(1)
    batcher = make(execute, max_retained_items=1, max_batch_items=2, max_in_flight_batches=1)
    outcomes = Outcomes()
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1)])
        await trio.sleep(0.25)  # (1,) flushes at 0.25 and holds the only retention slot
        await start_in_order(nursery, outcomes, batcher, [("b", 2), ("c", 3)])
        await trio.sleep(1.75)
        gate.set()
    # Admitted at t=2, long after their 0.25 s linger (counted from submit) passed.
    assert execute.batches[1:] == [(2.0, "b", (2,)), (2.0, "c", (3,))]
    assert outcomes[3] == ("ok", ("r", 3), 2.0)


async def test_a_batch_that_starts_in_time_is_not_wedged(
    autojump_clock: Any, entry_point: str
) -> None:
    submit = submitter(entry_point)
    execute = Recorder()
    batcher = make(execute, flush_seconds=1.0)
    async with batcher:
        assert await submit(batcher, "a", 1, max_wait=1.5) == ("r", 1)
        assert trio.current_time() == 1.0


async def test_max_wait_zero_always_raises(autojump_clock: Any, entry_point: str) -> None:
    submit = submitter(entry_point)
    execute = Recorder()
    batcher = make(execute, max_batch_items=1)
    async with batcher:
        with pytest.raises(LaneWedgedError):
            await submit(batcher, "a", 1, max_wait=0)
        assert trio.current_time() == 0.0
    assert execute.executed == []


@pytest.mark.parametrize("max_wait", [-1.0, math.nan, math.inf, "1", True])
async def test_a_bad_max_wait_is_rejected(max_wait: Any, entry_point: str) -> None:
    submit = submitter(entry_point)
    batcher = make(Recorder())
    async with batcher:
        with pytest.raises(InvalidInputError):
            await submit(batcher, "a", 1, max_wait=max_wait)
        assert batcher.stats().retained_items == 0


# --- rule 6: execute's failures --------------------------------------------------------


async def test_every_caller_of_a_batch_gets_the_same_exception(
    autojump_clock: Any, entry_point: str
) -> None:
    boom = RuntimeError("boom")

    async def execute(batch: Batch[Any, Any]) -> list[Any]:
        raise boom

    batcher = make(execute)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1), ("a", 2)])
    assert outcomes[1] == ("error", boom, 0.25)
    assert outcomes[2] == ("error", boom, 0.25)


async def test_a_shared_exceptions_traceback_does_not_pile_up_across_callers(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    submit = submitter(entry_point)

    async def execute(batch: Batch[Any, Any]) -> list[Any]:
        raise RuntimeError("boom")

    batcher = make(execute, max_batch_items=3)
    depths: list[int] = []

    async def call(value: int) -> None:
        try:
            await submit(batcher, "a", value)
        except RuntimeError as exc:
            depths.append(len(traceback.extract_tb(exc.__traceback__)))

    async with batcher, trio.open_nursery() as nursery:
        for value in range(3):
            nursery.start_soon(call, value)
    assert len(depths) == 3 and len(set(depths)) == 1


@pytest.mark.parametrize(
    "answer", [None, 7, "ab", b"ab", {"a": 1, "b": 2}, [1], [1, 2, 3], iter([1, 2])]
)
async def test_a_result_that_is_not_one_per_value_is_a_contract_error(
    autojump_clock: Any, answer: Any, entry_point: str
) -> None:
    async def execute(batch: Batch[Any, Any]) -> Any:
        return answer

    batcher = make(execute, max_batch_items=2)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", 1), ("a", 2)])
    for value in (1, 2):
        kind, error, _ = outcomes[value]
        assert kind == "error" and isinstance(error, BatchContractError)
    assert outcomes[1][1] is outcomes[2][1]


async def test_any_sequence_of_the_right_length_is_accepted(
    autojump_clock: Any, entry_point: str
) -> None:
    async def execute(batch: Batch[Any, Any]) -> Any:
        return range(len(batch.values))

    batcher = make(execute, max_batch_items=2)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", "x"), ("a", "y")])
    assert outcomes["x"][:2] == ("ok", 0) and outcomes["y"][:2] == ("ok", 1)


async def test_the_batcher_keeps_working_after_a_failed_batch(
    autojump_clock: Any, entry_point: str
) -> None:
    submit = submitter(entry_point)
    calls = 0

    async def execute(batch: Batch[Any, Any]) -> list[Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("first batch fails")
        return list(batch.values)

    batcher = make(execute, max_batch_items=1)
    async with batcher:
        with pytest.raises(ValueError, match="first batch fails"):
            await submit(batcher, "a", 1)
        assert await submit(batcher, "a", 2) == 2


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limit",
    [
        "max_batch_items",
        "max_batch_bytes",
        "max_retained_items",
        "max_retained_bytes",
        "max_in_flight_batches",
    ],
)
@pytest.mark.parametrize("bad", [0, -1])
def test_limits_below_one_are_rejected_at_construction(limit: str, bad: int) -> None:
    with pytest.raises(ValueError, match=limit):
        make(Recorder(), **{limit: bad})


@pytest.mark.parametrize("flush", [-0.001, math.nan, math.inf, -math.inf])
def test_a_negative_or_non_finite_flush_is_rejected(flush: float) -> None:
    with pytest.raises(ValueError, match="flush_seconds"):
        make(Recorder(), flush_seconds=flush)


def test_a_zero_flush_is_allowed() -> None:
    assert isinstance(make(Recorder(), flush_seconds=0), BoundedBatchFunction)


@pytest.mark.parametrize("argument", ["execute", "key_id", "estimate_bytes"])
def test_non_callables_are_rejected(argument: str) -> None:
    kwargs: dict[str, Any] = {**DEFAULTS, argument: 42}
    execute = kwargs.pop("execute", Recorder())
    with pytest.raises(TypeError, match=argument):
        BoundedBatchFunction(execute, **kwargs)


@pytest.mark.parametrize("estimate", [-1, 1.5, True, "3", None])
async def test_a_bad_estimate_fails_only_its_caller(
    autojump_clock: Any, estimate: Any, entry_point: str
) -> None:
    execute = Recorder()
    batcher = make(execute, estimate_bytes=lambda v: estimate if v == "bad" else 1)
    outcomes = Outcomes(entry_point)
    async with batcher, trio.open_nursery() as nursery:
        await start_in_order(nursery, outcomes, batcher, [("a", "good"), ("a", "bad")])
        await start_in_order(nursery, outcomes, batcher, [("a", "also good")])
    kind, error, at = outcomes["bad"]
    assert (kind, type(error), at) == ("error", InvalidInputError, 0.0)
    assert execute.executed == [("good", "also good")]
    assert outcomes["good"] == ("ok", ("r", "good"), 0.25)


async def test_an_estimate_that_raises_fails_only_its_caller(
    autojump_clock: Any, entry_point: str
) -> None:
    submit = submitter(entry_point)

    def estimate(value: Any) -> int:
        if value == "bad":
            raise LookupError("cannot size")
        return 1

    execute = Recorder()
    batcher = make(execute, estimate_bytes=estimate)
    async with batcher:
        with pytest.raises(LookupError):
            await submit(batcher, "a", "bad")
        assert await submit(batcher, "a", "good") == ("r", "good")


async def test_an_unhashable_lane_id_fails_only_its_caller(
    autojump_clock: Any, entry_point: str
) -> None:
    submit = submitter(entry_point)
    execute = Recorder()
    batcher = make(execute)
    async with batcher:
        with pytest.raises(TypeError):
            await submit(batcher, ["not", "hashable"], 1)
        assert batcher.stats().retained_items == 0
        assert await submit(batcher, "a", 2) == ("r", 2)


# --- rule 9: statistics ---------------------------------------------------------------


async def test_stats_count_batches_values_and_peaks(autojump_clock: Any, entry_point: str) -> None:
    submit = submitter(entry_point)

    async def execute(batch: Batch[Any, Any]) -> list[Any]:
        await trio.sleep(1)
        return list(batch.values)

    batcher = make(execute, max_batch_items=2, estimate_bytes=len)
    async with batcher, trio.open_nursery() as nursery:
        for value in ("a", "bb", "ccc", "dddd", "eeeee"):
            nursery.start_soon(submit, batcher, "lane", value)
    stats = batcher.stats()
    assert isinstance(stats, BatcherStatistics)
    assert (stats.batches, stats.values) == (3, 5)
    assert (stats.peak_retained_items, stats.peak_retained_bytes) == (5, 15)
    # Two full batches ran from t=0 and the fifth value flushed alone at 0.25.
    assert stats.peak_in_flight == 3
    assert (stats.retained_items, stats.retained_bytes, stats.in_flight, stats.lanes) == (
        0,
        0,
        0,
        0,
    )


async def test_a_lane_that_lingered_behind_the_in_flight_cap_flushes_on_time(
    autojump_clock: Any,
    entry_point: str,
) -> None:
    # The scheduler's last look (at 0.35, when d wedged) found the in-flight cap
    # reached and so armed no flush timer; finishing z must re-arm it for c.
    execute = Recorder()
    gate = execute.hold("z1")
    batcher = make(execute, max_batch_items=2, max_in_flight_batches=1)
    outcomes = Outcomes(entry_point)
    with trio.fail_after(10):
        async with batcher, trio.open_nursery() as nursery:
            await start_in_order(nursery, outcomes, batcher, [("z", "z1"), ("z", "z2")])
            await start_in_order(nursery, outcomes, batcher, [("b", "b1")])
            await start_in_order(nursery, outcomes, batcher, [("d", "d1")], max_wait=0.375)
            await trio.sleep(0.3125)
            await start_in_order(nursery, outcomes, batcher, [("c", "c1")])
            await trio.sleep(0.125)
            assert isinstance(outcomes["d1"][1], LaneWedgedError)
            gate.set()
    assert execute.batches == [
        (0.0, "z", ("z1", "z2")),
        (0.4375, "b", ("b1",)),
        (0.5625, "c", ("c1",)),
    ]
