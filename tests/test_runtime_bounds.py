"""Bounds a runner relies on: a million-row iteration holds one page of rows and a bounded
batcher, and a runner cancelled mid-iteration leaves no task, thread or session connection."""

from __future__ import annotations

import random
import threading
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing

from _runtime_helpers import (
    NULL_TAIL,
    ROADS,
    CountingGateway,
    Seed,
    counting_gateway,
    new_play,
    no_session_connections,
    runtime,
    seeding,
    session_connections,
    sheet_of,
)
from sheetplane.budgets import (
    READ_BATCH_MAX_RESPONSE_BYTES,
    READ_BATCH_MAX_RETAINED_PAGES,
    READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
)
from sheetplane.runtime import Strategy
from sheetplane.store import SheetStore

#: What iterating may hold at its peak, whatever the sheet's length: the rows of
#: one page as Python objects stay well under the decoded response budget.
ITERATION_MEMORY_BUDGET_BYTES = READ_BATCH_MAX_RESPONSE_BYTES


@pytest.fixture
async def seeded(store: SheetStore) -> AsyncIterator[Seed]:
    async with seeding(store) as seed:
        yield seed


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


async def random_reads(dataset: Any, size: int, calls: int, seed: int) -> None:
    """``calls`` random ``at`` calls, 16 at a time, each checked against its index.

    Indexes stay among the first ``size`` rows: an ``at`` is an offset read,
    which costs Postgres the rows it skips.
    """
    rng = random.Random(seed)
    for _ in range(calls // 16):
        async with trio.open_nursery() as nursery:
            for index in rng.sample(range(size - NULL_TAIL), 16):

                async def one(i: int = index) -> None:
                    row = await dataset.at(i)
                    assert row is not None and row["_input_index"] == i

                nursery.start_soon(one)


@pytest.mark.heavy(42)
async def test_iterating_a_million_rows_holds_one_page_and_a_bounded_batcher(
    gateway: CountingGateway,
    store: SheetStore,
    seeded: Seed,
    record_property: Callable[[str, object], None],
) -> None:
    """Both roads over one seeded sheet. tracemalloc slows allocation-heavy code about
    tenfold, so it traces two windows of each iteration, the first and the last tenth:
    rows held past their page would show as a peak that grows with the window's
    position, and over the budget. The gateway runs in this process, so its side of
    each read (rows decoded, the JSON body) is traced too."""
    n, window = 1_000_000, 100_000
    play, ns = new_play(), "big"
    await seeded(sheet_of(play, ns), n)
    for strategy in ROADS:
        peaks: list[int] = []
        async with runtime(gateway, strategy, play=play) as rt:
            dataset = rt.dataset(ns)
            await dataset.at(0)  # sessions minted, connections open, before measuring
            seen, last_index = 0, -1
            try:
                async with trio.open_nursery() as nursery:
                    tracemalloc.start()
                    nursery.start_soon(random_reads, dataset, 50_000, 512, 11)
                    async for row in dataset:
                        index = row["_input_index"]
                        if index is not None:
                            assert index == last_index + 1
                            last_index = index
                        seen += 1
                        if seen in (window, n):
                            peaks.append(tracemalloc.get_traced_memory()[1])
                            tracemalloc.stop()
                        elif seen == n - window:
                            tracemalloc.start()
            finally:
                tracemalloc.stop()
            stats = rt.stats()
        record_property(f"{strategy}_iteration_peak_traced_bytes", peaks)
        record_property(
            f"{strategy}_batcher_peak_retained_request_bytes", stats.peak_retained_request_bytes
        )
        print(
            f"1M rows, {strategy}: tracemalloc peaks {[round(p / 2**20, 1) for p in peaks]} MiB "
            f"(first and last {window:,} rows), batcher peak retained "
            f"{stats.peak_retained_request_bytes} B over {stats.page_reads} page reads"
        )
        assert seen == n
        assert stats.page_reads >= 512
        assert 0 < stats.peak_retained_request_bytes <= READ_BATCH_MAX_RETAINED_REQUEST_BYTES
        assert rt.reader.stats().peak_retained_items <= READ_BATCH_MAX_RETAINED_PAGES
        assert len(peaks) == 2
        assert max(peaks) <= ITERATION_MEMORY_BUDGET_BYTES


def runner_tasks() -> list[str]:
    """Names of the live trio tasks that run sheetplane's runner-side code."""
    names, stack = [], [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task.name.startswith("sheetplane.") and not task.name.startswith(
            "sheetplane.gateway.server"
        ):
            names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return names


def busy_threads() -> set[str]:
    """The runner side's threads, less trio's idle cached workers ("Trio thread N" while idle).

    The reference gateway runs in this process too; a request it is still
    answering after the runner hung up may hold a worker thread (named for
    hypercorn's task) until its answer is encoded. That is the server's, not
    the runner's, so it is left out.
    """
    return {
        t.name
        for t in threading.enumerate()
        if not t.name.startswith("Trio thread") and "hypercorn" not in t.name
    }


#: How long a worker cancelled while it waited for a pooled connection may take to
#: return: ``TrioPool`` does not wait for it (nothing runs on the server), and it
#: returns once the pool it waited on is closed.
THREAD_EXIT_S = 5.0


async def threads_beyond(before: set[str]) -> set[str]:
    """Busy threads not in ``before``, once they have had ``THREAD_EXIT_S`` to finish."""
    with trio.move_on_after(THREAD_EXIT_S):
        # A thread's end cannot be awaited from trio without holding it; poll the list.
        while busy_threads() - before:  # noqa: ASYNC110
            await trio.sleep(THREAD_EXIT_S / 100)
        return set()
    return busy_threads() - before


@pytest.mark.parametrize("strategy", ROADS)
async def test_cancelling_a_runner_mid_iteration_leaves_nothing_behind(
    gateway: CountingGateway, store: SheetStore, seeded: Seed, strategy: Strategy
) -> None:
    n = 40_000
    play, ns = new_play(), "leads"
    await seeded(sheet_of(play, ns), n)
    threads_before = busy_threads()
    assert runner_tasks() == []
    seen = 0
    with trio.CancelScope() as scope:
        async with runtime(gateway, strategy, play=play) as rt:
            dataset = rt.dataset(ns)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(random_reads, dataset, n, 10_000, 3)
                async for _row in dataset:
                    seen += 1
                    if seen == 12_345:
                        assert runner_tasks() != []  # the reader's and the pools' tasks
                        if strategy == "direct":
                            assert await session_connections(store) != []
                        scope.cancel()
    assert scope.cancelled_caught
    assert 12_345 <= seen < n
    await trio.testing.wait_all_tasks_blocked()
    assert runner_tasks() == []
    assert await threads_beyond(threads_before) == set()
    assert await no_session_connections(store) == []
