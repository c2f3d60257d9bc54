"""Reads on a real Postgres: order, run filter, row modes, batches, the byte budget, keysets."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from sheetplane._types import ContractColumn, Page, PageRequest, SheetContract, SheetRef, Summary
from sheetplane.budgets import (
    READ_BATCH_MAX_PAGES,
    READ_BATCH_MAX_RESPONSE_BYTES,
    READ_PAGE_MAX_ROWS,
)
from sheetplane.errors import InvalidInputError, ReadBatchTooLargeError
from sheetplane.store import RowCursor, RowFilter, SheetStore, sheet_names
from sheetplane.store._reads import _Budget

CONTRACT = SheetContract(
    (
        ContractColumn("Company", "company", "input"),
        ContractColumn("score", "score_col", "output"),
    )
)
BASE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


async def insert(store: SheetStore, sheet: SheetRef, rows: Sequence[dict[str, Any]]) -> None:
    """Insert rows as they would be stored; ``created`` is seconds after BASE."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> None:
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (_key, _input_index, _created_at, _run_id, _status,"
                    " company, score_col) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                ).format(names.ident("sheet_table")),
                [
                    (
                        row["key"],
                        row.get("index"),
                        BASE + dt.timedelta(seconds=row.get("created", 0)),
                        row.get("run"),
                        row.get("status", "pending"),
                        Jsonb(row.get("company")),
                        Jsonb(row.get("score")),
                    )
                    for row in rows
                ],
            )

    await store.pool.run(run)


def model_order(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The read order, computed in Python: index ascending with None last, created, key."""

    def sort_key(row: dict[str, Any]) -> tuple[Any, ...]:
        index = row.get("index")
        return (index is None, index or 0, row.get("created", 0), row["key"])

    return [row["key"] for row in sorted(rows, key=sort_key)]


@pytest.fixture
async def ready(store: SheetStore, sheet: SheetRef) -> SheetRef:
    await store.ensure_sheet(sheet, CONTRACT)
    return sheet


def mixed_rows(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        rows.append(
            {
                "key": f"k{rng.randrange(10**6):06d}-{i}",
                "index": rng.choice([None, rng.randrange(5)]),
                "created": rng.randrange(3),
                "run": rng.choice(["run-a", "run-b", None]),
                "company": f"co {i}",
                "score": rng.choice([None, i, {"nested": [i]}]),
            }
        )
    return rows


async def test_read_order_puts_null_indexes_last(store: SheetStore, ready: SheetRef) -> None:
    rows = [
        {"key": "b", "index": None, "created": 1},
        {"key": "a", "index": None, "created": 1},
        {"key": "z", "index": None, "created": 0},
        {"key": "c", "index": 2, "created": 5},
        {"key": "d", "index": 1, "created": 9},
        {"key": "e", "index": 2, "created": 5},
        {"key": "f", "index": 0, "created": 7},
    ]
    await insert(store, ready, rows)
    page = await store.read_rows(ready, PageRequest(limit=100, offset=0))
    assert [row["_key"] for row in page.rows] == ["f", "d", "c", "e", "z", "a", "b"]
    assert [row["_key"] for row in page.rows] == model_order(rows)
    assert await store.read_row_keys(ready, PageRequest(3, 2)) == ["c", "e", "z"]


async def test_output_and_all_row_modes(store: SheetStore, ready: SheetRef) -> None:
    await insert(
        store,
        ready,
        [{"key": "k", "index": 4, "run": "r", "company": "ACME", "score": {"v": [1, "ü"]}}],
    )
    (output,) = (await store.read_rows(ready, PageRequest(1, 0))).rows
    assert output == {
        "_key": "k",
        "Company": "ACME",
        "score": {"v": [1, "ü"]},
        "_status": "pending",
        "_error": None,
        "_input_index": 4,
    }
    assert next(iter(output)) == "_key"
    (full,) = (
        await store.read_rows(ready, PageRequest(1, 0), which=RowFilter(row_mode="all"))
    ).rows
    assert {k: full[k] for k in output} == output
    assert set(full) - set(output) == {
        "_run_id",
        "_stage",
        "_provider",
        "_created_at",
        "_updated_at",
        "_cell_meta",
        "_write_version",
    }
    assert full["_run_id"] == "r"
    assert dt.datetime.fromisoformat(full["_created_at"]) == BASE
    assert isinstance(full["_updated_at"], str)
    assert full["_cell_meta"] == {} and full["_write_version"] == 0
    json.dumps(full)  # every value is JSON


async def test_run_id_filter(store: SheetStore, ready: SheetRef) -> None:
    rows = mixed_rows(7, 40)
    await insert(store, ready, rows)
    for run in ("run-a", "run-b"):
        expected = model_order([row for row in rows if row["run"] == run])
        page = await store.read_rows(ready, PageRequest(100, 0), which=RowFilter(run_id=run))
        assert [row["_key"] for row in page.rows] == expected
        assert await store.count(ready, which=RowFilter(run_id=run)) == len(expected)
        keys = await store.read_row_keys(ready, PageRequest(100, 0), which=RowFilter(run_id=run))
        assert keys == expected
    assert await store.count(ready) == 40
    assert (
        await store.read_rows(ready, PageRequest(5, 0), which=RowFilter(run_id="nobody"))
    ).rows == ()


async def test_batch_reads_equal_single_reads(store: SheetStore, ready: SheetRef) -> None:
    rows = mixed_rows(11, 60)
    await insert(store, ready, rows)
    requests = [PageRequest(7, 0), PageRequest(7, 5), PageRequest(30, 50), PageRequest(3, 200)]
    for mode in ("output", "all"):
        batch = await store.read_rows_batch(ready, requests, which=RowFilter(row_mode=mode))
        singles = [
            await store.read_rows(ready, r, which=RowFilter(row_mode=mode)) for r in requests
        ]
        assert batch == singles
        assert [(p.limit, p.offset) for p in batch] == [(r.limit, r.offset) for r in requests]
    assert [len(p.rows) for p in batch] == [7, 7, 10, 0]
    order = model_order(rows)
    assert [row["_key"] for row in batch[2].rows] == order[50:]


async def test_missing_sheet_reads_empty(store: SheetStore, sheet: SheetRef) -> None:
    assert await store.read_rows_batch(sheet, [PageRequest(5, 0), PageRequest(5, 5)]) == [
        Page((), 5, 0),
        Page((), 5, 5),
    ]
    assert await store.count(sheet) == 0
    assert await store.read_row_keys(sheet, PageRequest(5, 0)) == []
    assert await store.read_rows_by_keys(sheet, ["a"]) == []
    assert await store.read_rows_after(sheet, None, 5) == ([], None)
    assert await store.summary(sheet) == Summary(0, 0, 0, 0, 0)


async def test_rows_by_keys_and_summary(store: SheetStore, ready: SheetRef) -> None:
    await insert(
        store,
        ready,
        [
            {"key": "x", "index": 2},
            {"key": "y", "index": 1},
            {"key": 'it\'s "q"', "index": 3},
        ],
    )
    rows = await store.read_rows_by_keys(ready, ["x", "missing", 'it\'s "q"', "y", "x"])
    assert [row["_key"] for row in rows] == ["y", "x", 'it\'s "q"']
    assert await store.read_rows_by_keys(ready, []) == []
    # Rows inserted by plain SQL are counted too: the counting triggers count rows.
    assert await store.summary(ready) == Summary(3, 3, 0, 0, 0)
    # The summary row's counts (inserts and deletes count there; an older sheet's
    # counts are kept there too) add to the log's.
    names = sheet_names(ready)
    await store.pool.run(
        lambda c: c.execute(
            sql.SQL(
                "UPDATE {} SET total = total + 3, queued = queued + 1, running = running + 1,"
                " completed = completed + 1"
            ).format(names.ident("summary_table"))
        )
    )
    assert await store.summary(ready) == Summary(6, 4, 1, 1, 0)


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 50])
async def test_keyset_iteration_equals_offset_iteration(
    store: SheetStore, ready: SheetRef, limit: int
) -> None:
    rows = mixed_rows(limit, 45)
    # Ties on (index, created) so the key decides, on both sides of NULL.
    rows += [{"key": f"tie-{n}", "index": 1, "created": 1} for n in range(4)]
    rows += [{"key": f"null-tie-{n}", "index": None, "created": 1} for n in range(4)]
    await insert(store, ready, rows)
    for run_id in (None, "run-a"):
        by_offset: list[dict[str, Any]] = []
        offset = 0
        while page := (
            await store.read_rows(ready, PageRequest(limit, offset), which=RowFilter(run_id=run_id))
        ).rows:
            by_offset += page
            offset += len(page)
        by_keyset: list[dict[str, Any]] = []
        cursor: RowCursor | None = None
        calls = 0
        while True:
            page_rows, cursor = await store.read_rows_after(
                ready, cursor, limit, which=RowFilter(run_id=run_id)
            )
            calls += 1
            by_keyset += page_rows
            assert len(page_rows) <= limit
            if cursor is None:
                break
        assert by_keyset == by_offset
        assert calls <= len(by_offset) // limit + 1
        expected = [r for r in rows if run_id is None or r.get("run") == run_id]
        assert [row["_key"] for row in by_keyset] == model_order(expected)


def test_row_cursor_is_frozen() -> None:
    cursor = RowCursor(1, BASE, "k")
    with pytest.raises(AttributeError):
        cursor.key = "other"  # type: ignore[misc]


# --- the byte budget ------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["dicts", "json"])
async def test_batch_over_budget_raises_with_observed_bytes(
    store: SheetStore, ready: SheetRef, form: str
) -> None:
    big = 4 * 1024 * 1024
    names = sheet_names(ready)
    await store.pool.run(
        lambda c: c.execute(
            sql.SQL(
                "INSERT INTO {} (_key, _input_index, company)"
                " SELECT 'big' || i, i, to_jsonb(repeat('x', %s)) FROM generate_series(1, 4) i"
            ).format(names.ident("sheet_table")),
            (big,),
        )
    )
    read_batch = store.read_rows_batch if form == "dicts" else store.read_rows_batch_json
    # Two big rows fit the budget.
    (page,) = await read_batch(ready, [PageRequest(2, 0)])
    assert len(page.rows) == 2
    # Four pages of one big row each: the third page already passes 12 MiB.
    requests = [PageRequest(1, n) for n in range(4)]
    with pytest.raises(ReadBatchTooLargeError) as caught:
        await read_batch(ready, requests)
    observed = caught.value.observed_bytes
    assert observed > READ_BATCH_MAX_RESPONSE_BYTES
    assert observed < 3 * big + 4096
    assert caught.value.code == "runtime_sheet_read_batch_too_large"
    # One page of all four rows: over budget too, and no more than that page is read.
    with pytest.raises(ReadBatchTooLargeError):
        await read_batch(ready, [PageRequest(4, 0)])
    read_after = store.read_rows_after if form == "dicts" else store.read_rows_after_json
    with pytest.raises(ReadBatchTooLargeError):
        await read_after(ready, None, 4)
    # The pool is fine afterwards.
    assert await store.count(ready) == 4


values = st.one_of(st.none(), st.integers(), st.text(max_size=20), st.lists(st.booleans()))


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, int, list[tuple[Any, ...]]]]]:
    keys = draw(st.lists(st.text(max_size=5), unique=True, min_size=1, max_size=4))
    row = st.tuples(*(values for _ in keys))
    pages = draw(
        st.lists(
            st.tuples(st.integers(1, 5000), st.integers(0, 10**9), st.lists(row, max_size=12)),
            max_size=4,
        )
    )
    return keys, pages


@settings(max_examples=150)
@given(answers(), st.integers(1, 4))
def test_budget_counts_the_exact_answer(
    answer: tuple[list[str], list[tuple[int, int, list[tuple[Any, ...]]]]], slice_rows: int
) -> None:
    keys, pages = answer
    key_bytes = sum(len(json.dumps(k, ensure_ascii=False).encode()) + 1 for k in keys)
    whole = {
        "pages": [
            {
                "rows": [dict(zip(keys, row, strict=True)) for row in rows],
                "limit": lim,
                "offset": off,
            }
            for lim, off, rows in pages
        ]
    }
    exact = len(json.dumps(whole, separators=(",", ":"), ensure_ascii=False).encode())

    def compact(row: tuple[Any, ...]) -> bytes:
        value = dict(zip(keys, row, strict=True))
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    for encoded in (False, True):
        for limit in (exact, exact - 1):
            try:
                budget = _Budget(limit)
                for page_limit, offset, rows in pages:
                    budget.start_page(PageRequest(page_limit, offset))
                    for start in range(0, len(rows), slice_rows):
                        part = rows[start : start + slice_rows]
                        if encoded:
                            budget.add_encoded([compact(row) for row in part])
                        else:
                            budget.add_rows(part, key_bytes)
            except ReadBatchTooLargeError as exc:
                assert limit == exact - 1
                assert limit < exc.observed_bytes <= exact
            else:
                assert limit == exact
                assert budget.used == exact


async def test_contiguous_pages_read_by_keyset_equal_offset_pages(
    store: SheetStore, ready: SheetRef
) -> None:
    rows = mixed_rows(3, 80)
    rows += [{"key": f"tie-{n}", "index": 2, "created": 1} for n in range(6)]
    rows += [{"key": f"null-{n}", "index": None, "created": 1} for n in range(6)]
    await insert(store, ready, rows)
    order = model_order(rows)
    for run_id in (None, "run-b"):
        expected = model_order([r for r in rows if run_id is None or r.get("run") == run_id])
        for limit in (1, 4, 9, 40):
            requests = [PageRequest(limit, n * limit) for n in range(4)]
            batch = await store.read_rows_batch(ready, requests, which=RowFilter(run_id=run_id))
            got = [row["_key"] for page in batch for row in page.rows]
            assert got == expected[: 4 * limit]
            as_json = await store.read_rows_batch_json(
                ready, requests, which=RowFilter(run_id=run_id)
            )
            assert [[json.loads(r) for r in p.rows] for p in as_json] == [
                list(p.rows) for p in batch
            ]
            for page in batch:
                single = await store.read_rows(
                    ready, PageRequest(page.limit, page.offset), which=RowFilter(run_id=run_id)
                )
                assert page == single
    assert len(order) == 92


# --- bad input, rejected before any query ------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s, ref: s.read_rows_batch(ref, []),
        lambda s, ref: s.read_rows_batch(ref, [PageRequest(1, 0)] * (READ_BATCH_MAX_PAGES + 1)),
        lambda s, ref: s.read_rows_batch(ref, [{"limit": 1, "offset": 0}]),
        lambda s, ref: s.read_rows_batch(ref, PageRequest(1, 0)),
        lambda s, ref: s.read_rows(ref, PageRequest(READ_PAGE_MAX_ROWS + 1, 0)),
        lambda s, ref: s.read_rows(ref, PageRequest(1, 2**63)),
        lambda s, ref: s.read_rows(ref, PageRequest(1, 0), which=RowFilter(run_id="")),
        lambda s, ref: s.read_rows(ref, PageRequest(1, 0), which=RowFilter(run_id="a\x00b")),
        lambda s, ref: s.read_rows(ref, PageRequest(1, 0), which=RowFilter(row_mode="raw")),
        lambda s, ref: s.read_rows(ref, PageRequest(1, 0), which={"run_id": "r"}),
        lambda s, ref: s.read_rows_batch(ref, [PageRequest(1, 0)], which=RowFilter(admitted=5)),
        lambda s, ref: s.read_rows_after(ref, None, 0),
        lambda s, ref: s.read_rows_after(ref, None, -1),
        lambda s, ref: s.read_rows_after(ref, None, math.nan),
        lambda s, ref: s.read_rows_after(ref, None, math.inf),
        lambda s, ref: s.read_rows_after(ref, None, 2.0),
        lambda s, ref: s.read_rows_after(ref, None, True),
        lambda s, ref: s.read_rows_after(ref, None, "5"),
        lambda s, ref: s.read_rows_after(ref, ("k",), 5),
        lambda s, ref: s.read_row_keys(ref, PageRequest(READ_PAGE_MAX_ROWS + 1, 0)),
        lambda s, ref: s.read_rows_by_keys(ref, "abc"),
        lambda s, ref: s.read_rows_by_keys(ref, ["ok", 3]),
        lambda s, ref: s.read_rows_by_keys(ref, ["nul\x00"]),
        lambda s, ref: s.count(ref, which=RowFilter(run_id=5)),
        lambda s, ref: s.read_rows(SheetRef("", "p", "n"), PageRequest(1, 0)),
        lambda s, ref: s.count(SheetRef("o", "p", "n\x00")),
    ],
)
async def test_bad_arguments_are_rejected_before_any_query(
    store: SheetStore, ready: SheetRef, call: Any
) -> None:
    runs = store.pool.stats()["runs"]
    with pytest.raises(InvalidInputError):
        await call(store, ready)
    assert store.pool.stats()["runs"] == runs


@pytest.mark.parametrize(
    ("limit", "offset"),
    [(math.nan, 0), (math.inf, 0), (-1, 0), (0, 0), (1, -1), (1, math.nan), (1.5, 0), (True, 0)],
)
def test_page_requests_reject_bad_numbers(limit: Any, offset: Any) -> None:
    with pytest.raises(InvalidInputError):
        PageRequest(limit, offset)


async def test_json_rows_refuse_a_stored_number_past_a_float(
    store: SheetStore, ready: SheetRef
) -> None:
    """jsonb holds numbers no float can (read as infinity, which JSON cannot write):
    the JSON form refuses them wherever they stand in the page, rather than
    writing null or Infinity."""
    rows = [{"key": f"k{n}", "index": n, "company": f"c{n}"} for n in range(8)]
    await insert(store, ready, rows)
    names = sheet_names(ready)
    await store.pool.run(
        lambda c: c.execute(
            sql.SQL(
                "UPDATE {} SET score_col = ('1' || repeat('0', 400) || '.5')::jsonb"
                " WHERE _key = 'k5'"
            ).format(names.ident("sheet_table"))
        )
    )
    with pytest.raises(InvalidInputError, match="no JSON form"):
        await store.read_rows_batch_json(ready, [PageRequest(8, 0)])
    with pytest.raises(InvalidInputError, match="no JSON form"):
        await store.read_rows_after_json(ready, None, 8)
    (page,) = await store.read_rows_batch_json(ready, [PageRequest(5, 0)])
    assert [json.loads(row)["_key"] for row in page.rows] == [f"k{n}" for n in range(5)]


def test_budget_encoding_path_counts_utf8_and_escapes_exactly() -> None:
    keys = ["_key", "naïve", "q"]
    key_bytes = sum(len(json.dumps(k, ensure_ascii=False).encode()) + 1 for k in keys)
    rows = [(f"k{n}", 'ü☃\n\t"\\' * (n % 3), [n, None, {"é": True}]) for n in range(200)]
    whole = {
        "pages": [
            {"rows": [dict(zip(keys, r, strict=True)) for r in rows], "limit": 200, "offset": 0}
        ]
    }
    exact = len(json.dumps(whole, separators=(",", ":"), ensure_ascii=False).encode())
    budget = _Budget(READ_BATCH_MAX_RESPONSE_BYTES)  # far from the limit: slices get encoded
    budget.start_page(PageRequest(200, 0))
    for start in range(0, 200, 10):
        budget.add_rows(rows[start : start + 10], key_bytes)
    assert budget.used == exact
