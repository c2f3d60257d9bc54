"""Admission: ``start_dataset`` puts an input's rows on the sheet for one attempt.

What happens, in order:

1. Every row is checked (a JSON object with string field names, JSON values
   with finite numbers, at most ``MAX_ROW_BYTES`` as compact JSON, measured
   with ``json_byte_length_up_to`` so an oversized row is not serialised whole)
   and keyed (``sheetplane.identity.row_key``). Rows are checked as they are
   written, inside the transaction of step 3: a bad row raises
   ``InvalidInputError`` and the transaction rolls back, so nothing is
   committed. This CPU work runs on the pool's worker thread, so a large input
   does not stall trio.
2. Duplicate keys are dropped, the first occurrence kept; ``_input_index`` is
   the row's position among the kept rows (0, 1, 2, ...).
3. In one transaction, under the sheet's writer lock: take a new write version
   (``write_version = write_version + 1``). On a sheet with no rows (the first
   admission) every kept row is new, and one ``COPY`` takes the rows as they
   are checked, so Postgres stores rows while the next ones are prepared.
   Otherwise, per chunk of ``POSTGRES_WRITE_CHUNK_ROWS`` kept rows, look the
   keys up, and

   * insert new keys as ``pending`` rows stamped with the version, the run id
     and the input index (``COPY`` straight into the sheet table: the writer
     lock means no one else can insert those keys meanwhile);
   * re-admit keys that are ``stale``, ``pending``, ``running`` or ``failed``:
     stamp the version, set ``pending``, the run id and the input index, clear
     ``_error``, and refresh the input columns the row carries (outputs stay);
   * leave ``enriched`` rows alone (they keep their version), except that their
     ``_input_index`` follows the new input order.

   One ``admission`` event is recorded in the same transaction (the counting
   triggers move the counters with the rows, ``_counters``), and the sheet's
   counter log is compacted while the exclusive writer lock is held.
   Cancellation rolls everything back.
4. Return the inserted and skipped counts as the seed's admission counts
   them (inserted = new rows and revived ``stale`` ones; skipped = input rows
   - inserted: duplicates, enriched rows and re-admitted open rows), the
   rows to map (``pending_rows``) and the already-enriched rows merged with
   their stored outputs (``completed_rows``), both in input order, each
   carrying ``_key``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from .._rowchecks import check_row
from .._types import ContractColumn, InlineAdmission, SheetContract, SheetRef
from ..budgets import POSTGRES_WRITE_CHUNK_ROWS
from ..errors import InvalidInputError
from ..identity import row_key, strip_row_key, with_row_key
from ._counters import compact_counters
from ._names import SheetNames
from ._pool import ConnectionRunner
from ._rowdata import (
    analyze_if_grown,
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
)

__all__ = ["merge_completed_row", "start_dataset"]

_READMITTED = frozenset({"stale", "pending", "running", "failed"})


@attrs.frozen
class _Entry:
    """One kept input row."""

    key: str
    row: Mapping[str, Any]
    index: int
    """The row's position among the kept rows: its ``_input_index``."""


def _kept_rows(
    rows: Sequence[Any], key_field: str | None
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Check and key each row in input order; yield ``(key, row)`` for the first
    occurrence of every key.

    Lazy: admission consumes it inside its transaction, so a bad row raises
    ``InvalidInputError`` part-way through and the transaction rolls back.
    """
    seen: set[str] = set()
    for position, raw in enumerate(rows):
        row = check_row(raw, position)
        try:
            key = row_key(row, key_field)
        except InvalidInputError as exc:
            raise InvalidInputError(f"row {position}: {exc}") from None
        if key not in seen:
            seen.add(key)
            yield key, row


def _batches(entries: Iterable[_Entry], size: int) -> Iterator[list[_Entry]]:
    """Consecutive lists of at most ``size`` entries."""
    iterator = iter(entries)
    while batch := list(islice(iterator, size)):
        yield batch


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


@attrs.define(eq=False)
class _Writer:
    """One admission's writes inside its transaction, and what they changed."""

    conn: psycopg.Connection[Any]
    names: SheetNames
    columns: Sequence[ContractColumn]
    run_id: str
    version: int
    inserted: int = 0
    readmitted: int = 0
    revived: int = 0
    """Of the re-admitted rows, those that were ``stale`` (the seed's admission
    revives them and counts them inserted)."""

    def admit_into_empty(
        self, kept: Iterable[tuple[str, Mapping[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Admit into a sheet with no rows (a first admission); returns the pending rows.

        There are no keys to look up and every kept row is new, so one ``COPY``
        takes the rows as ``kept`` checks and keys them: Postgres stores rows
        while this thread prepares the next ones.
        """
        pending_rows: list[dict[str, Any]] = []

        def new_rows() -> Iterator[tuple[str, int, Mapping[str, Any]]]:
            for index, (key, row) in enumerate(kept):
                pending_rows.append(with_row_key(row, key))
                yield key, index, row

        self.insert(new_rows())
        return pending_rows

    def admit_into_sheet(
        self, kept: Iterable[tuple[str, Mapping[str, Any]]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Admit into a sheet that has rows, a chunk of keys at a time; returns the
        pending rows and the completed (already enriched) rows."""
        entries: list[_Entry] = []
        enriched_keys: set[str] = set()
        numbered = (_Entry(key, row, index) for index, (key, row) in enumerate(kept))
        for chunk in _batches(numbered, POSTGRES_WRITE_CHUNK_ROWS):
            entries.extend(chunk)
            enriched_keys.update(self.admit_chunk(chunk))
        stored = self.stored_values(enriched_keys)
        pending_rows = []
        completed_rows = []
        for entry in entries:
            if entry.key in enriched_keys:
                merged = merge_completed_row(
                    strip_row_key(entry.row), stored.get(entry.key, {}), self.columns
                )
                completed_rows.append(with_row_key(merged, entry.key))
            else:
                pending_rows.append(with_row_key(entry.row, entry.key))
        return pending_rows, completed_rows

    def admit_chunk(self, chunk: Sequence[_Entry]) -> list[str]:
        """Look the chunk's keys up; insert new keys, re-admit open rows, re-order
        enriched ones. Returns the enriched rows' keys."""
        sheet_table = self.names.ident("sheet_table")
        cur = self.conn.execute(
            sql.SQL("SELECT _key, _status, _input_index FROM {} WHERE _key = ANY(%s)").format(
                sheet_table
            ),
            ([e.key for e in chunk],),
        )
        existing = {key: (status_of(status), idx) for key, status, idx in cur.fetchall()}
        new = [e for e in chunk if e.key not in existing]
        again = [e for e in chunk if e.key in existing and existing[e.key][0] in _READMITTED]
        kept = [e for e in chunk if e.key in existing and existing[e.key][0] == "enriched"]
        if new:
            self.insert((e.key, e.index, e.row) for e in new)
        if again:
            self.readmit(again)
            self.revived += sum(1 for e in again if existing[e.key][0] == "stale")
        if kept:
            # Enriched rows keep their version and outputs; they follow the new
            # input order and are stamped as this admission's completed rows.
            self.conn.execute(
                sql.SQL(
                    "UPDATE {} AS t SET _input_index = u.idx, seq.admitted_version = %s, "
                    "_updated_at = clock_timestamp() "
                    "FROM unnest(%s::text[], %s::bigint[]) AS u(key, idx) WHERE t._key = u.key"
                ).format(sheet_table),
                (self.version, [e.key for e in kept], [e.index for e in kept]),
            )
        return [e.key for e in kept]

    def insert(self, new: Iterable[tuple[str, int, Mapping[str, Any]]]) -> None:
        """``COPY`` ``(key, input index, row)`` in as ``pending`` rows as ``new`` yields them."""
        lookups = column_lookups(self.columns)
        self.inserted += copy_new_rows(
            self.conn,
            self.names,
            ((key, index, column_texts(row, lookups)) for key, index, row in new),
            [c.sql_name for c in self.columns],
            run_id=self.run_id,
            version=self.version,
            admitted=True,
        )

    def readmit(self, entries: Sequence[_Entry]) -> None:
        """Re-admit existing non-enriched rows (outputs kept, input columns refreshed)."""
        input_columns = [c for c in self.columns if c.source in ("input", "mapField")]
        input_names = [c.sql_name for c in input_columns]
        payload = Jsonb(
            [
                {"key": e.key, "idx": e.index, "data": project_row(e.row, input_columns)}
                for e in entries
            ]
        )
        column_sets = [
            sql.SQL(
                ", {col} = CASE WHEN i.data ? {lit} THEN NULLIF(i.data -> {lit}, 'null'::jsonb) "
                "ELSE t.{col} END"
            ).format(col=sql.Identifier(n), lit=sql.Literal(n))
            for n in input_names
        ]
        self.conn.execute(
            sql.SQL(
                "WITH incoming AS (SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) "
                "  AS i(key text, idx bigint, data jsonb)) "
                "UPDATE {sheet} AS t SET _status = 'pending', "
                "seq = ROW(%(version)s, %(version)s)::{versions}, "
                "_run_id = %(run_id)s, _error = NULL, _input_index = i.idx, "
                "_updated_at = clock_timestamp(){sets} "
                "FROM incoming AS i WHERE t._key = i.key AND t._key = ANY(%(keys)s::text[])"
            ).format(
                sheet=self.names.ident("sheet_table"),
                versions=self.names.versions_type,
                sets=sql.SQL("").join(column_sets),
            ),
            # The key array steers the plan to the key index: the rows' statistics may
            # be stale (an admission's COPY), and a misestimate joins every row.
            {
                "rows": payload,
                "keys": [e.key for e in entries],
                "version": self.version,
                "run_id": self.run_id,
            },
        )
        self.readmitted += len(entries)

    def stored_values(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The stored column values of ``keys``' rows, by key, then by sql name."""
        sql_names = [c.sql_name for c in self.columns]
        columns_sql = sql.SQL("").join(sql.SQL(", {}").format(sql.Identifier(n)) for n in sql_names)
        stored: dict[str, dict[str, Any]] = {}
        for key_chunk in chunked(sorted(keys), POSTGRES_WRITE_CHUNK_ROWS):
            cur = self.conn.execute(
                sql.SQL("SELECT _key{} FROM {} WHERE _key = ANY(%s)").format(
                    columns_sql, self.names.ident("sheet_table")
                ),
                (list(key_chunk),),
            )
            for record in cur.fetchall():
                stored[record[0]] = dict(zip(sql_names, record[1:], strict=True))
        return stored


async def start_dataset(
    pool: ConnectionRunner,
    names: SheetNames,
    sheet: SheetRef,
    rows: Sequence[Mapping[str, Any]],
    run_id: str,
    contract: SheetContract,
    *,
    key_field: str | None = None,
    check: Callable[[InlineAdmission], None] | None = None,
) -> InlineAdmission:
    """Admit ``rows`` for the attempt ``run_id``; see the module docstring.

    ``check`` is called with the admission inside the transaction, on the
    worker thread, before the commit: an exception it raises rolls the whole
    admission back and propagates (nothing is committed).

    A bad row or argument raises ``InvalidInputError`` and nothing is committed
    (rows are checked as they are written, inside the transaction, which then
    rolls back). The sheet's tables (and the contract's columns) must exist:
    ``ensure_sheet`` first. If cancelled, the transaction rolls back and no
    row, counter or version changes.
    """
    check_text(run_id, "run_id")
    if key_field is not None:
        check_text(key_field, "key_field")
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
        raise InvalidInputError(f"rows must be a sequence of objects, got {type(rows).__name__}")
    columns = physical_columns(contract)

    def run(conn: psycopg.Connection[Any]) -> InlineAdmission:
        lock_sheet(conn, names)
        writer = _Writer(conn, names, columns, run_id, next_write_version(conn, names))
        kept = _kept_rows(rows, key_field)
        empty = conn.execute(
            sql.SQL("SELECT NOT EXISTS (SELECT FROM {})").format(names.ident("sheet_table"))
        ).fetchone() == (True,)
        completed_rows: list[dict[str, Any]] = []
        if empty:
            pending_rows = writer.admit_into_empty(kept)
        else:
            pending_rows, completed_rows = writer.admit_into_sheet(kept)
        compact_counters(conn, names)
        analyze_if_grown(conn, names, writer.inserted)
        record_event(
            conn,
            names,
            kind="admission",
            row_count=writer.inserted + writer.readmitted,
            run_id=run_id,
            write_version=writer.version,
        )
        # As the seed counts them: new and revived (stale) rows are inserted, every
        # other input row is skipped (duplicates, enriched rows, and open rows
        # re-admitted as they are).
        inserted = writer.inserted + writer.revived
        admission = InlineAdmission(
            inserted=inserted,
            skipped=len(rows) - inserted,
            pending_rows=tuple(pending_rows),
            completed_rows=tuple(completed_rows),
            write_version=writer.version,
            table_namespace=sheet.table_namespace,
        )
        if check is not None:
            check(admission)
        return admission

    return await pool.run(run)
