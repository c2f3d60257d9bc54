"""Terminal writes under write-version fencing.

Every admission stamps the rows it admits with a new write version; a runner's
terminal writes (``complete_map_rows``, ``fail_map_rows``) carry the version of
the admission that gave it the rows. A row is written only while it is
non-terminal (``pending`` or ``running``) at exactly that version. Everything
else is decided by ``decide_terminal_write``, a pure function of the stored
state and the writer's version (tested on its own and checked against a plain
model by the Hypothesis state machine):

=================================  ===========================================
stored row                          outcome
=================================  ===========================================
absent                              stale ``newer_write_version``, stamp None
pending/running, version == v       written
pending/running, version > v        stale ``newer_write_version``
pending/running, version < v        stale ``older_write_version``
terminal, version > v / < v         stale ``newer_`` / ``older_write_version``
terminal, version == v, identical   committed (idempotent replay, not updated)
terminal, version == v, other run   stale ``already_terminal`` (benign)
terminal, version == v, different   ``WriteConflictError``; nothing is written
``stale`` status, version == v      stale ``already_terminal`` (benign)
any row, ``write_version=None``     pending/running: written regardless of the
                                    stamp; otherwise stale ``already_terminal``
=================================  ===========================================

Decisions where the runtime's contract is silent, and why:

* **A key the sheet does not hold** is reported stale (``newer_write_version``,
  ``row_version_stamp=None``) and never created: an admitted row only
  disappears through ``replace_rows``, a later write that owns the sheet now,
  and a runner holding rows that are gone must stop, not resurrect them.
* **Same version, different values** raises ``WriteConflictError`` (the whole
  call rolls back) rather than reporting a stale reason: the row *is* owned by
  this writer's version, so no other admission is to blame; two different
  terminal results for one row from one admission means the runner is broken
  (or two runners share an admission), and silently keeping either value would
  hide that. "Identical" means: same terminal status, every physical column the
  write carries equal to the stored value (jsonb equality), the cell-meta patch
  already contained key-for-key, and for failures the same ``_error``.
* **``write_version=None``** is a legacy, unfenced writer (the seed's 0.1.2
  runtime writes so): it writes any pending or running row whatever its stamp
  (and leaves the stamp alone), and a terminal row is reported
  ``already_terminal``, the one benign reason, since nothing was overwritten.
  The reverse order: a row an unversioned writer made terminal keeps the
  attempt's stamp, so the attempt's own write of it meets a terminal row at
  its version; with the same values it is a replay, with others it is
  ``already_terminal`` when the row carries another run's id (an admission
  belongs to one run, so only an unversioned writer leaves that), and
  ``WriteConflictError`` only between writers of the one run. The seed's own
  direct-road statement (``completeRuntimeMapRows``) is unfenced by design:
  it overwrites whatever row holds the key, terminal or not, and leaves the
  stamp. Fencing between versioned attempts is unchanged.
* **Duplicate keys in one call**: the last occurrence wins.
* **Data fields that are not physical contract columns** are ignored; a column
  the write does not carry keeps its stored value; JSON null is stored as SQL
  NULL.

The whole call runs in one transaction under the sheet's writer lock taken
*shared* (``_locking``): terminal writes of one sheet run side by side, and
an admission (which takes it exclusively, with a new version) excludes them.
Rows are read ``FOR UPDATE`` in ``_key`` order ("C" collation), chunk after
chunk, so row locks decide between two writes of one row; they are decided,
written, and one event row is recorded in the same transaction (the counting
triggers move the counters with the rows, ``_counters``). If the caller is
cancelled, the transaction is rolled back by the pool and nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
import orjson
import psycopg
from psycopg import sql

from .._rowchecks import CheckedObject, checked_json_object
from .._types import (
    CompleteRow,
    FailRow,
    RowStatus,
    SheetContract,
    StaleReason,
    StaleRow,
    TerminalWriteResult,
)
from ..budgets import POSTGRES_WRITE_CHUNK_ROWS
from ..errors import InvalidInputError, WriteConflictError
from ._locking import lock_sheet
from ._names import SheetNames
from ._pool import ConnectionRunner
from ._rowdata import (
    check_key,
    check_text,
    check_write_version,
    chunked,
    column_lookups,
    physical_columns,
    project_row,
    record_event,
    status_of,
)
from ._schema import sheet_exists

__all__ = [
    "Decision",
    "StoredRow",
    "complete_map_rows",
    "decide_terminal_write",
    "fail_map_rows",
]

TerminalStatus = Literal["enriched", "failed"]
Disposition = Literal["write", "replay", "stale", "conflict"]

_WRITABLE: frozenset[str] = frozenset({"pending", "running"})


# --- the sans-IO core ---------------------------------------------------------------


@attrs.frozen
class StoredRow:
    """What a terminal write needs to know about one stored row."""

    status: RowStatus
    """The row's ``_status``."""
    write_version: int
    """The row's write version stamp (``(seq).write_version``)."""
    same_values: bool
    """Whether the row already holds exactly what this write would store
    (target status, carried columns, cell meta, error)."""
    other_run: bool = False
    """Whether the row's ``_run_id`` is not the writer's: a terminal row at the
    writer's own version with another run's id was written by an unversioned
    writer (an admission belongs to one run), not by this attempt."""


@attrs.frozen
class Decision:
    """What a terminal write does to one key."""

    disposition: Disposition
    """``write``: store it; ``replay``: already stored, committed idempotently;
    ``stale``: not written, see ``reason``; ``conflict``: same version, other values."""
    reason: StaleReason | None = None
    """Why, when ``stale``."""
    row_version_stamp: int | None = None
    """The stored row's version, when stale (None for an absent row)."""


def decide_terminal_write(stored: StoredRow | None, writer_version: int | None) -> Decision:
    """Decide one key's outcome from the stored row and the writer's version.

    See the module docstring for the table this implements.
    """
    if stored is None:
        return Decision("stale", "newer_write_version", None)
    stamp = stored.write_version
    if stored.status in _WRITABLE:
        if writer_version is None or stamp == writer_version:
            return Decision("write")
    elif writer_version is None or (stamp == writer_version and stored.status == "stale"):
        return Decision("stale", "already_terminal", stamp)
    elif stamp == writer_version:
        if stored.same_values:
            return Decision("replay")
        if stored.other_run:
            # An unversioned writer finished the row (it leaves the stamp): benign.
            return Decision("stale", "already_terminal", stamp)
        return Decision("conflict")
    assert writer_version is not None and stamp != writer_version
    reason: StaleReason = "newer_write_version" if stamp > writer_version else "older_write_version"
    return Decision("stale", reason, stamp)


@attrs.frozen
class _Incoming:
    """One key's write, projected onto the contract's physical columns."""

    key: str
    data: dict[str, Any]
    """``{sql_name: value}`` for the physical columns the write carries."""
    cell_meta: dict[str, Any]
    error: str | None


def _collect(
    rows: Sequence[CompleteRow] | Sequence[FailRow],
    contract: SheetContract,
    target: TerminalStatus,
) -> list[_Incoming]:
    """Check and project the rows, last occurrence of a key winning, in first-seen order."""
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
        raise InvalidInputError("rows must be a sequence of row writes")
    columns = physical_columns(contract)
    lookups = column_lookups(columns)
    by_key: dict[str, _Incoming] = {}
    expected = CompleteRow if target == "enriched" else FailRow
    for position, row in enumerate(rows):
        if not isinstance(row, expected):
            raise InvalidInputError(
                f"row {position} must be a {expected.__name__}, got {type(row).__name__}"
            )
        key = check_key(row.key, f"row {position} key")
        raw_data: object = row.data
        raw_meta: object = row.cell_meta_patch if isinstance(row, CompleteRow) else None
        error = (
            None if isinstance(row, CompleteRow) else check_text(row.error, f"row {position} error")
        )
        data = _checked_object(raw_data, position, "data")
        meta = _checked_object(raw_meta, position, "cell meta patch")
        by_key[key] = _Incoming(key, project_row(data, columns, lookups), meta, error)
    return list(by_key.values())


def _checked_object(value: object, position: int, what: str) -> dict[str, Any]:
    """A field of the row at ``position`` (None: empty) checked as a JSON object; its
    name in an error is built only for one. A ``CheckedObject`` (``map``'s outputs,
    checked where ``fn`` returned them) is taken as it is: a row is checked once."""
    if type(value) is CheckedObject:
        return value
    if value is None:
        return {}
    return checked_json_object(value, lambda: f"row {position} {what}")[0]


# --- SQL -------------------------------------------------------------------------------


def _encoded(rows: Sequence[_Incoming]) -> str:
    """The rows as the JSON array ``_incoming_cte`` reads, written once per chunk and
    sent as text (cast to ``jsonb`` in the statement). orjson writes it; a value the
    row checks let through that orjson has no form for (an integer past 64 bits) is
    written by the standard library, as psycopg's ``Jsonb`` writes it."""
    payload = [{"key": r.key, "data": r.data, "meta": r.cell_meta, "error": r.error} for r in rows]
    try:
        return orjson.dumps(payload).decode("utf-8")
    except TypeError:
        return json.dumps(payload)


def _incoming_cte(names: SheetNames) -> sql.Composable:
    del names
    return sql.SQL(
        "incoming AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) "
        "AS i(key text, data jsonb, meta jsonb, error text))"
    )


def _same_values_expr(sql_names: Sequence[str], target: TerminalStatus) -> sql.Composable:
    parts = [
        sql.SQL("t._status = {}").format(sql.Literal(target)),
        sql.SQL("(t._cell_meta || i.meta) = t._cell_meta"),
    ]
    if target == "failed":
        parts.append(sql.SQL("t._error IS NOT DISTINCT FROM i.error"))
    for name in sql_names:
        parts.append(
            sql.SQL(
                "(NOT (i.data ? {lit}) OR t.{col} IS NOT DISTINCT FROM "
                "NULLIF(i.data -> {lit}, 'null'::jsonb))"
            ).format(lit=sql.Literal(name), col=sql.Identifier(name))
        )
    return sql.SQL(" AND ").join(parts)


def _update_rows(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    to_write: Sequence[_Incoming],
    writes: str,
    sql_names: Sequence[str],
    *,
    target: TerminalStatus,
    run_id: str,
    version: int | None,
) -> int:
    """Write the rows the fence let through (``writes``: their JSON, ``_encoded``), in
    one ``UPDATE``; how many it wrote."""
    sheet = names.ident("sheet_table")
    column_sets = [
        sql.SQL(
            "{col} = CASE WHEN i.data ? {lit} THEN NULLIF(i.data -> {lit}, 'null'::jsonb) "
            "ELSE t.{col} END"
        ).format(col=sql.Identifier(name), lit=sql.Literal(name))
        for name in sql_names
    ]
    sets = sql.SQL(", ").join(
        [
            sql.SQL("_status = {}").format(sql.Literal(target)),
            sql.SQL("_run_id = %(run_id)s"),
            sql.SQL("_error = i.error"),
            sql.SQL("_updated_at = clock_timestamp()"),
            sql.SQL("_cell_meta = t._cell_meta || i.meta"),
            *column_sets,
        ]
    )
    cur = conn.execute(
        sql.SQL(
            "WITH {incoming} "
            "UPDATE {sheet} AS t SET {sets} FROM incoming AS i "
            "WHERE t._key = i.key AND t._key = ANY(%(keys)s::text[]) "
            "AND t._status IN ('pending', 'running') "
            "AND (%(version)s::bigint IS NULL OR (t.seq).write_version = %(version)s::bigint)"
        ).format(incoming=_incoming_cte(names), sheet=sheet, sets=sets),
        # The key array steers the plan to the key index: with stale statistics (rows
        # an admission has just copied in) a misestimate joins every row of the sheet.
        {
            "rows": writes,
            "keys": [r.key for r in to_write],
            "run_id": run_id,
            "version": version,
        },
    )
    if cur.rowcount != len(to_write):
        raise AssertionError("a fenced row changed under the sheet's writer lock")
    return cur.rowcount


def _write_chunk(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    chunk: Sequence[_Incoming],
    sql_names: Sequence[str],
    *,
    target: TerminalStatus,
    run_id: str,
    writer_version: int | None,
) -> tuple[list[str], list[StaleRow], list[str], int]:
    """Decide and write one chunk. Returns committed keys, stale rows, conflict keys
    and how many rows it wrote."""
    sheet = names.ident("sheet_table")
    payload = _encoded(chunk)
    cur = conn.execute(
        sql.SQL(
            "WITH {incoming} SELECT t._key, t._status, (t.seq).write_version, {same}, "
            "t._run_id IS DISTINCT FROM %(run_id)s "
            "FROM {sheet} AS t JOIN incoming AS i ON t._key = i.key "
            'ORDER BY t._key COLLATE "C" FOR UPDATE OF t'
        ).format(
            incoming=_incoming_cte(names),
            same=_same_values_expr(sql_names, target),
            sheet=sheet,
        ),
        {"rows": payload, "run_id": run_id},
    )
    stored = {
        key: StoredRow(status_of(status), int(version), bool(same), bool(other))
        for key, status, version, same, other in cur.fetchall()
    }
    committed: list[str] = []
    stale: list[StaleRow] = []
    conflicts: list[str] = []
    to_write: list[_Incoming] = []
    for row in chunk:
        decision = decide_terminal_write(stored.get(row.key), writer_version)
        if decision.disposition == "write":
            to_write.append(row)
            committed.append(row.key)
        elif decision.disposition == "replay":
            committed.append(row.key)
        elif decision.disposition == "conflict":
            conflicts.append(row.key)
        else:
            assert decision.reason is not None
            stale.append(StaleRow(row.key, decision.reason, decision.row_version_stamp))
    if conflicts or not to_write:
        return committed, stale, conflicts, 0

    # Every row of the chunk is written (the usual case): its JSON is the chunk's.
    writes = payload if len(to_write) == len(chunk) else _encoded(to_write)
    written = _update_rows(
        conn,
        names,
        to_write,
        writes,
        sql_names,
        target=target,
        run_id=run_id,
        version=writer_version,
    )
    return committed, stale, conflicts, written


async def _terminal_write(
    pool: ConnectionRunner,
    names: SheetNames,
    contract: SheetContract,
    rows: Sequence[CompleteRow] | Sequence[FailRow],
    *,
    target: TerminalStatus,
    run_id: str,
    write_version: int | None,
) -> TerminalWriteResult:
    check_text(run_id, "run_id")
    writer_version = check_write_version(write_version)
    incoming = _collect(rows, contract, target)
    if not incoming:
        return TerminalWriteResult((), (), 0)
    sql_names = [column.sql_name for column in physical_columns(contract)]
    kind = "complete_map_rows" if target == "enriched" else "fail_map_rows"

    # Rows are locked in one order by every terminal write (``_key`` in the "C"
    # collation, which is code point order, as Python sorts str): chunks go in
    # that order and each chunk locks its rows in it, so two writes that share
    # rows wait for each other instead of deadlocking. Answers keep input order.
    position = {row.key: index for index, row in enumerate(incoming)}
    in_lock_order = sorted(incoming, key=lambda row: row.key)

    def run(conn: psycopg.Connection[Any]) -> TerminalWriteResult:
        if not sheet_exists(conn, names):
            # A sheet never admitted holds none of the keys, and a write that cannot
            # apply creates nothing (no schema, tables or summary row).
            absent = tuple(StaleRow(row.key, "newer_write_version", None) for row in incoming)
            return TerminalWriteResult((), absent, 0)
        lock_sheet(conn, names, "shared")
        committed: list[str] = []
        stale: list[StaleRow] = []
        conflicts: list[str] = []
        updated = 0
        for chunk in chunked(in_lock_order, POSTGRES_WRITE_CHUNK_ROWS):
            c, s, x, written = _write_chunk(
                conn,
                names,
                chunk,
                sql_names,
                target=target,
                run_id=run_id,
                writer_version=writer_version,
            )
            committed += c
            stale += s
            conflicts += x
            updated += written
            if conflicts:
                break
        if conflicts:
            conflicts.sort(key=position.__getitem__)
            sample = ", ".join(repr(key) for key in conflicts[:5])
            raise WriteConflictError(
                f"{len(conflicts)} row(s) already hold a different terminal result at write "
                f"version {writer_version}; nothing was written (keys: {sample})"
            )
        if updated:
            record_event(
                conn,
                names,
                kind=kind,
                row_count=updated,
                run_id=run_id,
                write_version=writer_version,
            )
        committed.sort(key=position.__getitem__)
        stale.sort(key=lambda row: position[row.key])
        return TerminalWriteResult(tuple(committed), tuple(stale), updated)

    return await pool.run(run)


async def complete_map_rows(
    pool: ConnectionRunner,
    names: SheetNames,
    contract: SheetContract,
    rows: Sequence[CompleteRow],
    *,
    run_id: str,
    write_version: int | None,
) -> TerminalWriteResult:
    """Mark rows ``enriched`` with their outputs, fenced by ``write_version``.

    Returns the committed keys (written now or identical replays), the stale
    rows with reasons, and how many rows changed. Raises ``WriteConflictError``
    (nothing written) when a row already holds a different terminal result at
    this very version, and ``InvalidInputError`` (nothing written) for bad input.
    Cancellation rolls the whole call back.
    """
    return await _terminal_write(
        pool, names, contract, rows, target="enriched", run_id=run_id, write_version=write_version
    )


async def fail_map_rows(
    pool: ConnectionRunner,
    names: SheetNames,
    contract: SheetContract,
    rows: Sequence[FailRow],
    *,
    run_id: str,
    write_version: int | None,
) -> TerminalWriteResult:
    """Mark rows ``failed`` with their error (and any partial outputs), fenced like
    ``complete_map_rows``."""
    return await _terminal_write(
        pool, names, contract, rows, target="failed", run_id=run_id, write_version=write_version
    )
