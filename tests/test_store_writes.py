"""append / upsert / replace on a real Postgres: idempotency keys, merges, the
replace semantics, and bad input refused before anything is written."""

from __future__ import annotations

import math

import pytest
import trio

from _store_helpers import (
    column_counts_match,
    counters_match_rows,
    set_status,
    snapshot,
    stored_rows,
)
from sheetplane._types import (
    CompleteRow,
    ContractColumn,
    SheetContract,
    SheetRef,
    StaleRow,
    WriteResult,
)
from sheetplane.errors import InvalidInputError
from sheetplane.identity import derive_row_identity
from sheetplane.store import SheetStore
from sheetplane.store._writes import appended_row_key

CONTRACT = SheetContract(
    (
        ContractColumn("company", "company", "input"),
        ContractColumn("score", "score_col", "output"),
    )
)


async def test_append_writes_once_per_idempotency_key(store: SheetStore, sheet: SheetRef) -> None:
    await store.start_dataset(sheet, [{"company": "a"}], "run-1", CONTRACT)
    rows = [{"company": "b"}, {"company": "b"}, {"score": 3}]
    assert await store.append_rows(sheet, rows, idempotency_key="k1") == WriteResult(3, False)
    before = await snapshot(store, sheet)
    assert await store.append_rows(sheet, rows, idempotency_key="k1") == WriteResult(0, True)
    assert await snapshot(store, sheet) == before
    assert await store.append_rows(sheet, rows[:1], idempotency_key="k2") == WriteResult(1, False)

    stored = await stored_rows(store, sheet)
    assert len(stored) == 5
    key = appended_row_key({"company": "b"}, "k1", 1)
    assert key.startswith(derive_row_identity({"company": "b"}, sheet.table_namespace) + ":append:")
    row = stored[key]
    assert (row["_status"], row["_write_version"], row["_input_index"]) == ("pending", 0, 2)
    assert stored[appended_row_key({"score": 3}, "k1", 2)]["score_col"] == 3
    summary, recount = await counters_match_rows(store, sheet)
    assert (
        summary == recount == {"total": 5, "queued": 5, "running": 0, "completed": 0, "failed": 0}
    )
    counts, recount_columns = await column_counts_match(store, sheet, ["company", "score_col"])
    assert counts == recount_columns


async def test_racing_appends_with_one_key_write_once(store: SheetStore, sheet: SheetRef) -> None:
    await store.ensure_sheet(sheet, CONTRACT)
    results: list[WriteResult] = []

    async def append() -> None:
        results.append(
            await store.append_rows(sheet, [{"company": "x"}] * 10, idempotency_key="same")
        )

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(append)
    assert sorted(results, key=lambda r: r.written) == [
        WriteResult(0, True),
        WriteResult(0, True),
        WriteResult(10, False),
    ]
    assert await store.count(sheet) == 10


async def test_appended_rows_are_fenced_from_running_attempts(
    store: SheetStore, sheet: SheetRef
) -> None:
    admission = await store.start_dataset(sheet, [{"company": "a"}], "run-1", CONTRACT)
    await store.append_rows(sheet, [{"company": "b"}], idempotency_key="k")
    key = appended_row_key({"company": "b"}, "k", 0)
    result = await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow(key, {"score": 1})],
        run_id="run-1",
        write_version=admission.write_version,
    )
    assert result.stale_rows == (StaleRow(key, "older_write_version", 0),)
    # A later admission takes the appended row up like any other.
    again = await store.start_dataset(sheet, [{"company": "b", "_key": key}], "run-2", CONTRACT)
    assert [r["_key"] for r in again.pending_rows] == [key]


async def test_upsert_inserts_new_keys_and_merges_existing_rows(
    store: SheetStore, sheet: SheetRef
) -> None:
    await store.start_dataset(
        sheet,
        [{"id": 1, "company": "a"}, {"id": 2, "company": "b"}],
        "run-1",
        CONTRACT,
        key_field="id",
    )
    await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow("1", {"score": 9})], run_id="run-1", write_version=1
    )
    result = await store.upsert_rows(
        sheet,
        [
            {"id": 1, "company": "A"},
            {"id": 3, "company": "c"},
            {"id": 3, "score": 4},
            {"id": 2, "company": "b"},
        ],
        idempotency_key="u1",
        key_field="id",
    )
    assert result == WriteResult(2, False)  # row 1 changed, row 3 inserted, row 2 unchanged
    stored = await stored_rows(store, sheet)
    assert (stored["1"]["company"], stored["1"]["score_col"], stored["1"]["_status"]) == (
        "A",
        9,
        "enriched",
    )
    assert stored["1"]["_write_version"] == 1
    assert (stored["3"]["company"], stored["3"]["score_col"], stored["3"]["_status"]) == (
        "c",
        4,
        "pending",
    )
    assert stored["3"]["_input_index"] == 2
    assert await store.upsert_rows(
        sheet, [{"id": 9}], idempotency_key="u1", key_field="id"
    ) == WriteResult(0, True)
    summary, recount = await counters_match_rows(store, sheet)
    assert summary == recount
    counts, recount_columns = await column_counts_match(store, sheet, ["company", "score_col"])
    assert counts == recount_columns


async def test_upsert_reopens_stale_rows(store: SheetStore, sheet: SheetRef) -> None:
    await store.start_dataset(sheet, [{"id": 1, "company": "a"}], "run-1", CONTRACT, key_field="id")
    await set_status(store, sheet, "1", "stale")
    result = await store.upsert_rows(
        sheet, [{"id": 1, "company": "a"}], idempotency_key="u", key_field="id"
    )
    assert result == WriteResult(1, False)
    assert (await stored_rows(store, sheet))["1"]["_status"] == "pending"
    summary, recount = await counters_match_rows(store, sheet)
    assert summary == recount


async def test_replace_swaps_every_row_and_keeps_the_version_counter(
    store: SheetStore, sheet: SheetRef
) -> None:
    admission = await store.start_dataset(
        sheet, [{"company": "a"}, {"company": "b"}], "run-1", CONTRACT
    )
    old_key = admission.pending_rows[0]["_key"]
    await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow(old_key, {"score": 1})], run_id="run-1", write_version=1
    )
    result = await store.replace_rows(sheet, [{"company": "z"}], idempotency_key="r1")
    assert result == WriteResult(1, False)
    stored = await stored_rows(store, sheet)
    assert list(stored) == [appended_row_key({"company": "z"}, "r1", 0)]
    assert next(iter(stored.values()))["_input_index"] == 0
    summary, recount = await counters_match_rows(store, sheet)
    assert (
        summary == recount == {"total": 1, "queued": 1, "running": 0, "completed": 0, "failed": 0}
    )
    counts, recount_columns = await column_counts_match(store, sheet, ["company", "score_col"])
    assert counts == recount_columns == {"company": 1, "score_col": 0}
    # The replaced rows' attempt is fenced; the next admission gets a newer version.
    late = await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow(admission.pending_rows[1]["_key"], {"score": 2})],
        run_id="run-1",
        write_version=1,
    )
    assert late.stale_rows[0].reason == "newer_write_version"
    assert (await store.start_dataset(sheet, [], "run-2", CONTRACT)).write_version == 2
    before = await snapshot(store, sheet)
    assert await store.replace_rows(sheet, [], idempotency_key="r1") == WriteResult(0, True)
    assert await snapshot(store, sheet) == before


@pytest.mark.parametrize(
    "bad_row",
    [
        ["x"],
        "text",
        {"score": math.nan},
        {"score": -math.inf},
        {"company": "x" * (7 * 1024 * 1024)},
    ],
)
async def test_bad_rows_leave_the_sheet_unchanged(
    store: SheetStore, sheet: SheetRef, bad_row: object
) -> None:
    await store.start_dataset(sheet, [{"company": "kept"}], "run-1", CONTRACT)
    before = await snapshot(store, sheet)
    for write in (store.append_rows, store.replace_rows, store.upsert_rows):
        with pytest.raises(InvalidInputError):
            await write(sheet, [{"company": "fine"}, bad_row], idempotency_key="k")  # type: ignore[list-item]
    assert await snapshot(store, sheet) == before


async def test_idempotency_keys_are_required(store: SheetStore, sheet: SheetRef) -> None:
    await store.ensure_sheet(sheet, CONTRACT)
    for key in ("", None, 5):
        with pytest.raises(InvalidInputError, match="idempotency_key"):
            await store.append_rows(sheet, [{"company": "a"}], idempotency_key=key)  # type: ignore[arg-type]
