"""The physical layout of a sheet: the idempotent DDL that creates it (its tables'
names are ``store/_names.py``'s).

One schema per org (``sp_<org>_<hash>``); in it, per sheet (play + table
namespace) a sheet table (with its counting triggers, ``_counters``), an event
table, a summary table, a column-summary table, a counter log, a lock table
(the writer lock's, ``_locking``), a metadata table and the staging tables,
and per play a work-receipts table. Logical names can be any text (quotes,
unicode, SQL-looking strings); the play name and the namespace are taken
normalised (``sheetplane.names``: a ``SheetRef`` holds them so), and the
physical names are a sanitised ASCII
prefix plus a SHA-256 suffix of the exact logical name, so they are always
valid identifiers of at most 63 bytes and two distinct sheets never share a
table.
Every identifier reaches SQL through ``psycopg.sql.Identifier``; the logical
names and the contract's column ids are kept in the sheet's metadata table
(readable only by the sheet's own session roles), never in catalog comments,
through ``sql.Literal``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Final

import psycopg
from psycopg import sql

from .._types import SYSTEM_COLUMNS, SheetContract, SheetRef
from ..budgets import (
    MAX_CONTRACT_COLUMNS,
    MAX_RECEIPT_TABLES_PER_ORG,
    MAX_REQUEST_TEXT_BYTES,
    MAX_ROW_KEY_BYTES,
    MAX_SHEETS_PER_ORG,
)
from ..errors import InvalidInputError
from ..identity import IDENTITY_SCHEME
from ._counters import COUNT_TRIGGERS, count_trigger_ddl, fold_status_log
from ._guards import admit_ddl, guard_ddl, guards_missing
from ._locking import lock_sheet
from ._names import TABLE_ATTRS, SheetNames
from ._pool import ConnectionRunner
from ._quotas import (
    ADMISSION_QUOTA_COLUMNS,
    QUOTA_SCHEMA,
    check_room,
    create_quota_objects,
    quota_objects_missing,
    quota_trigger_ddl,
    quota_triggers_missing,
)
from ._seedlayout import (
    grant_lock_key,
    ownership_pending,
    seed_layout_ddl,
    seed_layout_missing,
    take_ownership,
)
from ._shares import share_ddl, shares_missing

__all__ = [
    "POSTGRES_SYSTEM_COLUMNS",
    "RESERVED_SQL_NAMES",
    "SYSTEM_COLUMNS",
    "column_ids",
    "ensure_ddl",
    "ensure_receipts",
    "ensure_sheet",
    "relations_missing",
    "sheet_exists",
]


#: Postgres truncates identifiers longer than this many bytes.
MAX_IDENTIFIER_BYTES = 63

#: Postgres's own system columns (every table has them); no user column may
#: take one of these names (``ALTER TABLE`` refuses it).
POSTGRES_SYSTEM_COLUMNS: frozenset[str] = frozenset(
    {"tableoid", "xmin", "cmin", "xmax", "cmax", "ctid"}
)

#: Names no contract column may take: the sheet table's system columns and the
#: staging table's own (``_admission_id``, ``_position``). Any other ``_`` name is
#: a virtual column (never physical, as in the runtime this library re-creates);
#: these would silently never be stored, so they are refused.
RESERVED_SQL_NAMES: frozenset[str] = frozenset({*SYSTEM_COLUMNS, "_admission_id", "_position"})

_LEGACY_COMMENTS = """
    SELECT a.attname, col_description(a.attrelid, a.attnum) FROM pg_attribute AS a
    WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
      AND col_description(a.attrelid, a.attnum) IS NOT NULL
"""


def _move_legacy_comments(conn: psycopg.Connection[Any], names: SheetNames) -> None:
    """Column ids a sheet kept in column comments move to its metadata table."""
    sheet = names.ident("sheet_table")
    for name, column_id in conn.execute(_LEGACY_COMMENTS, (sheet.as_string(conn),)).fetchall():
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (kind, name, value) VALUES ('column', %s, %s) "
                "ON CONFLICT (kind, name) DO NOTHING"
            ).format(names.ident("meta_table")),
            (name, column_id),
        )
        conn.execute(sql.SQL("COMMENT ON COLUMN {}.{} IS NULL").format(sheet, sql.Identifier(name)))


_COLUMN_IDS = """
    SELECT a.attname, coalesce(m.value, a.attname)
    FROM pg_attribute AS a LEFT JOIN {meta} AS m ON m.kind = 'column' AND m.name = a.attname
    WHERE a.attrelid = to_regclass(%(sheet)s) AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum
"""

_COLUMN_IDS_LEGACY = """
    SELECT a.attname, coalesce(col_description(a.attrelid, a.attnum), a.attname)
    FROM pg_attribute AS a
    WHERE a.attrelid = to_regclass(%(sheet)s) AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum
"""


def column_ids(conn: psycopg.Connection[Any], names: SheetNames) -> list[tuple[str, str]] | None:
    """``(sql name, column id)`` of the sheet table's physical columns, in table
    order; None when the sheet does not exist.

    The ids come from the sheet's metadata table (readable by the sheet's own
    session roles); a sheet not ensured since the ids lived in column comments
    is read from those.
    """
    qualified = {
        "sheet": names.ident("sheet_table").as_string(conn),
        "meta": names.ident("meta_table").as_string(conn),
    }
    found = conn.execute(
        "SELECT to_regclass(%(sheet)s) IS NOT NULL, to_regclass(%(meta)s) IS NOT NULL", qualified
    ).fetchone()
    if found is None or not found[0]:
        return None
    query: sql.Composed | sql.SQL = (
        sql.SQL(_COLUMN_IDS).format(meta=names.ident("meta_table"))
        if found[1]
        else sql.SQL(_COLUMN_IDS_LEGACY)
    )
    rows = conn.execute(query, qualified).fetchall()
    return [
        (str(name), str(column_id))
        for name, column_id in rows
        if name not in SYSTEM_COLUMNS and name not in _LEGACY_VERSION_COLUMNS
    ]


def sheet_exists(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether the sheet's tables were created (an admission or ``ensure_sheet`` ran)."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (names.ident("summary_table").as_string(conn),)
    ).fetchone()
    return bool(row and row[0])


# --- DDL ------------------------------------------------------------------------------


def _lock_key(schema: str) -> int:
    """A signed 64-bit advisory-lock key for one org's DDL."""
    digest = hashlib.sha256(f"sheetplane-ddl:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _storable(text: str) -> bool:
    """Whether Postgres can store ``text``: no NUL, and valid UTF-8 (no lone surrogate)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _physical_columns(contract: SheetContract) -> dict[str, str]:
    """sql name -> column id, for the contract's physical columns (the last one wins)."""
    if len(contract.columns) > MAX_CONTRACT_COLUMNS:
        raise InvalidInputError(
            f"a sheet contract declares at most {MAX_CONTRACT_COLUMNS} columns, "
            f"got {len(contract.columns)}"
        )
    columns: dict[str, str] = {}
    for column in contract.columns:
        name = column.sql_name
        if name in RESERVED_SQL_NAMES:
            raise InvalidInputError(
                f"sheet contract sqlName {name!r} is a system column of the sheet"
            )
        # Every column's names are text Postgres can hold, a column that is not physical
        # (``_``-named, skipped below) too: Postgres text cannot carry NUL, and the id of
        # a physical column is stored (in the sheet's metadata).
        for what, text in (("sqlName", name), ("id", column.id), ("field", column.field)):
            if text is not None and not _storable(text):
                raise InvalidInputError(
                    f"sheet contract column {what} {text!r} holds NUL or a lone surrogate"
                )
            if text is not None and len(text.encode("utf-8")) > MAX_REQUEST_TEXT_BYTES:
                raise InvalidInputError(
                    f"sheet contract column {what} is longer than {MAX_REQUEST_TEXT_BYTES} bytes"
                )
        if not column.is_physical:
            continue
        if len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
            raise InvalidInputError(
                f"sheet contract sqlName {name!r} is not a valid column name "
                f"(at most {MAX_IDENTIFIER_BYTES} bytes, no NUL)"
            )
        if name in SYSTEM_COLUMNS or name in POSTGRES_SYSTEM_COLUMNS:
            raise InvalidInputError(f"sheet contract sqlName {name!r} is a system column")
        columns[name] = column.id
    return columns


_CATALOG = sql.SQL(
    """
    SELECT c.relname, a.attname,
      (SELECT count(*) FROM pg_trigger AS t
       WHERE t.tgrelid = c.oid AND t.tgname = ANY(%(triggers)s))
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a
      ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      AND c.relname IN (%(sheet)s, %(counts)s, %(staging)s)
    WHERE n.nspname = %(schema)s AND c.relname = ANY(%(tables)s) AND c.relkind = 'r'
    """
)

_TRIGGER_NAMES = [name for name, _, _ in COUNT_TRIGGERS]


def _staging_current(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether the staging table has its last layout's marker: the foreign key from
    each staging row to its recorded chunk (after the chunk chain's ``_prev_seq``)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE n.nspname = %s AND t.relname = %s AND c.conname = %s)",
        (names.schema, names.staging_table, names.staging_owner_constraint),
    ).fetchone()
    return bool(row and row[0])


#: The two columns the row versions were kept in before ``seq`` (a sheet not ensured
#: since still has them; ``_fold_versions`` moves them).
_LEGACY_VERSION_COLUMNS: Final = ("_write_version", "_admitted_version")


def unversioned(names: SheetNames) -> sql.Composed:
    """``seq``'s default: write version 0 and no admitted version (a row no
    admission stamped, as every insert that names no ``seq`` makes it)."""
    return sql.SQL("ROW(0, NULL)::{}").format(names.versions_type)


def _ensure_versions_type(conn: psycopg.Connection[Any], names: SheetNames) -> None:
    """The org's composite type of a row's versions, made once per org schema
    (under the org's DDL key). ``USAGE`` on it is the gateway's only: no other
    role makes an object of it, and reading or writing ``seq`` needs none."""
    found = conn.execute(
        "SELECT to_regtype(%s) IS NOT NULL", (names.versions_type.as_string(conn),)
    ).fetchone()
    if found and found[0]:
        return
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(names.schema)))
    conn.execute(
        sql.SQL("CREATE TYPE {} AS (write_version bigint, admitted_version bigint)").format(
            names.versions_type
        )
    )
    conn.execute(sql.SQL("REVOKE ALL ON TYPE {} FROM PUBLIC").format(names.versions_type))


def _fold_versions(conn: psycopg.Connection[Any], names: SheetNames) -> None:
    """A rows table made before ``seq`` keeps its versions in ``_write_version``
    and ``_admitted_version`` (the oldest, in the first only): they become the one
    ``seq`` column, in one rewrite of the table that fires no trigger."""
    found = {
        str(row[0])
        for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attnum > 0 AND NOT attisdropped AND attname = ANY(%s)",
            (names.ident("sheet_table").as_string(conn), list(_LEGACY_VERSION_COLUMNS)),
        )
    }
    if "_write_version" not in found:
        return
    sheet, versions = names.ident("sheet_table"), names.versions_type
    admitted = sql.SQL("_admitted_version" if "_admitted_version" in found else "NULL::bigint")
    conn.execute(
        sql.SQL(
            "ALTER TABLE {sheet} ALTER COLUMN _write_version DROP DEFAULT, "
            "ALTER COLUMN _write_version TYPE {versions} "
            "USING ROW(_write_version, {admitted})::{versions}"
        ).format(sheet=sheet, versions=versions, admitted=admitted)
    )
    if "_admitted_version" in found:
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN _admitted_version").format(sheet))
    conn.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN _write_version TO seq").format(sheet))
    conn.execute(
        sql.SQL("ALTER TABLE {} ALTER COLUMN seq SET DEFAULT {}").format(sheet, unversioned(names))
    )


def _missing_ddl(
    conn: psycopg.Connection[Any], names: SheetNames, columns: Mapping[str, str]
) -> bool:
    """Whether anything of the layout (a table, a column, a column's id, a counting
    trigger) is missing, or the counter table is still the sharded one."""
    tables = [getattr(names, attr) for attr in sorted(TABLE_ATTRS)]
    rows = conn.execute(
        _CATALOG,
        {
            "sheet": names.sheet_table,
            "counts": names.counter_table,
            "staging": names.staging_table,
            "schema": names.schema,
            "tables": tables,
            "triggers": _TRIGGER_NAMES,
        },
    ).fetchall()
    found_tables = {row[0] for row in rows}
    attributes = {row[1] for row in rows if row[0] == names.sheet_table and row[1] is not None}
    if found_tables != set(tables) or "seq" not in attributes:
        return True  # a new sheet, or one whose versions are still two columns
    if any(row[0] == names.counter_table and row[1] == "shard" for row in rows):
        return True
    if not _staging_current(conn, names):
        return True  # an older staging table (no chunk chain or owner key): made again
    if any(row[0] == names.sheet_table and row[2] != len(_TRIGGER_NAMES) for row in rows):
        return True
    if any(name not in attributes for name in columns):
        return True
    ids = dict(
        conn.execute(
            sql.SQL("SELECT name, value FROM {} WHERE kind = 'column'").format(
                names.ident("meta_table")
            )
        ).fetchall()
    )
    if any(ids.get(name) != column_id for name, column_id in columns.items()):
        return True
    return (
        guards_missing(conn, names)
        or quota_triggers_missing(conn, names)
        or seed_layout_missing(conn, names)
    )


def _ddl(names: SheetNames, columns: Mapping[str, str], logical: Mapping[str, str]) -> sql.Composed:
    sheet = names.ident("sheet_table")
    statements: list[sql.Composable] = [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(names.schema)),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                _key text PRIMARY KEY,
                _status text NOT NULL DEFAULT 'pending'
                    CHECK (_status IN ('pending', 'running', 'enriched', 'failed', 'stale')),
                _run_id text,
                _error text,
                _stage text,
                _provider text,
                _input_index bigint,
                _created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                _updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                _cell_meta jsonb NOT NULL DEFAULT '{{}}',
                seq {versions} NOT NULL DEFAULT {unversioned}
            )"""
        ).format(sheet, versions=names.versions_type, unversioned=unversioned(names)),
    ]
    if columns:
        statements.append(
            sql.SQL("ALTER TABLE {} {}").format(
                sheet,
                sql.SQL(", ").join(
                    sql.SQL("ADD COLUMN IF NOT EXISTS {} jsonb").format(sql.Identifier(name))
                    for name in columns
                ),
            )
        )
    meta = names.ident("meta_table")
    entries = [("sheet", key, value) for key, value in logical.items()]
    entries += [("column", name, column_id) for name, column_id in columns.items()]
    statements += [
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                kind text NOT NULL,
                name text NOT NULL,
                value text NOT NULL,
                PRIMARY KEY (kind, name)
            )"""
        ).format(meta),
        sql.SQL(
            "INSERT INTO {} (kind, name, value) VALUES {} "
            "ON CONFLICT (kind, name) DO UPDATE SET value = EXCLUDED.value"
        ).format(
            meta,
            sql.SQL(", ").join(
                sql.SQL("({}, {}, {})").format(*map(sql.Literal, entry)) for entry in entries
            ),
        ),
        # The identity scheme the sheet was created with: written once, never rewritten
        # (``sheetplane.identity``'s migration rule; a sheet without it predates the record).
        sql.SQL(
            "INSERT INTO {} (kind, name, value) VALUES ('sheet', 'identity_scheme', {}) "
            "ON CONFLICT (kind, name) DO NOTHING"
        ).format(meta, sql.Literal(IDENTITY_SCHEME)),
        # A sheet made when this metadata lived in catalog comments loses them.
        sql.SQL("COMMENT ON TABLE {} IS NULL").format(sheet),
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (_input_index, _created_at, _key)").format(
            sql.Identifier(names.order_index), sheet
        ),
        # The planner's estimates of the fence's and the admission reads' filters (a
        # field of a composite has no column statistics of its own): built by ANALYZE,
        # nothing to maintain on a write, unlike an index. The expressions are the ones
        # the statements write, which the planner matches exactly.
        sql.SQL(
            "CREATE STATISTICS IF NOT EXISTS {} ON ((seq).write_version), "
            "((seq).admitted_version) FROM {}"
        ).format(sql.Identifier(names.schema, names.versions_statistics), sheet),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                id bigserial PRIMARY KEY,
                kind text NOT NULL,
                run_id text,
                write_version bigint,
                idempotency_key text,
                row_count integer NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now()
            )"""
        ).format(names.ident("event_table")),
        sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} (kind, idempotency_key)").format(
            sql.Identifier(names.event_key_index), names.ident("event_table")
        ),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                id boolean PRIMARY KEY DEFAULT true CHECK (id),
                total bigint NOT NULL DEFAULT 0,
                queued bigint NOT NULL DEFAULT 0,
                running bigint NOT NULL DEFAULT 0,
                completed bigint NOT NULL DEFAULT 0,
                failed bigint NOT NULL DEFAULT 0,
                write_version bigint NOT NULL DEFAULT 0,
                updated_at timestamptz
            )"""
        ).format(names.ident("summary_table")),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                column_name text PRIMARY KEY,
                non_null bigint NOT NULL DEFAULT 0,
                updated_at timestamptz
            )"""
        ).format(names.ident("column_summary_table")),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                kind text NOT NULL CHECK (kind IN ('status', 'column')),
                name text NOT NULL,
                value bigint NOT NULL
            )"""
        ).format(names.ident("counter_table")),
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ()").format(names.ident("lock_table")),
        _receipts_ddl(names),
        *_staging_ddl(names),
    ]
    return sql.SQL(";\n").join(statements)


#: The staging table's key-cap function, one per org schema.
_KEYS_FIT = "sp_staged_keys_fit"


def _keys_fit(names: SheetNames) -> sql.Identifier:
    return sql.Identifier(names.schema, _KEYS_FIT)


def _staging_ddl(names: SheetNames) -> list[sql.Composable]:
    """The staged-admission tables: an admission registry, its chunks, and the rows.

    The rows are ``UNLOGGED`` (scratch space: a crash empties them, and a commit
    counts them against the chunks before it writes anything), one staging row
    per chunk holding the chunk's keys and row documents as two jsonb arrays (the
    checks keep them arrays of one length, of non-empty strings and of objects, so
    the commit can rely on them whoever wrote them). The table does not depend
    on the contract: a new contract column changes nothing here. A chunk row's
    foreign key makes staging into an unknown admission fail, and its check
    takes a key-share lock on the admission, which the commit's ``FOR UPDATE``
    waits for: no chunk lands while its admission commits. A staging row after
    the first names the one before it (``_prev_seq``, a foreign key within the
    unlogged table), so a chunk staged after a crash emptied the table fails at
    once instead of at the commit.
    """
    staging = names.ident("staging_table")
    return [
        # The key cap of every other road (``MAX_ROW_KEY_BYTES``, the B-tree entry a
        # commit makes of each key) on the staging table itself, where a stage role
        # writes: owned by the gateway, in a schema no scoped role may create in.
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}(keys jsonb) RETURNS boolean LANGUAGE sql "
            "IMMUTABLE PARALLEL SAFE AS "
            "'SELECT coalesce(bool_and(octet_length(k) <= {}), true) "
            "FROM jsonb_array_elements_text(keys) AS k'"
        ).format(_keys_fit(names), sql.Literal(MAX_ROW_KEY_BYTES)),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                admission_id text PRIMARY KEY,
                run_id text NOT NULL,
                state text NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'committed', 'aborted', 'expired')),
                created_at timestamptz NOT NULL DEFAULT now(),
                closed_at timestamptz,
                input_rows bigint,
                write_version bigint,
                inserted bigint,
                skipped bigint,
                pending_count bigint,
                completed_count bigint,
                {}
            )"""
        ).format(
            names.ident("admissions_table"),
            sql.SQL(", ").join(map(sql.SQL, ADMISSION_QUOTA_COLUMNS)),
        ),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                admission_id text NOT NULL REFERENCES {} ON DELETE CASCADE,
                seq integer NOT NULL,
                first_position bigint NOT NULL,
                row_count integer NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (admission_id, seq)
            )"""
        ).format(names.ident("stage_chunks_table"), names.ident("admissions_table")),
        sql.SQL(
            """CREATE UNLOGGED TABLE IF NOT EXISTS {} (
                _admission_id text NOT NULL,
                _seq integer NOT NULL,
                _first_position bigint NOT NULL,
                _row_count integer NOT NULL,
                _keys jsonb NOT NULL,
                _rows jsonb NOT NULL,
                _prev_seq integer CHECK (_prev_seq = _seq - 1),
                CONSTRAINT {} PRIMARY KEY (_admission_id, _seq),
                CONSTRAINT {} FOREIGN KEY (_admission_id, _prev_seq) REFERENCES {}
                    (_admission_id, _seq) ON DELETE CASCADE,
                CONSTRAINT {} FOREIGN KEY (_admission_id, _seq) REFERENCES {}
                    (admission_id, seq) ON DELETE CASCADE,
                CONSTRAINT {} CHECK ({}(_keys)),
                CHECK (jsonb_typeof(_keys) = 'array' AND jsonb_typeof(_rows) = 'array'
                    AND jsonb_array_length(_keys) = _row_count
                    AND jsonb_array_length(_rows) = _row_count
                    AND NOT jsonb_path_exists(_keys, 'strict $[*] ? (@.type() != "string")')
                    AND NOT jsonb_path_exists(_keys, 'strict $[*] ? (@ == "")')
                    AND NOT jsonb_path_exists(_rows, 'strict $[*] ? (@.type() != "object")'))
            )"""
        ).format(
            staging,
            sql.Identifier(names.staging_index),
            sql.Identifier(names.staging_prev_constraint),
            staging,
            sql.Identifier(names.staging_owner_constraint),
            names.ident("stage_chunks_table"),
            sql.Identifier(names.staging_keys_constraint),
            _keys_fit(names),
        ),
    ]


def _staging_storage(names: SheetNames) -> sql.Composed:
    """Store a new staging table's arrays out of line as they are: pglz compressing
    every chunk cost more than the space it saved on a table that lives for one
    admission. Run only on a table this transaction created: its ``ACCESS
    EXCLUSIVE`` lock on a live one would wait for staging chunks, which wait for
    their admission's registry row."""
    return sql.SQL(
        "ALTER TABLE {} ALTER COLUMN _keys SET STORAGE EXTERNAL, "
        "ALTER COLUMN _rows SET STORAGE EXTERNAL"
    ).format(names.ident("staging_table"))


def _receipts_ddl(names: SheetNames) -> sql.Composed:
    return sql.SQL(
        """CREATE TABLE IF NOT EXISTS {} (
            key text PRIMARY KEY,
            result jsonb,
            run_id text,
            run_attempt integer,
            completed_at timestamptz,
            claim_holder text,
            claim_expires_at timestamptz,
            claim_token_digest bytea
        );
        ALTER TABLE {} ADD COLUMN IF NOT EXISTS claim_token_digest bytea"""
    ).format(names.ident("receipts_table"), names.ident("receipts_table"))


def _receipts_missing(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether the receipts table, or its lease-token column (a table made before
    leases carried tokens), is missing."""
    if relations_missing(conn, names.schema, [names.receipts_table]):
        return True
    row = conn.execute(
        "SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s"
        " AND c.relname = %s AND a.attname = 'claim_token_digest' AND NOT a.attisdropped",
        (names.schema, names.receipts_table),
    ).fetchone()
    return row is None or row[0] == 0


def _summary_row(names: SheetNames) -> sql.Composed:
    return sql.SQL("INSERT INTO {} (id) VALUES (true) ON CONFLICT (id) DO NOTHING").format(
        names.ident("summary_table")
    )


_RELATIONS_FOUND = """
    SELECT count(*) FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = ANY(%s) AND c.relkind = 'r'
"""


def relations_missing(conn: psycopg.Connection[Any], schema: str, tables: list[str]) -> bool:
    """Whether any of ``tables`` is missing from ``schema``, read from the catalog tables.

    A query on ``pg_class`` rather than ``to_regclass``: see ``ensure_ddl`` for why
    a check made under the DDL key must read the catalog tables themselves.
    """
    row = conn.execute(_RELATIONS_FOUND, (schema, tables)).fetchone()
    return row is None or row[0] != len(set(tables))


async def ensure_ddl(
    pool: ConnectionRunner,
    schema: str,
    missing: Callable[[psycopg.Connection[Any]], bool],
    create: Callable[[psycopg.Connection[Any]], None],
) -> None:
    """Run ``create`` if ``missing`` finds part of an org's layout missing; safe under concurrency.

    The one pattern of every DDL path of an org schema (its sheets, its plays'
    receipts, its plays table): ``missing`` runs first in a transaction of its
    own, so the hot path (nothing missing) takes no lock. Otherwise a second
    transaction takes the org's DDL key as its first statement, checks again
    (a racing caller may have created everything while this one waited) and
    only then runs ``create``.

    Why a second transaction, with ``missing`` reading the catalog tables:
    Postgres resolves a name in DDL (``CREATE SCHEMA IF NOT EXISTS``, the
    schema of ``CREATE TABLE``) through its per-backend catalog cache, which
    also remembers that a name was *not* found (``to_regclass`` leaves such an
    entry). A backend takes in other backends' catalog changes only when a
    transaction starts or when it first locks a relation in a transaction, and
    an advisory lock is not a relation lock. So a caller that looked the schema
    up, then waited on the key while another created it, still believed it
    missing and failed ``CREATE SCHEMA IF NOT EXISTS`` with a duplicate key on
    ``pg_namespace`` (20 first claims at once in a new org: a quarter of them
    answered 500). Taking the key first, then reading ``pg_class`` (the
    transaction's first lock on it, which takes in every committed change),
    leaves the cache current for ``create``.
    """

    def locked(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(schema),))
        if missing(conn):
            create(conn)

    if await pool.run(missing):
        await pool.run(locked)


def _refuse_renamed_columns(
    conn: psycopg.Connection[Any], names: SheetNames, columns: Mapping[str, str]
) -> None:
    """Refuse a contract that gives a column the sheet already stores a new ``sql_name``.

    Adding the new name as a column would leave every written value under the old
    one, and every row would read back null. Renaming the physical column instead
    would break each runner still on the old contract (its admissions and writes name
    the old column) and the seed's direct statements, and cannot be undone by the
    next runner; so the sheet keeps its columns, and the contract is refused.
    """
    existing = column_ids(conn, names)
    if not existing:
        return
    stored = {name for name, _ in existing}
    by_id: dict[str, list[str]] = {}
    for name, column_id in existing:
        by_id.setdefault(column_id, []).append(name)
    for name, column_id in columns.items():
        if name in stored or column_id not in by_id:
            continue
        old = by_id[column_id][0]
        raise InvalidInputError(
            f"column {column_id!r} is stored in this sheet as {old!r}, and the contract now"
            f" names it {name!r}: a sheet's columns are never renamed (its rows, and any"
            f" runner still on the old contract, use {old!r}); keep sql_name {old!r}, or give"
            " the new column an id of its own"
        )


def _lock_for_ddl(
    conn: psycopg.Connection[Any], names: SheetNames, max_sheets: int
) -> tuple[Any, ...]:
    """Take the locks a sheet's DDL needs, in the one lock order, and answer what the
    catalog holds: (lock table, counter table, sharded counters, an older staging
    table, a registry without quota columns, no staging table, a registry)."""
    # The lock order (docs/store.md): DDL key, then the sheet's writer lock, then
    # the rows table. An existing sheet's DDL takes the writer lock exclusively
    # before ALTER TABLE locks the rows table, as every writer does before it
    # touches rows; taking them the other way round deadlocked with admissions.
    # A sheet made before the lock table existed had its writer lock on the
    # counter table: that one excludes writers of that layout while this upgrades.
    found = conn.execute(
        "SELECT to_regclass(%(lock)s) IS NOT NULL, to_regclass(%(counts)s) IS NOT NULL,"
        " EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%(counts)s)"
        "   AND attname = 'shard' AND NOT attisdropped),"
        " to_regclass(%(staging)s) IS NOT NULL AND NOT EXISTS (SELECT FROM pg_constraint"
        "   WHERE conrelid = to_regclass(%(staging)s) AND conname = %(owner)s),"
        " to_regclass(%(admissions)s) IS NOT NULL AND NOT EXISTS (SELECT FROM pg_attribute"
        "   WHERE attrelid = to_regclass(%(admissions)s) AND attname = 'open_counted'"
        "   AND NOT attisdropped),"
        " to_regclass(%(staging)s) IS NULL, to_regclass(%(admissions)s) IS NOT NULL",
        {
            "lock": names.ident("lock_table").as_string(conn),
            "counts": names.ident("counter_table").as_string(conn),
            "staging": names.ident("staging_table").as_string(conn),
            "owner": names.staging_owner_constraint,
            "admissions": names.ident("admissions_table").as_string(conn),
        },
    ).fetchone()
    assert found is not None
    if relations_missing(conn, names.schema, [names.sheet_table]):
        # A new sheet, counted under the org's DDL key: racing first callers
        # cannot pass the cap together.
        check_room(conn, names.schema, "sheet", max_sheets)
    if ownership_pending(conn, names):
        # The owner role's hand-over rewrites the schema's and the rows table's
        # ACLs, as mints and the reaper do under the org's grant key: taken here,
        # before the writer lock and the rows table's, never after them (a mint
        # holding the key waits for the rows table's ACCESS SHARE).
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (grant_lock_key(names.schema),))
    if found[0]:
        lock_sheet(conn, names, "exclusive")
    elif found[1]:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(names.ident("counter_table"))
        )
    if found[6] and (found[4] or quota_triggers_missing(conn, names)):
        # A registry made before the staging quotas. Its lock first, before the
        # staging table's: a staging chunk holds its admission's registry row (the
        # foreign key's share lock) before it writes its staging row, and then
        # reserves its bytes on that registry row.
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                names.ident("admissions_table")
            )
        )
    return tuple(found)


def _create_or_upgrade(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    sheet: SheetRef,
    columns: dict[str, str],
    logical: dict[str, str],
    max_sheets: int,
) -> None:
    """The sheet's DDL, under the org's DDL key: create what is missing, upgrade an
    older layout, and (re)generate its triggers and functions (``ensure_sheet``)."""
    found = _lock_for_ddl(conn, names, max_sheets)
    if found[4]:
        # Its rows count nothing (an open one gives back only what it reserves
        # from now on).
        conn.execute(
            sql.SQL("ALTER TABLE {} {}").format(
                names.ident("admissions_table"),
                sql.SQL(", ").join(
                    sql.SQL("ADD COLUMN IF NOT EXISTS {}").format(sql.SQL(column))
                    for column in ADMISSION_QUOTA_COLUMNS
                ),
            )
        )
    if found[3]:
        # An older staging table (one row per staged row, or chunks without their
        # chain): scratch space, made again (an admission staged into it starts again).
        conn.execute(sql.SQL("DROP TABLE {}").format(names.ident("staging_table")))
    _refuse_renamed_columns(conn, names, columns)
    # The rows table's owner role first: the ALTER TABLE below needs its ownership.
    take_ownership(conn, names)
    _ensure_versions_type(conn, names)
    _fold_versions(conn, names)
    conn.execute(_ddl(names, columns, logical))
    if found[5] or found[3]:
        conn.execute(_staging_storage(names))
    if not found[0]:
        # No policy: even a role granted more than UPDATE would see and change no row.
        conn.execute(
            sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(names.ident("lock_table"))
        )
    if found[2]:
        # Counters kept as sharded rows keyed (kind, name, shard): the rows stay (a
        # read sums them all the same), the key and the shard go.
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP COLUMN shard").format(names.ident("counter_table"))
        )
    _move_legacy_comments(conn, names)
    conn.execute(_summary_row(names))
    # The seed's columns and the summary's key; inserts and deletes count in the
    # summary row now (its total is the row count), so the log's status entries
    # move there; the rows table goes to the sheet's owner role.
    for statement in seed_layout_ddl(names, sheet):
        conn.execute(statement)
    conn.execute(fold_status_log(names))
    take_ownership(conn, names)
    # The counting triggers count every physical column the rows table has now.
    counted = [name for name, _ in column_ids(conn, names) or ()]
    for statement in count_trigger_ddl(conn, names, counted):
        conn.execute(statement)
    for statement in guard_ddl(conn, names):
        conn.execute(statement)
    for statement in admit_ddl(conn, names):
        conn.execute(statement)
    for statement in quota_trigger_ddl(conn, names):
        conn.execute(statement)
    # The attempts' shares (many workers on one attempt): their table and functions.
    for statement in share_ddl(conn, names):
        conn.execute(statement)


async def ensure_sheet(
    pool: ConnectionRunner,
    names: SheetNames,
    sheet: SheetRef,
    contract: SheetContract,
    *,
    max_sheets: int = MAX_SHEETS_PER_ORG,
) -> None:
    """Create the sheet's tables, and columns for new physical contract columns, if missing.

    Idempotent and safe to race (``ensure_ddl``): a catalog check skips the DDL
    when nothing is missing (so a hot path takes no table lock), and the DDL
    itself runs under a transaction-scoped advisory lock per org schema, after
    the same check again. Existing columns and data are never changed: a contract
    that gives a stored column a new ``sql_name`` is refused with
    ``InvalidInputError`` (``_refuse_renamed_columns`` says why). If
    cancelled, the transaction rolls back. A new sheet of an org that holds
    ``max_sheets`` already raises ``SheetCapError`` and creates nothing.
    """
    if not isinstance(contract, SheetContract):
        raise InvalidInputError(f"contract must be a SheetContract, got {type(contract).__name__}")
    columns = _physical_columns(contract)
    logical = {
        "org_id": sheet.org_id,
        "play_name": sheet.play_name,
        "table_namespace": sheet.table_namespace,
    }

    create = partial(
        _create_or_upgrade,
        names=names,
        sheet=sheet,
        columns=columns,
        logical=logical,
        max_sheets=max_sheets,
    )

    def missing(conn: psycopg.Connection[Any]) -> bool:
        return (
            _missing_ddl(conn, names, columns)
            or quota_objects_missing(conn)
            or shares_missing(conn, names)
        )

    if await pool.run(missing):
        # The staging counters the sheet's quota triggers call, under their own key.
        await ensure_ddl(pool, QUOTA_SCHEMA, quota_objects_missing, create_quota_objects)
        await ensure_ddl(pool, names.schema, missing, create)


async def ensure_receipts(
    pool: ConnectionRunner, names: SheetNames, *, max_tables: int = MAX_RECEIPT_TABLES_PER_ORG
) -> None:
    """Create the org schema and the play's receipts table if missing (idempotent,
    safe under concurrency: ``ensure_ddl``); ``SheetCapError`` when the org holds
    ``max_tables`` receipt tables already."""

    def create(conn: psycopg.Connection[Any]) -> None:
        check_room(conn, names.schema, "receipts", max_tables)
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(names.schema)))
        conn.execute(_receipts_ddl(names))

    await ensure_ddl(
        pool,
        names.schema,
        lambda conn: _receipts_missing(conn, names),
        create,
    )
