"""A runner wakes a deep lane's callers in rounds, not in one wave (see _WAKE_ROUND)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from sheetplane import BatcherClosedError, BoundedBatchFunction
from sheetplane.batching import Batch

CALLERS = 512
BATCH = 4


def _batcher(execute: Any) -> BoundedBatchFunction[int, int, int]:
    return BoundedBatchFunction(
        execute,
        max_batch_items=BATCH,
        max_batch_bytes=1 << 20,
        max_retained_items=CALLERS,
        max_retained_bytes=1 << 20,
        max_in_flight_batches=8,
        flush_seconds=1.0,
    )


async def test_a_deep_lanes_first_callers_run_before_its_last_batch_starts() -> None:
    """Once hundreds of values are queued in one lane, the first callers woken get to
    run (and submit again) before the runner has started every batch of the lane: the
    runner yields between rounds instead of waking all of them in one step."""
    started = 0

    async def execute(batch: Batch[int, int]) -> tuple[int, ...]:
        nonlocal started
        started += 1
        return batch.values

    seen: list[int] = []
    batcher = _batcher(execute)
    async with batcher, trio.open_nursery() as nursery:

        async def caller(value: int) -> None:
            assert await batcher.submit(0, value) == value
            seen.append(started)

        for value in range(CALLERS):
            nursery.start_soon(caller, value)
    assert len(seen) == CALLERS and batcher.stats().batches == CALLERS // BATCH
    assert min(seen) < CALLERS // BATCH  # woken while later batches were still queued


@pytest.mark.parametrize("when", [1, 20, 40])
async def test_a_teardown_while_a_runner_yields_between_rounds_settles_every_caller(
    when: int,
) -> None:
    """Leaving the block by an exception while a runner is between two rounds: every
    caller gets its result or BatcherClosedError, none is left waiting."""
    started = 0

    async def execute(batch: Batch[int, int]) -> tuple[int, ...]:
        nonlocal started
        started += 1
        if started == when:
            raise_in_body.set()
        return batch.values

    raise_in_body = trio.Event()
    results: dict[int, object] = {}

    async def caller(value: int) -> None:
        try:
            results[value] = await batcher.submit(0, value)
        except BatcherClosedError as error:
            results[value] = error

    batcher = _batcher(execute)
    left = False
    try:
        async with trio.open_nursery() as nursery, batcher:
            for value in range(CALLERS):
                nursery.start_soon(caller, value)
            await raise_in_body.wait()
            raise KeyError("leave")
    except* KeyError:
        left = True
    assert left and len(results) == CALLERS
    assert all(r == v or isinstance(r, BatcherClosedError) for v, r in results.items())
    assert any(isinstance(r, BatcherClosedError) for r in results.values())


async def test_a_runner_settling_values_nobody_awaits_still_yields_between_rounds() -> None:
    """Values from submit_nowait wake nobody, so they do not count towards the rounds
    of woken callers; a runner draining thousands of them (an execute that never
    checkpoints) still lets other tasks run before the lane's last batch starts."""
    started = 0

    async def execute(batch: Batch[int, int]) -> tuple[int, ...]:
        nonlocal started
        started += 1
        return batch.values

    total = 4096
    batcher = BoundedBatchFunction(
        execute,
        max_batch_items=BATCH,
        max_batch_bytes=1 << 20,
        max_retained_items=total,
        max_retained_bytes=1 << 20,
        max_in_flight_batches=8,
        flush_seconds=1.0,
    )
    seen: list[int] = []
    async with batcher:
        pendings = [batcher.submit_nowait(0, value) for value in range(total)]
        while not pendings[-1].done:
            await trio.lowlevel.checkpoint()
            seen.append(started)
    assert [pending.result() for pending in pendings] == list(range(total))
    assert any(0 < count < total // BATCH for count in seen)
