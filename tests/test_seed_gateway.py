"""sheetplane's runtime in front of a gateway built to the runtime it re-creates: only the
seed's actions (``sheetplane.testing.seed_gateway``), every other one answered 400
"Unsupported runtime data-plane action". Admission falls back to one ``start_sheet_dataset``
(learned once per client), and map, reads and terminal writes go on the direct road."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from _runtime_helpers import (
    CONTRACT,
    ORG,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    reap_session_roles,
    runtime,
    select_rows,
)
from sheetplane import (
    AdmissionTooLargeError,
    GatewayActionMissingError,
    StoreError,
    UnsupportedActionError,
)
from sheetplane import protocol as m
from sheetplane._types import SheetRef
from sheetplane.budgets import ADMISSION_CHUNK_ROWS, TRANSPORT_CEILING_BYTES
from sheetplane.identity import derive_row_identity
from sheetplane.runtime import CompleteRow, FailRow, Strategy
from sheetplane.store import SheetStore
from sheetplane.testing.seed_gateway import SEED_ACTIONS
from test_runner_guide import example_namespace

BEGIN_ADMISSION = m.action_of(m.BeginAdmissionRequest)
START_SHEET_DATASET = m.action_of(m.StartSheetDatasetRequest)


@pytest.fixture(scope="module", autouse=True)
def _drop_session_roles(database_url: str) -> Iterator[None]:
    yield
    reap_session_roles(database_url)


@pytest.fixture
async def seed(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url, actions=SEED_ACTIONS) as gw:
        yield gw


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def sheet_of(play: str, namespace: str = "leads") -> SheetRef:
    return SheetRef(ORG, play, namespace)


def inputs(keys: list[int]) -> list[dict[str, Any]]:
    return [{"_key": f"r{i:04d}", "text": f"text number {i}"} for i in keys]


async def test_the_fixture_answers_every_other_action_as_the_seeds_gateway_does(
    seed: CountingGateway,
) -> None:
    async with runtime(seed, "gateway_only", play=new_play()) as rt:
        with pytest.raises(UnsupportedActionError, match="Unsupported runtime data-plane action"):
            await rt.client.summary("leads")
        assert await rt.client.probe_action(START_SHEET_DATASET) is True
        assert await rt.client.probe_action(BEGIN_ADMISSION) is False


@pytest.mark.parametrize("strategy", ROADS)
async def test_start_admits_whole_and_learns_it_once(
    seed: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(seed, strategy, play=play) as rt:
        writer = rt.writer("leads", CONTRACT)
        # An iterator: the rows the staged attempt read before its begin was refused
        # are admitted too.
        one = await writer.start(iter(inputs([3, 1, 4, 0, 3, 2])))
        assert rt.client.serves(BEGIN_ADMISSION) is False
        assert (one.inserted, one.skipped, one.pending_count, one.completed_count) == (5, 1, 5, 0)
        assert writer.write_version == one.write_version
        pending = await one.pending().materialize()
        assert [row["_key"] for row in pending] == ["r0003", "r0001", "r0004", "r0000", "r0002"]
        done = [CompleteRow("r0001", {"words": 2}), CompleteRow("r0004", {"words": 4})]
        failed = [FailRow("r0000", "boom")]
        if strategy == "direct":
            await writer.complete(done)
            await writer.fail(failed)
        else:  # the seed's gateway has no terminal writes: write them as the direct road would
            version = {"run_id": "run-1", "write_version": one.write_version}
            await store.complete_map_rows(sheet_of(play), CONTRACT, done, **version)
            await store.fail_map_rows(sheet_of(play), CONTRACT, failed, **version)

        before = seed.requests
        again = await writer.start(inputs([4, 0, 5, 1]))
        if strategy == "gateway_only":
            assert seed.requests - before == 1  # one start_sheet_dataset, no second begin
        assert again.write_version > one.write_version
        assert (again.inserted, again.pending_count, again.completed_count) == (1, 2, 2)
        # The failed row is re-admitted; the enriched ones come back completed, merged
        # with their input (mergeRuntimeCompletedRow), in input order, keyed both ways.
        assert [row["_key"] async for row in again.pending()] == ["r0000", "r0005"]
        completed = await again.completed().materialize()
        assert [(row["_key"], row["__deeplineRowKey"], row["words"]) for row in completed] == [
            ("r0004", "r0004", 4),
            ("r0001", "r0001", 2),
        ]
    rows = await select_rows(store, sheet_of(play))
    assert {row["_key"]: row["_status"] for row in rows} == {
        "r0000": "pending",
        "r0001": "enriched",
        "r0002": "pending",
        "r0003": "pending",
        "r0004": "enriched",
        "r0005": "pending",
    }


async def test_a_stale_row_is_revived_to_pending(seed: CountingGateway, store: SheetStore) -> None:
    play = new_play()
    async with runtime(seed, "direct", play=play) as rt:
        first = rt.writer("leads", CONTRACT)
        await first.start(inputs([0, 1]))
        await rt.writer("leads", CONTRACT).start(inputs([0, 1]))
        with pytest.raises(Exception, match="RUNTIME_SHEET_ATTEMPT_SUPERSEDED"):
            await first.complete([CompleteRow("r0000", {"words": 1})])

        def mark_stale(conn: Any) -> None:
            from psycopg import sql

            from sheetplane.store import sheet_names

            table = sheet_names(sheet_of(play)).ident("sheet_table")
            conn.execute(
                sql.SQL("UPDATE {} SET _status = 'stale' WHERE _key = 'r0001'").format(table)
            )

        await store.pool.run(mark_stale)
        revived = await rt.writer("leads", CONTRACT).start(inputs([1]))
        assert [row["_key"] async for row in revived.pending()] == ["r0001"]
    rows = {row["_key"]: row["_status"] for row in await select_rows(store, sheet_of(play))}
    assert rows["r0001"] == "pending"


async def test_map_reads_and_writes_on_the_direct_road(
    seed: CountingGateway, store: SheetStore
) -> None:
    example = example_namespace()
    play = new_play()
    rows = [
        {"email": f"lead{i}@Domain{i % 3}.example" if i % 10 != 9 else "broken", "company": f"C{i}"}
        for i in range(120)
    ]
    async with runtime(seed, "direct", play=play) as rt:
        report = await rt.map(example["NAMESPACE"], example["CONTRACT"], rows, example["enrich"])
        assert (report.admitted, report.pending, report.completed, report.failed) == (
            120,
            120,
            108,
            12,
        )
        dataset = rt.dataset(example["NAMESPACE"])
        assert await dataset.count() == 120
        statuses = [row["_status"] async for row in dataset]
        assert statuses.count("enriched") == 108 and statuses.count("failed") == 12
        first = await dataset.at(0)
        assert first is not None and first["domain"] == "domain0.example"
        # A rerun maps only the failed rows again.
        again = await rt.map(example["NAMESPACE"], example["CONTRACT"], rows, example["enrich"])
        assert (again.pending, again.failed) == (12, 12)
        # Receipts are gateway actions the seed's gateway does not serve.
        with pytest.raises(UnsupportedActionError, match="complete_work_receipt"):
            await rt.receipts().complete("run-1:summary", {"n": 1})
        with pytest.raises(GatewayActionMissingError, match="claim_work_receipt"):
            await rt.map(
                example["NAMESPACE"], example["CONTRACT"], rows, example["enrich"], receipts=True
            )


async def test_map_on_the_gateway_road_refuses_before_admitting(
    seed: CountingGateway, store: SheetStore
) -> None:
    play = new_play()

    async def fn(row: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("never called")

    async with runtime(seed, "gateway_only", play=play) as rt:
        with pytest.raises(GatewayActionMissingError) as raised:
            await rt.map("leads", CONTRACT, inputs([0, 1]), fn)
        assert raised.value.action == "runtime_sheet_complete_map_rows"
        assert "runtime_sheet_complete_map_rows" in str(raised.value)
        before = seed.requests
        with pytest.raises(GatewayActionMissingError):
            await rt.map("leads", CONTRACT, inputs([0, 1]), fn)
        assert seed.requests == before  # learned once
        # start() alone still admits, through start_sheet_dataset.
        admission = await rt.writer("leads", CONTRACT).start(inputs([0, 1]))
        assert admission.pending_count == 2
    assert [row["_key"] for row in await select_rows(store, sheet_of(play))] == ["r0000", "r0001"]


async def test_an_input_over_the_ceiling_is_refused_before_anything_is_sent(
    seed: CountingGateway, store: SheetStore
) -> None:
    play = new_play()
    big = "x" * (1024 * 1024)
    rows = ({"_key": f"r{i}", "text": big} for i in range(17))
    async with runtime(seed, "gateway_only", play=play) as rt:
        assert await rt.client.probe_action(BEGIN_ADMISSION) is False
        before = seed.requests
        with pytest.raises(AdmissionTooLargeError, match=f"{TRANSPORT_CEILING_BYTES} byte"):
            await rt.writer("leads", CONTRACT).start(rows)
        assert seed.requests == before
    with pytest.raises(StoreError, match="does not exist"):
        await select_rows(store, sheet_of(play))  # nothing was sent: no sheet was made


# --- __deeplineRowKey ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ROADS)
@pytest.mark.parametrize("path", ["staged", "whole"])
async def test_deepline_row_key_is_the_key_and_is_stripped(
    seed: CountingGateway,
    gateway: CountingGateway,
    store: SheetStore,
    strategy: Strategy,
    path: str,
) -> None:
    play = new_play()
    rows = [
        {"__deeplineRowKey": "alpha", "text": "one two"},
        {"__deeplineRowKey": "beta", "text": "three"},
        {"__deeplineRowKey": 7, "text": "not a string key"},
    ]
    derived = derive_row_identity({"text": "not a string key"}, "leads")
    handed: list[dict[str, Any]] = []

    async def fn(row: dict[str, Any]) -> dict[str, Any]:
        handed.append(row)
        return {"words": len(str(row["text"]).split())}

    via = gateway if path == "staged" else seed
    async with runtime(via, strategy, play=play) as rt:
        if strategy == "direct":
            await rt.map("leads", CONTRACT, rows, fn)
            assert sorted(row["_key"] for row in handed) == sorted(["alpha", "beta", derived])
            assert all(row["__deeplineRowKey"] == row["_key"] for row in handed)
        else:
            writer = rt.writer("leads", CONTRACT)
            admitted = await writer.start(rows)
            pending = await admitted.pending().materialize()
            assert [(r["_key"], r["__deeplineRowKey"]) for r in pending] == [
                ("alpha", "alpha"),
                ("beta", "beta"),
                (derived, derived),
            ]
            await store.complete_map_rows(
                sheet_of(play),
                CONTRACT,
                [CompleteRow(r["_key"], {"words": 1}) for r in pending],
                run_id="run-1",
                write_version=admitted.write_version,
            )
        again = await rt.writer("leads", CONTRACT).start(rows)
        completed = await again.completed().materialize()
        assert [(r["_key"], r["__deeplineRowKey"]) for r in completed] == [
            ("alpha", "alpha"),
            ("beta", "beta"),
            (derived, derived),
        ]
        assert [r["text"] for r in completed] == ["one two", "three", "not a string key"]
    stored = await select_rows(store, sheet_of(play))
    assert [(row["_key"], row["text"]) for row in stored] == [
        ("alpha", "one two"),
        ("beta", "three"),
        (derived, "not a string key"),
    ]


async def test_the_inline_answer_carries_the_row_key(store: SheetStore, sheet: SheetRef) -> None:
    await store.ensure_sheet(sheet, CONTRACT)
    rows = [{"__deeplineRowKey": "k1", "text": "a"}, {"__deeplineRowKey": "k1", "text": "dup"}]
    admission = await store.start_dataset(sheet, rows, "run-1", CONTRACT)
    assert admission.pending_rows == ({"text": "a", "_key": "k1", "__deeplineRowKey": "k1"},)
    assert admission.skipped == 1


@pytest.mark.parametrize("strategy", ROADS)
async def test_an_async_input_is_admitted_whole_without_losing_the_rows_read_first(
    seed: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play = new_play()
    N = ADMISSION_CHUNK_ROWS + 7

    async def generated() -> AsyncIterator[dict[str, Any]]:
        for row in inputs(list(range(N))):  # the staged attempt reads a whole chunk first
            yield row

    async with runtime(seed, strategy, play=play) as rt:
        admission = await rt.writer("leads", CONTRACT).start(generated())
        assert (admission.inserted, admission.pending_count) == (N, N)
    rows = await select_rows(store, sheet_of(play))
    assert [row["_key"] for row in rows] == [f"r{i:04d}" for i in range(N)]


async def test_a_staging_gateway_is_learned_too_and_keeps_staging(
    gateway: CountingGateway,
) -> None:
    async with runtime(gateway, "gateway_only", play=new_play()) as rt:
        await rt.writer("leads", CONTRACT).start(inputs([0, 1]))
        assert rt.client.serves(BEGIN_ADMISSION) is True
        again = await rt.writer("leads", CONTRACT).start(inputs([1, 2]))
        assert (again.inserted, again.pending_count) == (1, 2)
