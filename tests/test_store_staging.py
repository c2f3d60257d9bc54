"""Staged admission in the store: chunks then one commit give exactly what one
``start_dataset`` of the same input gives (rows, versions, counters, column summary,
events), and the commit is all or nothing, once."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from _store_helpers import snapshot
from sheetplane._types import CompleteRow, ContractColumn, FailRow, SheetContract, SheetRef
from sheetplane.errors import STAGING_LOST_TEXT, AdmissionStateError, InvalidInputError
from sheetplane.protocol import prepare_chunk
from sheetplane.store import SheetStore, _staging, sheet_names

CONTRACT = SheetContract(
    (
        ContractColumn("company", "company", "input"),
        ContractColumn("domain", "domain_col", "input", field="site"),
        ContractColumn("score", "score", "output"),
    )
)
COLUMNS = CONTRACT.columns


def new_sheet() -> SheetRef:
    return SheetRef("org-staging", "play", f"ns-{uuid.uuid4().hex[:10]}")


async def staged(
    store: SheetStore,
    sheet: SheetRef,
    rows: Sequence[dict[str, Any]],
    run_id: str,
    *,
    chunk: int = 3,
) -> Any:
    admission_id = uuid.uuid4().hex
    await store.begin_admission(sheet, CONTRACT, admission_id, run_id)
    seq = 0
    for first in range(0, len(rows), chunk):
        prepared = prepare_chunk(rows[first : first + chunk], first)
        assert await store.stage_chunk(sheet, admission_id, seq, first, prepared)
        seq += 1
    return await store.commit_admission(
        sheet, CONTRACT, admission_id, run_id, chunks=seq, rows=len(rows)
    )


def comparable(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without timestamps and event ids (which differ between two sheets)."""
    rows = [(r[0], r[1], r[2], r[3], r[6], r[9], r[10], r[11], *r[12:]) for r in snap["rows"]]
    events = [(e[1], e[2], e[3], e[5]) for e in snap["events"]]
    summary = [s[:7] for s in snap["summary"]]
    columns = [c[:2] for c in snap["columns"]]
    return {
        "rows": rows,
        "events": events,
        "summary": summary,
        "columns": columns,
        "counters": snap["counters"],
    }


ATTEMPTS: list[list[dict[str, Any]]] = [
    [
        {"_key": "b", "company": "B", "site": "b.io"},
        {"_key": "a", "company": "A"},
        {"_key": "c", "company": None, "score": 7},
        {"_key": "a", "company": "A again"},  # a duplicate across chunks: the first wins
        {"_key": "d", "company": "D", "site": None},
        {"_key": "e", "company": "E"},
        {"_key": "b", "company": "B again"},
    ],
    [
        {"_key": "e", "company": "E2"},
        {"_key": "a", "company": "A2", "site": "a.io"},
        {"_key": "f", "company": "F"},
        {"_key": "c", "site": "c.io"},
        {"_key": "b", "company": None},
        {"_key": "d"},
        {"_key": "f", "company": "F dup"},
        {"_key": "g", "company": "G"},
    ],
]


def _first_occurrences(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    return [row for row in rows if not (row["_key"] in seen or seen.add(row["_key"]))]


#: A first admission whose keys are unique: the commit's one-statement insert into
#: the empty sheet (the first attempt of ATTEMPTS repeats keys: the range statements).
UNIQUE_FIRST: list[list[dict[str, Any]]] = [_first_occurrences(ATTEMPTS[0]), ATTEMPTS[1]]


@pytest.mark.parametrize(
    ("chunk", "attempts"),
    [(1, ATTEMPTS), (3, ATTEMPTS), (100, ATTEMPTS), (3, UNIQUE_FIRST)],
    ids=["chunk1", "chunk3", "chunk100", "unique-first"],
)
async def test_staged_admission_equals_one_start_dataset(
    store: SheetStore,
    chunk: int,
    attempts: list[list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ranges of 2 positions: the commit's statements meet at range boundaries.
    monkeypatch.setattr(_staging, "ADMISSION_COMMIT_RANGE_ROWS", 2)
    direct, via_stage = new_sheet(), new_sheet()
    for attempt, rows in enumerate(attempts, start=1):
        run_id = f"run-{attempt}"
        one = await store.start_dataset(direct, rows, run_id, CONTRACT)
        counts = await staged(store, via_stage, rows, run_id, chunk=chunk)
        assert counts.write_version == one.write_version == attempt
        assert counts.inserted == one.inserted
        assert counts.skipped == one.skipped
        assert counts.pending_count == len(one.pending_rows)
        assert counts.completed_count == len(one.completed_rows)
        assert comparable(await snapshot(store, via_stage)) == comparable(
            await snapshot(store, direct)
        )
        # Between attempts: complete one row, fail one, on both sheets alike.
        for sheet in (direct, via_stage):
            await store.complete_map_rows(
                sheet,
                CONTRACT,
                [CompleteRow("a", {"score": 1})],
                run_id=run_id,
                write_version=attempt,
            )
            await store.fail_map_rows(
                sheet, CONTRACT, [FailRow("e", "boom")], run_id=run_id, write_version=attempt
            )
    assert comparable(await snapshot(store, via_stage)) == comparable(await snapshot(store, direct))


async def test_a_replayed_chunk_and_commit_are_applied_once(store: SheetStore) -> None:
    sheet = new_sheet()
    admission_id = uuid.uuid4().hex
    await store.begin_admission(sheet, CONTRACT, admission_id, "run-1")
    await store.begin_admission(sheet, CONTRACT, admission_id, "run-1")  # a retried begin
    rows = [{"_key": f"k{i}", "company": str(i)} for i in range(5)]
    first = prepare_chunk(rows[:3], 0)
    assert await store.stage_chunk(sheet, admission_id, 0, 0, first)
    assert not await store.stage_chunk(sheet, admission_id, 0, 0, first)
    second = prepare_chunk(rows[3:], 3)
    assert await store.stage_chunk(sheet, admission_id, 1, 3, second)
    before = await snapshot(store, sheet)
    assert before["rows"] == []
    counts = await store.commit_admission(sheet, CONTRACT, admission_id, "run-1", chunks=2, rows=5)
    after = await snapshot(store, sheet)
    again = await store.commit_admission(sheet, CONTRACT, admission_id, "run-1", chunks=2, rows=5)
    assert again == counts
    assert await snapshot(store, sheet) == after
    assert (counts.write_version, counts.inserted, counts.pending_count) == (1, 5, 5)
    assert [e[1] for e in after["events"]] == ["admission"]
    with pytest.raises(AdmissionStateError):  # a chunk after the commit
        await store.stage_chunk(sheet, admission_id, 2, 5, second)


async def test_a_commit_whose_chunks_do_not_add_up_writes_nothing(store: SheetStore) -> None:
    sheet = new_sheet()
    admission_id = uuid.uuid4().hex
    await store.begin_admission(sheet, CONTRACT, admission_id, "run-1")
    rows = [{"_key": f"k{i}"} for i in range(4)]
    await store.stage_chunk(sheet, admission_id, 0, 0, prepare_chunk(rows[:2], 0))
    # A chunk after a gap names a chunk the staging table does not hold: refused at once.
    with pytest.raises(AdmissionStateError, match=STAGING_LOST_TEXT):
        await store.stage_chunk(sheet, admission_id, 2, 2, prepare_chunk(rows[2:], 2))
    await store.stage_chunk(sheet, admission_id, 1, 2, prepare_chunk(rows[2:], 2))
    before = await snapshot(store, sheet)
    for chunks, total in ((1, 4), (3, 4), (2, 5)):
        with pytest.raises(AdmissionStateError):
            await store.commit_admission(
                sheet, CONTRACT, admission_id, "run-1", chunks=chunks, rows=total
            )
    with pytest.raises(AdmissionStateError):
        await store.commit_admission(sheet, CONTRACT, admission_id, "run-2", chunks=2, rows=4)
    assert await snapshot(store, sheet) == before


def test_prepare_chunk_names_the_position_in_the_whole_input() -> None:
    with pytest.raises(InvalidInputError, match="row 6002 must be a JSON object"):
        prepare_chunk([{"a": 1}, {"a": 2}, ["not", "a", "row"]], 6000)


async def test_a_staging_table_of_the_row_per_row_layout_is_made_again_by_ensure_sheet(
    store: SheetStore,
) -> None:
    # A sheet staged into before chunks were one staging row each: its staging table has
    # a row per staged row (and a jsonb column per contract column). ensure_sheet makes
    # it again in the chunk layout, and staged admission works on the sheet.
    sheet = new_sheet()
    await store.ensure_sheet(sheet, CONTRACT)
    names = sheet_names(sheet)
    staging = names.ident("staging_table")

    def old_layout(conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("DROP TABLE {}").format(staging))
        conn.execute(
            sql.SQL(
                "CREATE UNLOGGED TABLE {} (_admission_id text NOT NULL, _position bigint NOT NULL,"
                " _key text NOT NULL, company jsonb, domain_col jsonb, score jsonb)"
            ).format(staging)
        )
        conn.execute(
            sql.SQL("CREATE INDEX {} ON {} (_admission_id, _position)").format(
                sql.Identifier(names.staging_index), staging
            )
        )

    await store.pool.run(old_layout)
    await store.ensure_sheet(sheet, CONTRACT)  # never cached: reads the catalog
    rows = [{"_key": "a", "company": "A"}, {"_key": "b", "site": "b.example"}]
    counts = await staged(store, sheet, rows, "run-1", chunk=1)
    assert (counts.inserted, counts.pending_count) == (2, 2)
    columns = await store.pool.run(
        lambda conn: conn.execute(
            "SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (staging.as_string(conn),),
        ).fetchone()
    )
    assert columns == (
        ["_admission_id", "_seq", "_first_position", "_row_count", "_keys", "_rows", "_prev_seq"],
    )


async def test_a_lost_staging_table_is_found_at_the_next_chunk(store: SheetStore) -> None:
    # A database restart empties the unlogged staging table. Before, the runner staged
    # every remaining chunk and learned it only at the commit ("staging table holds
    # 180000 rows, not the 300000 its chunks record"); now the next chunk is refused.
    sheet = new_sheet()
    admission_id = uuid.uuid4().hex
    await store.begin_admission(sheet, CONTRACT, admission_id, "run-1")
    rows = [{"_key": f"k{i}", "company": str(i)} for i in range(6)]
    assert await store.stage_chunk(sheet, admission_id, 0, 0, prepare_chunk(rows[:3], 0))
    staging = sheet_names(sheet).ident("staging_table")
    await store.pool.run(lambda conn: conn.execute(sql.SQL("TRUNCATE {}").format(staging)))
    with pytest.raises(AdmissionStateError, match=STAGING_LOST_TEXT):
        await store.stage_chunk(sheet, admission_id, 1, 3, prepare_chunk(rows[3:], 3))
    # The commit refuses it too, saying the same, and nothing is written.
    with pytest.raises(AdmissionStateError, match=STAGING_LOST_TEXT):
        await store.commit_admission(sheet, CONTRACT, admission_id, "run-1", chunks=1, rows=3)
    assert (await snapshot(store, sheet))["rows"] == []


def planned_rows(store: SheetStore, sheet: SheetRef, version: int) -> Any:
    """The planner's estimate of the rows a fenced write at ``version`` may change."""
    table = sheet_names(sheet).ident("sheet_table")

    def run(conn: psycopg.Connection[Any]) -> int:
        found = conn.execute(
            sql.SQL(
                "EXPLAIN (FORMAT JSON) SELECT _key FROM {} "
                "WHERE _status IN ('pending', 'running') AND (seq).write_version = %s"
            ).format(table),
            (version,),
        ).fetchone()
        assert found is not None
        return int(found[0][0]["Plan"]["Plan Rows"])

    return store.pool.run(run)


@pytest.mark.parametrize("road", ["staged", "inline"])
@pytest.mark.parametrize("first", ["unique-keys", "repeated-keys"])
async def test_the_writes_after_a_large_admission_are_planned_on_its_rows(
    store: SheetStore, road: str, first: str
) -> None:
    # A sheet never analyzed has no column statistics: the fenced writes that follow an
    # admission were planned as if it held a row or two (one `complete_map_rows` of 5,000
    # rows right after a 16,000-row admission ran for 17-19 s, a nested loop over both).
    rows = [{"_key": f"k{i:05d}", "company": f"C{i}"} for i in range(3_000)]
    if first == "repeated-keys":  # the range statements instead of the one insert
        rows.append({"_key": "k00000", "company": "again"})
    sheet = new_sheet()
    if road == "staged":
        counts = await staged(store, sheet, rows, "run-1", chunk=1_000)
        version = counts.write_version
    else:
        version = (await store.start_dataset(sheet, rows, "run-1", CONTRACT)).write_version
    assert await planned_rows(store, sheet, version) >= 3_000 // 2
