"""persist_csv_dataset (the runtime's persistRuntimeCsvDataset), the datasets' descriptors,
and peek's clamps, on both roads against the reference gateway."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from _runtime_helpers import (
    CONTRACT,
    ORG,
    ROADS,
    CountingGateway,
    Seed,
    counting_gateway,
    runtime,
    seeding,
)
from sheetplane import InvalidInputError
from sheetplane._types import SheetRef
from sheetplane.budgets import DATASET_PREVIEW_ROWS, READ_PAGE_MAX_ROWS
from sheetplane.dataset import (
    SHEET_STORAGE,
    Dataset,
    DatasetBacking,
    InMemoryDataset,
    SheetBacking,
    runtime_dataset_id,
)
from sheetplane.runtime import Strategy
from sheetplane.store import SheetStore
from sheetplane.testing.seed_gateway import SEED_ACTIONS


@pytest.fixture
def gateway(runtime_gateway: CountingGateway) -> CountingGateway:
    return runtime_gateway


@pytest.fixture
async def seeded(store: SheetStore) -> AsyncIterator[Seed]:
    async with seeding(store) as seed:
        yield seed


def _csv(n: int) -> list[dict[str, Any]]:
    return [{"text": f"line {i}", "city": "Oslo" if i % 2 else "Bergen"} for i in range(n)]


def _play() -> str:
    return f"Csv-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_csv_that_fits_the_preview_answers_from_the_rows_it_holds(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play, rows = _play(), _csv(DATASET_PREVIEW_ROWS)
    async with runtime(gateway, strategy, play=play) as rt:
        ds = await rt.persist_csv_dataset(" Leads ", CONTRACT, rows, source_label="leads.csv")
        sent = gateway.requests
        assert isinstance(ds, InMemoryDataset)
        assert await ds.count() == DATASET_PREVIEW_ROWS
        assert await ds.materialize() == rows
        assert await ds.peek(3) == rows[:3]
        assert [row async for row in ds] == rows
        assert gateway.requests == sent  # read from the rows it holds
    assert (ds.dataset_kind, ds.source_label, ds.backing) == ("csv", "leads.csv", None)
    assert ds.dataset_id == runtime_dataset_id(play.lower(), "leads")
    assert ds.preview_rows == rows
    # ... and admitted all the same.
    assert await store.count(SheetRef(ORG, play, "leads")) == DATASET_PREVIEW_ROWS


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_csv_past_the_preview_is_read_from_its_sheet(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play, rows = _play(), _csv(DATASET_PREVIEW_ROWS + 1)
    async with runtime(gateway, strategy, play=play) as rt:
        ds = await rt.persist_csv_dataset("leads", CONTRACT, rows)
        assert isinstance(ds, Dataset)
        sent = gateway.requests
        found = await ds.materialize()
        assert gateway.requests > sent  # read from the sheet
        assert [row["text"] for row in found] == [row["text"] for row in rows]
        assert await ds.count() == len(rows)
        assert ds.dataset_id == rt.dataset("LEADS").dataset_id
    assert (ds.dataset_kind, ds.source_label) == ("csv", None)
    assert ds.preview_rows == rows[:DATASET_PREVIEW_ROWS]
    assert ds.backing == DatasetBacking(SHEET_STORAGE, SheetBacking(play.lower(), "leads"))


async def test_persisting_again_adds_only_the_new_rows(gateway: CountingGateway) -> None:
    rows = [{"_key": f"k{i}", "text": f"t {i}"} for i in range(3)]
    async with runtime(gateway, "direct", play=_play()) as rt:
        await rt.persist_csv_dataset("leads", CONTRACT, rows)
        await rt.persist_csv_dataset("leads", CONTRACT, [*rows, {"_key": "k9", "text": "new"}])
        summary = await rt.client.summary("leads")
    assert summary.total == 4


async def test_a_sheet_dataset_describes_its_sheet(gateway: CountingGateway) -> None:
    play = _play()
    async with runtime(gateway, "gateway_only", play=play) as rt:
        ds = rt.dataset("NormTest")
        admission = await rt.writer("normtest", CONTRACT).start(_csv(2))
        pending = admission.pending()
    sheet = SheetBacking(play.lower(), "normtest")
    for described in (ds, pending):
        assert described.dataset_kind == "map"
        assert described.dataset_id == runtime_dataset_id(play.lower(), "normtest")
        assert described.backing == DatasetBacking(SHEET_STORAGE, sheet)
        assert (described.preview_rows, described.source_label) == ([], None)


def test_dataset_ids_are_unambiguous() -> None:
    assert runtime_dataset_id("enrich", "leads") == "sheet:enrich:leads"
    assert runtime_dataset_id("a:b", "c") != runtime_dataset_id("a", "b:c")
    assert runtime_dataset_id("a:b", "c") == "sheet:a%3Ab:c"


@pytest.mark.parametrize(("rows", "label"), [("not rows", None), ([1], None), ([{"text": "a"}], 7)])
async def test_bad_arguments_are_refused_before_anything_is_sent(
    gateway: CountingGateway, rows: Any, label: Any
) -> None:
    async with runtime(gateway, "direct", play=_play()) as rt:
        sent = gateway.requests
        with pytest.raises(InvalidInputError):
            await rt.persist_csv_dataset("leads", CONTRACT, rows, source_label=label)
        assert gateway.requests == sent


@pytest.mark.parametrize("strategy", ROADS)
async def test_peek_clamps_like_the_runtime_on_both_roads(
    gateway: CountingGateway, seeded: Seed, strategy: Strategy
) -> None:
    play = _play()
    await seeded(SheetRef(ORG, play, "big"), READ_PAGE_MAX_ROWS + 10)
    async with runtime(gateway, strategy, play=play) as rt:
        ds = rt.dataset("big")
        sent = gateway.requests
        assert await ds.peek(0) == [] and await ds.peek(-5) == []
        if strategy == "gateway_only":
            assert gateway.requests == sent  # nothing read
        rows = await ds.peek(READ_PAGE_MAX_ROWS + 10)
    assert len(rows) == READ_PAGE_MAX_ROWS
    assert rows[0]["_key"] == "k0000000"


@pytest.fixture
async def seed_only(
    database_url: str, session_roles_reaped: None
) -> AsyncIterator[CountingGateway]:
    """The reference gateway serving only the runtime's own actions."""
    async with counting_gateway(database_url, actions=SEED_ACTIONS) as gateway:
        yield gateway


@pytest.mark.parametrize("n", [3, DATASET_PREVIEW_ROWS + 2])
async def test_persist_csv_dataset_against_a_gateway_of_the_runtimes_actions_only(
    seed_only: CountingGateway, n: int
) -> None:
    play, rows = _play(), _csv(n)
    async with runtime(seed_only, "direct", play=play) as rt:
        ds = await rt.persist_csv_dataset(" Leads ", CONTRACT, rows, source_label="in.csv")
        assert await ds.count() == n
        assert [row["text"] for row in await ds.materialize()] == [row["text"] for row in rows]
        assert await rt.dataset("LEADS").count() == n
    assert (ds.dataset_kind, ds.source_label) == ("csv", "in.csv")
    assert ds.dataset_id == runtime_dataset_id(play.lower(), "leads")
    assert isinstance(ds, InMemoryDataset if n <= DATASET_PREVIEW_ROWS else Dataset)
