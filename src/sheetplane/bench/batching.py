"""Batching benchmark: ``BoundedBatchFunction`` (trio) against aiodataloader (asyncio).

One workload, both in this process, run after run: ``callers`` concurrent
callers each submit ``values`` values one after another (each waits for its
result before the next), batches of ``batch`` values, and an ``execute`` that
returns its inputs. aiodataloader runs with its cache off, so it batches
every value as ``BoundedBatchFunction`` does (which has no cache).

``BoundedBatchFunction`` runs with every bound enforced and none throttling:
batch items and bytes, retained items (``callers``: one value per caller can
be outstanding) and bytes, an in-flight cap, the page reader's flush linger
(``READ_BATCH_FLUSH_MS``) and a per-value ``max_wait`` (``MAX_QUEUE_WAIT_MS``).
Each value is its own estimate of 1 byte (the default).

A second pair measures the non-waiting entry points: one producer task queues
the same ``callers x values`` values with ``batcher.submit_nowait`` (no task
per value), keeping at most ``callers`` outstanding (the retained-items cap:
where it raises ``trio.WouldBlock`` the producer awaits its oldest value),
against aiodataloader's ``load`` (a future per value, no task) with the same
window of outstanding values. Every result is read and checked on both sides:
aiodataloader's futures each awaited in turn (``await`` of a done future does
not suspend); on trio the oldest value awaited (``await pending.wait()``) and
each settled one after it read without waiting (``pending.result()``).

A third column is a floor for context, not a peer: the same callers on trio
with no batcher at all, only the park/reschedule round trip every trio
batcher needs (every fourth caller wakes its batch inline with one object
that each caller reads its slot from, as the batcher's callers do; no
bounds, no deadlines, no cancellation). It shows how much of the per-value
budget trio's own scheduling takes on this machine.

The figure is values per second, timed inside each event loop from the first
caller's start to the last result (loop start-up excluded on every side).
Each run starts after a full garbage collection, on every side alike.
The report gives every run, the medians and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from .._plain import PlainHelpFormatter
from ..batching import Batch, BoundedBatchFunction, Pending
from ..budgets import (
    MAX_QUEUE_WAIT_MS,
    READ_BATCH_FLUSH_MS,
    READ_BATCH_MAX_REQUEST_BYTES,
    READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
)

CALLERS = 2_000
VALUES_PER_CALLER = 25
BATCH_ITEMS = 4
RUNS = 5
#: ``execute`` calls allowed at once; a trivial execute never holds more than a few.
IN_FLIGHT = 64


@attrs.frozen
class Workload:
    """The benchmark's shape."""

    callers: int
    """Concurrent callers."""
    values: int
    """Values each caller submits, one after another."""
    batch: int
    """Values per batch."""

    @property
    def total(self) -> int:
        """Values submitted in one run."""
        return self.callers * self.values


@attrs.frozen
class Result:
    """Values per second of every run, for both sides."""

    ours: tuple[float, ...]
    """``BoundedBatchFunction`` values/s, run by run."""
    peer: tuple[float, ...]
    """aiodataloader values/s, run by run."""
    floor: tuple[float, ...]
    """Bare trio park/reschedule values/s, run by run (empty when not run)."""
    ours_nowait: tuple[float, ...] = ()
    """``submit_nowait`` values/s, run by run."""
    peer_nowait: tuple[float, ...] = ()
    """aiodataloader ``load`` futures values/s, run by run."""

    @property
    def ratio(self) -> float:
        """Median ours / median peer (``await submit`` against awaited ``load``)."""
        return statistics.median(self.ours) / statistics.median(self.peer)

    @property
    def nowait_ratio(self) -> float:
        """Median ours / median peer for the non-waiting entry points."""
        return statistics.median(self.ours_nowait) / statistics.median(self.peer_nowait)


async def _echo(batch: Batch[int, tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return batch.values


def _batcher(workload: Workload) -> BoundedBatchFunction[int, tuple[int, int], tuple[int, int]]:
    """The batcher both of its sides use: every bound enforced, none throttling."""
    return BoundedBatchFunction(
        _echo,
        max_batch_items=workload.batch,
        max_batch_bytes=READ_BATCH_MAX_REQUEST_BYTES,
        max_retained_items=workload.callers,
        max_retained_bytes=READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
        max_in_flight_batches=IN_FLIGHT,
        flush_seconds=READ_BATCH_FLUSH_MS / 1000,
    )


def run_bounded(workload: Workload) -> float:
    """One run of ``BoundedBatchFunction``; returns values/s."""

    async def main() -> float:
        batcher = _batcher(workload)
        max_wait = MAX_QUEUE_WAIT_MS / 1000
        wrong = 0

        async def caller(index: int) -> None:
            nonlocal wrong
            for step in range(workload.values):
                value = (index, step)
                if await batcher.submit(0, value, max_wait=max_wait) != value:
                    wrong += 1

        started = time.perf_counter()
        async with batcher, trio.open_nursery() as nursery:
            for index in range(workload.callers):
                nursery.start_soon(caller, index)
        elapsed = time.perf_counter() - started
        stats = batcher.stats()
        if wrong or stats.values != workload.total:
            raise AssertionError(f"BoundedBatchFunction answered wrongly: {wrong}, {stats}")
        return workload.total / elapsed

    return trio.run(main)


def run_bounded_nowait(workload: Workload) -> float:
    """One run of ``submit_nowait`` from one producer task; returns values/s."""

    async def main() -> float:
        batcher = _batcher(workload)
        max_wait = MAX_QUEUE_WAIT_MS / 1000
        wrong = 0
        window: deque[tuple[tuple[int, int], Pending[int, tuple[int, int]]]] = deque()

        async def settle_oldest() -> None:
            """Wait for the oldest value, then take every settled one after it."""
            nonlocal wrong
            value, pending = window.popleft()
            if await pending.wait() != value:
                wrong += 1
            while window and window[0][1].done:
                value, pending = window.popleft()
                if pending.result() != value:
                    wrong += 1

        started = time.perf_counter()
        async with batcher:
            for index in range(workload.total):
                value = (index % workload.callers, index // workload.callers)
                while True:
                    try:
                        pending = batcher.submit_nowait(0, value, max_wait=max_wait)
                    except trio.WouldBlock:
                        await settle_oldest()
                    else:
                        break
                window.append((value, pending))
            while window:
                await settle_oldest()
        elapsed = time.perf_counter() - started
        stats = batcher.stats()
        if wrong or stats.values != workload.total:
            raise AssertionError(f"submit_nowait answered wrongly: {wrong}, {stats}")
        return workload.total / elapsed

    return trio.run(main)


def run_aiodataloader_futures(workload: Workload) -> float:
    """One run of aiodataloader's ``load`` futures from one producer; returns values/s."""
    from aiodataloader import DataLoader

    async def load(keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return list(keys)

    async def main() -> float:
        loader = DataLoader(load, max_batch_size=workload.batch, cache=False)
        wrong = 0
        window: deque[tuple[tuple[int, int], asyncio.Future[tuple[int, int]]]] = deque()

        async def settle_oldest() -> None:
            nonlocal wrong
            value, future = window.popleft()
            if await future != value:
                wrong += 1

        started = time.perf_counter()
        for index in range(workload.total):
            value = (index % workload.callers, index // workload.callers)
            if len(window) >= workload.callers:
                await settle_oldest()
            window.append((value, loader.load(value)))
        while window:
            await settle_oldest()
        elapsed = time.perf_counter() - started
        if wrong:
            raise AssertionError(f"aiodataloader futures answered wrongly: {wrong}")
        return workload.total / elapsed

    return asyncio.run(main())


def run_aiodataloader(workload: Workload) -> float:
    """One run of aiodataloader's DataLoader (cache off); returns values/s."""
    from aiodataloader import DataLoader

    async def load(keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return list(keys)

    async def main() -> float:
        loader = DataLoader(load, max_batch_size=workload.batch, cache=False)
        wrong = 0

        async def caller(index: int) -> None:
            nonlocal wrong
            for step in range(workload.values):
                value = (index, step)
                if await loader.load(value) != value:
                    wrong += 1

        started = time.perf_counter()
        await asyncio.gather(*(caller(index) for index in range(workload.callers)))
        elapsed = time.perf_counter() - started
        if wrong:
            raise AssertionError(f"aiodataloader answered wrongly: {wrong}")
        return workload.total / elapsed

    return asyncio.run(main())


class _FloorBatch:
    """The floor's outcome of one batch: every caller of it is woken with this one
    object and reads its own slot, as the batcher's callers do (one object a batch,
    not an ``outcome.Value`` a value)."""

    __slots__ = ("values",)

    def __init__(self, values: list[tuple[int, int]]) -> None:
        self.values = values

    def unwrap(self) -> list[tuple[int, int]]:
        return self.values


def run_trio_floor(workload: Workload) -> float:
    """Trio's park/reschedule round trip alone, batched inline with no bounds; values/s."""

    def no_abort(raise_cancel: Any) -> trio.lowlevel.Abort:
        return trio.lowlevel.Abort.FAILED  # the floor is never cancelled

    async def main() -> float:
        values: list[tuple[int, int]] = []
        tasks: list[trio.lowlevel.Task] = []
        wrong = 0

        async def submit(value: tuple[int, int]) -> Any:
            nonlocal values, tasks
            index = len(values)
            values.append(value)
            tasks.append(trio.lowlevel.current_task())
            if index + 1 == workload.batch:
                woken = _FloorBatch(values)
                for task in tasks:
                    trio.lowlevel.reschedule(task, woken)  # type: ignore[arg-type]
                values, tasks = [], []
            return (await trio.lowlevel.wait_task_rescheduled(no_abort))[index]

        async def caller(index: int) -> None:
            nonlocal wrong
            for step in range(workload.values):
                value = (index, step)
                if await submit(value) != value:
                    wrong += 1

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index in range(workload.callers):
                nursery.start_soon(caller, index)
        elapsed = time.perf_counter() - started
        if wrong:
            raise AssertionError(f"the trio floor answered wrongly: {wrong}")
        return workload.total / elapsed

    if workload.callers % workload.batch:
        # Callers then move in lockstep (every one is woken each round), so no
        # caller is ever left alone in a batch that nobody else will fill.
        raise ValueError("the trio floor needs a caller count divisible by the batch size")
    return trio.run(main)


def run_bench(workload: Workload, runs: int) -> Result:
    """``runs`` rounds; each round runs every side, rotating which goes first. The
    floor is left out (no figures) unless the caller count divides into batches."""
    sides: tuple[Any, ...] = (
        run_bounded,
        run_aiodataloader,
        run_bounded_nowait,
        run_aiodataloader_futures,
        run_trio_floor,
    )
    if workload.callers % workload.batch:
        sides = sides[:-1]
    figures: dict[Any, list[float]] = {side: [] for side in sides}
    for round_ in range(runs):
        for offset in range(len(sides)):
            side = sides[(round_ + offset) % len(sides)]
            # Every side starts from the same collector state: garbage a previous
            # run left (and the count towards a full collection) is not billed to
            # whichever side happens to run next.
            gc.collect()
            figures[side].append(side(workload))
    return Result(
        tuple(figures[run_bounded]),
        tuple(figures[run_aiodataloader]),
        tuple(figures.get(run_trio_floor, ())),
        tuple(figures[run_bounded_nowait]),
        tuple(figures[run_aiodataloader_futures]),
    )


def report(workload: Workload, result: Result) -> Any:
    """A rich table of every run, the medians and the ratio."""
    from rich.table import Table

    table = Table(
        title=(
            f"batching: {workload.callers:,} callers x {workload.values} values, "
            f"batches of {workload.batch}; BoundedBatchFunction and the floor on trio, "
            "aiodataloader on asyncio"
        )
    )
    table.add_column("run", justify="right")
    table.add_column("BoundedBatchFunction values/s", justify="right")
    table.add_column("aiodataloader values/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("submit_nowait values/s", justify="right")
    table.add_column("load futures values/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("trio floor values/s", justify="right")
    floors = [f"{floor:,.0f}" for floor in result.floor] or ["-"] * len(result.ours)
    nowaits = zip(result.ours_nowait, result.peer_nowait, strict=True)
    rows = zip(result.ours, result.peer, nowaits, floors, strict=True)
    for index, (ours, peer, (nowait, futures), floor) in enumerate(rows, 1):
        table.add_row(
            str(index),
            f"{ours:,.0f}",
            f"{peer:,.0f}",
            f"{ours / peer:.2f}x",
            f"{nowait:,.0f}",
            f"{futures:,.0f}",
            f"{nowait / futures:.2f}x",
            floor,
        )
    median = statistics.median
    table.add_row(
        "median",
        f"{median(result.ours):,.0f}",
        f"{median(result.peer):,.0f}",
        f"{result.ratio:.2f}x",
        f"{median(result.ours_nowait):,.0f}",
        f"{median(result.peer_nowait):,.0f}",
        f"{result.nowait_ratio:.2f}x",
        f"{median(result.floor):,.0f}" if result.floor else "-",
        style="bold",
    )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """Run the batching benchmark and print values/s per run, the medians and the ratio."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench batching", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument(
        "--callers", type=int, default=CALLERS, help=f"concurrent callers (default {CALLERS:,})"
    )
    parser.add_argument(
        "--values",
        type=int,
        default=VALUES_PER_CALLER,
        help=f"values each caller submits, one after another (default {VALUES_PER_CALLER})",
    )
    parser.add_argument(
        "--batch", type=int, default=BATCH_ITEMS, help=f"values a batch (default {BATCH_ITEMS})"
    )
    parser.add_argument(
        "--runs", type=int, default=RUNS, help=f"runs of each side; medians (default {RUNS})"
    )
    args = parser.parse_args(argv)
    for name in ("callers", "values", "batch", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    workload = Workload(callers=args.callers, values=args.values, batch=args.batch)
    result = run_bench(workload, args.runs)

    from rich.console import Console

    console = Console()
    console.print(report(workload, result))
    console.print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    console.print(
        f"median ratio BoundedBatchFunction / aiodataloader: {result.ratio:.2f}x (target >= 1.00x)"
    )
    console.print(
        f"median ratio submit_nowait / aiodataloader load futures: {result.nowait_ratio:.2f}x "
        "(target >= 1.50x)"
    )
    if result.floor:
        floor = statistics.median(result.floor)
        peer, ours = statistics.median(result.peer), statistics.median(result.ours)
        console.print(
            f"for context: trio floor / aiodataloader {floor / peer:.2f}x, "
            f"BoundedBatchFunction / trio floor {ours / floor:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
