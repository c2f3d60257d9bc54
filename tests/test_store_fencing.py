"""Terminal writes under write-version fencing: the pure decision table, then the
same rules on a real Postgres, replays, conflicts, legacy writers and races."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

from _store_helpers import column_counts_match, counters_match_rows, snapshot, stored_rows
from sheetplane import _rowchecks
from sheetplane._types import (
    CompleteRow,
    ContractColumn,
    FailRow,
    SheetContract,
    SheetRef,
    StaleRow,
    TerminalWriteResult,
)
from sheetplane.errors import AttemptSupersededError, InvalidInputError, WriteConflictError
from sheetplane.store import SheetStore, raise_if_superseded, sheet_names, superseded_rows
from sheetplane.store._fencing import Decision, StoredRow, decide_terminal_write

CONTRACT = SheetContract(
    (
        ContractColumn("company", "company", "input"),
        ContractColumn("score", "score_col", "output"),
        ContractColumn("note", "note", "output"),
        ContractColumn("hidden", "_hidden", "output"),
    )
)


# --- the decision table ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "writer", "expected"),
    [
        (None, 3, Decision("stale", "newer_write_version", None)),
        (None, None, Decision("stale", "newer_write_version", None)),
        (StoredRow("pending", 3, False), 3, Decision("write")),
        (StoredRow("running", 3, False), 3, Decision("write")),
        (StoredRow("pending", 4, False), 3, Decision("stale", "newer_write_version", 4)),
        (StoredRow("pending", 2, False), 3, Decision("stale", "older_write_version", 2)),
        (StoredRow("enriched", 4, True), 3, Decision("stale", "newer_write_version", 4)),
        (StoredRow("failed", 1, True), 3, Decision("stale", "older_write_version", 1)),
        (StoredRow("enriched", 3, True), 3, Decision("replay")),
        (StoredRow("failed", 3, True), 3, Decision("replay")),
        (StoredRow("enriched", 3, False), 3, Decision("conflict")),
        # Another run finished it at this version: an unversioned writer (the seed's
        # 0.1.2 runtime, write_version=None) leaves the stamp; benign, not a conflict.
        (StoredRow("enriched", 3, False, True), 3, Decision("stale", "already_terminal", 3)),
        (StoredRow("failed", 3, False, True), 3, Decision("stale", "already_terminal", 3)),
        (StoredRow("enriched", 3, True, True), 3, Decision("replay")),
        (StoredRow("failed", 3, False), 3, Decision("conflict")),
        (StoredRow("stale", 3, False), 3, Decision("stale", "already_terminal", 3)),
        (StoredRow("stale", 4, False), 3, Decision("stale", "newer_write_version", 4)),
        (StoredRow("pending", 9, False), None, Decision("write")),
        (StoredRow("running", 0, False), None, Decision("write")),
        (StoredRow("enriched", 9, True), None, Decision("stale", "already_terminal", 9)),
        (StoredRow("failed", 9, False), None, Decision("stale", "already_terminal", 9)),
    ],
)
def test_decision_table(stored: StoredRow | None, writer: int | None, expected: Decision) -> None:
    assert decide_terminal_write(stored, writer) == expected


def test_superseded_rows_skip_benign_and_excepted_keys() -> None:
    result = TerminalWriteResult(
        committed_keys=("ok",),
        stale_rows=(
            StaleRow("a", "newer_write_version", 5),
            StaleRow("b", "already_terminal", 3),
            StaleRow("c", "older_write_version", 1),
            StaleRow("d", "unreported", None),
            StaleRow("a", "newer_write_version", 5),
        ),
        updated=1,
    )
    assert [r.key for r in superseded_rows(result)] == ["a", "c", "d"]
    assert [r.key for r in superseded_rows(result, except_keys=["c"])] == ["a", "d"]
    fields = {"table_namespace": "Leads", "run_id": "run-1", "write_version": 4}
    raise_if_superseded(result, except_keys=["a", "c", "d"], **fields)
    with pytest.raises(AttemptSupersededError) as caught:
        raise_if_superseded(result, **fields)
    error = caught.value
    assert error.superseded_rows == (
        StaleRow("a", "newer_write_version", 5),
        StaleRow("c", "older_write_version", 1),
        StaleRow("d", "unreported", None),
    )
    # Submitted: the distinct keys the result accounts for (ok, a, b, c, d).
    assert (error.table_namespace, error.run_id, error.write_version) == ("Leads", "run-1", 4)
    assert error.submitted_rows == 5
    assert str(error) == (
        'RUNTIME_SHEET_ATTEMPT_SUPERSEDED: Runtime Sheet table "Leads" rejected 3 of 5 '
        "terminal row write(s) from run run-1 at write version 4 because the rows are owned "
        "by a different write version (newer_write_version=1, older_write_version=1, "
        "unreported=1). This attempt has been superseded by a newer admission of these rows "
        "and must stop executing: nothing it persists from here on can be accepted. Sample: "
        "key=a row_write_version=5; key=c row_write_version=1; key=d row_write_version=unknown."
    )


def test_superseded_error_samples_five_keys_and_counts_reasons_in_order_seen() -> None:
    rows = (
        *(StaleRow(f"k{n}", "older_write_version", n) for n in range(2)),
        *(StaleRow(f"k{n}", "newer_write_version", 9) for n in range(2, 8)),
    )
    with pytest.raises(AttemptSupersededError) as caught:
        raise_if_superseded(
            TerminalWriteResult((), rows, 0), table_namespace="t", run_id="r", write_version=None
        )
    message = str(caught.value)
    assert "rejected 8 of 8 terminal row write(s) from run r at write version none " in message
    assert "(older_write_version=2, newer_write_version=6)" in message
    assert message.endswith("key=k3 row_write_version=9; key=k4 row_write_version=9.")
    assert "k5" not in message


# --- on Postgres ---------------------------------------------------------------------------


async def admit(store: SheetStore, sheet: SheetRef, ids: list[int], run_id: str) -> int:
    rows = [{"id": n, "company": f"c{n}"} for n in ids]
    admission = await store.start_dataset(sheet, rows, run_id, CONTRACT, key_field="id")
    return admission.write_version


async def test_a_write_at_the_admission_version_commits(store: SheetStore, sheet: SheetRef) -> None:
    version = await admit(store, sheet, [1, 2, 3], "run-1")
    result = await store.complete_map_rows(
        sheet,
        CONTRACT,
        [
            CompleteRow("1", {"score": 10, "note": "x", "hidden": "never stored", "junk": 1}),
            CompleteRow("2", {"score_col": 20}, cell_meta_patch={"score": {"source": "p"}}),
        ],
        run_id="run-1",
        write_version=version,
    )
    assert result == TerminalWriteResult(("1", "2"), (), 2)
    rows = await stored_rows(store, sheet)
    assert (rows["1"]["_status"], rows["1"]["score_col"], rows["1"]["note"]) == (
        "enriched",
        10,
        "x",
    )
    assert rows["2"]["score_col"] == 20
    assert rows["2"]["_cell_meta"] == {"score": {"source": "p"}}
    assert rows["1"]["_write_version"] == version
    assert rows["3"]["_status"] == "pending"
    summary, recount = await counters_match_rows(store, sheet)
    assert (
        summary == recount == {"total": 3, "queued": 1, "running": 0, "completed": 2, "failed": 0}
    )
    counts, recount_columns = await column_counts_match(store, sheet, ["score_col", "note"])
    assert counts == recount_columns == {"score_col": 2, "note": 1}


async def test_a_terminal_write_stores_values_orjson_has_no_form_for(
    store: SheetStore, sheet: SheetRef
) -> None:
    # A chunk's rows are written as JSON once (orjson); an integer past 64 bits, which
    # the row checks let through, is written by the standard library instead.
    version = await admit(store, sheet, [1, 2], "run-1")
    result = await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow("1", {"score": 2**70, "note": "é"}), CompleteRow("2", {"note": "b"})],
        run_id="run-1",
        write_version=version,
    )
    assert result == TerminalWriteResult(("1", "2"), (), 2)
    rows = await stored_rows(store, sheet)
    assert (rows["1"]["score_col"], rows["1"]["note"], rows["2"]["note"]) == (2**70, "é", "b")


async def test_a_terminal_write_of_flat_outputs_bounds_them_instead_of_measuring(
    store: SheetStore, sheet: SheetRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each row's data and cell meta were measured as JSON (two walks a row, the
    # store's costliest step of a map's write); a flat object passes on its size bound.
    version = await admit(store, sheet, list(range(200)), "run-1")
    measured = 0
    measure = _rowchecks.json_byte_length_up_to

    def counting(value: object, limit: int) -> Any:
        nonlocal measured
        measured += 1
        return measure(value, limit)

    monkeypatch.setattr(_rowchecks, "json_byte_length_up_to", counting)
    rows = [CompleteRow(str(i), {"score": i, "note": f"n{i}"}, {"score": None}) for i in range(200)]
    result = await store.complete_map_rows(
        sheet, CONTRACT, rows, run_id="run-1", write_version=version
    )
    assert result.updated == 200
    assert measured == 0
    stored = await stored_rows(store, sheet)
    assert (stored["7"]["score_col"], stored["7"]["note"]) == (7, "n7")
    assert stored["7"]["_cell_meta"] == {"score": None}


async def test_map_outputs_checked_once_are_not_checked_again_by_the_store(
    store: SheetStore, sheet: SheetRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    # map checks each output where fn returned it (a CheckedObject); the store takes it
    # as it is, and checks only what arrives as a plain mapping.
    version = await admit(store, sheet, [1, 2], "run-1")
    checked, _size = _rowchecks.checked_outputs({"score": 1, "note": "a"}, lambda: "outputs")
    assert type(checked) is _rowchecks.CheckedObject
    bounds = 0
    bound = _rowchecks.flat_row_bound

    def counting(row: Any) -> Any:
        nonlocal bounds
        bounds += 1
        return bound(row)

    monkeypatch.setattr(_rowchecks, "flat_row_bound", counting)
    rows = [CompleteRow("1", checked), CompleteRow("2", {"score": 2, "note": "b"})]
    result = await store.complete_map_rows(
        sheet, CONTRACT, rows, run_id="run-1", write_version=version
    )
    assert (result.updated, bounds) == (2, 1)  # row 2's data alone
    stored = await stored_rows(store, sheet)
    assert [(stored[k]["score_col"], stored[k]["note"]) for k in ("1", "2")] == [(1, "a"), (2, "b")]
    with pytest.raises(InvalidInputError, match="NUL"):
        _rowchecks.checked_outputs({"note": "a\x00"}, lambda: "outputs")


async def test_an_identical_replay_commits_without_updating(
    store: SheetStore, sheet: SheetRef
) -> None:
    version = await admit(store, sheet, [1], "run-1")
    row = CompleteRow("1", {"score": 10}, cell_meta_patch={"score": {"a": 1}})
    await store.complete_map_rows(sheet, CONTRACT, [row], run_id="run-1", write_version=version)
    before = await snapshot(store, sheet)
    again = await store.complete_map_rows(
        sheet, CONTRACT, [row], run_id="run-1", write_version=version
    )
    assert again == TerminalWriteResult(("1",), (), 0)
    assert await snapshot(store, sheet) == before


@pytest.mark.parametrize(
    "replay",
    [
        CompleteRow("1", {"score": 11}),
        CompleteRow("1", {"score": 10}, cell_meta_patch={"score": {"a": 2}}),
        CompleteRow("1", {"score": 10, "note": "new"}),
    ],
)
async def test_same_version_different_values_is_a_conflict(
    store: SheetStore, sheet: SheetRef, replay: CompleteRow
) -> None:
    version = await admit(store, sheet, [1, 2], "run-1")
    await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow("1", {"score": 10}, cell_meta_patch={"score": {"a": 1}})],
        run_id="run-1",
        write_version=version,
    )
    before = await snapshot(store, sheet)
    with pytest.raises(WriteConflictError, match="'1'"):
        await store.complete_map_rows(
            sheet,
            CONTRACT,
            [CompleteRow("2", {"score": 5}), replay],
            run_id="run-1",
            write_version=version,
        )
    assert await snapshot(store, sheet) == before  # row 2 was not written either


async def test_fail_then_complete_at_one_version_is_a_conflict(
    store: SheetStore, sheet: SheetRef
) -> None:
    version = await admit(store, sheet, [1], "run-1")
    await store.fail_map_rows(
        sheet, CONTRACT, [FailRow("1", "boom")], run_id="run-1", write_version=version
    )
    replay = await store.fail_map_rows(
        sheet, CONTRACT, [FailRow("1", "boom")], run_id="run-1", write_version=version
    )
    assert replay == TerminalWriteResult(("1",), (), 0)
    with pytest.raises(WriteConflictError):
        await store.complete_map_rows(
            sheet, CONTRACT, [CompleteRow("1", {"score": 1})], run_id="run-1", write_version=version
        )
    with pytest.raises(WriteConflictError):
        await store.fail_map_rows(
            sheet, CONTRACT, [FailRow("1", "other")], run_id="run-1", write_version=version
        )


async def test_a_newer_admission_fences_the_older_attempt(
    store: SheetStore, sheet: SheetRef
) -> None:
    old = await admit(store, sheet, [1, 2], "run-1")
    new = await admit(store, sheet, [2], "run-2")
    result = await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow("1", {"score": 1}), CompleteRow("2", {"score": 2})],
        run_id="run-1",
        write_version=old,
    )
    assert result.committed_keys == ("1",)
    assert result.stale_rows == (StaleRow("2", "newer_write_version", new),)
    assert (await stored_rows(store, sheet))["2"]["score_col"] is None
    with pytest.raises(AttemptSupersededError, match="newer_write_version=1") as caught:
        raise_if_superseded(result, table_namespace="leads", run_id="run-1", write_version=old)
    assert caught.value.superseded_rows == result.stale_rows
    assert caught.value.submitted_rows == 2


async def test_a_writer_ahead_of_the_row_sees_an_older_version(
    store: SheetStore, sheet: SheetRef
) -> None:
    first = await admit(store, sheet, [1], "run-1")
    second = await admit(store, sheet, [2], "run-2")
    result = await store.fail_map_rows(
        sheet, CONTRACT, [FailRow("1", "late")], run_id="run-2", write_version=second
    )
    assert result.stale_rows == (StaleRow("1", "older_write_version", first),)
    assert result.updated == 0


async def test_a_missing_key_is_stale_and_never_created(store: SheetStore, sheet: SheetRef) -> None:
    version = await admit(store, sheet, [1], "run-1")
    result = await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow("ghost", {"score": 1})], run_id="run-1", write_version=version
    )
    assert result.stale_rows == (StaleRow("ghost", "newer_write_version", None),)
    assert set(await stored_rows(store, sheet)) == {"1"}


async def test_a_legacy_writer_is_unfenced_but_never_overwrites_terminal_rows(
    store: SheetStore, sheet: SheetRef
) -> None:
    await admit(store, sheet, [1, 2], "run-1")
    await admit(store, sheet, [2], "run-2")  # row 2 now carries version 2
    result = await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow("1", {"score": 1}), CompleteRow("2", {"score": 2})],
        run_id="legacy",
        write_version=None,
    )
    assert result == TerminalWriteResult(("1", "2"), (), 2)
    again = await store.fail_map_rows(
        sheet, CONTRACT, [FailRow("1", "late")], run_id="legacy", write_version=None
    )
    assert again.stale_rows == (StaleRow("1", "already_terminal", 1),)
    assert superseded_rows(again) == ()
    rows = await stored_rows(store, sheet)
    assert rows["1"]["_status"] == "enriched"
    assert rows["2"]["_write_version"] == 2  # a legacy write leaves the stamp alone


async def test_fail_rows_store_error_and_partial_outputs(
    store: SheetStore, sheet: SheetRef
) -> None:
    version = await admit(store, sheet, [1, 2], "run-1")
    result = await store.fail_map_rows(
        sheet,
        CONTRACT,
        [FailRow("1", "first"), FailRow("2", "boom", {"note": "partial"}), FailRow("1", "last")],
        run_id="run-1",
        write_version=version,
    )
    assert result == TerminalWriteResult(("1", "2"), (), 2)
    rows = await stored_rows(store, sheet)
    assert (rows["1"]["_status"], rows["1"]["_error"]) == ("failed", "last")
    assert (rows["2"]["_error"], rows["2"]["note"]) == ("boom", "partial")
    summary, recount = await counters_match_rows(store, sheet)
    assert (
        summary == recount == {"total": 2, "queued": 0, "running": 0, "completed": 0, "failed": 2}
    )


async def test_cell_meta_patches_merge(store: SheetStore, sheet: SheetRef) -> None:
    version = await admit(store, sheet, [1], "run-1")
    await store.fail_map_rows(
        sheet, CONTRACT, [FailRow("1", "x")], run_id="run-1", write_version=version
    )
    version = await admit(store, sheet, [1], "run-2")
    await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow("1", {"score": 1}, cell_meta_patch={"score": {"p": "a"}})],
        run_id="run-2",
        write_version=version,
    )
    version = await admit(store, sheet, [1], "run-3")  # enriched: not re-admitted
    rows = await stored_rows(store, sheet)
    assert rows["1"]["_cell_meta"] == {"score": {"p": "a"}}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([CompleteRow("", {})], "key"),
        ([CompleteRow("1", {"score": float("nan")})], "finite"),
        ([CompleteRow("1", {"score": 1}, cell_meta_patch={"m": float("inf")})], "finite"),
        ([CompleteRow("1", ["not", "a", "mapping"])], "JSON object"),  # type: ignore[arg-type]
        ([{"key": "1", "data": {}}], "CompleteRow"),
        ([FailRow("1", "x")], "CompleteRow"),
    ],
)
async def test_bad_terminal_writes_are_refused_before_anything_is_written(
    store: SheetStore, sheet: SheetRef, rows: list[Any], message: str
) -> None:
    version = await admit(store, sheet, [1], "run-1")
    before = await snapshot(store, sheet)
    with pytest.raises(InvalidInputError, match=message):
        await store.complete_map_rows(sheet, CONTRACT, rows, run_id="run-1", write_version=version)
    assert await snapshot(store, sheet) == before


async def test_bad_versions_and_run_ids_are_refused(store: SheetStore, sheet: SheetRef) -> None:
    await admit(store, sheet, [1], "run-1")
    for version in (-1, 1.5, "1", True, float("inf")):
        with pytest.raises(InvalidInputError):
            await store.complete_map_rows(
                sheet,
                CONTRACT,
                [CompleteRow("1", {})],
                run_id="r",
                write_version=version,  # type: ignore[arg-type]
            )
    with pytest.raises(InvalidInputError, match="run_id"):
        await store.complete_map_rows(
            sheet, CONTRACT, [CompleteRow("1", {})], run_id="", write_version=1
        )


async def test_racing_attempts_have_one_winner_per_row(store: SheetStore, sheet: SheetRef) -> None:
    keys = [str(n) for n in range(200)]
    old = await admit(store, sheet, list(range(200)), "run-1")
    new = await admit(store, sheet, list(range(200)), "run-2")
    results: dict[str, TerminalWriteResult] = {}

    async def write(run_id: str, version: int, score: int) -> None:
        results[run_id] = await store.complete_map_rows(
            sheet,
            CONTRACT,
            [CompleteRow(key, {"score": score}) for key in keys],
            run_id=run_id,
            write_version=version,
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write, "run-1", old, 1)
        nursery.start_soon(write, "run-2", new, 2)

    assert results["run-2"].committed_keys == tuple(keys)
    assert results["run-1"].committed_keys == ()
    assert {(r.reason, r.row_version_stamp) for r in results["run-1"].stale_rows} == {
        ("newer_write_version", new)
    }
    rows = await stored_rows(store, sheet)
    assert {row["score_col"] for row in rows.values()} == {2}  # nothing from the old version
    summary, recount = await counters_match_rows(store, sheet)
    assert summary == recount


async def test_racing_writers_at_one_version_apply_once(store: SheetStore, sheet: SheetRef) -> None:
    keys = [str(n) for n in range(100)]
    version = await admit(store, sheet, list(range(100)), "run-1")
    results: list[TerminalWriteResult] = []

    async def write() -> None:
        results.append(
            await store.complete_map_rows(
                sheet,
                CONTRACT,
                [CompleteRow(key, {"score": 7}) for key in keys],
                run_id="run-1",
                write_version=version,
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        nursery.start_soon(write)

    assert sorted(r.updated for r in results) == [0, 100]
    assert all(r.committed_keys == tuple(keys) and r.stale_rows == () for r in results)
    summary, _ = await counters_match_rows(store, sheet)
    assert summary["completed"] == 100


def _to_the_two_version_columns(conn: psycopg.Connection[Any], names: Any, admitted: bool) -> None:
    """The rows table as sheetplane made it before ``seq``: ``_write_version`` and
    ``_admitted_version`` (the oldest sheets: the first only)."""
    sheet = names.ident("sheet_table")
    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN _write_version bigint NOT NULL DEFAULT 0").format(sheet)
    )
    conn.execute(sql.SQL("UPDATE {} SET _write_version = (seq).write_version").format(sheet))
    if admitted:
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN _admitted_version bigint").format(sheet))
        conn.execute(
            sql.SQL("UPDATE {} SET _admitted_version = (seq).admitted_version").format(sheet)
        )
    conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN seq").format(sheet))


def _version_columns(conn: psycopg.Connection[Any], names: Any) -> list[tuple[str, str]]:
    return [
        (str(name), str(kind))
        for name, kind in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
            "AND attname IN ('seq', '_write_version', '_admitted_version')",
            (names.ident("sheet_table").as_string(conn),),
        ).fetchall()
    ]


@pytest.mark.parametrize("admitted", [True, False], ids=["two-columns", "write-version-only"])
async def test_a_sheet_with_version_columns_moves_them_into_seq_on_its_next_ensure_sheet(
    store: SheetStore, sheet: SheetRef, admitted: bool
) -> None:
    """A sheet made before ``seq`` (its versions in ``_write_version`` and
    ``_admitted_version``) keeps every row's versions in ``seq`` after its next
    ``ensure_sheet``, loses the two columns, and fences and admits as before."""
    version = await admit(store, sheet, [1, 2, 3], "run-1")
    await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow("1", {"score": 1})], run_id="run-1", write_version=version
    )
    names = sheet_names(sheet)
    await store.pool.run(
        functools.partial(_to_the_two_version_columns, names=names, admitted=admitted)
    )
    before = {
        key: (row["_status"], row["_write_version"], row.get("_admitted_version"))
        for key, row in (await _stored_rows_before_seq(store, sheet)).items()
    }
    assert before == {
        "1": ("enriched", 1, 1 if admitted else None),
        "2": ("pending", 1, 1 if admitted else None),
        "3": ("pending", 1, 1 if admitted else None),
    }

    await store.ensure_sheet(sheet, CONTRACT)

    assert await store.pool.run(functools.partial(_version_columns, names=names)) == [
        ("seq", f"{names.schema}.sp_row_versions")
    ]
    after = await stored_rows(store, sheet)
    assert {
        key: (row["_status"], row["_write_version"], row["_admitted_version"])
        for key, row in after.items()
    } == before
    # Fenced as before: the admission's version writes, another is stale.
    written = await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow("2", {"score": 2})], run_id="run-1", write_version=version
    )
    assert written.committed_keys == ("2",)
    newer = await admit(store, sheet, [1, 2, 3], "run-2")
    stale = await store.complete_map_rows(
        sheet, CONTRACT, [CompleteRow("3", {"score": 3})], run_id="run-1", write_version=version
    )
    assert stale.stale_rows == (StaleRow("3", "newer_write_version", newer),)
    rows = await stored_rows(store, sheet)
    assert {
        key: (row["_write_version"], row["_admitted_version"]) for key, row in rows.items()
    } == {
        "1": (1, newer),
        "2": (1, newer),
        "3": (newer, newer),
    }
    await store.ensure_sheet(sheet, CONTRACT)  # nothing left to move
    assert await store.pool.run(functools.partial(_version_columns, names=names)) == [
        ("seq", f"{names.schema}.sp_row_versions")
    ]


async def _stored_rows_before_seq(store: SheetStore, sheet: SheetRef) -> dict[str, dict[str, Any]]:
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
        cur = conn.execute(sql.SQL("SELECT * FROM {}").format(names.ident("sheet_table")))
        assert cur.description is not None
        fields = [column.name for column in cur.description]
        return {record[0]: dict(zip(fields, record, strict=True)) for record in cur.fetchall()}

    return await store.pool.run(run)
