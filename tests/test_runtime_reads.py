"""Reads through the runtime on both roads, against real Postgres and the reference gateway:
exact rows in read order (also under faults and on a legacy gateway), coalescing of
concurrent random reads, and the gateway's keyset cursor."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from _runtime_helpers import (
    NULL_TAIL,
    ROADS,
    CountingGateway,
    Seed,
    counting_gateway,
    new_play,
    runtime,
    seeding,
    select_rows,
    sheet_of,
)
from sheetplane.budgets import READ_BATCH_MAX_PAGES, KiB
from sheetplane.gateway.faults import FAULT_HEADER
from sheetplane.runtime import Strategy
from sheetplane.store import SheetStore


@pytest.fixture
async def seeded(store: SheetStore) -> AsyncIterator[Seed]:
    async with seeding(store) as seed:
        yield seed


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url, allow_test_faults=True) as gw:
        yield gw


@pytest.fixture
async def legacy_gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url, legacy=True) as gw:
        yield gw


async def read_all(gw: CountingGateway, strategy: Strategy, play: str, ns: str, **kw: Any) -> Any:
    async with runtime(gw, strategy, play=play, **kw) as rt:
        dataset = rt.dataset(ns)
        rows = [row async for row in dataset]
        return rows, await dataset.count(), rt.stats()


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_100k_row_sheet_reads_exactly_like_one_select(
    gateway: CountingGateway, store: SheetStore, seeded: Seed, strategy: Strategy
) -> None:
    play, ns = new_play(), "leads"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 100_000)
    expected = await select_rows(store, sheet)
    assert len(expected) == 100_000
    assert [row["_input_index"] for row in expected[-NULL_TAIL:]] == [None] * NULL_TAIL

    rows, count, stats = await read_all(gateway, strategy, play, ns)

    assert rows == expected
    assert count == 100_000
    # Keyset paging: one read per 5,000 rows (plus the empty read that ends it at most).
    assert 20 <= stats.keyset_reads <= 21
    assert stats.offset_reads == 0


async def test_reads_limited_to_a_run_and_every_row_mode(
    gateway: CountingGateway, store: SheetStore, seeded: Seed
) -> None:
    play, ns = new_play(), "leads"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 900, run_id="run-a")
    for strategy in ROADS:
        async with runtime(gateway, strategy, play=play) as rt:
            assert [r async for r in rt.dataset(ns, run_id="run-a")] == await select_rows(
                store, sheet, run_id="run-a"
            )
            assert await rt.dataset(ns, run_id="run-b").count() == 0
            assert await rt.dataset(ns, run_id="run-a").count() == 900
            assert [r async for r in rt.dataset(ns, run_id="run-b")] == []
            everything = await rt.dataset(ns, "all").materialize(limit=3)
            assert [r["_run_id"] for r in everything] == ["run-a"] * 3
            assert all(isinstance(r["_created_at"], str) for r in everything)


FAULTS = {
    "503 on keyset reads": "runtime_sheet_read_rows=503:2",
    "resets on keyset reads": "runtime_sheet_read_rows=reset:2",
    "413 on keyset reads": "runtime_sheet_read_rows=413:3",
    "503 and resets on batch reads": "runtime_sheet_read_rows_batch=503:1, "
    "runtime_sheet_read_rows_batch=reset:1",
    "413 on batch reads": "runtime_sheet_read_rows_batch=413:4",
    "legacy batch answers": "runtime_sheet_read_rows_batch=unsupported:2",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_faults_on_the_gateway_road_leave_the_rows_exact(
    gateway: CountingGateway, store: SheetStore, seeded: Seed, fault: str
) -> None:
    play, ns = new_play(), "leads"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 12_000)
    expected = await select_rows(store, sheet)
    headers = {FAULT_HEADER: f"{FAULTS[fault]}; nonce={uuid.uuid4().hex}"}
    # A one-row read answered 413 is final (one row too large), so under 413 faults
    # the random reads are multi-row pages, which the splitter can halve.
    indices = [] if "413" in fault else [0, 1, 4_999, 5_000, 11_999, 12_000, 7_321, 3]
    async with runtime(gateway, "gateway_only", play=play, headers=headers) as rt:
        dataset = rt.dataset(ns)
        peeks = await trio_gather([dataset.peek(3_000), dataset.peek(1_200), dataset.peek(7)])
        found = await trio_gather([dataset.at(i) for i in indices])
        rows = [row async for row in dataset]
        stats = rt.stats()
    assert rows == expected
    assert peeks == [expected[:3_000], expected[:1_200], expected[:7]]
    assert found == [expected[i] if i < len(expected) else None for i in indices]
    assert gateway.state.faults.pending("runtime_sheet_read_rows") == 0
    assert gateway.state.faults.pending("runtime_sheet_read_rows_batch") == 0
    if "413" in fault:
        assert stats.splits >= 1


@pytest.mark.parametrize("threshold", [48 * KiB, 160 * KiB, 700 * KiB])
@pytest.mark.parametrize("strategy", ROADS)
async def test_a_response_budget_at_several_thresholds_splits_but_stays_exact(
    gateway: CountingGateway,
    store: SheetStore,
    seeded: Seed,
    strategy: Strategy,
    threshold: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway (answering 413) and the direct road split reads past ``threshold``."""
    play, ns = new_play(), "leads"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 15_000)
    expected = await select_rows(store, sheet)
    from sheetplane.store import _reads

    # Both roads' answers are measured by the store (the gateway runs in this process).
    monkeypatch.setattr(_reads, "READ_BATCH_MAX_RESPONSE_BYTES", threshold)
    async with runtime(gateway, strategy, play=play) as rt:
        dataset = rt.dataset(ns)
        rows = [row async for row in dataset]
        pages = await trio_gather([dataset.peek(5_000), dataset.peek(4_000)])
        stats = rt.stats()
    assert rows == expected
    assert pages == [expected[:5_000], expected[:4_000]]
    assert stats.splits >= 1


async def trio_gather(awaitables: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(awaitables)

    async def one(i: int) -> None:
        results[i] = await awaitables[i]

    async with trio.open_nursery() as nursery:
        for i in range(len(awaitables)):
            nursery.start_soon(one, i)
    return results


async def test_a_legacy_gateway_is_read_exactly_by_offsets(
    legacy_gateway: CountingGateway, store: SheetStore, seeded: Seed
) -> None:
    play, ns = new_play(), "leads"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 11_000)
    expected = await select_rows(store, sheet)
    async with runtime(legacy_gateway, "gateway_only", play=play) as rt:
        dataset = rt.dataset(ns)
        rows = [row async for row in dataset]
        picks = await trio_gather([dataset.at(i) for i in (0, 10_999, 5_000, 11_000)])
        stats = rt.stats()
    assert rows == expected
    assert picks == [expected[0], expected[10_999], expected[5_000], None]
    # The first read asked by keyset, was answered by offset, and the rest went by offset.
    assert stats.keyset_reads == 1
    assert stats.offset_reads >= 2


@pytest.mark.parametrize("strategy", ROADS)
async def test_concurrent_at_calls_coalesce_into_batches(
    gateway: CountingGateway, store: SheetStore, seeded: Seed, strategy: Strategy
) -> None:
    play, ns = new_play(), "leads"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 3_000)
    expected = await select_rows(store, sheet)
    calls = 64
    indices = random.Random(5).sample(range(3_000), calls)
    async with runtime(gateway, strategy, play=play) as rt:
        dataset = rt.dataset(ns)
        await dataset.at(0)  # mints the session (direct) and opens the connection
        before_requests = gateway.requests
        before = rt.stats()
        rows = await trio_gather([dataset.at(i) for i in indices])
        after = rt.stats()
        served = gateway.requests - before_requests
    assert rows == [expected[i] for i in indices]
    batches = after.reader_batches - before.reader_batches
    assert after.page_reads - before.page_reads == calls
    assert calls // READ_BATCH_MAX_PAGES <= batches < calls // 2
    assert after.batch_requests - before.batch_requests == batches
    if strategy == "gateway_only":
        # One HTTP request per batch, seen by the server.
        assert served == batches
    else:
        # Direct reads never touch the gateway once the session is minted (one per
        # batch shape: 1 to 4 pages).
        assert served <= READ_BATCH_MAX_PAGES


async def test_concurrent_first_mints_of_several_shapes_all_open(
    gateway: CountingGateway, store: SheetStore, seeded: Seed
) -> None:
    """Regression: concurrent first mints each generated the manager's RSA key, and a
    session sealed to a key that another mint had replaced failed to open."""
    play, ns = new_play(), "leads"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 50)
    expected = await select_rows(store, sheet)
    for _ in range(3):
        async with runtime(gateway, "direct", play=play) as rt:
            dataset = rt.dataset(ns)
            answers = await trio_gather(
                [dataset.count(), dataset.at(3), dataset.peek(2), dataset.materialize()]
            )
            assert rt.sessions.minted >= 3  # count, keyset, and the batch of at+peek
        assert answers == [50, expected[3], expected[:2], expected]


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_keyset_page_too_large_fails_before_it_is_held_whole(
    gateway: CountingGateway,
    store: SheetStore,
    seeded: Seed,
    strategy: Strategy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """5,000 rows of 2 KB against a 256 KiB budget: the read stops a slice past the
    budget instead of decoding 10 MB first (on the gateway road, server side)."""
    import tracemalloc

    from sheetplane import ReadBatchTooLargeError
    from sheetplane.store import _reads, sheet_names

    play, ns = new_play(), "wide"
    sheet = sheet_of(play, ns)
    await seeded(sheet, 5_000)
    table = sheet_names(sheet).ident("sheet_table")
    await store.pool.run(
        lambda conn: conn.execute(
            _reads.sql.SQL("UPDATE {} SET text = to_jsonb(repeat('x', 2000))").format(table)
        )
    )
    monkeypatch.setattr(_reads, "READ_BATCH_MAX_RESPONSE_BYTES", 256 * KiB)
    async with runtime(gateway, strategy, play=play) as rt:
        road = rt.road(ns)
        await road.count()  # the session and connections exist before measuring
        tracemalloc.start()
        try:
            with pytest.raises(ReadBatchTooLargeError) as raised:
                await road.read_after(None, 5_000)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        rows, _ = await road.read_after(None, 100)  # fewer rows fit
    assert raised.value.observed_bytes < 2 * 256 * KiB
    assert peak < 4 * 2**20  # the whole page would be over 10 MB
    assert len(rows) == 100


BAD_AFTER: dict[str, Any] = {
    "a number": 5,
    "a list": [1, "2020-01-01T00:00:00+00:00", "k"],
    "no key": {"inputIndex": 1, "createdAt": "2020-01-01T00:00:00+00:00"},
    "no createdAt": {"inputIndex": 1, "key": "k"},
    "createdAt not a time": {"inputIndex": 1, "createdAt": "yesterday", "key": "k"},
    "createdAt without zone": {"inputIndex": 1, "createdAt": "2020-01-01T00:00:00", "key": "k"},
    "inputIndex text": {"inputIndex": "1", "createdAt": "2020-01-01T00:00:00+00:00", "key": "k"},
    "inputIndex past bigint": {
        "inputIndex": 2**70,
        "createdAt": "2020-01-01T00:00:00+00:00",
        "key": "k",
    },
    "key with NUL": {"inputIndex": 1, "createdAt": "2020-01-01T00:00:00+00:00", "key": "k\x00"},
    "key with a lone surrogate": {
        "inputIndex": None,
        "createdAt": "2020-01-01T00:00:00+00:00",
        "key": "\ud800",
    },
}


async def test_a_bad_keyset_cursor_is_refused_400(
    gateway: CountingGateway, store: SheetStore, seeded: Seed
) -> None:
    import json

    import httpx

    from sheetplane.gateway.server import RUNTIME_PATH

    play = new_play()
    await seeded(sheet_of(play, "leads"), 10)
    async with httpx.AsyncClient(base_url=gateway.base_url) as http:
        for case, after in BAD_AFTER.items():
            body = {
                "action": "runtime_sheet_read_rows",
                "playName": play,
                "input": {"tableNamespace": "leads", "limit": 5, "offset": 0, "after": after},
            }
            response = await http.post(
                RUNTIME_PATH,
                content=json.dumps(body).encode(),  # ensure_ascii: the surrogate travels escaped
                headers={"authorization": f"Bearer {gateway.token}"},
            )
            assert response.status_code == 400, (case, response.text)
