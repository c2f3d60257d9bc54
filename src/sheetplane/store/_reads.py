"""Reads of a sheet: pages, batches of pages under one snapshot, keyset pages, keys, counts.

Every read returns rows in the sheet's read order,
``_input_index ASC NULLS LAST, _created_at ASC, _key ASC`` (the order of the
sheet table's btree index), the rows a ``RowFilter`` sees: optionally limited to
one ``_run_id`` and/or to one admission's pending or completed rows
(``AdmittedPart``), in its row mode. A row is a
dict: row mode ``output`` gives ``_key``, every physical column under its
contract column id (kept as the column's comment by ``ensure_sheet``), then
``_status``, ``_error`` and ``_input_index``; row mode ``all`` adds the other
system columns, timestamps as ISO 8601 strings.

A batch read answers at most ``READ_BATCH_MAX_RESPONSE_BYTES`` of compact JSON
(``{"pages": [{"rows": [...], "limit": L, "offset": O}, ...]}``). The size is
measured with ``json_byte_length_up_to`` as rows are decoded, a slice of rows at
a time, and the read stops with ``ReadBatchTooLargeError`` as soon as the answer
so far would exceed it, so an oversized batch never holds more than one slice
of rows past the budget.

The gateway reads the same rows as their compact JSON bytes
(``read_rows_batch_json``, ``read_rows_after_json``): Postgres writes each row's
JSON text, in the form ``json_byte_length_up_to`` measures (a row whose cells
Postgres writes otherwise is rewritten here), so each row is measured by its
length and the answer is spliced from the bytes, not decoded and encoded again.

A sheet whose tables do not exist yet has no rows: reads answer empty pages,
``count`` 0 and an all-zero summary.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, Generic, TypeVar

import attrs
import psycopg
from psycopg import sql

from .. import _tracing
from .._json import decode_body
from .._types import (
    EVERY_ROW,
    AdmittedPart,
    CheckedPage,
    CheckedPages,
    Page,
    PageRequest,
    RowCursor,
    RowFilter,
    RowMode,
    Summary,
    check_page_batch,
    check_page_request,
)
from ..budgets import READ_BATCH_MAX_RESPONSE_BYTES
from ..errors import InvalidInputError, ReadBatchTooLargeError
from ..protocol import ANSWER_OVERHEAD, page_overhead
from ..sizes import json_byte_length_up_to
from ._counters import status_counts
from ._names import SheetNames
from ._pool import ConnectionRunner
from ._rowdata import check_text
from ._schema import column_ids

__all__ = [
    "JsonPage",
    "RowCursor",
    "count",
    "read_row_keys",
    "read_rows",
    "read_rows_after",
    "read_rows_after_json",
    "read_rows_batch",
    "read_rows_batch_json",
    "read_rows_by_keys",
    "summary",
    "whole_sheet_read",
]

Conn = psycopg.Connection[Any]

#: Most rows fetched from the server (and decoded, and measured) at a time.
_FETCH_ROWS = 500

#: Rows of the first fetch of a measured read, before any row size is known.
_FIRST_FETCH_ROWS = 1

#: A measured read fetches at most this fraction of its remaining budget at once
#: (at the rows' average size so far), so a read refused 413 holds about its
#: budget, not the page it asked for.
_FETCH_BUDGET_SHARE = 4

#: The read order, written once.
ORDER_BY = sql.SQL("ORDER BY _input_index ASC NULLS LAST, _created_at ASC, _key ASC")

_OUTPUT_TAIL = ("_status", "_error", "_input_index")
_ALL_TAIL = (
    "_status",
    "_error",
    "_input_index",
    "_run_id",
    "_stage",
    "_provider",
    "_created_at",
    "_updated_at",
    "_cell_meta",
    "_write_version",
)
_TIMESTAMPS = frozenset({"_created_at", "_updated_at"})
#: Fields of an ``all`` row read from an expression rather than a column of that name:
#: the write version is a field of the rows' ``seq`` (docs/store.md, "Row versions").
_EXPRESSIONS: Final = {"_write_version": sql.SQL("(seq).write_version")}


def _source(name: str) -> sql.Composable:
    """What a row field is read from: its column, or its expression."""
    return _EXPRESSIONS.get(name, sql.Identifier(name))


# --- input checks ---------------------------------------------------------------------


def _check_row_mode(row_mode: object) -> RowMode:
    if row_mode == "output":
        return "output"
    if row_mode == "all":
        return "all"
    raise InvalidInputError(f"row_mode must be 'output' or 'all', got {row_mode!r}")


# --- projection --------------------------------------------------------------------------


@attrs.frozen
class _Projection:
    """What one read selects and the dict keys its rows get, in order."""

    select: sql.Composable
    """The select list: one column per key, then any hidden position columns."""
    keys: tuple[str, ...]
    """The row dicts' keys (unique), one per selected column before the hidden ones."""
    key_bytes: int
    """What the keys add to one row's compact JSON over the same values as a list:
    each key as a JSON string plus its colon."""


def _json_len(value: str) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


_POSITION = sql.SQL("_input_index AS _pos_index, _created_at AS _pos_created")


def _projection(
    columns: Sequence[tuple[str, str]], row_mode: RowMode, *, position: bool = False
) -> _Projection:
    """``columns``: (sql name, column id) of the physical columns, in table order.

    A column id that repeats keeps its last column; an id that names a system
    column is left out (the system column wins). With ``position``, the raw
    ``_input_index`` and ``_created_at`` follow as two hidden columns.
    """
    tail = _OUTPUT_TAIL if row_mode == "output" else _ALL_TAIL
    reserved = {"_key", *tail}
    by_id = {column_id: name for name, column_id in columns if column_id not in reserved}
    parts: list[sql.Composable] = [sql.Identifier("_key")]
    parts += [sql.Identifier(name) for name in by_id.values()]
    for name in tail:
        if name in _TIMESTAMPS:
            # The JSON form of a timestamptz is ISO 8601 (in the session's UTC).
            # Left unnamed on purpose: ORDER BY _created_at must keep meaning
            # the timestamp column, not this text.
            parts.append(sql.SQL("to_json({}) #>> '{{}}'").format(sql.Identifier(name)))
        elif name in _EXPRESSIONS:
            parts.append(sql.SQL("{} AS {}").format(_source(name), sql.Identifier(name)))
        else:
            parts.append(sql.Identifier(name))
    if position:
        parts.append(_POSITION)
    keys = ("_key", *by_id, *tail)
    key_bytes = sum(_json_len(key) + 1 for key in keys)
    return _Projection(sql.SQL(", ").join(parts), keys, key_bytes)


def _physical_columns(conn: Conn, names: SheetNames) -> list[tuple[str, str]] | None:
    """(sql name, column id) of the sheet table's physical columns; None if it does not exist."""
    return column_ids(conn, names)


def whole_sheet_read(conn: Conn, names: SheetNames) -> tuple[sql.Composed, tuple[str, ...]] | None:
    """The statement that selects every row of the sheet in read order as a read does
    (row mode ``output``), and the keys of its rows' dicts; None if the sheet does not
    exist. The peer the store benchmark times its reads against."""
    columns = _physical_columns(conn, names)
    if columns is None:
        return None
    projection = _projection(columns, "output")
    query = sql.SQL("SELECT {} FROM {} {}").format(
        projection.select, names.ident("sheet_table"), ORDER_BY
    )
    return query, projection.keys


@attrs.frozen
class _Filter:
    """Which rows a read sees: all, one run's, and/or one admission's pending or completed."""

    run_id: str | None = None
    admitted: AdmittedPart | None = None
    row_mode: RowMode = "output"

    def where(self, *more: sql.Composable) -> sql.Composed:
        conditions: list[sql.Composable] = []
        if self.run_id is not None:
            conditions.append(sql.SQL("_run_id = %(run_id)s"))
        if self.admitted is not None:
            conditions.append(sql.SQL("(seq).admitted_version = %(admitted)s"))
            if self.admitted.part == "completed":
                conditions.append(sql.SQL("(seq).write_version <> %(admitted)s"))
            else:
                conditions.append(sql.SQL("(seq).write_version = %(admitted)s"))
            if self.admitted.part == "unsettled":
                conditions.append(sql.SQL("_status IN ('pending', 'running')"))
            if self.admitted.first_index is not None:
                conditions.append(
                    sql.SQL("_input_index BETWEEN %(first_index)s AND %(last_index)s")
                )
        conditions += more
        if not conditions:
            return sql.Composed([])
        return sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions)

    def params(self, **more: Any) -> dict[str, Any]:
        part = self.admitted
        return {
            "run_id": self.run_id,
            "admitted": None if part is None else part.write_version,
            "first_index": None if part is None else part.first_index,
            "last_index": None if part is None else part.last_index,
            **more,
        }


def _filter(which: object) -> _Filter:
    """The checked form of a read's ``RowFilter`` (``InvalidInputError`` for a bad field)."""
    if not isinstance(which, RowFilter):
        raise InvalidInputError(f"which must be a RowFilter, got {which!r}")
    run_id, admitted = which.run_id, which.admitted
    if admitted is not None and not isinstance(admitted, AdmittedPart):
        raise InvalidInputError(f"admitted must be an AdmittedPart or None, got {admitted!r}")
    row_mode = _check_row_mode(which.row_mode)
    return _Filter(None if run_id is None else check_text(run_id, "run_id"), admitted, row_mode)


def _snapshot(conn: Conn) -> None:
    """Make the rest of the transaction read one snapshot, read-only."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


# --- the byte budget ------------------------------------------------------------------------


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

#: A slice is encoded whole only while its expected size, this many times over,
#: still fits what remains of the budget.
_ENCODE_HEADROOM = 4


class _Budget:
    """Counts the compact-JSON bytes of a batch answer as its rows arrive.

    Rows are measured as they come off the wire, a slice at a time, as value
    tuples (a tuple's JSON is its dict's JSON without the keys; the keys' bytes
    are added per row). The count is exact while within the budget.

    A slice that may come near the budget is measured with
    ``json_byte_length_up_to`` against what remains, which stops as soon as it
    passes. A slice that, at the batch's average row size so far, would fill
    only a fraction (``1 / _ENCODE_HEADROOM``) of what remains is measured by
    encoding it (the same compact JSON, at C speed): the string built is then
    bounded by the budget, and the read of a typical sheet does not spend most
    of its time counting bytes. The first slice of a batch always takes the
    counting path, which sets the average.

    ``row_bytes`` is the rows' part alone: each row's compact JSON object, summed,
    without the commas between them or any envelope (what a read's span reports).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.pages = 0
        self.page_rows = 0
        self.row_bytes = 0
        self._rows_measured = 0
        self._row_bytes_measured = 0
        self._add(ANSWER_OVERHEAD)

    def start_page(self, request: PageRequest) -> None:
        separator = 1 if self.pages else 0
        self.pages += 1
        self.page_rows = 0
        self._add(separator + page_overhead(request.limit, request.offset))

    def add_rows(self, rows: Sequence[Sequence[Any]], key_bytes: int) -> None:
        """Count rows of the current page, given as value tuples."""
        if not rows:
            return
        # The JSON of a list of n rows is "[" + rows joined by "," + "]": the
        # brackets are in the page overhead, the separators are counted here.
        separator = 1 if self.page_rows else 0
        keys = key_bytes * len(rows)
        room = max(0, self.limit - self.used - separator - keys + 2)
        if self._small_enough(len(rows), room):
            text = _ENCODE(rows)
            measured = len(text) if text.isascii() else len(text.encode("utf-8"))
            exceeded = measured > room
        else:
            measurement = json_byte_length_up_to(rows, room)
            measured, exceeded = measurement.bytes, measurement.exceeded
        size = separator + keys + measured - 2
        if exceeded:
            raise ReadBatchTooLargeError(self.used + size)
        # A dict's JSON is its tuple's plus its keys: the rows' less the list's brackets
        # and commas.
        self.row_bytes += keys + measured - 2 - (len(rows) - 1)
        self.page_rows += len(rows)
        self._rows_measured += len(rows)
        self._row_bytes_measured += measured
        self._add(size)

    def add_encoded(self, rows: Sequence[bytes]) -> None:
        """Count rows of the current page, given as their compact JSON: exactly their bytes."""
        if not rows:
            return
        measured = sum(map(len, rows))
        # One comma between rows, and one before the first if the page has rows already.
        size = measured + len(rows) - (0 if self.page_rows else 1)
        if self.used + size > self.limit:
            raise ReadBatchTooLargeError(self.used + size)
        self.row_bytes += measured
        self.page_rows += len(rows)
        self._rows_measured += len(rows)
        self._row_bytes_measured += measured
        self._add(size)

    def rows_to_fetch(self, most: int, share: int) -> int:
        """How many rows the next fetch may ask for: about ``1 / share`` of the
        remaining budget at the average row size measured so far (1 to ``most``)."""
        if not self._rows_measured:
            return most
        average = max(1, self._row_bytes_measured // self._rows_measured)
        return max(1, min(most, (self.limit - self.used) // (share * average)))

    def _small_enough(self, rows: int, room: int) -> bool:
        if not self._rows_measured:
            return False
        expected = self._row_bytes_measured * rows // self._rows_measured + 2
        return expected * _ENCODE_HEADROOM <= room

    def _add(self, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            raise ReadBatchTooLargeError(self.used)


_DECLARE = sql.SQL("DECLARE sheetplane_page NO SCROLL CURSOR FOR {}")
_FETCH = sql.SQL("FETCH FORWARD {} FROM sheetplane_page")
_CLOSE = sql.SQL("CLOSE sheetplane_page")


@contextmanager
def _page_cursor(
    conn: Conn, query: sql.Composed, params: Mapping[str, Any], *, binary: bool = False
) -> Iterator[Callable[[int], list[Any]]]:
    """A page query's rows a bounded fetch at a time: yields ``fetch(n)``, the next
    ``n`` rows (fewer at the end, none past it).

    The query runs as a cursor declared on the server, so the client never holds
    more of the page than one fetch. Each fetch is its own statement, whose result
    is dropped as soon as its rows are loaded: a psycopg server-side cursor would
    keep each fetch's result until the next one had arrived, two fetches at once.
    ``binary`` fetches in binary format (a ``bytea`` column comes as ``bytes``).
    The cursor is closed when the block ends; on an exception the transaction's
    rollback closes it.
    """
    conn.execute(_DECLARE.format(query), params)

    def fetch(rows: int) -> list[Any]:
        with conn.cursor(binary=binary) as cursor:
            cursor.execute(_FETCH.format(sql.Literal(rows)))
            return cursor.fetchall()

    yield fetch
    conn.execute(_CLOSE)


def _fetch(
    conn: Conn,
    query: sql.Composed,
    params: Mapping[str, Any],
    projection: _Projection,
    budget: _Budget | None,
) -> tuple[list[dict[str, Any]], Sequence[Any] | None]:
    """Run a page query; its rows as dicts (measured into ``budget``) and the last raw row.

    The rows come through ``_page_cursor``, a bounded fetch at a time: a
    client-side cursor would hold the whole page in the client before the first
    row is measured. With a budget, each fetch asks for about a
    ``1 / _FETCH_BUDGET_SHARE`` of what remains at the rows' average size so far
    (``_FIRST_FETCH_ROWS`` first), so a read refused ``ReadBatchTooLargeError``
    has held about its budget and one fetch, whatever the page's size.
    """
    rows: list[dict[str, Any]] = []
    keys = projection.keys
    last: Sequence[Any] | None = None
    want = _FETCH_ROWS if budget is None else _FIRST_FETCH_ROWS
    with _page_cursor(conn, query, params) as fetch:
        while chunk := fetch(want):
            if budget is not None:
                # Hidden position columns (past the keys) are not part of the answer.
                width = len(keys)
                shown = chunk if len(chunk[0]) == width else [row[:width] for row in chunk]
                budget.add_rows(shown, projection.key_bytes)
                want = budget.rows_to_fetch(_FETCH_ROWS, _FETCH_BUDGET_SHARE)
            # zip stops at the keys: hidden position columns are left out.
            rows += [dict(zip(keys, row)) for row in chunk]  # noqa: B905
            last = chunk[-1]
    return rows, last


_Position = tuple["int | None", datetime.datetime, str]

R = TypeVar("R")


class _Form(Generic[R]):
    """How a read's rows come back: the page query and the fetch that decodes it."""

    def query(self, table: sql.Identifier, where: sql.Composable, *, offset: bool) -> sql.Composed:
        """The page query: rows ``where``, in read order, ``%(limit)s`` (and ``%(offset)s``)."""
        raise NotImplementedError

    def fetch(
        self, conn: Conn, query: sql.Composed, params: Mapping[str, Any], budget: _Budget
    ) -> tuple[list[R], Sequence[Any] | None]:
        """The page's rows, measured into ``budget`` as they arrive, and the last raw row."""
        raise NotImplementedError

    def position(self, last: Sequence[Any]) -> tuple[_Position | None, str]:
        """The read-order position of the last raw row, if the row carries it, and its key."""
        raise NotImplementedError


class _Dicts(_Form[dict[str, Any]]):
    """Rows as dicts of Python values, measured by ``_Budget.add_rows`` (the store's own reads)."""

    def __init__(self, projection: _Projection) -> None:
        self.projection = projection

    def query(self, table: sql.Identifier, where: sql.Composable, *, offset: bool) -> sql.Composed:
        page = "SELECT {} FROM {} {} {} LIMIT %(limit)s" + (" OFFSET %(offset)s" if offset else "")
        return sql.SQL(page).format(self.projection.select, table, where, ORDER_BY)

    def fetch(
        self, conn: Conn, query: sql.Composed, params: Mapping[str, Any], budget: _Budget
    ) -> tuple[list[dict[str, Any]], Sequence[Any] | None]:
        return _fetch(conn, query, params, self.projection, budget)

    def position(self, last: Sequence[Any]) -> tuple[_Position | None, str]:
        key = last[0]  # the projection's first column is _key
        if len(last) == len(self.projection.keys) + 2:
            return (last[-2], last[-1], key), key
        return None, key


# --- rows as compact JSON, written by Postgres ---------------------------------------------

#: System columns by how their value is written as JSON (every other column is jsonb).
_TEXT_COLUMNS = frozenset({"_key", "_status", "_error", "_run_id", "_stage", "_provider"})
_INTEGER_COLUMNS = frozenset({"_input_index", "_write_version"})

#: A jsonb cell whose text is not already the compact form: Postgres writes a
#: non-empty object or array with a space after each ':' and ',', and a number
#: with a fraction as its numeric text ("1.50"), where the wire writes the
#: float Python reads from it ("1.5"). Strings (escaped as ``json.dumps``
#: escapes them), true, false, null, integers and empty containers are written
#: exactly as the wire writes them.
_RECODE_CELL = (
    "CASE jsonb_typeof({0}) WHEN 'number' THEN strpos({0}::text, '.') > 0"
    " WHEN 'object' THEN {0} <> '{{}}'::jsonb WHEN 'array' THEN {0} <> '[]'::jsonb"
    " ELSE false END"
)

_WIRE_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _recoded(text: bytes) -> bytes:
    """The compact wire form of a row whose Postgres text is not compact.

    ``decode_body`` reads it as psycopg reads a jsonb value; the standard
    library writes it in the form ``json_byte_length_up_to`` measures. A
    number past a float's range (read as infinity) has no JSON form.
    """
    try:
        return _WIRE_ENCODE(decode_body(text)).encode("utf-8")
    except ValueError as exc:
        raise InvalidInputError(f"a stored value has no JSON form: {exc}") from None


def _wire_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False) + ":"


class _Json(_Form[bytes]):
    """Rows as their compact JSON bytes, the object a dict row would encode to.

    Postgres writes each row's JSON text (``to_json`` of the text columns,
    the jsonb cells' own text, the keys as literals) in one pass over a page
    already cut by ``LIMIT``/``OFFSET`` (a subquery, so rows an ``OFFSET``
    skips are never written). A row holding a cell whose text is not compact
    (``_RECODE_CELL``) is rewritten here. Each row is measured by its length:
    the bytes measured are the bytes sent.
    """

    def __init__(self, columns: Sequence[tuple[str, str]], row_mode: RowMode) -> None:
        tail = _OUTPUT_TAIL if row_mode == "output" else _ALL_TAIL
        reserved = {"_key", *tail}
        by_id = {column_id: name for name, column_id in columns if column_id not in reserved}
        # (key, sql column, whether it is jsonb), in the dict rows' key order; every
        # physical column is jsonb (``ensure_sheet``).
        cells = [("_key", "_key", False)]
        cells += [(column_id, name, True) for column_id, name in by_id.items()]
        cells += [(name, name, name == "_cell_meta") for name in tail]
        inner: list[sql.Composable] = [
            sql.SQL("_key AS _o_key, _input_index AS _o_index, _created_at AS _o_created")
        ]
        pieces: list[sql.Composable] = []
        recode: list[sql.Composable] = []
        for number, (key, column, is_jsonb) in enumerate(cells):
            alias = sql.Identifier(f"_v{number}")
            source = _source(column)
            pieces.append(sql.Literal(("{" if number == 0 else ",") + _wire_key(key)))
            # The subquery selects bare columns: its projection is also computed for
            # the rows an OFFSET skips, so everything else is written outside it.
            inner.append(sql.SQL("{} AS {}").format(source, alias))
            if is_jsonb:
                pieces.append(sql.SQL("COALESCE({}::text, 'null')").format(alias))
                recode.append(sql.SQL(_RECODE_CELL).format(alias))
            elif column in _INTEGER_COLUMNS:
                pieces.append(sql.SQL("COALESCE({}::text, 'null')").format(alias))
            else:
                # Text, and timestamps as ISO 8601 strings (in the session's UTC).
                pieces.append(sql.SQL("COALESCE(to_json({})::text, 'null')").format(alias))
        pieces.append(sql.Literal("}"))
        self._inner = sql.SQL(", ").join(inner)
        self._row = sql.SQL(" || ").join(pieces)
        self._recode = sql.SQL(" OR ").join(recode) if recode else sql.SQL("false")

    def query(self, table: sql.Identifier, where: sql.Composable, *, offset: bool) -> sql.Composed:
        page = (
            "SELECT convert_to({row}, 'UTF8'), {recode}, _o_key, _o_index, _o_created FROM"
            " (SELECT {inner} FROM {table} {where} {order} LIMIT %(limit)s"
            + (" OFFSET %(offset)s" if offset else "")
            + ") AS page ORDER BY _o_index ASC NULLS LAST, _o_created ASC, _o_key ASC"
        )
        return sql.SQL(page).format(
            row=self._row,
            recode=self._recode,
            inner=self._inner,
            table=table,
            where=where,
            order=ORDER_BY,
        )

    def fetch(
        self, conn: Conn, query: sql.Composed, params: Mapping[str, Any], budget: _Budget
    ) -> tuple[list[bytes], Sequence[Any] | None]:
        rows: list[bytes] = []
        last: Sequence[Any] | None = None
        want = _FIRST_FETCH_ROWS
        # Binary: each row's text arrives as the bytes sent (its UTF-8, a bytea),
        # never decoded to a str and encoded again.
        with _page_cursor(conn, query, params, binary=True) as fetch:
            while chunk := fetch(want):
                encoded = [_recoded(row[0]) if row[1] else row[0] for row in chunk]
                budget.add_encoded(encoded)
                want = budget.rows_to_fetch(_FETCH_ROWS, _FETCH_BUDGET_SHARE)
                rows += encoded
                last = chunk[-1]
        return rows, last

    def position(self, last: Sequence[Any]) -> tuple[_Position | None, str]:
        return (last[-2], last[-1], last[-3]), last[-3]


def _rows_after(
    conn: Conn,
    names: SheetNames,
    form: _Form[R],
    filt: _Filter,
    after: _Position | None,
    limit: int,
    budget: _Budget,
) -> tuple[list[R], Sequence[Any] | None]:
    """Up to ``limit`` rows after ``after`` in read order (keyset), and the last raw row.

    Numbered rows come first (an index range scan from the position), then the
    NULL-index rows (NULLS LAST), each part a plain ordered range of the read-
    order index.
    """
    table = names.ident("sheet_table")
    params: dict[str, Any] = filt.params(limit=limit)
    rows: list[R] = []
    last: Sequence[Any] | None = None
    null_part: sql.Composable = sql.SQL("_input_index IS NULL")
    if after is not None:
        index, created, key = after
        params |= {"index": index, "created": created, "key": key}
        if index is None:
            null_part = sql.SQL(
                "_input_index IS NULL AND (_created_at, _key) > (%(created)s, %(key)s)"
            )
    if after is None or after[0] is not None:
        numbered: sql.Composable = sql.SQL("_input_index IS NOT NULL")
        if after is not None:
            numbered = sql.SQL(
                "(_input_index, _created_at, _key) > (%(index)s, %(created)s, %(key)s)"
            )
        query = form.query(table, filt.where(numbered), offset=False)
        rows, last = form.fetch(conn, query, params, budget)
        if len(rows) >= limit:
            return rows, last
        params["limit"] = limit - len(rows)
    query = form.query(table, filt.where(null_part), offset=False)
    more, more_last = form.fetch(conn, query, params, budget)
    return rows + more, more_last if more else last


def _count(budget: _Budget) -> None:
    """Report a read's row bytes on the statement's span and to the read span above it
    (a page read's on the runner's direct road; none on the gateway's side)."""
    _tracing.annotate({_tracing.READ_BYTES: budget.row_bytes})
    _tracing.count_read_bytes(budget.row_bytes)


_POSITION_OF = "SELECT _input_index, _created_at FROM {} WHERE _key = %s"


def _read_batch(
    conn: Conn,
    names: SheetNames,
    requests: Sequence[PageRequest],
    filt: _Filter,
    form: _Form[R] | None,
) -> list[list[R]]:
    """The rows of each page of a batch (``form`` None: the sheet does not exist), measured
    against ``READ_BATCH_MAX_RESPONSE_BYTES`` as one answer.

    A page that starts right where the previous full page of the batch ended
    is read by keyset from that page's last row.
    """
    budget = _Budget(READ_BATCH_MAX_RESPONSE_BYTES)
    results: list[list[R]] = []
    if form is None:
        for request in requests:
            budget.start_page(request)
            results.append([])
        return results
    table = names.ident("sheet_table")
    by_offset = form.query(table, filt.where(), offset=True)
    position_of = sql.SQL(_POSITION_OF).format(table)
    # Where the previous page ended, when it came back full: (offset, position).
    ended: tuple[int, _Position | None, str] | None = None
    for request in requests:
        budget.start_page(request)
        after: _Position | None = None
        if ended is not None and ended[0] == request.offset:
            after = ended[1]
            if after is None:
                found = conn.execute(position_of, (ended[2],)).fetchone()
                if found is not None:
                    after = (found[0], found[1], ended[2])
        if after is not None:
            rows, last = _rows_after(conn, names, form, filt, after, request.limit, budget)
        else:
            params = filt.params(limit=request.limit, offset=request.offset)
            rows, last = form.fetch(conn, by_offset, params, budget)
        ended = None
        if len(rows) == request.limit and last is not None:
            position, key = form.position(last)
            ended = (request.offset + request.limit, position, key)
        results.append(rows)
    _count(budget)
    return results


# --- reads -------------------------------------------------------------------------------------


async def read_rows_batch(
    pool: ConnectionRunner,
    names: SheetNames,
    pages: Sequence[PageRequest],
    *,
    which: RowFilter = EVERY_ROW,
) -> list[Page]:
    """Read 1 to ``READ_BATCH_MAX_PAGES`` pages under one snapshot; one ``Page`` per request.

    A page that starts right where the previous full page of the batch ended
    is read by keyset from that page's last row (the same rows as its offset
    would give, in one snapshot, without scanning the offset again).

    Raises ``ReadBatchTooLargeError`` (with the bytes observed so far) as soon as
    the answer would exceed ``READ_BATCH_MAX_RESPONSE_BYTES``; the caller splits
    the read. Bad requests raise ``InvalidInputError`` before any query.
    """
    read, requests = await _batch(pool, names, pages, which, lambda c, m: _Dicts(_projection(c, m)))
    return [Page(tuple(rows), r.limit, r.offset) for rows, r in zip(read, requests, strict=True)]


@attrs.frozen
class JsonPage:
    """A page as the gateway sends it: each row's compact JSON, in read order."""

    rows: list[bytes]
    """Each row as the bytes of the JSON object its dict row encodes to."""
    limit: int
    offset: int


async def read_rows_batch_json(
    pool: ConnectionRunner,
    names: SheetNames,
    pages: Sequence[PageRequest],
    *,
    which: RowFilter = EVERY_ROW,
) -> list[JsonPage]:
    """``read_rows_batch`` with each row as its compact JSON, written by Postgres.

    The same rows, under the same budget, counted as the bytes themselves.
    """
    read, requests = await _batch(pool, names, pages, which, _Json)
    return [JsonPage(rows, r.limit, r.offset) for rows, r in zip(read, requests, strict=True)]


async def _batch(
    pool: ConnectionRunner,
    names: SheetNames,
    pages: Sequence[PageRequest],
    which: RowFilter,
    make_form: Callable[[Sequence[tuple[str, str]], RowMode], _Form[R]],
) -> tuple[list[list[R]], CheckedPages]:
    """The rows of each page of a batch read in ``make_form``'s form, and the requests
    (checked here unless they come checked: ``CheckedPages``)."""
    requests = check_page_batch(pages)
    filt = _filter(which)

    def run(conn: Conn) -> list[list[R]]:
        _snapshot(conn)
        columns = _physical_columns(conn, names)
        form = None if columns is None else make_form(columns, filt.row_mode)
        return _read_batch(conn, names, requests, filt, form)

    return await pool.run(run), requests


async def read_rows(
    pool: ConnectionRunner,
    names: SheetNames,
    request: PageRequest,
    *,
    which: RowFilter = EVERY_ROW,
) -> Page:
    """Read one page; the same rules (and byte budget) as a batch of one."""
    (page,) = await read_rows_batch(pool, names, [request], which=which)
    return page


async def read_rows_after(
    pool: ConnectionRunner,
    names: SheetNames,
    cursor: RowCursor | None,
    limit: int | CheckedPage,
    *,
    which: RowFilter = EVERY_ROW,
) -> tuple[list[dict[str, Any]], RowCursor | None]:
    """Up to ``limit`` rows after ``cursor`` (from the start if None), and the next cursor.

    ``limit`` may be a ``CheckedPage`` a road checked (its ``limit`` rows), read
    without checking it again.

    Keyset pagination: unlike an offset, each page costs the same however deep
    it is, and rows admitted meanwhile never shift a page. The next cursor is
    None once a page comes back short (the sheet ended).

    The rows are measured as they decode, as a batch read of one page is:
    ``ReadBatchTooLargeError`` is raised as soon as they would exceed
    ``READ_BATCH_MAX_RESPONSE_BYTES``, so a page of large rows is never held
    whole before the caller learns to ask for fewer.
    """
    return await _read_after(
        pool,
        names,
        cursor,
        limit,
        which,
        lambda columns, mode: _Dicts(_projection(columns, mode, position=True)),
    )


async def read_rows_after_json(
    pool: ConnectionRunner,
    names: SheetNames,
    cursor: RowCursor | None,
    limit: int | CheckedPage,
    *,
    which: RowFilter = EVERY_ROW,
) -> tuple[list[bytes], RowCursor | None]:
    """``read_rows_after`` with each row as its compact JSON, written by Postgres.

    ``limit`` may be the ``CheckedPage`` the reference gateway decoded (its
    ``limit`` rows, measured with its ``offset`` as the answer will carry it)."""
    return await _read_after(pool, names, cursor, limit, which, _Json)


async def _read_after(
    pool: ConnectionRunner,
    names: SheetNames,
    cursor: RowCursor | None,
    limit: int | CheckedPage,
    which: RowFilter,
    make_form: Callable[[Sequence[tuple[str, str]], RowMode], _Form[R]],
) -> tuple[list[R], RowCursor | None]:
    if cursor is not None and not isinstance(cursor, RowCursor):
        raise InvalidInputError(f"cursor must be a RowCursor or None, got {cursor!r}")
    page = limit if isinstance(limit, CheckedPage) else CheckedPage(limit, 0)
    filt = _filter(which)
    after = None if cursor is None else (cursor.input_index, cursor.created_at, cursor.key)

    def run(conn: Conn) -> tuple[list[R], RowCursor | None]:
        _snapshot(conn)
        columns = _physical_columns(conn, names)
        if columns is None:
            return [], None
        form = make_form(columns, filt.row_mode)
        budget = _Budget(READ_BATCH_MAX_RESPONSE_BYTES)
        budget.start_page(page)
        rows, last = _rows_after(conn, names, form, filt, after, page.limit, budget)
        _count(budget)
        if len(rows) < page.limit or last is None:
            return rows, None
        position, _ = form.position(last)
        if position is None:
            raise AssertionError("a keyset read selects the position of its rows")
        return rows, RowCursor(*position)

    return await pool.run(run)


async def read_row_keys(
    pool: ConnectionRunner,
    names: SheetNames,
    request: PageRequest,
    *,
    which: RowFilter = EVERY_ROW,
) -> list[str]:
    """The keys of the rows ``read_rows(request)`` would return, in read order."""
    request = check_page_request(request)
    filt = _filter(which)

    def run(conn: Conn) -> list[str]:
        if _physical_columns(conn, names) is None:
            return []
        query = sql.SQL("SELECT _key FROM {} {} {} LIMIT %(limit)s OFFSET %(offset)s").format(
            names.ident("sheet_table"), filt.where(), ORDER_BY
        )
        params = filt.params(limit=request.limit, offset=request.offset)
        return [row[0] for row in conn.execute(query, params).fetchall()]

    return await pool.run(run)


async def count(
    pool: ConnectionRunner,
    names: SheetNames,
    *,
    which: RowFilter = EVERY_ROW,
) -> int:
    """How many rows the sheet holds that ``which`` sees (its ``run_id``: how many that
    run stamped; its ``admitted``: how many that admission's part holds)."""
    filt = _filter(which)

    def run(conn: Conn) -> int:
        if _physical_columns(conn, names) is None:
            return 0
        query = sql.SQL("SELECT count(*) FROM {} {}").format(
            names.ident("sheet_table"), filt.where()
        )
        row = conn.execute(query, filt.params()).fetchone()
        return int(row[0]) if row else 0

    return await pool.run(run)


async def read_rows_by_keys(
    pool: ConnectionRunner,
    names: SheetNames,
    keys: Sequence[str],
    *,
    row_mode: RowMode = "output",
) -> list[dict[str, Any]]:
    """The stored rows among ``keys`` (missing keys are skipped), in read order."""
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise InvalidInputError("keys must be a sequence of strings")
    for key in keys:
        if not isinstance(key, str) or "\x00" in key:
            raise InvalidInputError(f"row key must be a string without NUL, got {key!r}")
    row_mode = _check_row_mode(row_mode)
    wanted = list(dict.fromkeys(keys))
    if not wanted:
        return []

    def run(conn: Conn) -> list[dict[str, Any]]:
        _snapshot(conn)
        columns = _physical_columns(conn, names)
        if columns is None:
            return []
        projection = _projection(columns, row_mode)
        query = sql.SQL("SELECT {} FROM {} WHERE _key = ANY(%(keys)s::text[]) {}").format(
            projection.select, names.ident("sheet_table"), ORDER_BY
        )
        rows, _ = _fetch(conn, query, {"keys": wanted}, projection, None)
        return rows

    return await pool.run(run)


async def summary(pool: ConnectionRunner, names: SheetNames) -> Summary:
    """The sheet's status counters (all zero for a sheet that does not exist yet):
    the summary row's base plus the counter log (``_counters``), one snapshot."""

    def run(conn: Conn) -> Summary:
        tables = [names.ident(t).as_string(conn) for t in ("summary_table", "counter_table")]
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL", tables
        ).fetchone()
        if exists is None or not exists[0]:
            return Summary(0, 0, 0, 0, 0)
        # A sheet made before the counter table existed keeps every count in its base.
        return Summary(**status_counts(conn, names, log=bool(exists[1])))

    return await pool.run(run)
