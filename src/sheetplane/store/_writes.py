"""Direct row writes: ``append_rows``, ``upsert_rows`` and ``replace_rows``.

Each write carries an idempotency key. Inside its transaction, under the
sheet's writer lock, the write first looks for ``(kind, idempotency_key)`` in
the event table: found, it writes nothing and answers
``WriteResult(written=0, replayed=True)``; otherwise it writes and records that
pair (with the row count) in the same transaction, so a retried call, even one
racing the first, applies exactly once. ``kind`` is ``append``, ``upsert`` or
``replace``: the same key used for two kinds names two writes.

None of these is an admission: they do not take a write version. New rows are
``pending``, stamped with the caller's ``run_id`` (as the runtime's writes stamp
theirs, so a read limited to the run finds them) and write version 0
("never admitted"), so no running attempt can complete them (its fenced write
would see ``older_write_version``) until an admission takes them up. The columns written
are the sheet table's physical columns (``ensure_sheet`` made them); a row
carries a column's value under the input column's ``field``, else the column
id, else its sql name (``_rowdata.column_lookup_names``), other fields are not
stored.

* **append** inserts every row as a new row. Its key is the row's derived
  identity plus ``:append:`` and 12 hex digits of SHA-1 over the idempotency
  key and the row's position in the call (``identity.append_row_key``, as the
  runtime builds it), so appending the same content twice
  (with two keys) makes two rows, and a replay makes the same keys. New rows
  follow the sheet's last ``_input_index``.
* **upsert** merges by key (``key_field``, else the row's ``_key``, else its
  derived identity; repeated keys in one call merge left to right). A new key
  is inserted like an appended row. An existing row gets the columns the row
  carries, and the others keep their values; its status, version, run id and
  input index stay, except that a ``stale`` row goes back to ``pending``.
  ``written`` counts inserted rows plus rows whose stored values changed.
* **replace** deletes every row of the sheet (the counting triggers take every
  counter back to zero with them; the admission counter ``write_version``
  stays: versions only ever grow, so an attempt admitted before the replace
  stays fenced), then
  inserts the rows as append does with input indexes from 0. The event table
  is kept, since it is the ledger of idempotency keys. ``written`` is the
  number of rows inserted.

No write moves a counter itself: the sheet's counting triggers
(``_counters``) do, from the rows each statement changed, whichever role runs it.

Cancellation rolls the transaction back: nothing is written and the key is
not recorded, so the call can be retried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from .._rowchecks import check_row
from .._threads import run_sync
from .._types import WriteResult
from ..budgets import POSTGRES_WRITE_CHUNK_ROWS
from ..errors import InvalidInputError
from ..identity import append_row_key, content_identity, row_key
from ._guards import clear_rows
from ._names import SheetNames
from ._pool import ConnectionRunner
from ._rowdata import (
    check_key_size,
    check_text,
    chunked,
    column_lookups,
    column_texts,
    copy_new_rows,
    lock_sheet,
    project_row,
    record_event,
    table_columns,
)

__all__ = ["append_rows", "appended_row_key", "check_keyed_write", "replace_rows", "upsert_rows"]

WriteKind = Literal["append", "upsert", "replace"]


def appended_row_key(row: Mapping[str, Any], idempotency_key: str, ordinal: int) -> str:
    """The key of the ``ordinal``-th row of an append (or replace) with ``idempotency_key``
    (``identity.append_row_key`` over the row's derived identity)."""
    return append_row_key(content_identity(row), idempotency_key, ordinal)


def _check_rows(rows: object) -> list[Mapping[str, Any]]:
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
        raise InvalidInputError(f"rows must be a sequence of objects, got {type(rows).__name__}")
    return [check_row(row, position) for position, row in enumerate(rows)]


def _replayed(conn: psycopg.Connection[Any], names: SheetNames, kind: str, key: str) -> bool:
    cur = conn.execute(
        sql.SQL("SELECT 1 FROM {} WHERE kind = %s AND idempotency_key = %s").format(
            names.ident("event_table")
        ),
        (kind, key),
    )
    return cur.fetchone() is not None


def _next_index(conn: psycopg.Connection[Any], names: SheetNames) -> int:
    cur = conn.execute(
        sql.SQL("SELECT coalesce(max(_input_index), -1) + 1 FROM {}").format(
            names.ident("sheet_table")
        )
    )
    row = cur.fetchone()
    assert row is not None
    return int(row[0])


def _insert_appended(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    rows: Sequence[Mapping[str, Any]],
    idempotency_key: str,
    first_index: int,
    run_id: str | None,
) -> int:
    columns = table_columns(conn, names)
    sql_names = [c.sql_name for c in columns]
    lookups = column_lookups(columns)
    prepared = [
        (appended_row_key(row, idempotency_key, ordinal), first_index + ordinal, row)
        for ordinal, row in enumerate(rows)
    ]
    return copy_new_rows(
        conn,
        names,
        ((key, index, column_texts(row, lookups)) for key, index, row in prepared),
        sql_names,
        run_id=run_id,
        version=0,
    )


async def _write(
    pool: ConnectionRunner,
    names: SheetNames,
    kind: WriteKind,
    idempotency_key: str,
    body: Any,
    run_id: str | None,
) -> WriteResult:
    def run(conn: psycopg.Connection[Any]) -> WriteResult:
        lock_sheet(conn, names)
        if _replayed(conn, names, kind, idempotency_key):
            return WriteResult(written=0, replayed=True)
        written = body(conn)
        record_event(
            conn,
            names,
            kind=kind,
            row_count=written,
            run_id=run_id,
            idempotency_key=idempotency_key,
        )
        return WriteResult(written=written, replayed=False)

    return await pool.run(run)


def check_keyed_write(
    rows: object,
    *,
    idempotency_key: object,
    run_id: object,
    key_field: object = None,
    by_key: bool = False,
) -> None:
    """Raise ``InvalidInputError`` for what ``append_rows``, ``replace_rows`` or (with
    ``by_key``) ``upsert_rows`` would refuse of these arguments, as they refuse it. The
    reference gateway checks a keyed write so before it ensures the sheet, so a refused
    write creates nothing."""
    check_key_size(check_text(idempotency_key, "idempotency_key"), "idempotency_key")
    if key_field is not None:
        check_text(key_field, "key_field")
    _run_id(run_id)
    checked = _check_rows(rows)
    if by_key:
        _merge_by_key(checked, key_field if isinstance(key_field, str) else None)


async def append_rows(
    pool: ConnectionRunner,
    names: SheetNames,
    rows: Sequence[Mapping[str, Any]],
    *,
    idempotency_key: str,
    run_id: str | None = None,
) -> WriteResult:
    """Insert ``rows`` as new pending rows stamped with ``run_id``, once per
    ``idempotency_key``.

    Raises ``InvalidInputError`` before anything is written for a bad row or key.
    """
    check_key_size(check_text(idempotency_key, "idempotency_key"), "idempotency_key")
    run_id = _run_id(run_id)
    checked = await run_sync(_check_rows, rows)

    def body(conn: psycopg.Connection[Any]) -> int:
        first = _next_index(conn, names)
        return _insert_appended(conn, names, checked, idempotency_key, first, run_id)

    return await _write(pool, names, "append", idempotency_key, body, run_id)


async def replace_rows(
    pool: ConnectionRunner,
    names: SheetNames,
    rows: Sequence[Mapping[str, Any]],
    *,
    idempotency_key: str,
    run_id: str | None = None,
) -> WriteResult:
    """Replace every row of the sheet with ``rows`` stamped with ``run_id``, once
    per ``idempotency_key``.

    Raises ``InvalidInputError`` before anything is written (or deleted).
    """
    check_key_size(check_text(idempotency_key, "idempotency_key"), "idempotency_key")
    run_id = _run_id(run_id)
    checked = await run_sync(_check_rows, rows)

    def body(conn: psycopg.Connection[Any]) -> int:
        # Through the sheet's clear function: no session role holds DELETE (_guards).
        clear_rows(conn, names)
        return _insert_appended(conn, names, checked, idempotency_key, 0, run_id)

    return await _write(pool, names, "replace", idempotency_key, body, run_id)


def _run_id(run_id: object) -> str | None:
    """The run id a direct write stamps (None: none), checked."""
    return None if run_id is None else check_text(run_id, "run_id")


def _merge_by_key(
    rows: Sequence[Mapping[str, Any]], key_field: str | None
) -> list[tuple[str, dict[str, Any]]]:
    merged: dict[str, dict[str, Any]] = {}
    for position, row in enumerate(rows):
        try:
            key = row_key(row, key_field)
        except InvalidInputError as exc:
            raise InvalidInputError(f"row {position}: {exc}") from None
        merged.setdefault(key, {}).update(row)
    return list(merged.items())


async def upsert_rows(
    pool: ConnectionRunner,
    names: SheetNames,
    rows: Sequence[Mapping[str, Any]],
    *,
    idempotency_key: str,
    key_field: str | None = None,
    run_id: str | None = None,
) -> WriteResult:
    """Insert new keys and merge the carried columns into existing rows, once per
    ``idempotency_key``; new and revived (stale) rows are stamped with ``run_id``.

    Raises ``InvalidInputError`` before anything is written for a bad row, key
    field or idempotency key.
    """
    check_key_size(check_text(idempotency_key, "idempotency_key"), "idempotency_key")
    if key_field is not None:
        check_text(key_field, "key_field")
    run_id = _run_id(run_id)
    checked = await run_sync(_check_rows, rows)
    entries = await run_sync(_merge_by_key, checked, key_field)

    def body(conn: psycopg.Connection[Any]) -> int:
        columns = table_columns(conn, names, ("INSERT", "UPDATE"))
        sql_names = [c.sql_name for c in columns]
        lookups = column_lookups(columns)
        sheet = names.ident("sheet_table")
        written = 0
        next_index = _next_index(conn, names)
        for chunk in chunked(entries, POSTGRES_WRITE_CHUNK_ROWS):
            cur = conn.execute(
                sql.SQL("SELECT _key FROM {} WHERE _key = ANY(%s)").format(sheet),
                ([key for key, _ in chunk],),
            )
            existing = {record[0] for record in cur.fetchall()}
            new = [(key, row) for key, row in chunk if key not in existing]
            if new:
                inserted = copy_new_rows(
                    conn,
                    names,
                    (
                        (key, next_index + n, column_texts(row, lookups))
                        for n, (key, row) in enumerate(new)
                    ),
                    sql_names,
                    run_id=run_id,
                    version=0,
                )
                next_index += inserted
                written += inserted
            updates = [
                {"key": key, "data": project_row(row, columns)}
                for key, row in chunk
                if key in existing
            ]
            if updates:
                written += _merge_existing(conn, names, updates, sql_names, run_id)
        return written

    return await _write(pool, names, "upsert", idempotency_key, body, run_id)


def _merge_existing(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    updates: Sequence[Mapping[str, Any]],
    sql_names: Sequence[str],
    run_id: str | None,
) -> int:
    """Merge carried columns into existing rows (and reopen stale ones, stamped
    with ``run_id`` when one is given, as the runtime's upsert does); only rows
    that change are touched. Returns the changed count."""
    sheet = names.ident("sheet_table")

    def new_value(name: str) -> sql.Composable:
        return sql.SQL(
            "CASE WHEN i.data ? {lit} THEN NULLIF(i.data -> {lit}, 'null'::jsonb) ELSE t.{col} END"
        ).format(lit=sql.Literal(name), col=sql.Identifier(name))

    sets = sql.SQL("").join(
        sql.SQL(", {col} = {value}").format(col=sql.Identifier(n), value=new_value(n))
        for n in sql_names
    )
    differs = sql.SQL(" OR ").join(
        [sql.SQL("t._status = 'stale'")]
        + [
            sql.SQL("t.{col} IS DISTINCT FROM {value}").format(
                col=sql.Identifier(n), value=new_value(n)
            )
            for n in sql_names
        ]
    )
    cur = conn.execute(
        sql.SQL(
            "WITH incoming AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) "
            "  AS i(key text, data jsonb)) "
            "UPDATE {sheet} AS t SET "
            "_status = CASE WHEN t._status = 'stale' THEN 'pending' ELSE t._status END, "
            "_run_id = CASE WHEN t._status = 'stale' "
            "  THEN coalesce(%(run_id)s::text, t._run_id) ELSE t._run_id END, "
            "_updated_at = clock_timestamp(){sets} "
            "FROM incoming AS i WHERE t._key = i.key AND t._key = ANY(%(keys)s::text[]) "
            "AND ({differs})"
        ).format(sheet=sheet, sets=sets, differs=differs),
        # The key array steers the plan to the key index (statistics may be stale).
        {
            "rows": Jsonb(list(updates)),
            "keys": [update["key"] for update in updates],
            "run_id": run_id,
        },
    )
    return cur.rowcount
