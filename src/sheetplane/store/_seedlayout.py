"""The seed's storage contract on a sheet's tables, and the sheet's owner role.

A session minted by ``create_db_session`` may run the seed's own direct-road
statements (0.1.2's ``runtime-api.ts``) against the tables its answer names.
Those statements name columns of their own beside the store's:

* the event table: ``play_name, table_namespace, _key, _status, _run_id,
  _stage, data_patch`` (one event per written row); the store's ``kind`` and
  ``row_count`` take defaults (``'row'``, 1) so the seed's insert needs neither;
* the summary table: ``play_name, table_namespace, total, queued, running,
  completed, failed, _updated_at``, keyed by play and namespace (a unique
  index: the seed upserts ``ON CONFLICT (play_name, table_namespace)``). The
  sheet's one summary row carries the sheet's normalised play name and
  namespace, and its ``total`` is the row count (``store._counters``);
* the column summary table: ``play_name, table_namespace`` (the seed's
  replace deletes by them; the store's base rows carry neither, so it deletes
  none of them).

The seed's reads use ``SELECT *`` on the rows table and take every column
not in its system list as row data; the store's row versions are in ``seq``,
a name on that list, so the rows table has no column the seed does not drop
or know (docs/store.md, "Row versions").

Every seed write path starts with ``ALTER TABLE <rows> ADD COLUMN IF NOT
EXISTS ... jsonb``, which Postgres lets only the table's owner run, even when
every column exists. So the rows table is owned by a role of its own, the
sheet's owner role (``sp_own_<digest>``, ``NOLOGIN``), whose own privileges on
the table are all revoked: it holds nothing but ownership. The gateway is a
member (it keeps its DDL) and holds its table privileges by grant; a write
session is made a member too (``gateway.server._roles``), and the database's
session DDL guard (an event trigger, ``gateway.server._hardening``) refuses
every DDL a session runs except that one ``ALTER TABLE`` form, and that one
when it adds nothing. The owner role is made only by a store role that may
create roles (a superuser, or ``CREATEROLE``); under any other the rows table
keeps its owner and a session's ``ALTER TABLE`` fails as before.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from .._types import SheetRef
    from ._names import SheetNames

__all__ = [
    "OWNER_ROLE_PREFIX",
    "SEED_EVENT_COLUMNS",
    "SEED_SUMMARY_COLUMNS",
    "grant_lock_key",
    "owner_role",
    "ownership_pending",
    "seed_layout_ddl",
    "seed_layout_missing",
    "take_ownership",
]

#: Every sheet owner role's name starts with this.
OWNER_ROLE_PREFIX: Final = "sp_own_"

#: What the seed inserts into the event table, per row.
SEED_EVENT_COLUMNS: Final = (
    "play_name",
    "table_namespace",
    "_key",
    "_status",
    "_run_id",
    "_stage",
    "data_patch",
)

#: What the seed's summary upsert inserts (and its counters, which it updates).
SEED_SUMMARY_COLUMNS: Final = (
    "play_name",
    "table_namespace",
    "total",
    "queued",
    "running",
    "completed",
    "failed",
)


def grant_lock_key(schema: str) -> int:
    """A signed 64-bit advisory-lock key for the grants on one org's schema: every
    change of its ACLs and its tables' (a mint's grants, the reaper's ``DROP
    OWNED``, an owner change) takes it, or two at once fail with "tuple
    concurrently updated"."""
    digest = hashlib.sha256(f"sheetplane-grants:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _summary_key(names: SheetNames) -> str:
    return f"{names.summary_table}_play"


def seed_layout_ddl(names: SheetNames, sheet: SheetRef) -> list[sql.Composed]:
    """The statements that give the sheet's tables the seed's columns (idempotent);
    run by the gateway under the DDL lock, after the summary row exists."""
    events, summary = names.ident("event_table"), names.ident("summary_table")
    return [
        sql.SQL(
            "ALTER TABLE {} ALTER COLUMN kind SET DEFAULT 'row', "
            "ALTER COLUMN row_count SET DEFAULT 1, "
            "ADD COLUMN IF NOT EXISTS play_name text, "
            "ADD COLUMN IF NOT EXISTS table_namespace text, "
            "ADD COLUMN IF NOT EXISTS _key text, "
            "ADD COLUMN IF NOT EXISTS _status text, "
            "ADD COLUMN IF NOT EXISTS _run_id text, "
            "ADD COLUMN IF NOT EXISTS _stage text, "
            "ADD COLUMN IF NOT EXISTS data_patch jsonb"
        ).format(events),
        sql.SQL(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS play_name text, "
            "ADD COLUMN IF NOT EXISTS table_namespace text, "
            "ADD COLUMN IF NOT EXISTS _updated_at timestamptz"
        ).format(summary),
        sql.SQL(
            "UPDATE {} SET play_name = {}, table_namespace = {} WHERE id"
            " AND (play_name, table_namespace) IS DISTINCT FROM ({}, {})"
        ).format(
            summary,
            sql.Literal(sheet.play_name),
            sql.Literal(sheet.table_namespace),
            sql.Literal(sheet.play_name),
            sql.Literal(sheet.table_namespace),
        ),
        sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} (play_name, table_namespace)").format(
            sql.Identifier(_summary_key(names)), summary
        ),
        sql.SQL(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS play_name text, "
            "ADD COLUMN IF NOT EXISTS table_namespace text"
        ).format(names.ident("column_summary_table")),
    ]


#: The sheet's owner role's name: roles belong to the whole cluster, so it is a
#: digest of the database (name and oid) and the sheet's rows table.
_OWNER_NAME: Final = sql.SQL(
    "%(prefix)s::text || left(encode(sha256(convert_to(concat_ws(':', current_database(),"
    " (SELECT oid FROM pg_database WHERE datname = current_database()),"
    " %(schema)s::text, %(table)s::text), 'UTF8')), 'hex'), 24)"
)

#: One round trip: whether the seed's layout is whole, and (where the current role
#: may create roles) whether the rows table is owned by the sheet's owner role.
_LAYOUT_FOUND: Final = sql.SQL("""
    SELECT
      EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%(events)s)
              AND attname = 'data_patch' AND NOT attisdropped)
      AND EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%(colsum)s)
              AND attname = 'play_name' AND NOT attisdropped)
      AND to_regclass(%(key)s) IS NOT NULL
      AND (NOT (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user)
           OR (SELECT pg_get_userbyid(relowner) FROM pg_class
               WHERE oid = to_regclass(%(rows)s)) = {owner_name})
""").format(owner_name=_OWNER_NAME)


def _may_create_roles(conn: psycopg.Connection[Any]) -> tuple[bool, bool]:
    """(superuser, may create roles) of the current role."""
    row = conn.execute(
        "SELECT rolsuper, rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def _name_params(names: SheetNames) -> dict[str, str]:
    return {"prefix": OWNER_ROLE_PREFIX, "schema": names.schema, "table": names.sheet_table}


def owner_role(conn: psycopg.Connection[Any], names: SheetNames) -> str:
    """The name of the sheet's owner role (whether or not it exists)."""
    row = conn.execute(sql.SQL("SELECT {}").format(_OWNER_NAME), _name_params(names)).fetchone()
    assert row is not None
    return str(row[0])


def _rows_owner(conn: psycopg.Connection[Any], names: SheetNames) -> str | None:
    row = conn.execute(
        "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass(%s)",
        (names.ident("sheet_table").as_string(conn),),
    ).fetchone()
    return None if row is None else str(row[0])


def seed_layout_missing(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether the seed's columns, the summary's key, or (where the store may create
    roles) the rows table's owner role are missing: ``ensure_sheet`` adds them."""
    found = conn.execute(
        _LAYOUT_FOUND,
        {
            **_name_params(names),
            "events": names.ident("event_table").as_string(conn),
            "colsum": names.ident("column_summary_table").as_string(conn),
            "rows": names.ident("sheet_table").as_string(conn),
            "key": sql.Identifier(names.schema, _summary_key(names)).as_string(conn),
        },
    ).fetchone()
    return found != (True,)


def ownership_pending(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether ``take_ownership`` will hand the rows table over (a new sheet, or one
    whose table is not its owner role's yet, where the store may create roles)."""
    if not _may_create_roles(conn)[1]:
        return False
    return _rows_owner(conn, names) != owner_role(conn, names)


def take_ownership(conn: psycopg.Connection[Any], names: SheetNames) -> None:
    """Hand the rows table to the sheet's owner role, stripped of every privilege but
    ownership (the gateway keeps its own by grant). Nothing when the current role
    may not create roles. Run by the gateway under the DDL lock and the exclusive
    writer lock."""
    superuser, may_create = _may_create_roles(conn)
    if not may_create:
        return
    name = owner_role(conn, names)
    role = sql.Identifier(name)
    exists = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s)", (name,)
    ).fetchone()
    if exists != (True,):
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN NOINHERIT").format(role))
    if not superuser:
        member = conn.execute("SELECT pg_has_role(current_user, %s, 'USAGE')", (name,)).fetchone()
        if member != (True,):
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(role))
    current = _rows_owner(conn, names)
    if current is None or current == name:
        return
    if not superuser:
        # A session that ran REASSIGN OWNED (no event trigger fires for it) owns the
        # table itself: the gateway takes that role's privileges to hand it back.
        held = conn.execute("SELECT pg_has_role(current_user, %s, 'USAGE')", (current,))
        if held.fetchone() != (True,):
            conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(current)))
    # The schema's and the table's ACLs change: the org's grant key (``ensure_sheet``
    # took it already, before the writer lock; taking it again is a no-op).
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (grant_lock_key(names.schema),))
    rows = names.ident("sheet_table")
    # A new owner needs CREATE on the schema (unless a superuser hands the table
    # over): held for this transaction only, so no one ever sees it.
    schema = sql.Identifier(names.schema)
    conn.execute(sql.SQL("GRANT CREATE ON SCHEMA {} TO {}").format(schema, role))
    conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(rows, role))
    conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema, role))
    conn.execute(sql.SQL("REVOKE ALL ON TABLE {} FROM {}").format(rows, role))
    conn.execute(sql.SQL("GRANT ALL ON TABLE {} TO CURRENT_USER").format(rows))
