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
2. the input, a chunk of ``DIRECT_ADMISSION_CHUNK_ROWS`` rows at a time: each row
   checked and keyed as the staged road does it (``keyed_document``, so a bad
   row is refused with the same message and position), its columns written as
   COPY text fields, then one ``COPY`` of the chunk into the sheet, as
   ``pending`` rows stamped with the version, inside a savepoint. The chunk is
   encoded and sent ``_PIECE_ROWS`` rows at a time on one thread, so Postgres
   stores one piece while the runner encodes the next. A key that repeats (in
   the chunk, or one an earlier chunk took: the sheet was empty, so every row
   in it is this admission's) fails the primary key; the savepoint rolls the
   chunk back and it is copied again without the repeats, the first
   occurrence kept. ``_input_index`` is the row's position among the kept rows.
   The transaction's ``work_mem`` is ``DIRECT_ADMISSION_WORK_MEM_BYTES``, so the
   rows a chunk inserted, kept for its statement triggers, stay in memory;
3. the finish function (the owner's): the admission's event, the counter
   log compacted, an ``ANALYZE`` when the sheet grew enough (as every
   admission does); it answers the sheet's row count, which is the rows this
   admission inserted.

The admit guard (``_guards``) holds every row the session inserts to the
version its own transaction took, so the fence stays exact. Committed once or
not at all: a bad row, a lost connection, a cancellation or a crash rolls the
transaction back and nothing of it is ever visible. Two admissions of one
sheet queue on the writer lock. Memory holds one chunk of encoded rows (kept
for a copy without repeats).

What holding the transaction costs, and its bounds (``budgets``): the sheet's
writer lock is held from the begin to the commit, so every other writer of the
sheet waits that long; the runner gives up (rolls back) once the transaction
has run ``DIRECT_ADMISSION_HOLD_MS``, which is under the statement timeout a
waiting writer's ``LOCK`` runs under and under the session's transaction
timeout. Between statements the transaction is idle only while the runner
reads and encodes the first piece of the next chunk, on a worker thread. The runtime
hands this road only sequences (``runtime/_admit.py``): one that outruns the
bound is staged from its start; a one-shot input (an iterator, which could not
be read again, or an async iterable, which may wait on anything while the
lock is held) goes the staged way from the start.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice, repeat
from typing import Any, Final, Literal

import orjson
import psycopg
from psycopg import sql

from .._types import AdmissionCounts, ContractColumn
from ..budgets import DIRECT_ADMISSION_CHUNK_ROWS, DIRECT_ADMISSION_WORK_MEM_BYTES, KiB
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


class _Chunk:
    """One chunk of the input, encoded: each row's key, its key as a COPY text field, and
    its columns' COPY text fields joined by tabs (``None`` for a contract without
    columns). The rest of each line (the input index, the run, the versions) is the
    same for every row but the index, which is the row's position among the kept rows
    and is only known once the earlier chunks are in; ``lines`` joins them."""

    __slots__ = ("fields", "key_fields", "keys")

    def __init__(self, keys: list[str], key_fields: list[str], fields: list[str] | None) -> None:
        self.keys = keys
        self.key_fields = key_fields
        self.fields = fields

    def __len__(self) -> int:
        return len(self.keys)

    def extend(self, other: _Chunk) -> None:
        self.keys += other.keys
        self.key_fields += other.key_fields
        if self.fields is not None and other.fields is not None:
            self.fields += other.fields

    def lines(self, start: int, base: int, same: str) -> bytes:
        """The COPY text of the rows from offset ``start`` on, their input indexes
        counted from ``base``: each line is the key, the index, ``same`` (the run and
        versions), then the columns (the statement's column order), joined by
        ``map``/``zip`` (no Python step a row)."""
        count = len(self.keys) - start
        parts: list[Iterable[str]] = [
            self.key_fields[start:],
            map(str, range(base, base + count)),
            repeat(same, count),
        ]
        if self.fields is not None:
            parts.append(self.fields[start:])
        text = "\n".join(map("\t".join, zip(*parts, strict=False)))
        return (text + "\n").encode("utf-8") if count else b""

    def without(self, dropped: set[int]) -> _Chunk:
        """The chunk without the rows at the offsets in ``dropped``."""
        kept = [i for i in range(len(self.keys)) if i not in dropped]
        return _Chunk(
            [self.keys[i] for i in kept],
            [self.key_fields[i] for i in kept],
            None if self.fields is None else [self.fields[i] for i in kept],
        )


_NULL: Final = "\\N"

#: Rows encoded and sent at a time inside a chunk's ``COPY``: Postgres stores one
#: piece while the runner encodes the next (about 50 kB at 100 bytes a row). Chosen
#: by alternating runs of 300,000 rows at load 9-14 (docs/benchmarks.md): 250 and
#: 500 beat 1,000 and 5,000 (0.73-0.79 against 0.66-0.73 of COPY); 100 did not.
_PIECE_ROWS: Final = 500


def _escaped(text: str) -> str:
    """A COPY text field: backslash, tab, newline and carriage return escaped."""
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def _column_field(value: Any) -> str:
    """A column value as a COPY text field of jsonb (JSON null: SQL NULL).

    The common scalars take a direct path: a string with nothing JSON or COPY
    escapes (printable, no quote, no backslash) is its text in quotes, and an int
    (not a bool) its decimal digits, which is what orjson writes for both. Anything
    else is written by orjson, which escapes every control character, so only its
    backslashes need COPY's escaping."""
    kind = type(value)
    if kind is str:
        if value.isprintable() and '"' not in value and "\\" not in value:
            return f'"{value}"'
    elif kind is int:
        return int.__repr__(value)
    elif value is None:
        return _NULL
    try:
        text = orjson.dumps(value, option=ENCODE_OPTIONS).decode("utf-8")
    except TypeError:  # what the row's checks let through orjson does not write
        found = jsonb_text(value)
        return _NULL if found is None else _escaped(found)
    if text == "null":
        return _NULL
    return text.replace("\\", "\\\\") if "\\" in text else text


def _encoded(
    rows: Iterator[object], first: int, lookups: Sequence[Sequence[str]], limit: int
) -> _Chunk:
    """The next ``limit`` rows of ``rows`` (fewer at its end): each row checked and keyed
    as the staged road does it (``keyed_document``), with its key and its columns as COPY
    text fields."""
    keys: list[str] = []
    key_fields: list[str] = []
    fields: list[str] = []
    field = _column_field
    for position, raw in enumerate(islice(rows, limit), first):
        key, _document = keyed_document(raw, position)
        row: Mapping[str, Any] = raw  # type: ignore[assignment]  # keyed_document checked it
        texts = []
        for names in lookups:
            for name in names:
                if name in row:
                    texts.append(field(row[name]))
                    break
            else:
                texts.append(_NULL)
        keys.append(key)
        key_fields.append(key if key.isprintable() and "\\" not in key else _escaped(key))
        fields.append("\t".join(texts))
    return _Chunk(keys, key_fields, fields if lookups else None)


def _admit_chunk(
    conn: Conn,
    names: SheetNames,
    statement: sql.Composed,
    source: Iterator[object],
    position: int,
    base: int,
    lookups: Sequence[Sequence[str]],
    same: str,
) -> tuple[int, int]:
    """Read the next chunk of ``source`` (``DIRECT_ADMISSION_CHUNK_ROWS`` rows, fewer at its
    end; ``position`` is its first row's) and COPY it into the sheet in a savepoint,
    its input indexes counted from ``base``. The rows are encoded and sent
    ``_PIECE_ROWS`` at a time, so Postgres stores one piece while the runner encodes
    the next, on this one thread. On a repeated key, the chunk is read to its end and
    copied again without the repeats. Returns the rows read and the rows kept."""
    chunk = _encoded(source, position, lookups, min(_PIECE_ROWS, DIRECT_ADMISSION_CHUNK_ROWS))
    if not chunk:
        return 0, 0
    try:
        with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
            start = 0
            while True:
                copy.write(chunk.lines(start, base + start, same))
                start = len(chunk)
                piece = _encoded(
                    source,
                    position + start,
                    lookups,
                    min(_PIECE_ROWS, DIRECT_ADMISSION_CHUNK_ROWS - start),
                )
                if not piece:
                    break
                chunk.extend(piece)
        return len(chunk), len(chunk)
    except psycopg.errors.UniqueViolation:
        pass
    # The server may refuse the chunk before the runner has read all of it.
    while len(chunk) < DIRECT_ADMISSION_CHUNK_ROWS:
        piece = _encoded(
            source,
            position + len(chunk),
            lookups,
            min(_PIECE_ROWS, DIRECT_ADMISSION_CHUNK_ROWS - len(chunk)),
        )
        if not piece:
            break
        chunk.extend(piece)
    # The sheet was empty at the begin: a key it holds now is this admission's.
    found = conn.execute(
        sql.SQL("SELECT _key FROM {} WHERE _key = ANY(%s)").format(names.ident("sheet_table")),
        (chunk.keys,),
    ).fetchall()
    seen = {row[0] for row in found}
    dropped = set()
    for offset, key in enumerate(chunk.keys):
        if key in seen:
            dropped.add(offset)
        seen.add(key)
    kept = chunk.without(dropped)
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(kept.lines(0, base, same))
    return len(chunk), len(kept)


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
    # A chunk's inserted rows stay in memory for its statement triggers (budgets).
    conn.execute(
        "SELECT set_config('work_mem', %s, true)",
        (f"{DIRECT_ADMISSION_WORK_MEM_BYTES // KiB}kB",),
    )
    targets = ["_key", "_input_index", "_run_id", "seq"]
    targets += [c.sql_name for c in columns]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        names.ident("sheet_table"), sql.SQL(", ").join(map(sql.Identifier, targets))
    )
    lookups = column_lookups(columns)
    # ``seq``'s text form: (write version, admitted version).
    same = f"{_escaped(run_id)}\t({version},{version})"
    source = iter(rows)
    position = kept = 0
    while True:
        read, added = _admit_chunk(conn, names, statement, source, position, kept, lookups, same)
        if not read:
            break
        position += read
        kept += added
        if time.monotonic() >= deadline:
            raise _HoldExceeded
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
