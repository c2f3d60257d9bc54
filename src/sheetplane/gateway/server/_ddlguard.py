"""The session DDL guard: an event trigger that refuses every DDL a session role
runs but the seed's ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` that adds nothing.

A write session is a member of its sheet's owner role (``store._seedlayout``):
Postgres lets only a table's owner run ``ALTER TABLE``, even an ``ADD COLUMN IF
NOT EXISTS`` of columns that exist, and the seed's runtime starts every write
with one. Ownership would let the session run any DDL on the rows table
(``DROP``, ``DISABLE TRIGGER``, ``GRANT``...), so two event triggers, created
by a superuser (Postgres allows no one else), confine it:

* on ``ddl_command_start``, a statement run by a session role (its
  ``session_user`` starts with the session prefix: ``SET ROLE`` cannot change
  that) is refused with ``insufficient_privilege`` unless the whole query text
  is one ``ALTER TABLE "schema"."table" ADD COLUMN IF NOT EXISTS "name" jsonb
  [, ADD COLUMN IF NOT EXISTS "name" jsonb ...]`` (quoted identifiers only, as
  the seed writes them; no second statement, no comment, no other clause);
* on ``ddl_command_end`` of an ``ALTER TABLE``, a session's statement that
  added a column (an attribute of the altered table written by this
  transaction) is refused, and so rolled back: the rows table's columns are the
  gateway's (``ensure_sheet`` adds the contract's before a session is minted).

Non-DDL commands that ownership allows are not event-trigger commands; what
they open is in docs/gateway.md (Security: the seed's direct road).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql

__all__ = [
    "DDL_GUARD_SCHEMA",
    "DDL_GUARD_TRIGGERS",
    "ddl_guard_installed",
    "ddl_guard_statements",
]

#: The schema of the guard's functions (a superuser's; no grant to ``PUBLIC``).
DDL_GUARD_SCHEMA: Final = "sheetplane_guard"
#: The two event triggers.
DDL_GUARD_TRIGGERS: Final = ("sheetplane_session_ddl_start", "sheetplane_session_ddl_end")

#: The one DDL statement a session may run: the seed's, whole.
_SEED_ALTER: Final = (
    r'^\s*ALTER\s+TABLE\s+"([^"]|"")+"\s*\.\s*"([^"]|"")+"'
    r'\s+ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS\s+"([^"]|"")+"\s+jsonb'
    r'(\s*,\s*ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS\s+"([^"]|"")+"\s+jsonb)*\s*;?\s*$'
)

_START_BODY: Final = """
BEGIN
  IF NOT starts_with(session_user, {prefix}) THEN
    RETURN;
  END IF;
  IF tg_tag = 'ALTER TABLE' AND current_query() ~* {pattern} THEN
    RETURN;
  END IF;
  RAISE EXCEPTION 'a session may not run %', tg_tag
    USING ERRCODE = 'insufficient_privilege';
END
"""

_END_BODY: Final = """
DECLARE
  xid text := (pg_current_xact_id_if_assigned()::text::numeric % 4294967296)::text;
BEGIN
  IF NOT starts_with(session_user, {prefix}) OR xid IS NULL THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT FROM pg_event_trigger_ddl_commands() AS c
             JOIN pg_attribute AS a ON a.attrelid = c.objid
             WHERE a.attnum > 0 AND a.xmin::text = xid) THEN
    RAISE EXCEPTION 'a session adds no column to a sheet (the gateway adds the contract''s)'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
END
"""


def _function(name: str) -> sql.Identifier:
    return sql.Identifier(DDL_GUARD_SCHEMA, name)


def ddl_guard_installed(conn: psycopg.Connection[Any]) -> bool:
    """Whether both event triggers exist and are enabled in this database."""
    row = conn.execute(
        "SELECT count(*) FROM pg_event_trigger WHERE evtname = ANY(%s) AND evtenabled <> 'D'",
        (list(DDL_GUARD_TRIGGERS),),
    ).fetchone()
    return row is not None and row[0] == len(DDL_GUARD_TRIGGERS)


def ddl_guard_statements(conn: psycopg.Connection[Any], session_prefix: str) -> list[sql.Composed]:
    """The statements that install the guard (empty once it is); a superuser runs them."""
    if ddl_guard_installed(conn):
        return []
    prefix = sql.Literal(session_prefix)
    pinned = sql.SQL("SET search_path = pg_catalog, pg_temp")
    start = sql.SQL(_START_BODY).format(prefix=prefix, pattern=sql.Literal(_SEED_ALTER))
    end = sql.SQL(_END_BODY).format(prefix=prefix)
    statements = [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(DDL_GUARD_SCHEMA)),
        sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(DDL_GUARD_SCHEMA)),
    ]
    for name, body in (("session_ddl_start", start), ("session_ddl_end", end)):
        statements += [
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {}() RETURNS event_trigger LANGUAGE plpgsql {} AS {}"
            ).format(_function(name), pinned, sql.Literal(body.as_string(conn))),
            sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(_function(name)),
        ]
    for trigger in DDL_GUARD_TRIGGERS:
        statements.append(
            sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(trigger))
        )
    statements += [
        sql.SQL("CREATE EVENT TRIGGER {} ON ddl_command_start EXECUTE FUNCTION {}()").format(
            sql.Identifier(DDL_GUARD_TRIGGERS[0]), _function("session_ddl_start")
        ),
        sql.SQL(
            "CREATE EVENT TRIGGER {} ON ddl_command_end WHEN TAG IN ('ALTER TABLE') "
            "EXECUTE FUNCTION {}()"
        ).format(sql.Identifier(DDL_GUARD_TRIGGERS[1]), _function("session_ddl_end")),
    ]
    return statements
