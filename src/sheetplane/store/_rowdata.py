"""What every write path shares: input checks, contract projection, the sheet's
exclusive writer lock, the write version and event rows (counters: ``_counters``).

The checks and projections are plain functions over plain values. The SQL
helpers take an open ``psycopg.Connection`` and run inside the caller's
transaction (the function handed to ``TrioPool.run``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from .._ints import check_int
from .._types import BIGINT_MAX, ContractColumn, RowStatus, SheetContract
from ..budgets import (
    ADMISSION_ANALYZE_MIN_ROWS,
    ADMISSION_ANALYZE_STATISTICS_TARGET,
    MAX_ROW_KEY_BYTES,
)
from ..errors import InvalidInputError
from ._counters import STATUS_COUNTER, status_counts
from ._locking import lock_sheet as lock_sheet_in
from ._names import SheetNames
from ._schema import column_ids

T = TypeVar("T")


# --- input checks -----------------------------------------------------------------


def check_key(key: object, what: str = "row key") -> str:
    """A row key must be a non-empty string."""
    if not isinstance(key, str) or not key or "\x00" in key or not _utf8(key):
        raise InvalidInputError(
            f"{what} must be a non-empty string without NUL or lone surrogates, got {key!r}"
        )
    return check_key_size(key, what)


def check_key_size(key: str, what: str) -> str:
    """Refuse a key longer than ``MAX_ROW_KEY_BYTES`` (UTF-8): keys are indexed, and
    Postgres refuses B-tree entries past about 2.7 KB inside the write."""
    if len(key) * 4 > MAX_ROW_KEY_BYTES and len(key.encode("utf-8")) > MAX_ROW_KEY_BYTES:
        raise InvalidInputError(
            f"{what} is longer than {MAX_ROW_KEY_BYTES} bytes (MAX_ROW_KEY_BYTES): {key[:40]!r}..."
        )
    return key


def check_text(value: object, what: str) -> str:
    """A required non-empty string argument (run id, idempotency key, holder)."""
    if not isinstance(value, str) or not value or "\x00" in value or not _utf8(value):
        raise InvalidInputError(
            f"{what} must be a non-empty string without NUL or lone surrogates, got {value!r}"
        )
    return value


def _utf8(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate), as Postgres text needs."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_write_version(value: object) -> int | None:
    """A writer's version: ``None`` (a legacy, unfenced writer) or an integer >= 0."""
    if value is None:
        return None
    return check_int("write_version", value, 0, BIGINT_MAX)


# --- contract projection -----------------------------------------------------------


def physical_columns(contract: SheetContract) -> tuple[ContractColumn, ...]:
    """The contract's physical columns; for a repeated ``sql_name`` the last declaration
    wins (as in ``ensure_sheet``), at the position of the first."""
    columns: dict[str, ContractColumn] = {}
    for column in contract.columns:
        if column.is_physical:
            columns[column.sql_name] = column
    return tuple(columns.values())


def column_lookup_names(column: ContractColumn) -> tuple[str, ...]:
    """Names a row may carry the column's value under (``ContractColumn.lookup_names``)."""
    return column.lookup_names


def input_field_name(column: ContractColumn) -> str:
    """The input row field an input column reads."""
    return column.field or column.id


_ABSENT: Any = object()


def column_value(row: Mapping[str, Any], column: ContractColumn) -> Any:
    """The row's value for ``column``, or ``ABSENT`` when the row does not carry it."""
    for name in column_lookup_names(column):
        if name in row:
            return row[name]
    return _ABSENT


ABSENT = _ABSENT


def project_row(
    row: Mapping[str, Any],
    columns: Sequence[ContractColumn],
    lookups: Sequence[Sequence[str]] | None = None,
) -> dict[str, Any]:
    """``{sql_name: value}`` for the physical columns the row carries (JSON null dropped).

    ``lookups``: ``column_lookups(columns)``, for a caller projecting many rows."""
    out: dict[str, Any] = {}
    for index, column in enumerate(columns):
        names = column_lookup_names(column) if lookups is None else lookups[index]
        for name in names:
            if name in row:
                out[column.sql_name] = row[name]
                break
    return out


_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def column_lookups(columns: Sequence[ContractColumn]) -> tuple[tuple[str, ...], ...]:
    """``column_lookup_names`` of each column, computed once per write."""
    return tuple(column_lookup_names(column) for column in columns)


def column_texts(
    row: Mapping[str, Any], lookups: Sequence[Sequence[str]]
) -> tuple[str | None, ...]:
    """The row's jsonb text per column (None where it carries no value, or null)."""
    texts: list[str | None] = []
    append = texts.append
    for names in lookups:
        for name in names:
            if name in row:
                append(jsonb_text(row[name]))
                break
        else:
            append(None)
    return tuple(texts)


def jsonb_text(value: Any) -> str | None:
    """A column value as jsonb input text (compact JSON); JSON null is stored as SQL NULL.

    Scalars take a direct path (this runs once per cell of every admitted row);
    the text is what ``json.dumps`` would write.
    """
    kind = type(value)
    if kind is str:
        return encode_basestring(value)
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return None
    if kind is bool:
        return "true" if value else "false"
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    return _COMPACT.encode(value)


def chunked(values: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of at most ``size`` values."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


# --- SQL helpers (inside the caller's transaction) -----------------------------------


def lock_sheet(conn: psycopg.Connection[Any], names: SheetNames) -> int:
    """Take the sheet's writer lock exclusively and return its write version.

    Admissions and append/upsert/replace take it first (``_locking`` has the
    whole lock order), so they run one at a time per sheet, exclude terminal
    writes, never meet a unique violation between two inserts of one key, and
    see rows no other writer is changing. The lock is released when the
    transaction ends. Writes nothing: a scoped session role takes it too, and
    may not write the summary table (0 while the summary row is missing).
    """
    lock_sheet_in(conn, names, "exclusive")
    cur = conn.execute(
        sql.SQL("SELECT coalesce((SELECT write_version FROM {} WHERE id), 0)").format(
            names.ident("summary_table")
        )
    )
    row = cur.fetchone()
    assert row is not None
    return int(row[0])


def next_write_version(conn: psycopg.Connection[Any], names: SheetNames) -> int:
    """Take the sheet's next write version (the admission counter), under the writer
    lock; creates the summary row if it is missing. Only the gateway admits."""
    cur = conn.execute(
        sql.SQL(
            "INSERT INTO {summary} AS s (id, write_version, updated_at) VALUES (true, 1, now()) "
            "ON CONFLICT (id) DO UPDATE SET write_version = s.write_version + 1, "
            "updated_at = now() RETURNING write_version"
        ).format(summary=names.ident("summary_table"))
    )
    row = cur.fetchone()
    assert row is not None
    return int(row[0])


def record_event(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    *,
    kind: str,
    row_count: int,
    run_id: str | None = None,
    write_version: int | None = None,
    idempotency_key: str | None = None,
) -> None:
    """Append one row to the sheet's event table."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (kind, run_id, write_version, idempotency_key, row_count) "
            "VALUES (%s, %s, %s, %s, %s)"
        ).format(names.ident("event_table")),
        (kind, run_id, write_version, idempotency_key, row_count),
    )


def analyze_if_grown(conn: psycopg.Connection[Any], names: SheetNames, added: int) -> bool:
    """``ANALYZE`` the sheet's rows table if an admission just added ``added`` rows,
    at least ``ADMISSION_ANALYZE_MIN_ROWS`` and a tenth of the rows the sheet now
    holds (its counters, compacted); returns whether it did.

    Until autovacuum's next pass (a minute or more) the planner would otherwise
    plan on what the sheet held before: a sheet never analyzed has no column
    statistics, so a fenced write's join of its incoming rows to the sheet was
    estimated at one row and run as a nested loop over both (a 5,000-row
    ``complete_map_rows`` right after a 16,000-row first admission took 17-19 s,
    near ``POSTGRES_STATEMENT_TIMEOUT_MS``; 0.6-1.4 s after an ``ANALYZE``). Run
    in the admission's own transaction under its writer lock, by the tables'
    owner (the gateway, or the store's role), at the statistics target
    ``ADMISSION_ANALYZE_STATISTICS_TARGET`` (for this transaction only): it
    samples the rows the transaction wrote, its statistics are visible when the
    admission commits and gone if it rolls back. A role that does not own the
    sheet is skipped with a warning, as ``ANALYZE`` does.
    """
    if added < ADMISSION_ANALYZE_MIN_ROWS:
        return False
    if added * 10 < status_counts(conn, names)["total"]:
        return False
    conn.execute(
        "SELECT set_config('default_statistics_target', %s, true)",
        (str(ADMISSION_ANALYZE_STATISTICS_TARGET),),
    )
    conn.execute(sql.SQL("ANALYZE {}").format(names.ident("sheet_table")))
    return True


def status_of(value: object) -> RowStatus:
    """A stored ``_status`` value, checked."""
    if value not in STATUS_COUNTER:
        raise AssertionError(f"unexpected stored row status {value!r}")
    return value  # type: ignore[return-value]


def table_columns(
    conn: psycopg.Connection[Any], names: SheetNames, writes: Sequence[str] = ("INSERT",)
) -> tuple[ContractColumn, ...]:
    """The sheet table's physical columns as the catalog knows them, of those the
    current role may ``writes`` (every one of these privileges).

    Used by writes that carry no contract (append, upsert, replace): each jsonb
    column the table has beyond the system columns, its id the one
    ``ensure_sheet`` recorded in the sheet's metadata table (else its name). A
    row carries a column's value under the column id or its sql name. A session
    role is granted the sheet's columns by name when it is minted, so a column
    another contract added since is not its to write (the owner writes every one).
    """
    found = column_ids(conn, names)
    if found is None:
        # No such sheet: fail as a query on it does (UndefinedTable, answered 404).
        conn.execute("SELECT %s::regclass", (names.ident("sheet_table").as_string(conn),))
    granted = {
        str(row[0])
        for row in conn.execute(
            "SELECT a.attname FROM pg_attribute AS a WHERE a.attrelid = %s::regclass"
            " AND a.attnum > 0 AND NOT a.attisdropped"
            " AND (SELECT bool_and(has_column_privilege(a.attrelid, a.attnum, p))"
            "      FROM unnest(%s::text[]) AS p)",
            (names.ident("sheet_table").as_string(conn), list(writes)),
        ).fetchall()
    }
    return tuple(
        ContractColumn(id=column_id, sql_name=name, source="input")
        for name, column_id in found or ()
        if name in granted
    )


def copy_new_rows(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    rows: Iterable[tuple[str, int, Sequence[str | None]]],
    sql_names: Sequence[str],
    *,
    run_id: str | None,
    version: int,
    admitted: bool = False,
) -> int:
    """Insert ``(key, input_index, jsonb texts per column)`` rows as ``pending`` with ``COPY``.

    The caller holds the sheet's writer lock and has checked that no key
    exists yet. With ``admitted`` (an admission), the admitted version is
    stamped with ``version`` too (both in ``seq``). Returns the row count (the counting triggers
    move the counters).
    """
    # A row never admitted (a direct write's, version 0) takes the status and the
    # versions from the columns' defaults ('pending', (0, null)): a session role may
    # insert neither column (its grants are by column, see _grants).
    versioned = admitted or version != 0
    system = ["_key", "_run_id", "_input_index"]
    if versioned:
        system += ["_status", "seq"]
    targets = sql.SQL(", ").join(sql.Identifier(name) for name in [*system, *sql_names])
    count = 0
    with (
        conn.cursor() as cur,
        cur.copy(
            sql.SQL("COPY {} ({}) FROM STDIN").format(names.ident("sheet_table"), targets)
        ) as copy,
    ):
        write_row = copy.write_row
        # ``seq``'s text form: (write version, admitted version), an empty field null.
        stamp = f"({version},{version})" if admitted else f"({version},)"
        for key, index, texts in rows:
            if versioned:
                write_row((key, run_id, index, "pending", stamp, *texts))
            else:
                write_row((key, run_id, index, *texts))
            count += 1
    return count
