"""Dataset and InMemoryDataset over a fake road: order, O(rows) iteration, bounds, cancellation."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from _fake_road import FakeRoad, make_rows
from sheetplane import BatchContractError, InvalidInputError, ReadBatchTooLargeError
from sheetplane.budgets import (
    READ_BATCH_MAX_PAGES,
    READ_BATCH_MAX_RETAINED_PAGES,
    READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
    READ_PAGE_MAX_ROWS,
)
from sheetplane.dataset import Dataset, DatasetIterator, InMemoryDataset, PageSizer
from sheetplane.pages import PageReader


@asynccontextmanager
async def open_dataset(road: FakeRoad, page_rows: int = 100) -> AsyncIterator[Dataset]:
    async with PageReader() as reader:
        yield Dataset(reader, road, page_rows=page_rows)


async def test_iteration_is_in_read_order_with_one_keyset_read_per_page() -> None:
    road = FakeRoad(make_rows(1_050))
    async with open_dataset(road) as dataset:
        rows = [row async for row in dataset]
    assert rows == road.rows
    assert len(road.after_calls) == math.ceil(1_050 / 100)
    assert [limit for _, limit in road.after_calls] == [100] * 11
    cursors = [cursor for cursor, _ in road.after_calls]
    assert cursors[0] is None and len(set(cursors)) == len(cursors)
    assert road.batch_calls == []  # sequential iteration never pages by offset


async def test_iteration_reads_grow_linearly_with_rows() -> None:
    small, large = FakeRoad(make_rows(500)), FakeRoad(make_rows(5_000))
    for road in (small, large):
        async with open_dataset(road, page_rows=50) as dataset:
            assert [row async for row in dataset] == road.rows
    assert len(large.after_calls) == 10 * len(small.after_calls)


async def test_an_exact_multiple_of_the_page_ends_without_an_empty_read() -> None:
    road = FakeRoad(make_rows(300))
    async with open_dataset(road) as dataset:
        assert len([row async for row in dataset]) == 300
    assert len(road.after_calls) == 3


async def test_materialize_respects_its_limit_and_reads_no_further() -> None:
    road = FakeRoad(make_rows(1_000))
    async with open_dataset(road) as dataset:
        assert await dataset.materialize(limit=250) == road.rows[:250]
        assert [limit for _, limit in road.after_calls] == [100, 100, 50]
        assert await dataset.materialize(limit=0) == []
        assert await dataset.materialize() == road.rows


async def test_peek_at_and_count() -> None:
    road = FakeRoad(make_rows(30))
    async with open_dataset(road) as dataset:
        assert await dataset.count() == 30
        assert await dataset.peek(5) == road.rows[:5]
        assert await dataset.peek(0) == []
        assert await dataset.peek(100) == road.rows
        assert await dataset.at(29) == road.rows[29]
        assert await dataset.at(30) is None


async def test_peek_clamps_like_the_runtime() -> None:
    # The runtime's peek: limit <= 0 answers [] unread; above READ_PAGE_MAX_ROWS, that many.
    road = FakeRoad(make_rows(READ_PAGE_MAX_ROWS + 10))
    async with open_dataset(road, page_rows=READ_PAGE_MAX_ROWS) as dataset:
        assert await dataset.peek(-3) == []
        assert await dataset.peek(0) == []
        assert road.batch_calls == [] and road.after_calls == []
        assert await dataset.peek(READ_PAGE_MAX_ROWS + 5) == road.rows[:READ_PAGE_MAX_ROWS]
    assert road.after_calls == []
    in_memory = InMemoryDataset(road.rows)
    assert await in_memory.peek(-1) == []
    assert await in_memory.peek(READ_PAGE_MAX_ROWS + 5) == road.rows[:READ_PAGE_MAX_ROWS]


async def test_concurrent_at_calls_coalesce_into_batch_reads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(64), delay=0.01)
    found: dict[int, Any] = {}
    async with open_dataset(road) as dataset:

        async def fetch(index: int) -> None:
            found[index] = await dataset.at(index)

        async with trio.open_nursery() as nursery:
            for index in range(64):
                nursery.start_soon(fetch, index)
    assert found == dict(enumerate(road.rows))
    assert len(road.batch_calls) == 64 // READ_BATCH_MAX_PAGES


async def test_iteration_halves_pages_under_a_byte_budget_and_stays_exact() -> None:
    road = FakeRoad(make_rows(200, pad=100), budget=1_500)  # eight rows a read
    async with open_dataset(road) as dataset:
        assert [row async for row in dataset] == road.rows
    limits = [limit for _, limit in road.after_calls]
    assert limits[:8] == [100, 50, 25, 13, 7, 10, 8, 9]  # halve, then search between 7 and 13
    assert limits[8:12] == [8, 8, 8, 8]  # settled
    assert len(limits) <= 200 // 8 + 12  # settling plus rare probes: O(rows) reads


async def test_iteration_re_raises_a_single_row_over_budget() -> None:
    rows = make_rows(5)
    rows[3] = {**rows[3], "pad": "y" * 5_000}
    road = FakeRoad(rows, budget=1_000)
    seen: list[dict[str, Any]] = []
    async with open_dataset(road) as dataset:
        with pytest.raises(ReadBatchTooLargeError):
            async for row in dataset:
                seen.append(row)
    assert seen == rows[:3]
    assert road.after_calls[-1][1] == 1


async def test_read_after_answering_more_than_asked_is_a_contract_error() -> None:
    class Greedy(FakeRoad):
        async def read_after(
            self, cursor: object | None, limit: int
        ) -> tuple[list[dict[str, Any]], object | None]:
            return list(self.rows), None

    async with open_dataset(Greedy(make_rows(10)), page_rows=3) as dataset:
        with pytest.raises(BatchContractError):
            await dataset.materialize()


async def test_a_road_that_stops_advancing_cannot_make_iteration_loop() -> None:
    class Stuck(FakeRoad):
        async def read_after(
            self, cursor: object | None, limit: int
        ) -> tuple[list[dict[str, Any]], object | None]:
            self.after_calls.append((cursor, limit))
            return [], "same cursor"

    road = Stuck(make_rows(10))
    async with open_dataset(road) as dataset:
        assert await dataset.materialize() == []
    assert len(road.after_calls) == 1


async def test_reader_budgets_hold_while_iterating_and_peeking(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(2_000), delay=0.001)
    async with PageReader() as reader:
        dataset = Dataset(reader, road, page_rows=100)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dataset.materialize)
            for index in range(0, 2_000, 37):
                nursery.start_soon(dataset.at, index)
            for n in (1, 10, 100):
                nursery.start_soon(dataset.peek, n)
        stats = reader.stats()
    assert stats.peak_retained_items <= READ_BATCH_MAX_RETAINED_PAGES
    assert stats.peak_retained_bytes <= READ_BATCH_MAX_RETAINED_REQUEST_BYTES
    assert stats.values == len(range(0, 2_000, 37)) + 3


def all_tasks() -> set[trio.lowlevel.Task]:
    found: set[trio.lowlevel.Task] = set()
    pending = [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        if task is None:
            continue
        found.add(task)
        for nursery in task.child_nurseries:
            pending.extend(nursery.child_tasks)
    return found


async def test_cancelling_mid_iteration_leaves_no_task_behind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(10_000), delay=0.001)
    before = all_tasks()
    seen = 0
    with trio.move_on_after(0.0105) as cancel_scope:
        async with PageReader() as reader:
            dataset = Dataset(reader, road, page_rows=100)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(dataset.at, 9_999)
                async for _row in dataset:
                    seen += 1
    assert cancel_scope.cancelled_caught
    assert 0 < seen < 10_000
    await trio.testing.wait_all_tasks_blocked()
    assert all_tasks() == before


async def test_iterator_cancelled_mid_read_resumes_at_the_same_page(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(250), delay=1.0)
    async with open_dataset(road) as dataset:
        iterator = aiter(dataset)
        first = [await anext(iterator) for _ in range(100)]
        with trio.move_on_after(0.5):
            await anext(iterator)
        rest = [row async for row in iterator]
    assert first + rest == road.rows


@pytest.mark.parametrize(
    "call",
    [
        lambda d: d.at(-1),
        lambda d: d.at(1.5),
        lambda d: d.peek(None),
        lambda d: d.peek(2.0),
        lambda d: d.materialize(limit=-1),
        lambda d: d.materialize(limit=True),
    ],
)
async def test_bad_arguments_are_refused(call: Any) -> None:
    road = FakeRoad(make_rows(3))
    async with open_dataset(road) as dataset:
        with pytest.raises(InvalidInputError):
            await call(dataset)
    with pytest.raises(InvalidInputError):
        await call(InMemoryDataset(road.rows))
    assert road.batch_calls == [] and road.after_calls == []


@pytest.mark.parametrize("page_rows", [0, READ_PAGE_MAX_ROWS + 1, 2.0])
async def test_bad_page_rows_are_refused(page_rows: Any) -> None:
    async with PageReader() as reader:
        with pytest.raises(InvalidInputError):
            Dataset(reader, FakeRoad(make_rows(1)), page_rows=page_rows)


async def test_in_memory_dataset_answers_like_a_road_backed_one() -> None:
    road = FakeRoad(make_rows(250))
    memory = InMemoryDataset(road.rows)
    async with open_dataset(road) as lazy:
        for dataset in (lazy, memory):
            assert await dataset.count() == 250
            assert await dataset.peek(7) == road.rows[:7]
            assert await dataset.at(249) == road.rows[249]
            assert await dataset.at(250) is None
            assert await dataset.materialize(limit=120) == road.rows[:120]
            assert await dataset.materialize() == road.rows
            assert [row async for row in dataset] == road.rows


async def test_in_memory_dataset_copies_its_rows() -> None:
    source = [{"a": 1}]
    dataset = InMemoryDataset(source)
    source[0]["a"] = 2
    source.append({"a": 3})
    assert await dataset.materialize() == [{"a": 1}]


async def test_in_memory_iteration_is_cancellable() -> None:
    dataset = InMemoryDataset({"i": i} for i in range(10))
    seen: list[Any] = []
    with trio.CancelScope() as cancel_scope:
        async for row in dataset:
            seen.append(row)
            if len(seen) == 3:
                cancel_scope.cancel()
    assert len(seen) == 3


CSV_TEXT = 'name,city\nAda,"London, UK"\nGrace,Arlington\n'


async def test_from_csv_text() -> None:
    dataset = InMemoryDataset.from_csv(CSV_TEXT)
    assert await dataset.materialize() == [
        {"name": "Ada", "city": "London, UK"},
        {"name": "Grace", "city": "Arlington"},
    ]


async def test_from_csv_path(tmp_path: Path) -> None:
    path = tmp_path / "input.csv"
    path.write_text("\ufeff" + CSV_TEXT, encoding="utf-8")  # a BOM, as spreadsheets write
    dataset = InMemoryDataset.from_csv(path)
    assert await dataset.count() == 2
    assert await dataset.at(0) == {"name": "Ada", "city": "London, UK"}


def test_from_csv_refuses_other_sources() -> None:
    with pytest.raises(TypeError):
        InMemoryDataset.from_csv(b"name\nAda\n")  # type: ignore[arg-type]


def simulate(sizer: PageSizer, fits: int, reads: int) -> tuple[int, int]:
    """``reads`` reads that fit, when ``fits`` rows fit a read; returns (failures, rows)."""
    failures = rows = 0
    for _ in range(reads):
        while (limit := sizer.next_limit()) > fits:
            sizer.too_large(limit)
            failures += 1
        sizer.fitted(limit)
        rows += limit
    return failures, rows


def test_page_sizer_settles_on_the_largest_size_that_fits() -> None:
    sizer = PageSizer(5_000)
    failures, _ = simulate(sizer, fits=777, reads=20)
    assert sizer.next_limit() == 777
    assert failures <= 2 * math.ceil(math.log2(5_000))


def test_page_sizer_probes_get_rare_when_rows_stay_the_same_size() -> None:
    sizer = PageSizer(5_000)
    simulate(sizer, fits=777, reads=20)
    failures, rows = simulate(sizer, fits=777, reads=10_000)
    assert failures <= 3 * math.ceil(math.log2(10_000))
    assert rows >= 10_000 * 700


def test_page_sizer_follows_rows_that_shrink_and_grow() -> None:
    sizer = PageSizer(1_000)
    simulate(sizer, fits=8, reads=10)
    assert sizer.next_limit() == 8
    simulate(sizer, fits=640, reads=40)
    assert sizer.next_limit() == 640
    simulate(sizer, fits=3, reads=5)
    assert sizer.next_limit() == 3
    simulate(sizer, fits=5_000, reads=200)
    assert sizer.next_limit() == 1_000


async def test_read_ahead_reads_the_next_page_while_rows_are_taken_two_pages_at_most(
    autojump_clock: Any,
) -> None:
    road = FakeRoad(make_rows(1_050), delay=1.0)
    iterator = DatasetIterator(road, 100, None)
    taken: list[dict[str, Any]] = []
    worst_held = 0
    async with trio.open_nursery() as nursery:

        async def ahead() -> None:
            while await iterator.read_ahead():
                pass

        nursery.start_soon(ahead)
        async for row in iterator:
            taken.append(row)
            worst_held = max(worst_held, sum(limit for _, limit in road.after_calls) - len(taken))
            await trio.sleep(0.1)  # 10 s a page: the next one (1 s) is read meanwhile
    assert taken == road.rows  # every row once, in order
    assert len(road.after_calls) == 11
    assert worst_held <= 2 * 100
    # Only the first read was waited for: 1 s, then 0.1 s a row.
    assert trio.current_time() == pytest.approx(1.0 + 1_050 * 0.1)


async def test_read_ahead_cancelled_mid_read_leaves_the_position_unchanged(
    autojump_clock: Any,
) -> None:
    road = FakeRoad(make_rows(250), delay=1.0)
    iterator = DatasetIterator(road, 100, None)
    first = [await anext(iterator) for _ in range(100)]
    with trio.move_on_after(0.5):
        await iterator.read_ahead()
    rest = [row async for row in iterator]
    assert first + rest == road.rows
