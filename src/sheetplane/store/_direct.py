"""The direct road's admission in one transaction: new rows written once, straight into the sheet.

On the direct road the runner holds a scoped session for the whole admission
anyway; this is the runtime's own direct admission (``startRuntimeSheetDataset``:
one transaction, the input in chunks, no staging) with sheetplane's write
version. A ``rows.admit`` session runs, in one transaction:

1. the sheet's begin function (``SECURITY DEFINER``, the owner's): the writer
   lock, exclusively, then the sheet's next write version; it answers the
   version and whether the sheet holds any row. A sheet that holds rows is
   left alone (the transaction rolls back, nothing was read from the input):
   re-admitting rows moves their status and version, which only the owner's
   statements do, so that admission goes the staged way (``_staging``);
2. the input, a chunk of ``ADMISSION_CHUNK_ROWS`` rows at a time: each row
   checked, keyed and encoded as the staged road does it (``keyed_document``, so a
   bad row is refused with the same message and position), then one ``COPY``
   of the chunk into the sheet, as ``pending`` rows stamped with the version,
   inside a savepoint. A key that repeats (in the chunk, or one an earlier
   chunk took: the sheet was empty, so every row in it is this admission's)
   fails the primary key; the savepoint rolls the chunk back and it is copied
   again without the repeats, the first occurrence kept. ``_input_index`` is
   the row's position among the kept rows;
3. the finish function (the owner's): the admission's event, the counter
   log compacted, an ``ANALYZE`` when the sheet grew enough (as every
   admission does); it answers the sheet's row count, which is the rows this
   admission inserted.

The admit guard (``_guards``) holds every row the session inserts to the
version its own transaction took, so the fence stays exact. Committed once or
not at all: a bad row, a lost connection, a cancellation or a crash rolls the
transaction back and nothing of it is ever visible. Two admissions of one
sheet queue on the writer lock. Memory holds one chunk of encoded rows.

What holding the transaction costs, and its bounds (``budgets``): the sheet's
writer lock is held from the begin to the commit, so every other writer of the
sheet waits that long; the runner gives up (rolls back) once the transaction
has run ``DIRECT_ADMISSION_HOLD_MS``, which is under the statement timeout a
waiting writer's ``LOCK`` runs under and under the session's transaction
timeout. Between statements the transaction is idle only while the runner
reads and encodes the next chunk of its input, on a worker thread. The runtime
hands this road only sequences (``runtime/_admit.py``): one that outruns the
bound is staged from its start; a one-shot input (an iterator, which could not
be read again, or an async iterable, which may wait on anything while the
lock is held) goes the staged way from the start.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any, Final, Literal

import orjson
import psycopg
from psycopg import sql

from .._types import AdmissionCounts, ContractColumn
from ..budgets import ADMISSION_CHUNK_ROWS
from ..protocol import ENCODE_OPTIONS, keyed_document
from ._guards import admit_functions
from ._names import SheetNames
from ._pool import ConnectionRunner
from ._rowdata import column_lookups, jsonb_text

__all__ = ["DirectOutcome", "admit_in_one_transaction"]

Conn = psycopg.Connection[Any]

#: What the one transaction came to: the admission's counts, or why it wrote nothing
#: (``"sheet_has_rows"``: the staged road re-admits; ``"hold_exceeded"``: the input
#: took longer than the hold bound, and the transaction was rolled back).
DirectOutcome = AdmissionCounts | Literal["sheet_has_rows", "hold_exceeded"]


class _SheetHasRows(Exception):
    """The begin found rows: roll back, the staged road re-admits them."""


class _HoldExceeded(Exception):
    """The transaction ran past its hold bound: roll back."""


#: One encoded row: its key, and its COPY text fields after the run, index and versions
#: (each contract column's jsonb text, escaped), ending the line.
_Encoded = tuple[str, bytes, bytes]

_NULL: Final = b"\\N"


def _escaped(text: bytes) -> bytes:
    """A COPY text field: backslash, tab, newline and carriage return escaped."""
    if b"\\" in text:
        text = text.replace(b"\\", b"\\\\")
    if b"\t" in text or b"\n" in text or b"\r" in text:
        text = text.replace(b"\t", b"\\t").replace(b"\n", b"\\n").replace(b"\r", b"\\r")
    return text


def _column_field(value: Any) -> bytes:
    """A column value as a COPY text field of jsonb (JSON null: SQL NULL). orjson writes
    JSON text with every control character escaped, so only its backslashes need it."""
    if value is None:
        return _NULL
    try:
        text = orjson.dumps(value, option=ENCODE_OPTIONS)
    except TypeError:  # what the row's checks let through orjson does not write (a big int)
        found = jsonb_text(value)
        return _NULL if found is None else _escaped(found.encode("utf-8"))
    if text == b"null":
        return _NULL
    return text.replace(b"\\", b"\\\\") if b"\\" in text else text


def _encoded(
    rows: Iterator[object], first: int, lookups: Sequence[Sequence[str]]
) -> list[_Encoded]:
    """The next chunk of ``rows``: each row checked and keyed as the staged road does it
    (``keyed_document``), as its key and the COPY text of its columns."""
    chunk: list[_Encoded] = []
    for position, raw in enumerate(islice(rows, ADMISSION_CHUNK_ROWS), first):
        key, _document = keyed_document(raw, position)
        row: Mapping[str, Any] = raw  # type: ignore[assignment]  # keyed_document checked it
        fields = []
        for names in lookups:
            for name in names:
                if name in row:
                    fields.append(_column_field(row[name]))
                    break
            else:
                fields.append(_NULL)
        tail = b"\t" + b"\t".join(fields) + b"\n" if fields else b"\n"
        chunk.append((key, _escaped(key.encode("utf-8")), tail))
    return chunk


def _copy(
    conn: Conn,
    statement: sql.Composed,
    chunk: Sequence[_Encoded],
    base: int,
    run_id: str,
    version: int,
) -> None:
    """One ``COPY`` of ``chunk``'s rows, their input indexes counted from ``base``."""
    run = b"\t" + _escaped(run_id.encode("utf-8")) + b"\t"
    versions = b"\t%d\t%d" % (version, version)
    parts: list[bytes] = []
    for index, (_key, key, tail) in enumerate(chunk, base):
        parts += (key, run, b"%d" % index, versions, tail)
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(b"".join(parts))


def _admit_chunk(
    conn: Conn,
    names: SheetNames,
    statement: sql.Composed,
    chunk: list[_Encoded],
    base: int,
    run_id: str,
    version: int,
) -> int:
    """COPY one chunk in a savepoint; on a repeated key, again without the repeats.
    Returns the rows kept."""
    try:
        with conn.transaction():
            _copy(conn, statement, chunk, base, run_id, version)
        return len(chunk)
    except psycopg.errors.UniqueViolation:
        pass
    # The sheet was empty at the begin: a key it holds now is this admission's.
    found = conn.execute(
        sql.SQL("SELECT _key FROM {} WHERE _key = ANY(%s)").format(names.ident("sheet_table")),
        ([key for key, _, _ in chunk],),
    ).fetchall()
    seen = {row[0] for row in found}
    kept = []
    for encoded in chunk:
        if encoded[0] not in seen:
            seen.add(encoded[0])
            kept.append(encoded)
    _copy(conn, statement, kept, base, run_id, version)
    return len(kept)


def _admit(
    conn: Conn,
    names: SheetNames,
    table_namespace: str,
    columns: Sequence[ContractColumn],
    rows: Iterable[object],
    run_id: str,
    deadline: float,
) -> AdmissionCounts:
    begin, _taken, finish = admit_functions(names)
    found = conn.execute(sql.SQL("SELECT taken_version, was_empty FROM {}()").format(begin))
    version, empty = found.fetchone() or (None, None)
    assert isinstance(version, int)
    if not empty:
        raise _SheetHasRows
    targets = ["_key", "_run_id", "_input_index", "_write_version", "_admitted_version"]
    targets += [c.sql_name for c in columns]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        names.ident("sheet_table"), sql.SQL(", ").join(map(sql.Identifier, targets))
    )
    lookups = column_lookups(columns)
    source = iter(rows)
    position = kept = 0
    # The next chunk is read and encoded on a helper thread while this one's COPY runs:
    # Postgres stores one chunk while Python prepares the next (the wait for the
    # server releases the GIL). One chunk ahead at most, so memory holds two.
    with ThreadPoolExecutor(1, thread_name_prefix="sheetplane-admit") as ahead:
        upcoming = ahead.submit(_encoded, source, position, lookups)
        while chunk := upcoming.result():
            position += len(chunk)
            upcoming = ahead.submit(_encoded, source, position, lookups)
            try:
                kept += _admit_chunk(conn, names, statement, chunk, kept, run_id, version)
                if time.monotonic() >= deadline:
                    raise _HoldExceeded
            except BaseException:
                upcoming.cancel()
                raise
    row = conn.execute(
        sql.SQL("SELECT taken_version, sheet_rows FROM {}(%s)").format(finish), (run_id,)
    ).fetchone()
    assert row is not None and row[0] == version, row
    # The sheet was empty at the begin and the writer lock kept every other writer out.
    assert row[1] == kept, (row, kept)
    return AdmissionCounts(
        write_version=version,
        inserted=kept,
        skipped=position - kept,
        pending_count=kept,
        completed_count=0,
        table_namespace=table_namespace,
    )


async def admit_in_one_transaction(
    pool: ConnectionRunner,
    names: SheetNames,
    table_namespace: str,
    columns: Sequence[ContractColumn],
    rows: Iterable[object],
    run_id: str,
    *,
    hold_ms: int,
) -> DirectOutcome:
    """Admit ``rows`` in one transaction on ``pool`` (a ``rows.admit`` session of the
    sheet); see the module docstring.

    ``rows`` is read on the pool's worker thread, chunk by chunk, while the
    transaction is open, and only after the begin found the sheet empty:
    ``"sheet_has_rows"`` means nothing of it was read. ``"hold_exceeded"``: the
    transaction had run ``hold_ms`` with input left, and was rolled back (part of
    ``rows`` was read). A bad row raises ``InvalidInputError`` naming its position,
    with nothing committed. If cancelled, the transaction rolls back.
    """

    def run(conn: Conn) -> AdmissionCounts:
        deadline = time.monotonic() + hold_ms / 1000
        return _admit(conn, names, table_namespace, columns, rows, run_id, deadline)

    try:
        return await pool.run(run)
    except _SheetHasRows:
        return "sheet_has_rows"
    except _HoldExceeded:
        return "hold_exceeded"
