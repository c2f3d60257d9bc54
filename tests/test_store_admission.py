"""Admission on a real Postgres: dedupe, input order, versions, re-admission,
completed rows, chunking, and bad input refused before anything is written."""

from __future__ import annotations

import math
from typing import Any

import pytest

from _store_helpers import (
    column_counts_match,
    counters_match_rows,
    snapshot,
    stored_rows,
)
from sheetplane._types import CompleteRow, ContractColumn, FailRow, SheetContract, SheetRef
from sheetplane.budgets import MAX_ROW_BYTES, POSTGRES_WRITE_CHUNK_ROWS
from sheetplane.errors import InvalidInputError
from sheetplane.identity import derive_row_identity
from sheetplane.store import SheetStore

CONTRACT = SheetContract(
    (
        ContractColumn("company", "company", "input"),
        ContractColumn("domain", "domain_col", "input", field="site"),
        ContractColumn("score", "score", "output"),
    )
)


async def test_new_rows_are_pending_stamped_and_in_input_order(
    store: SheetStore, sheet: SheetRef
) -> None:
    rows = [{"company": "b", "site": "b.io"}, {"company": "a"}, {"company": "c", "extra": 1}]
    admission = await store.start_dataset(sheet, rows, "run-1", CONTRACT)

    assert admission.inserted == 3
    assert admission.skipped == 0
    assert admission.write_version == 1
    assert admission.table_namespace == sheet.table_namespace
    assert admission.completed_rows == ()
    assert [r["company"] for r in admission.pending_rows] == ["b", "a", "c"]
    assert [r["_key"] for r in admission.pending_rows] == [
        derive_row_identity(r, sheet.table_namespace) for r in rows
    ]
    assert admission.pending_rows[2]["extra"] == 1

    stored = await stored_rows(store, sheet)
    first = stored[admission.pending_rows[0]["_key"]]
    assert first["_status"] == "pending"
    assert first["_write_version"] == 1
    assert first["_run_id"] == "run-1"
    assert first["company"] == "b"
    assert first["domain_col"] == "b.io"
    assert first["score"] is None
    assert [stored[r["_key"]]["_input_index"] for r in admission.pending_rows] == [0, 1, 2]
    summary, recount = await counters_match_rows(store, sheet)
    assert (
        summary == recount == {"total": 3, "queued": 3, "running": 0, "completed": 0, "failed": 0}
    )
    counts, recount_columns = await column_counts_match(
        store, sheet, ["company", "domain_col", "score"]
    )
    assert counts == recount_columns == {"company": 3, "domain_col": 1, "score": 0}
    events = (await snapshot(store, sheet))["events"]
    assert [(e[1], e[2], e[3], e[5]) for e in events] == [("admission", "run-1", 1, 3)]


async def test_duplicates_keep_the_first_occurrence(store: SheetStore, sheet: SheetRef) -> None:
    rows = [
        {"id": 1, "company": "first"},
        {"id": 2, "company": "other"},
        {"id": 1, "company": "second"},
    ]
    admission = await store.start_dataset(sheet, rows, "run-1", CONTRACT, key_field="id")
    assert admission.inserted == 2
    assert admission.skipped == 1
    assert [(r["_key"], r["company"]) for r in admission.pending_rows] == [
        ("1", "first"),
        ("2", "other"),
    ]
    stored = await stored_rows(store, sheet)
    assert stored["1"]["company"] == "first"
    assert (stored["1"]["_input_index"], stored["2"]["_input_index"]) == (0, 1)


async def test_every_admission_takes_a_new_version_and_readmits_open_rows(
    store: SheetStore, sheet: SheetRef
) -> None:
    rows = [{"id": n, "company": f"c{n}"} for n in range(4)]
    first = await store.start_dataset(sheet, rows, "run-1", CONTRACT, key_field="id")
    await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow("0", {"score": 10})], run_id="run-1", write_version=1
    )
    await store.fail_map_rows(
        sheet, CONTRACT, [FailRow("1", "provider down")], run_id="run-1", write_version=1
    )
    second = await store.start_dataset(sheet, rows, "run-2", CONTRACT, key_field="id")

    assert second.write_version == first.write_version + 1 == 2
    assert second.inserted == 0
    # As the seed counts: every row not new (nor revived from stale) is skipped, the
    # re-admitted open rows (pending_rows) too.
    assert second.skipped == 4
    assert [r["_key"] for r in second.pending_rows] == ["1", "2", "3"]
    assert [r["_key"] for r in second.completed_rows] == ["0"]
    assert second.completed_rows[0] == {
        "id": 0,
        "company": "c0",
        "score": 10,
        "_key": "0",
        "__deeplineRowKey": "0",
    }

    stored = await stored_rows(store, sheet)
    assert stored["0"]["_write_version"] == 1  # enriched rows keep their version
    assert stored["0"]["_status"] == "enriched"
    for key in ("1", "2", "3"):
        assert stored[key]["_status"] == "pending"
        assert stored[key]["_write_version"] == 2
        assert stored[key]["_run_id"] == "run-2"
    assert stored["1"]["_error"] is None
    summary, recount = await counters_match_rows(store, sheet)
    assert (
        summary == recount == {"total": 4, "queued": 3, "running": 0, "completed": 1, "failed": 0}
    )


async def test_a_new_input_order_restamps_input_indexes(store: SheetStore, sheet: SheetRef) -> None:
    rows = [{"id": n, "company": f"c{n}"} for n in range(3)]
    await store.start_dataset(sheet, rows, "run-1", CONTRACT, key_field="id")
    await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow("2", {"score": 1})], run_id="run-1", write_version=1
    )
    admission = await store.start_dataset(sheet, rows[::-1], "run-2", CONTRACT, key_field="id")
    assert [r["_key"] for r in admission.pending_rows] == ["1", "0"]
    assert [r["_key"] for r in admission.completed_rows] == ["2"]
    stored = await stored_rows(store, sheet)
    assert {key: row["_input_index"] for key, row in stored.items()} == {"2": 0, "1": 1, "0": 2}


async def test_readmission_refreshes_input_columns_and_keeps_outputs(
    store: SheetStore, sheet: SheetRef
) -> None:
    await store.start_dataset(
        sheet, [{"id": 1, "company": "old"}], "run-1", CONTRACT, key_field="id"
    )
    await store.fail_map_rows(
        sheet, CONTRACT, [FailRow("1", "boom", {"score": 3})], run_id="run-1", write_version=1
    )
    await store.start_dataset(
        sheet, [{"id": 1, "company": "new", "site": "n.io"}], "run-2", CONTRACT, key_field="id"
    )
    row = (await stored_rows(store, sheet))["1"]
    assert (row["company"], row["domain_col"], row["score"]) == ("new", "n.io", 3)
    counts, recount = await column_counts_match(store, sheet, ["company", "domain_col", "score"])
    assert counts == recount


async def test_completed_rows_never_take_synthetic_nulls(
    store: SheetStore, sheet: SheetRef
) -> None:
    await store.start_dataset(
        sheet, [{"id": 1, "company": "acme"}], "run-1", CONTRACT, key_field="id"
    )
    await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow("1", {"score": None, "company": None})],
        run_id="run-1",
        write_version=1,
    )
    admission = await store.start_dataset(
        sheet, [{"id": 1, "company": "acme"}], "run-2", CONTRACT, key_field="id"
    )
    # "site" (the domain column's field) was never in the input: its stored null
    # is synthetic and stays out; the stored null company does not overwrite the
    # input's value; the output column's null is reported.
    assert admission.completed_rows == (
        {"id": 1, "company": "acme", "score": None, "_key": "1", "__deeplineRowKey": "1"},
    )


async def test_keys_with_quotes_unicode_and_sql_are_just_keys(
    store: SheetStore, sheet: SheetRef
) -> None:
    keys = ['"; drop table x; --', "O'Brien", "ключ 🔑", "a\\b"]
    rows = [{"id": key, "company": key} for key in keys]
    admission = await store.start_dataset(sheet, rows, "run-1", CONTRACT, key_field="id")
    assert [r["_key"] for r in admission.pending_rows] == keys
    stored = await stored_rows(store, sheet)
    assert set(stored) == set(keys)
    assert all(stored[key]["company"] == key for key in keys)


async def test_more_than_one_chunk_is_admitted_in_one_transaction(
    store: SheetStore, sheet: SheetRef
) -> None:
    n = POSTGRES_WRITE_CHUNK_ROWS + 7
    rows = [{"id": i, "company": f"c{i}"} for i in range(n)]
    admission = await store.start_dataset(sheet, rows, "run-1", CONTRACT, key_field="id")
    assert admission.inserted == n
    assert [r["_key"] for r in admission.pending_rows] == [str(i) for i in range(n)]
    assert await store.count(sheet) == n
    # A re-admission over several chunks finds every key again.
    again = await store.start_dataset(sheet, rows, "run-2", CONTRACT, key_field="id")
    assert (again.inserted, len(again.pending_rows), again.write_version) == (0, n, 2)
    summary, recount = await counters_match_rows(store, sheet)
    assert summary == recount


def _oversized_row() -> dict[str, Any]:
    return {"company": "x" * (MAX_ROW_BYTES + 1)}


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        (["not", "an", "object"], "must be a JSON object"),
        ("a string", "must be a JSON object"),
        (None, "must be a JSON object"),
        ({1: "non-string field name"}, "non-string field name"),
        ({"score": math.nan}, "finite"),
        ({"score": math.inf}, "finite"),
        ({"nested": {"deep": [1, -math.inf]}}, "finite"),
        ({"company": object()}, "not valid JSON"),
        ({"company": "\ud800"}, "surrogate"),
        (_oversized_row(), "row budget"),
    ],
)
async def test_bad_rows_are_refused_before_anything_is_written(
    store: SheetStore, sheet: SheetRef, bad_row: Any, message: str
) -> None:
    await store.start_dataset(
        sheet, [{"id": 0, "company": "kept"}], "run-0", CONTRACT, key_field="id"
    )
    before = await snapshot(store, sheet)
    # The bad row sits after a full chunk of good rows, so a write-as-you-go
    # implementation would already have written something.
    rows = [{"id": i, "company": "new"} for i in range(1, POSTGRES_WRITE_CHUNK_ROWS + 2)]
    with pytest.raises(InvalidInputError, match=message):
        await store.start_dataset(sheet, [*rows, bad_row], "run-1", CONTRACT)
    assert await snapshot(store, sheet) == before


async def test_a_row_without_its_key_field_is_refused(store: SheetStore, sheet: SheetRef) -> None:
    await store.ensure_sheet(sheet, CONTRACT)
    before = await snapshot(store, sheet)
    with pytest.raises(InvalidInputError, match="row 1: row has no key field 'id'"):
        await store.start_dataset(
            sheet, [{"id": 1}, {"company": "no id"}], "run-1", CONTRACT, key_field="id"
        )
    with pytest.raises(InvalidInputError, match="run_id"):
        await store.start_dataset(sheet, [{"id": 1}], "", CONTRACT, key_field="id")
    with pytest.raises(InvalidInputError, match="sequence"):
        await store.start_dataset(sheet, {"id": 1}, "run-1", CONTRACT)  # type: ignore[arg-type]
    assert await snapshot(store, sheet) == before


async def test_an_empty_input_still_takes_a_version(store: SheetStore, sheet: SheetRef) -> None:
    first = await store.start_dataset(sheet, [], "run-1", CONTRACT)
    second = await store.start_dataset(sheet, [], "run-2", CONTRACT)
    assert (first.inserted, first.skipped, first.pending_rows) == (0, 0, ())
    assert (first.write_version, second.write_version) == (1, 2)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ("a string", "must be a JSON object"),
        ({"id": 0, "score": math.nan}, "finite"),
        ({"id": 0, "company": "\ud800"}, "surrogate"),
        ({"id": 0, "company": "x" * (MAX_ROW_BYTES + 1)}, "row budget"),
        ({"company": "no id"}, "has no key field 'id'"),
    ],
)
async def test_a_bad_row_in_a_first_admission_commits_nothing(
    store: SheetStore, sheet: SheetRef, bad_row: Any, message: str
) -> None:
    # A first admission streams rows into one COPY as they are checked: the bad
    # row comes after more than a chunk of rows already sent to the server.
    await store.ensure_sheet(sheet, CONTRACT)
    before = await snapshot(store, sheet)
    rows = [{"id": i, "company": "new"} for i in range(1, POSTGRES_WRITE_CHUNK_ROWS + 2)]
    connections = store.pool.stats()["connections_num"]
    with pytest.raises(InvalidInputError, match=message):
        await store.start_dataset(sheet, [*rows, bad_row], "run-1", CONTRACT, key_field="id")
    assert await snapshot(store, sheet) == before
    # The aborted COPY left its connection clean: the pool kept it.
    assert store.pool.stats()["connections_num"] == connections
    # The version the failed admission took was rolled back with its rows.
    admission = await store.start_dataset(sheet, rows, "run-2", CONTRACT, key_field="id")
    assert (admission.inserted, admission.write_version) == (len(rows), 1)
