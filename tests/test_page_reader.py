"""PageReader over a fake road: coalescing per scope, splitting, budgets, input normalisation."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest
import trio
import trio.testing

from _fake_road import FakeRoad, make_rows, scope
from sheetplane import InvalidInputError, LaneWedgedError
from sheetplane.budgets import (
    MAX_QUEUE_WAIT_MS,
    READ_BATCH_FLUSH_MS,
    READ_BATCH_MAX_IN_FLIGHT,
    READ_BATCH_MAX_PAGES,
    READ_BATCH_MAX_RETAINED_PAGES,
    READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
    READ_PAGE_MAX_ROWS,
)
from sheetplane.pages import Page, PageReader, PageRequest, ReadScope, SheetRoad
from sheetplane.pages import normalize_page_request as normalize


async def read_all(
    reader: PageReader, road: FakeRoad, requests: list[tuple[int, int]]
) -> list[Page]:
    results: list[Page | None] = [None] * len(requests)

    async def one(index: int, limit: int, offset: int) -> None:
        results[index] = await reader.read_page(road, limit, offset)

    async with trio.open_nursery() as nursery:
        for index, (limit, offset) in enumerate(requests):
            nursery.start_soon(one, index, limit, offset)
    assert all(page is not None for page in results)
    return [page for page in results if page is not None]


def test_fake_road_is_a_sheet_road() -> None:
    assert isinstance(FakeRoad(make_rows(1)), SheetRoad)


async def test_concurrent_single_row_reads_coalesce_into_full_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(100), delay=0.01)
    async with PageReader() as reader:
        pages = await read_all(reader, road, [(1, i) for i in range(40)])
        stats = reader.stats()
    assert [page.rows[0]["_input_index"] for page in pages] == list(range(40))
    assert sum(len(call) for call in road.batch_calls) == 40
    assert all(len(call) <= READ_BATCH_MAX_PAGES for call in road.batch_calls)
    assert len(road.batch_calls) == 40 // READ_BATCH_MAX_PAGES
    assert stats.batches == len(road.batch_calls)
    assert stats.values == 40


async def test_reads_of_different_scopes_never_share_a_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rows = make_rows(10)
    first = FakeRoad(rows, scope=scope("one"))
    second = FakeRoad(rows, scope=scope("two"))
    other_token = FakeRoad(rows, scope=scope("one", token="another-token"))
    roads = (first, second, other_token)
    async with PageReader() as reader, trio.open_nursery() as nursery:
        for number, road in enumerate(roads):
            for offset in (2 * number, 2 * number + 1):
                nursery.start_soon(reader.read_page, road, 1, offset)
    for number, road in enumerate(roads):
        # One batch each, holding exactly that road's two pages.
        assert len(road.batch_calls) == 1
        assert sorted(r.offset for r in road.batch_calls[0]) == [2 * number, 2 * number + 1]


async def test_roads_with_equal_scopes_share_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rows = make_rows(10)
    first, second = FakeRoad(rows), FakeRoad(rows)
    assert first.scope == second.scope
    async with PageReader() as reader, trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(reader.read_page, first, 1, i)
            nursery.start_soon(reader.read_page, second, 1, i + 2)
    calls = first.batch_calls + second.batch_calls
    assert [len(call) for call in calls] == [4]


async def test_a_lone_read_waits_exactly_the_flush_linger(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(3))
    async with PageReader() as reader:
        started = trio.current_time()
        page = await reader.read_page(road, 2, 1)
        assert trio.current_time() == started + READ_BATCH_FLUSH_MS / 1000
    assert page == Page(rows=tuple(road.rows[1:3]), limit=2, offset=1)


async def test_batches_too_large_are_split_and_still_exact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rows = make_rows(64, pad=100)
    road = FakeRoad(rows, budget=1_000)  # about seven rows a read
    async with PageReader() as reader:
        pages = await read_all(reader, road, [(16, 16 * i) for i in range(4)])
    assert [page.rows for page in pages] == [tuple(rows[16 * i : 16 * i + 16]) for i in range(4)]
    assert [(page.limit, page.offset) for page in pages] == [(16, 16 * i) for i in range(4)]
    batches = [call for call in road.batch_calls if len(call) > 1]
    alone = [call[0] for call in road.batch_calls if len(call) == 1 and call[0].limit == 16]
    halves = [call[0] for call in road.batch_calls if len(call) == 1 and call[0].limit < 16]
    assert len(batches) == 1  # the batch was tried whole once
    assert sorted(alone, key=lambda r: r.offset) == [PageRequest(16, 16 * i) for i in range(4)]
    assert halves and max(r.limit for r in halves) == 8


async def test_retention_and_concurrency_stay_within_budgets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(200), delay=0.02)
    async with PageReader() as reader:
        pages = await read_all(reader, road, [(1 + i % 7, i) for i in range(150)])
        stats = reader.stats()
    assert [page.offset for page in pages] == list(range(150))
    assert stats.peak_retained_items <= READ_BATCH_MAX_RETAINED_PAGES
    assert 0 < stats.peak_retained_bytes <= READ_BATCH_MAX_RETAINED_REQUEST_BYTES
    assert stats.peak_in_flight <= READ_BATCH_MAX_IN_FLIGHT
    assert road.peak_in_flight == READ_BATCH_MAX_IN_FLIGHT


async def test_a_wedged_road_fails_queued_reads_at_the_queue_wait_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(10), hang=True)
    started = trio.current_time()
    failures: list[float] = []

    async def late_read(offset: int) -> None:
        with pytest.raises(LaneWedgedError):
            await reader.read_page(road, 1, offset)
        failures.append(trio.current_time())

    async with PageReader() as reader, trio.open_nursery() as nursery:
        for offset in range(2 * READ_BATCH_MAX_PAGES):  # fills both in-flight batches
            nursery.start_soon(reader.read_page, road, 1, offset)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(late_read, 9)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(MAX_QUEUE_WAIT_MS / 1000 + 1)
        road.release.set()
    assert failures == [started + MAX_QUEUE_WAIT_MS / 1000]


@pytest.mark.parametrize(
    ("limit", "offset", "expected"),
    [
        (10, 0, PageRequest(10, 0)),
        (READ_PAGE_MAX_ROWS + 1, 3, PageRequest(READ_PAGE_MAX_ROWS, 3)),
        (0, 0, PageRequest(1, 0)),
        (-7, -3, PageRequest(1, 0)),
        (2.9, 4.5, PageRequest(2, 4)),
        (1e12, 1e3, PageRequest(READ_PAGE_MAX_ROWS, 1000)),
    ],
)
def test_page_inputs_are_normalised(limit: Any, offset: Any, expected: PageRequest) -> None:
    assert normalize(limit, offset) == expected


@pytest.mark.parametrize(
    ("limit", "offset"),
    [
        (math.nan, 0),
        (1, math.inf),
        (-math.inf, 0),
        ("10", 0),
        (None, 0),
        (True, 0),
        (1, [0]),
    ],
)
async def test_bad_page_inputs_raise_before_any_read(limit: Any, offset: Any) -> None:
    road = FakeRoad(make_rows(3))
    async with PageReader() as reader:
        with pytest.raises(InvalidInputError):
            await reader.read_page(road, limit, offset)
        assert reader.stats().values == 0
    assert road.batch_calls == []


async def test_read_page_answers_the_normalised_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    road = FakeRoad(make_rows(5))
    async with PageReader() as reader:
        page = await reader.read_page(road, 2.5, -1)
    assert (page.limit, page.offset, len(page.rows)) == (2, 0, 2)


def test_scope_carries_a_digest_never_the_token() -> None:
    token = "s3cret-executor-token"
    read_scope = ReadScope.for_token(
        base_url="http://gw.test/",
        token=f" {token} ",
        org_id="org",
        play_name="play",
        run_id=" ",
        table_namespace="ns",
    )
    assert read_scope.token_digest == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(read_scope)
    assert read_scope.base_url == "http://gw.test"
    assert read_scope.run_id is None
    assert read_scope.row_mode == "output"
    assert hash(read_scope) == hash(
        ReadScope.for_token(
            base_url="http://gw.test",
            token=token,
            org_id="org",
            play_name="play",
            run_id=None,
            table_namespace="ns",
        )
    )
