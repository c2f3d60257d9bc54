"""Admission: ``start_dataset`` puts an input's rows on the sheet for one attempt.

What happens, in order:

1. Every row is checked before anything is written (a JSON object with string
   field names, JSON values with finite numbers, at most ``MAX_ROW_BYTES`` as
   compact JSON, measured with ``json_byte_length_up_to`` so an oversized row is
   not serialised whole) and keyed (``sheetplane.identity.row_key``). Any bad
   row raises ``InvalidInputError`` and the database is not touched. This CPU
   work runs on a worker thread, so a large input does not stall trio.
2. Duplicate keys are dropped, the first occurrence kept; ``_input_index`` is
   the row's position among the kept rows (0, 1, 2, ...).
3. In one transaction, under the sheet's writer lock: take a new write version
   (``write_version = write_version + 1``), then per chunk of
   ``POSTGRES_WRITE_CHUNK_ROWS`` keys look the keys up, and

   * insert new keys as ``pending`` rows stamped with the version, the run id
     and the input index (``COPY`` straight into the sheet table: the writer
     lock means no one else can insert those keys meanwhile);
   * re-admit keys that are ``stale``, ``pending``, ``running`` or ``failed``:
     stamp the version, set ``pending``, the run id and the input index, clear
     ``_error``, and refresh the input columns the row carries (outputs stay);
   * leave ``enriched`` rows alone (they keep their version), except that their
     ``_input_index`` follows the new input order.

   The summary counters, the column summary and one ``admission`` event move
   in the same transaction. Cancellation rolls everything back.
4. Return the inserted and skipped counts (skipped = duplicates + enriched
   rows), the rows to map (``pending_rows``) and the already-enriched rows
   merged with their stored outputs (``completed_rows``), both in input order,
   each carrying ``_key``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql
from psycopg.types.json import Jsonb

from ..budgets import POSTGRES_WRITE_CHUNK_ROWS
from ..errors import InvalidInputError
from ..identity import row_key
from ._pool import TrioPool
from ._rowdata import (
    apply_column_delta,
    apply_summary_delta,
    check_row,
    check_text,
    chunked,
    column_lookups,
    column_texts,
    copy_new_rows,
    input_field_name,
    lock_sheet,
    next_write_version,
    physical_columns,
    project_row,
    record_event,
    status_of,
    transition_delta,
)
from ._schema import SheetNames
from ._types import Admission, ContractColumn, SheetContract, SheetRef

__all__ = ["merge_completed_row", "start_dataset"]

_READMITTED = frozenset({"stale", "pending", "running", "failed"})


@attrs.frozen
class _Entry:
    """One kept input row."""

    key: str
    row: Mapping[str, Any]
    index: int
    texts: tuple[str | None, ...]
    """The row's jsonb text per physical column."""


def _prepare(
    rows: Sequence[Any], columns: Sequence[ContractColumn], key_field: str | None
) -> tuple[list[_Entry], int]:
    """Check and key every row, dropping repeated keys; returns kept rows and repeat count."""
    entries: list[_Entry] = []
    seen: set[str] = set()
    lookups = column_lookups(columns)
    for position, raw in enumerate(rows):
        row = check_row(raw, position)
        try:
            key = row_key(row, key_field)
        except InvalidInputError as exc:
            raise InvalidInputError(f"row {position}: {exc}") from None
        if key in seen:
            continue
        seen.add(key)
        entries.append(_Entry(key, row, len(entries), column_texts(row, lookups)))
    return entries, len(rows) - len(entries)


def merge_completed_row(
    input_row: Mapping[str, Any],
    stored: Mapping[str, Any],
    columns: Sequence[ContractColumn],
) -> dict[str, Any]:
    """An already-enriched row as the runner sees it: the input row, overlaid with
    the stored column values (by column id).

    A stored null never overwrites a value the input row carries, and a stored
    null in an input column the row does not carry is a synthetic null (the
    column exists because the contract declares it, not because the row had
    it): it is left out.
    """
    merged = dict(input_row)
    for column in columns:
        value = stored.get(column.sql_name)
        if value is None:
            if column.id in input_row or input_field_name(column) in input_row:
                continue
            if column.source == "input":
                continue
        merged[column.id] = value
    return merged


def _readmit(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    entries: Sequence[_Entry],
    input_columns: Sequence[ContractColumn],
    *,
    run_id: str,
    version: int,
) -> tuple[Counter[str], Counter[str]]:
    """Re-admit existing non-enriched rows; returns the summary and column deltas."""
    sheet = names.ident("sheet_table")
    input_names = [c.sql_name for c in input_columns]
    payload = Jsonb(
        [{"key": e.key, "idx": e.index, "data": project_row(e.row, input_columns)} for e in entries]
    )
    column_sets = [
        sql.SQL(
            ", {col} = CASE WHEN i.data ? {lit} THEN NULLIF(i.data -> {lit}, 'null'::jsonb) "
            "ELSE t.{col} END"
        ).format(col=sql.Identifier(n), lit=sql.Literal(n))
        for n in input_names
    ]
    flags = [
        sql.SQL(", (o.{col} IS NOT NULL)::int, (t.{col} IS NOT NULL)::int").format(
            col=sql.Identifier(n)
        )
        for n in input_names
    ]
    cur = conn.execute(
        sql.SQL(
            "WITH incoming AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) "
            "  AS i(key text, idx bigint, data jsonb)), "
            "old AS (SELECT o.* FROM {sheet} AS o JOIN incoming AS i ON o._key = i.key) "
            "UPDATE {sheet} AS t SET _status = 'pending', _write_version = %(version)s, "
            "_run_id = %(run_id)s, _error = NULL, _input_index = i.idx, "
            "_updated_at = clock_timestamp(){sets} "
            "FROM incoming AS i, old AS o WHERE t._key = i.key AND o._key = i.key "
            "RETURNING o._status{flags}"
        ).format(sheet=sheet, sets=sql.SQL("").join(column_sets), flags=sql.SQL("").join(flags)),
        {"rows": payload, "version": version, "run_id": run_id},
    )
    summary: Counter[str] = Counter()
    non_null: Counter[str] = Counter()
    for record in cur.fetchall():
        summary.update(transition_delta([status_of(record[0])], ["pending"]))
        for position, name in enumerate(input_names):
            non_null[name] += record[2 + 2 * position] - record[1 + 2 * position]
    return summary, non_null


async def start_dataset(
    pool: TrioPool,
    names: SheetNames,
    sheet: SheetRef,
    rows: Sequence[Mapping[str, Any]],
    run_id: str,
    contract: SheetContract,
    *,
    key_field: str | None = None,
) -> Admission:
    """Admit ``rows`` for the attempt ``run_id``; see the module docstring.

    Raises ``InvalidInputError`` before anything is written when a row or an
    argument is bad. The sheet's tables (and the contract's columns) must
    exist: ``ensure_sheet`` first. If cancelled, the transaction rolls back and
    no row, counter or version changes.
    """
    check_text(run_id, "run_id")
    if key_field is not None:
        check_text(key_field, "key_field")
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
        raise InvalidInputError(f"rows must be a sequence of objects, got {type(rows).__name__}")
    columns = physical_columns(contract)
    sql_names = [c.sql_name for c in columns]
    input_columns = [c for c in columns if c.source in ("input", "mapField")]
    entries, duplicates = await trio.to_thread.run_sync(_prepare, rows, columns, key_field)

    def run(conn: psycopg.Connection[Any]) -> Admission:
        lock_sheet(conn, names)
        version = next_write_version(conn, names)
        sheet_table = names.ident("sheet_table")
        summary: Counter[str] = Counter()
        non_null: Counter[str] = Counter()
        inserted = 0
        readmitted = 0
        enriched_keys: set[str] = set()
        # A sheet with no rows (the first admission) has no keys to look up.
        empty = conn.execute(
            sql.SQL("SELECT NOT EXISTS (SELECT FROM {})").format(sheet_table)
        ).fetchone() == (True,)
        for chunk in chunked(entries, POSTGRES_WRITE_CHUNK_ROWS):
            existing: dict[str, tuple[str, int | None]] = {}
            if not empty:
                cur = conn.execute(
                    sql.SQL(
                        "SELECT _key, _status, _input_index FROM {} WHERE _key = ANY(%s)"
                    ).format(sheet_table),
                    ([e.key for e in chunk],),
                )
                existing = {key: (status_of(status), idx) for key, status, idx in cur.fetchall()}
            new = [e for e in chunk if e.key not in existing]
            again = [e for e in chunk if e.key in existing and existing[e.key][0] in _READMITTED]
            kept = [e for e in chunk if e.key in existing and existing[e.key][0] == "enriched"]
            if new:
                _, column_delta = copy_new_rows(
                    conn,
                    names,
                    ((e.key, e.index, e.texts) for e in new),
                    sql_names,
                    run_id=run_id,
                    version=version,
                )
                non_null.update(column_delta)
                summary.update(transition_delta([None] * len(new), ["pending"] * len(new)))
                inserted += len(new)
            if again:
                delta, column_delta = _readmit(
                    conn, names, again, input_columns, run_id=run_id, version=version
                )
                summary.update(delta)
                non_null.update(column_delta)
                readmitted += len(again)
            moved = [e for e in kept if existing[e.key][1] != e.index]
            if moved:
                conn.execute(
                    sql.SQL(
                        "UPDATE {} AS t SET _input_index = u.idx, _updated_at = clock_timestamp() "
                        "FROM unnest(%s::text[], %s::bigint[]) AS u(key, idx) WHERE t._key = u.key"
                    ).format(sheet_table),
                    ([e.key for e in moved], [e.index for e in moved]),
                )
            enriched_keys.update(e.key for e in kept)
        stored: dict[str, dict[str, Any]] = {}
        if enriched_keys:
            columns_sql = sql.SQL("").join(
                sql.SQL(", {}").format(sql.Identifier(n)) for n in sql_names
            )
            for key_chunk in chunked(sorted(enriched_keys), POSTGRES_WRITE_CHUNK_ROWS):
                cur = conn.execute(
                    sql.SQL("SELECT _key{} FROM {} WHERE _key = ANY(%s)").format(
                        columns_sql, sheet_table
                    ),
                    (list(key_chunk),),
                )
                for record in cur.fetchall():
                    stored[record[0]] = dict(zip(sql_names, record[1:], strict=True))
        apply_summary_delta(conn, names, summary)
        apply_column_delta(conn, names, non_null)
        record_event(
            conn,
            names,
            kind="admission",
            row_count=inserted + readmitted,
            run_id=run_id,
            write_version=version,
        )
        pending_rows = []
        completed_rows = []
        for entry in entries:
            if entry.key in enriched_keys:
                merged = merge_completed_row(entry.row, stored.get(entry.key, {}), columns)
                merged["_key"] = entry.key
                completed_rows.append(merged)
            else:
                pending_rows.append({**entry.row, "_key": entry.key})
        return Admission(
            inserted=inserted,
            skipped=duplicates + len(completed_rows),
            pending_rows=tuple(pending_rows),
            completed_rows=tuple(completed_rows),
            write_version=version,
            table_namespace=sheet.table_namespace,
        )

    return await pool.run(run)
