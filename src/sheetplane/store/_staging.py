"""Staged admission: an input of any size, sent in chunks, committed whole or not at all.

The path, in order:

1. ``begin_admission``: register an admission id (chosen by the runner, a
   random 128-bit hex string, so a retried begin is a no-op) for one run.
   Abandoned admissions of the sheet (open, idle past ``ADMISSION_IDLE_MS``)
   are expired on the way and their staging rows deleted. A new admission
   reserves one open admission of its org and of its token (``_quotas``).
2. ``stage_chunk`` (once per chunk, any number of times): record the chunk
   ``(admission id, seq)`` with ``INSERT ... ON CONFLICT DO NOTHING`` and,
   only if that inserted it, write its staging row, in one transaction. A
   chunk retried after a lost answer finds its row and writes nothing; two
   copies racing serialise on the primary key. A chunk is one staging row: its
   rows' keys and documents as two jsonb arrays (``EncodedChunk``), which
   ``protocol.encode_row`` wrote once per row, checking each where it encoded it. The
   runner encodes them on both roads; the gateway stages a chunk's arrays as
   they arrived when they carry keys and are in a form the store accepts
   (``gateway/server/_chunks.py``), and the direct road writes them itself,
   needing only ``INSERT`` on the staging and chunk tables (operation
   ``rows.stage``). On either road the staging table's trigger reserves the
   row's bytes on its admission, its org and the total, and refuses the row
   past a bound (``_quotas``).
3. ``commit_admission``: one transaction. Lock the admission row, check the
   chunks are exactly ``0..n-1``, contiguous, with the row count the runner
   sent and every chunk's staging row present; take the sheet's writer lock
   and a new write version; then admit the staged rows, taking each row's key
   and contract columns out of its chunk's arrays in SQL (no row is encoded
   again), the chunks starting in one range of positions per statement. On a
   sheet with no rows (a first admission) an ``INSERT ... SELECT`` per range,
   in position order (each chunk's arrays in order, no sort), takes them all as
   ``pending`` with their position as ``_input_index``, inside one savepoint:
   a key that repeats in the input fails the sheet's primary key, the
   savepoint rolls the inserts back, and the rows go the general way. The
   general way admits them in input order, a range of positions per
   statement: dedupe keeping the first occurrence (within a range by
   ``DISTINCT ON``, across ranges because a key taken in by an earlier range
   already carries this admitted version in ``seq``), insert new keys
   as ``pending``, re-admit ``stale``/``pending``/``running``/``failed`` rows,
   re-order and stamp ``enriched`` ones, exactly as ``start_dataset`` does.
   One ``admission`` event is recorded in the same transaction (the counting
   triggers move the counters with the rows, ``_counters``, and the counter
   log is compacted under the exclusive writer lock); the staging rows are
   deleted and the counts stored on the admission row, so a retried commit
   answers the same counts without writing. Readers never see a
   half-admitted version: the rows appear at the commit.
4. ``abort_admission``: an admission that will not be committed (bad input,
   a cancelled runner) drops its staging rows at once.

A runner that dies between chunks leaves an open admission: the sheet is
unchanged, and the next admission of the sheet (or the gateway's reaper,
``sweep_admissions``) expires it once idle and deletes its rows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final

import attrs
import psycopg
from psycopg import sql
from psycopg.adapt import Dumper

from .._ints import check_int
from .._types import INTEGER_MAX, AdmissionCounts, ContractColumn
from ..budgets import (
    ADMISSION_COMMIT_RANGE_ROWS,
    ADMISSION_COMMIT_WORK_MEM_BYTES,
    ADMISSION_IDLE_MS,
    ADMISSION_MAX_LIFETIME_MS,
    ADMISSION_SWEEP_LOCK_WAIT_MS,
    KiB,
)
from ..errors import STAGING_LOST_TEXT, AdmissionStateError, InvalidInputError
from ..protocol import EncodedChunk
from ._counters import compact_counters, compact_if_long
from ._names import ADMISSIONS_SUFFIX, SheetNames, sheet_tables
from ._pool import ConnectionRunner
from ._quotas import (
    StoreQuotas,
    counted_orgs,
    reconcile_org,
    reconcile_tokens,
    reserve_admission,
    staging_refusal,
)
from ._rowdata import (
    analyze_if_grown,
    column_lookup_names,
    lock_sheet,
    next_write_version,
    record_event,
)

__all__ = [
    "ADMISSION_ID_PATTERN",
    "abort_admission",
    "begin_admission",
    "check_admission_id",
    "commit_admission",
    "stage_chunk",
    "sweep_admissions",
]

Conn = psycopg.Connection[Any]

#: What an admission id looks like: ``uuid.uuid4().hex``.
ADMISSION_ID_PATTERN: Final = re.compile(r"[0-9a-f]{32}")
_READMITTED: Final = ("stale", "pending", "running", "failed")
_INPUT_SOURCES: Final = ("input", "mapField")


def check_admission_id(value: object) -> str:
    """An admission id: 32 lowercase hex digits (``uuid.uuid4().hex``)."""
    if not isinstance(value, str) or not ADMISSION_ID_PATTERN.fullmatch(value):
        raise InvalidInputError(f"admission id must be 32 lowercase hex digits, got {value!r}")
    return value


class _JsonText:
    """JSON text already encoded, sent to Postgres as a ``jsonb`` parameter as it is."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _JsonTextDumper(Dumper):
    oid = psycopg.adapters.types["jsonb"].oid

    def dump(self, obj: Any) -> bytes:
        data: bytes = obj.data
        return data


# --- begin, stage, abort ------------------------------------------------------------------


def _expire_idle(
    conn: Conn, names: SheetNames, lifetime_ms: int = ADMISSION_MAX_LIFETIME_MS
) -> int:
    """Expire the sheet's open admissions idle past ``ADMISSION_IDLE_MS`` or older than
    ``lifetime_ms`` (however often fed) and drop their rows; forget closed admissions
    older than that. Returns how many were expired."""
    admissions = names.ident("admissions_table")
    chunks = names.ident("stage_chunks_table")
    cur = conn.execute(
        sql.SQL(
            "UPDATE {a} AS a SET state = 'expired', closed_at = now() "
            "WHERE a.state = 'open' AND (greatest(a.created_at, "
            "  (SELECT max(c.created_at) FROM {c} AS c WHERE c.admission_id = a.admission_id)) "
            "  < now() - make_interval(secs => %(idle)s) "
            "  OR a.created_at < now() - make_interval(secs => %(lifetime)s)) "
            "RETURNING a.admission_id"
        ).format(a=admissions, c=chunks),
        {"idle": ADMISSION_IDLE_MS / 1000, "lifetime": lifetime_ms / 1000},
    )
    expired = [row[0] for row in cur.fetchall()]
    if expired:
        _drop_staged(conn, names, expired)
    # What no open admission owns: chunks a stage role recorded under an admission
    # that has closed since (its staging rows go with them, by their foreign key).
    conn.execute(
        sql.SQL(
            "DELETE FROM {c} AS c WHERE NOT EXISTS (SELECT FROM {a} AS a "
            "WHERE a.admission_id = c.admission_id AND a.state = 'open')"
        ).format(a=admissions, c=chunks)
    )
    conn.execute(
        sql.SQL(
            "DELETE FROM {} WHERE state <> 'open' "
            "AND closed_at < now() - make_interval(secs => %(idle)s)"
        ).format(admissions),
        {"idle": ADMISSION_IDLE_MS / 1000},
    )
    return len(expired)


def _drop_staged(conn: Conn, names: SheetNames, admission_ids: Sequence[str]) -> None:
    """Delete the staging rows and chunks of ``admission_ids``."""
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE _admission_id = ANY(%s)").format(
            names.ident("staging_table")
        ),
        (list(admission_ids),),
    )
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE admission_id = ANY(%s)").format(
            names.ident("stage_chunks_table")
        ),
        (list(admission_ids),),
    )


async def begin_admission(
    pool: ConnectionRunner,
    names: SheetNames,
    admission_id: str,
    run_id: str,
    *,
    quotas: StoreQuotas | None = None,
    token_id: str | None = None,
) -> None:
    """Register ``admission_id`` for ``run_id`` (a no-op if it exists for the same run).

    A new admission reserves one open admission of its org and of ``token_id``
    (the begin's token's id, a digest; None for a store called without one)
    against ``quotas`` (``budgets``' when None) and records the staged-bytes
    bound its chunks are held to (``_quotas``). Raises ``AdmissionStateError`` if
    the id is registered for another run, ``StagingQuotaError`` for a new
    admission past an open-admission bound (nothing is kept).
    """
    check_admission_id(admission_id)
    bounds = StoreQuotas() if quotas is None else quotas

    def run(conn: Conn) -> None:
        _expire_idle(conn, names, bounds.admission_lifetime_ms)
        inserted = conn.execute(
            sql.SQL(
                "INSERT INTO {} (admission_id, run_id, token_id, max_staged_bytes, open_counted) "
                "VALUES (%s, %s, %s, %s, true) ON CONFLICT (admission_id) DO NOTHING"
            ).format(names.ident("admissions_table")),
            (admission_id, run_id, token_id, bounds.max_admission_staged_bytes),
        ).rowcount
        if inserted:
            # Only a new admission counts; a retried begin found its row.
            reserve_admission(conn, bounds, names.schema, token_id)
            return
        found = conn.execute(
            sql.SQL("SELECT run_id FROM {} WHERE admission_id = %s").format(
                names.ident("admissions_table")
            ),
            (admission_id,),
        ).fetchone()
        if found is None or found[0] != run_id:
            raise AdmissionStateError(f"admission {admission_id} belongs to another run")

    await pool.run(run)


def _state(conn: Conn, names: SheetNames, admission_id: str, *, lock: str = "") -> Any:
    return conn.execute(
        sql.SQL(
            "SELECT state, run_id, write_version, inserted, skipped, pending_count, "
            "completed_count FROM {} WHERE admission_id = %s {}"
        ).format(names.ident("admissions_table"), sql.SQL(lock)),
        (admission_id,),
    ).fetchone()


def write_chunk(
    conn: Conn,
    names: SheetNames,
    admission_id: str,
    seq: int,
    first_position: int,
    chunk: EncodedChunk,
) -> bool:
    """Record the chunk and store its rows as one staging row, unless it was recorded
    before.

    Needs only ``INSERT`` on the chunk and staging tables (the direct road's
    scoped role runs it). Returns whether this call staged the rows.
    """
    # No conflict target: naming one needs SELECT on its columns, and the primary
    # key is the only constraint that can conflict.
    cur = conn.execute(
        sql.SQL(
            "INSERT INTO {} (admission_id, seq, first_position, row_count) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(names.ident("stage_chunks_table")),
        (admission_id, seq, first_position, chunk.row_count),
    )
    if cur.rowcount != 1:
        return False
    with conn.cursor() as staging:
        staging.adapters.register_dumper(_JsonText, _JsonTextDumper)
        staging.execute(
            sql.SQL(
                "INSERT INTO {} (_admission_id, _seq, _first_position, _row_count, _keys, _rows,"
                " _prev_seq) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            ).format(names.ident("staging_table")),
            (
                admission_id,
                seq,
                first_position,
                chunk.row_count,
                _JsonText(chunk.keys),
                _JsonText(chunk.rows),
                seq - 1 if seq > 0 else None,
            ),
        )
    return True


def staging_lost(admission_id: str) -> AdmissionStateError:
    """The error of a chunk that found the chunk before it gone from the staging table."""
    return AdmissionStateError(
        f"admission {admission_id}: {STAGING_LOST_TEXT} (a database restart empties the "
        "unlogged staging table): start the admission again"
    )


def _check_chunk_args(seq: object, first_position: object) -> None:
    # seq is an ``integer`` column; first_position a ``bigint`` one, kept below 2**62 so
    # that a position past it plus a chunk's rows still fits.
    for what, value, top in (
        ("seq", seq, INTEGER_MAX),
        ("first_position", first_position, 2**62 - 1),
    ):
        check_int(what, value, 0, top)


async def stage_chunk(
    pool: ConnectionRunner,
    names: SheetNames,
    admission_id: str,
    seq: int,
    first_position: int,
    chunk: EncodedChunk,
    *,
    check_state: bool = True,
) -> bool:
    """Stage one chunk (see the module docstring); returns False for a replay.

    With ``check_state`` (the gateway, which may read the registry) a chunk for an
    admission that is not open raises ``AdmissionStateError``; the direct road's
    role cannot read it, and a chunk for an unknown admission fails its foreign key.
    On either road the staging table's trigger reserves the chunk's bytes
    (``_quotas``): past its admission's bound ``AdmissionStagingTooLargeError``,
    past its org's or the total ``StagingQuotaError``, nothing written.
    """
    check_admission_id(admission_id)
    _check_chunk_args(seq, first_position)

    def run(conn: Conn) -> bool:
        if check_state:
            state = _state(conn, names, admission_id)
            if state is None:
                raise AdmissionStateError(f"admission {admission_id} does not exist")
            if state[0] != "open":
                raise AdmissionStateError(f"admission {admission_id} is {state[0]}")
        try:
            return write_chunk(conn, names, admission_id, seq, first_position, chunk)
        except psycopg.errors.ForeignKeyViolation as exc:
            if exc.diag.constraint_name == names.staging_prev_constraint:
                # The chunk before this one has no staging row: a restart emptied them.
                raise staging_lost(admission_id) from None
            raise AdmissionStateError(f"admission {admission_id} does not exist") from None
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:
            # The trigger found the admission closed (it closed after the check above).
            raise AdmissionStateError(exc.diag.message_primary or "admission closed") from None
        except (
            psycopg.errors.ProgramLimitExceeded,
            psycopg.errors.ConfigurationLimitExceeded,
        ) as exc:
            refused = staging_refusal(exc)
            if refused is None:
                raise
            raise refused from None

    return await pool.run(run)


async def abort_admission(pool: ConnectionRunner, names: SheetNames, admission_id: str) -> bool:
    """Drop an open admission's staging rows; returns False if it was not open."""
    check_admission_id(admission_id)

    def run(conn: Conn) -> bool:
        state = _state(conn, names, admission_id, lock="FOR UPDATE")
        if state is None or state[0] != "open":
            return False
        conn.execute(
            sql.SQL(
                "UPDATE {} SET state = 'aborted', closed_at = now() WHERE admission_id = %s"
            ).format(names.ident("admissions_table")),
            (admission_id,),
        )
        _drop_staged(conn, names, [admission_id])
        return True

    return await pool.run(run)


def _expire_unless_busy(conn: Conn, names: SheetNames, lifetime_ms: int) -> int | None:
    """``_expire_idle`` for the sweep, waiting at most ``ADMISSION_SWEEP_LOCK_WAIT_MS``
    for a row lock; None when another transaction holds one (the next pass expires)."""
    conn.execute(
        sql.SQL("SET LOCAL lock_timeout = {}").format(
            sql.Literal(f"{ADMISSION_SWEEP_LOCK_WAIT_MS}ms")
        )
    )
    try:
        with conn.transaction():
            return _expire_idle(conn, names, lifetime_ms)
    except psycopg.errors.LockNotAvailable:
        return None


def _compact_unless_busy(conn: Conn, names: SheetNames) -> bool:
    """Compact the sheet's counter log if it is long and no writer holds the sheet."""
    found = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (names.ident("lock_table").as_string(conn),)
    ).fetchone()
    if found != (True,):
        return False  # a sheet of the sharded layout: ensure_sheet upgrades it first
    try:
        with conn.transaction():
            return compact_if_long(conn, names)
    except psycopg.errors.LockNotAvailable:
        return False  # a writer holds the sheet: the next pass compacts


async def sweep_admissions(
    pool: ConnectionRunner, lifetime_ms: int = ADMISSION_MAX_LIFETIME_MS
) -> int:
    """The reaper's pass: expire every sheet's idle admissions and delete their staging
    rows, and compact every long counter log (``_counters.compact_if_long``), each
    sheet in its own transactions, then set the staging counters to what the open
    admissions hold (``_quotas.reconcile_org``); returns how many admissions were
    expired. A sheet whose rows another transaction holds past
    ``ADMISSION_SWEEP_LOCK_WAIT_MS`` is left to the next pass, and so are its org's
    other sheets: one org's open transaction delays the pass for every other org by
    at most that wait."""

    def tables(conn: Conn) -> list[tuple[str, str]]:
        rows = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class AS c "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname LIKE %s AND c.relname LIKE %s",
            (r"sp\_%", "%" + ADMISSIONS_SUFFIX.replace("_", r"\_")),
        ).fetchall()
        return [(schema, table) for schema, table in rows]

    expired = 0
    busy: set[str] = set()  # orgs a transaction holds rows of: left to the next pass
    for schema, table in await pool.run(tables):
        names = sheet_tables(schema, table.removesuffix(ADMISSIONS_SUFFIX))
        if schema not in busy:
            found = await pool.run(
                partial(_expire_unless_busy, names=names, lifetime_ms=lifetime_ms)
            )
            if found is None:
                busy.add(schema)
            else:
                expired += found
        await pool.run(partial(_compact_unless_busy, names=names))
    # The staging counters, each in a transaction of its own, set to what the open
    # admissions hold (they drift only when a registry is dropped with open ones).
    for schema in await pool.run(counted_orgs):
        await pool.run(partial(reconcile_org, schema=schema))
    await pool.run(reconcile_tokens)
    return expired


# --- commit -------------------------------------------------------------------------------


def _counts(state: Any, table_namespace: str) -> AdmissionCounts:
    return AdmissionCounts(
        write_version=int(state[2]),
        inserted=int(state[3]),
        skipped=int(state[4]),
        pending_count=int(state[5]),
        completed_count=int(state[6]),
        table_namespace=table_namespace,
    )


def _check_chunks(conn: Conn, names: SheetNames, admission_id: str, chunks: int, rows: int) -> None:
    """The staged chunks are exactly 0..chunks-1, contiguous from position 0, and hold
    ``rows`` rows, all of them present in the staging table."""
    found = conn.execute(
        sql.SQL(
            "SELECT count(*), coalesce(max(seq), -1), coalesce(sum(row_count), 0), "
            "  coalesce(bool_and(first_position = before), true) "
            "FROM (SELECT seq, row_count, first_position, coalesce(sum(row_count) OVER "
            "  (ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before "
            "  FROM {} WHERE admission_id = %s) AS c"
        ).format(names.ident("stage_chunks_table")),
        (admission_id,),
    ).fetchone()
    assert found is not None
    count, last, total, contiguous = int(found[0]), int(found[1]), int(found[2]), found[3]
    if count != chunks or last != chunks - 1 or total != rows or not contiguous:
        raise AdmissionStateError(
            f"admission {admission_id} staged {count} chunks holding {total} rows, "
            f"but its commit names {chunks} chunks and {rows} rows"
        )
    found = conn.execute(
        sql.SQL(
            "SELECT count(*), count(c.seq), coalesce(sum(s._row_count), 0) FROM {s} AS s "
            "LEFT JOIN {c} AS c ON c.admission_id = s._admission_id AND c.seq = s._seq "
            "  AND c.first_position = s._first_position AND c.row_count = s._row_count "
            "WHERE s._admission_id = %s"
        ).format(s=names.ident("staging_table"), c=names.ident("stage_chunks_table")),
        (admission_id,),
    ).fetchone()
    assert found is not None
    held, matching, held_rows = int(found[0]), int(found[1]), int(found[2])
    if (held, matching, held_rows) != (chunks, chunks, rows):
        # An UNLOGGED table is emptied by a database restart; a staging row no chunk
        # records was not written by write_chunk.
        raise AdmissionStateError(
            f"admission {admission_id}'s staging table holds {held_rows} rows in {held} "
            f"chunks, not the {rows} rows in {chunks} chunks its chunks record: "
            f"{STAGING_LOST_TEXT}; start the admission again"
        )


@attrs.define
class _Tally:
    """What the range statements did, summed."""

    kept: int = 0
    inserted: int = 0
    by_old_status: Counter[str] = attrs.Factory(Counter)


def _contract_inserts(
    sql_names: Sequence[str], source: str
) -> tuple[sql.Composable, sql.Composable]:
    """The contract columns of an insert into the sheet (``, a, b``) and their values
    from the relation ``source`` (``, NULLIF(source.a, 'null'::jsonb), ...``: a
    staged JSON null is no value)."""
    ident = sql.Identifier
    columns = sql.SQL("").join(sql.SQL(", {}").format(ident(n)) for n in sql_names)
    values = sql.SQL("").join(
        sql.SQL(", NULLIF({}, 'null'::jsonb)").format(ident(source, n)) for n in sql_names
    )
    return columns, values


def _cell(column: ContractColumn) -> sql.Composable:
    """A column's value in a staged document ``e._doc``: under the first of its lookup
    names the row carries (``column_lookup_names``), SQL NULL when it carries none."""
    lookups = column_lookup_names(column)
    *tried, last = (sql.Literal(name) for name in lookups)
    value = sql.SQL("e._doc -> {}").format(last)
    if not tried:
        return value
    cases = sql.SQL(" ").join(
        sql.SQL("WHEN e._doc ? {n} THEN e._doc -> {n}").format(n=name) for name in tried
    )
    return sql.SQL("CASE {} ELSE {} END").format(cases, value)


def _staged_rows(names: SheetNames, columns: Sequence[ContractColumn]) -> sql.Composed:
    """The staged rows of the chunks starting at positions ``[lo, hi)``, one per row:
    ``_key``, ``_position`` and each contract column's jsonb value, taken from the
    chunk's arrays in C (no row is encoded again)."""
    cells = sql.SQL("").join(
        sql.SQL(", {} AS {}").format(_cell(c), sql.Identifier(c.sql_name)) for c in columns
    )
    return sql.SQL(
        """SELECT e._key, c._first_position + e._ord - 1 AS _position{cells}
        FROM {staging} AS c,
            ROWS FROM (jsonb_array_elements_text(c._keys), jsonb_array_elements(c._rows))
                WITH ORDINALITY AS e(_key, _doc, _ord)
        WHERE c._admission_id = %(admission)s
          AND c._first_position >= %(lo)s AND c._first_position < %(hi)s"""
    ).format(cells=cells, staging=names.ident("staging_table"))


def _range_statement(names: SheetNames, columns: Sequence[ContractColumn]) -> sql.Composed:
    """Admit the staged rows of the chunks starting at positions ``[lo, hi)``; answers
    one row of tallies."""
    ident = sql.Identifier
    sql_names = [c.sql_name for c in columns]
    inputs = [c.sql_name for c in columns if c.source in _INPUT_SOURCES]
    staged_cols = sql.SQL("").join(sql.SQL(", s.{}").format(ident(n)) for n in sql_names)
    insert_cols, insert_vals = _contract_inserts(sql_names, "n")
    refresh = sql.SQL("").join(
        sql.SQL(
            ", {c} = CASE WHEN n.{c} IS NULL THEN t.{c} ELSE NULLIF(n.{c}, 'null'::jsonb) END"
        ).format(c=ident(n))
        for n in inputs
    )
    tallies: list[sql.Composable] = [
        sql.SQL("count(*)"),
        sql.SQL("count(*) FILTER (WHERE NOT n._present)"),
        *(
            sql.SQL("count(*) FILTER (WHERE n._old_status = {})").format(sql.Literal(status))
            for status in (*_READMITTED, "enriched")
        ),
    ]
    readmitted_in = sql.SQL(", ").join(map(sql.Literal, _READMITTED))
    return sql.SQL(
        """WITH s AS ({staged}
        ), r AS (
            SELECT DISTINCT ON (s._key) s._key AS _s_key, s._position AS _s_pos{staged_cols}
            FROM s ORDER BY s._key, s._position
        ), k AS (
            SELECT r.*, t._key IS NOT NULL AS _present, t._status AS _old_status
            FROM r LEFT JOIN {sheet} AS t ON t._key = r._s_key
            WHERE (t.seq).admitted_version IS DISTINCT FROM %(version)s
        ), n AS (
            SELECT k.*, %(base)s + row_number() OVER (ORDER BY k._s_pos) - 1 AS _idx FROM k
        ), ins AS (
            INSERT INTO {sheet}
                (_key, _status, _run_id, _input_index, seq{insert_cols})
            SELECT n._s_key, 'pending', %(run_id)s, n._idx,
                ROW(%(version)s, %(version)s)::{versions}{insert_vals}
            FROM n WHERE NOT n._present
        ), upd AS (
            UPDATE {sheet} AS t SET _status = 'pending',
                seq = ROW(%(version)s, %(version)s)::{versions},
                _run_id = %(run_id)s, _error = NULL,
                _input_index = n._idx, _updated_at = clock_timestamp(){refresh}
            FROM n WHERE t._key = n._s_key AND n._old_status IN ({readmitted_in})
        ), enr AS (
            UPDATE {sheet} AS t SET _input_index = n._idx, seq.admitted_version = %(version)s,
                _updated_at = clock_timestamp()
            FROM n WHERE t._key = n._s_key AND n._old_status = 'enriched'
        )
        SELECT {tallies} FROM n"""
    ).format(
        staged=_staged_rows(names, columns),
        staged_cols=staged_cols,
        sheet=names.ident("sheet_table"),
        versions=names.versions_type,
        insert_cols=insert_cols,
        insert_vals=insert_vals,
        refresh=refresh,
        readmitted_in=readmitted_in,
        tallies=sql.SQL(", ").join(tallies),
    )


def _first_admission_statement(
    names: SheetNames, columns: Sequence[ContractColumn]
) -> sql.Composed:
    """Insert every staged row of the chunks starting at positions ``[lo, hi)`` as a new
    ``pending`` row whose ``_input_index`` is its position: what the range statements
    do on a sheet with no rows when no key repeats (a repeated key fails the sheet's
    primary key). No sort: each chunk's arrays are read in order."""
    insert_cols, insert_vals = _contract_inserts([c.sql_name for c in columns], "s")
    return sql.SQL(
        """INSERT INTO {sheet}
            (_key, _status, _run_id, _input_index, seq{insert_cols})
        SELECT s._key, 'pending', %(run_id)s, s._position,
            ROW(%(version)s, %(version)s)::{versions}{insert_vals}
        FROM ({staged}) AS s"""
    ).format(
        sheet=names.ident("sheet_table"),
        versions=names.versions_type,
        staged=_staged_rows(names, columns),
        insert_cols=insert_cols,
        insert_vals=insert_vals,
    )


def _admit_into_empty(
    conn: Conn,
    names: SheetNames,
    columns: Sequence[ContractColumn],
    params: Mapping[str, Any],
    rows: int,
) -> bool:
    """On a sheet with no rows, admit every staged row with an ``INSERT ... SELECT`` per
    range of ``ADMISSION_COMMIT_RANGE_ROWS`` positions (each statement stays far under
    the statement timeout, like the range statements; no dedupe and no sort: the
    staging index gives the order), all inside one savepoint.

    Returns False, having written nothing, if the sheet has rows or a key repeats
    in the input (the savepoint rolls the insert back and the range statements,
    which keep each key's first occurrence, admit the rows instead).
    """
    found = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(names.ident("sheet_table"))
    ).fetchone()
    if found != (False,):
        return False
    statement = _first_admission_statement(names, columns)
    inserted = 0
    try:
        with conn.transaction():
            for lo in range(0, rows, ADMISSION_COMMIT_RANGE_ROWS):
                hi = lo + ADMISSION_COMMIT_RANGE_ROWS
                inserted += conn.execute(statement, {**params, "lo": lo, "hi": hi}).rowcount
    except psycopg.errors.UniqueViolation:
        return False
    assert inserted == rows
    return True


def _admit_by_ranges(
    conn: Conn,
    names: SheetNames,
    columns: Sequence[ContractColumn],
    params: Mapping[str, Any],
    rows: int,
    tally: _Tally,
) -> None:
    """Admit the staged rows a range of ``ADMISSION_COMMIT_RANGE_ROWS`` positions per
    statement (``_range_statement``), summing what each did into ``tally``."""
    statement = _range_statement(names, columns)
    for lo in range(0, rows, ADMISSION_COMMIT_RANGE_ROWS):
        found = conn.execute(
            statement,
            {**params, "lo": lo, "hi": lo + ADMISSION_COMMIT_RANGE_ROWS, "base": tally.kept},
        ).fetchone()
        assert found is not None
        kept, inserted, *by_status = (int(value) for value in found)
        tally.kept += kept
        tally.inserted += inserted
        for status, count in zip((*_READMITTED, "enriched"), by_status, strict=True):
            tally.by_old_status[status] += count


async def commit_admission(
    pool: ConnectionRunner,
    names: SheetNames,
    table_namespace: str,
    admission_id: str,
    run_id: str,
    columns: Sequence[ContractColumn],
    *,
    chunks: int,
    rows: int,
) -> AdmissionCounts:
    """Commit a staged admission as one new write version (see the module docstring).

    A commit already made answers its stored counts and writes nothing. Raises
    ``AdmissionStateError`` for an unknown, aborted or expired admission, one
    of another run, or chunks that do not add up to what the runner sent. If
    cancelled, the transaction rolls back and the admission stays open.
    """
    check_admission_id(admission_id)
    _check_chunk_args(chunks, rows)

    def run(conn: Conn) -> AdmissionCounts:
        # The writer lock first (the lock order, docs/store.md): before this commit
        # touches the staging tables, whose ALTER TABLE a column-adding ensure_sheet
        # runs while it holds the writer lock.
        lock_sheet(conn, names)
        state = _state(conn, names, admission_id, lock="FOR UPDATE")
        if state is None:
            raise AdmissionStateError(f"admission {admission_id} does not exist")
        if state[1] != run_id:
            raise AdmissionStateError(f"admission {admission_id} belongs to another run")
        if state[0] == "committed":
            return _counts(state, table_namespace)
        if state[0] != "open":
            raise AdmissionStateError(f"admission {admission_id} is {state[0]}")
        _check_chunks(conn, names, admission_id, chunks, rows)
        # A range's dedupe and order sorts stay in memory instead of spilling.
        conn.execute(
            "SELECT set_config('work_mem', %s, true)",
            (f"{ADMISSION_COMMIT_WORK_MEM_BYTES // KiB}kB",),
        )
        version = next_write_version(conn, names)
        tally = _Tally()
        params = {"admission": admission_id, "version": version, "run_id": run_id}
        if rows and _admit_into_empty(conn, names, columns, params, rows):
            tally.kept = tally.inserted = rows
        else:
            _admit_by_ranges(conn, names, columns, params, rows, tally)
        readmitted = sum(tally.by_old_status[s] for s in _READMITTED)
        compact_counters(conn, names)
        analyze_if_grown(conn, names, tally.inserted)
        record_event(
            conn,
            names,
            kind="admission",
            row_count=tally.inserted + readmitted,
            run_id=run_id,
            write_version=version,
        )
        pending = tally.inserted + readmitted
        # The seed's counts: new and revived (stale) rows are inserted, every other
        # input row skipped (as the whole admission, ``_admission``).
        inserted = tally.inserted + tally.by_old_status["stale"]
        counts = AdmissionCounts(
            write_version=version,
            inserted=inserted,
            skipped=rows - inserted,
            pending_count=pending,
            completed_count=tally.by_old_status["enriched"],
            table_namespace=table_namespace,
        )
        _record_commit(conn, names, admission_id, rows, counts)
        return counts

    return await pool.run(run)


def _record_commit(
    conn: Conn, names: SheetNames, admission_id: str, rows: int, counts: AdmissionCounts
) -> None:
    """Close the admission as committed with its counts (a retried commit answers them),
    and drop its staging rows."""
    conn.execute(
        sql.SQL(
            "UPDATE {} SET state = 'committed', closed_at = now(), input_rows = %s, "
            "write_version = %s, inserted = %s, skipped = %s, pending_count = %s, "
            "completed_count = %s WHERE admission_id = %s"
        ).format(names.ident("admissions_table")),
        (
            rows,
            counts.write_version,
            counts.inserted,
            counts.skipped,
            counts.pending_count,
            counts.completed_count,
            admission_id,
        ),
    )
    _drop_staged(conn, names, [admission_id])
