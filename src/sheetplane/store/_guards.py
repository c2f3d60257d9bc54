"""The fence's guards: what a role that does not own a sheet may not do to it
even where its column grants let the statement through.

Session roles (``gateway.server._roles``) write their own sheet by column
grants: ``INSERT`` of the key, run id, input index and contract columns,
``UPDATE`` of the status, run id, error, cell meta, ``_updated_at`` and
contract columns. A grant cannot say which values, so three guards owned by
the tables' owner decide what the fence decides:

* a row trigger on the rows table refuses every ``_status`` change except
  the ones a runner's own writes make: ``pending``/``running`` to
  ``enriched``/``failed`` (a fenced terminal write) and ``stale`` to
  ``pending`` (an upsert reopening a row). A terminal row never goes back, no
  row becomes ``stale`` or ``running``: those are the admissions' (the
  gateway's) to decide. Its ``WHEN`` clause lets every allowed transition,
  and every change by the owner, through without calling anything, so the
  fenced writes and the admissions pay nothing;
* a row trigger on the event table refuses an event whose kind the role's
  grants do not write (``append`` needs ``INSERT`` on the rows, ``upsert``,
  ``complete_map_rows`` and ``fail_map_rows`` need ``UPDATE``, ``replace``
  needs the clear function) and any event carrying a write version above the
  sheet's admission counter (an ``admission`` event is never a session's);
* ``replace`` deletes the rows through the clear function, a ``SECURITY
  DEFINER`` function of the owner, so no role holds ``DELETE`` on the rows:
  ``DELETE`` (like table-level ``UPDATE``) would let it ``LOCK TABLE ... IN
  ACCESS EXCLUSIVE MODE`` and hold every reader of the sheet.

A guard refuses with ``insufficient_privilege`` (42501), as a grant does. The
owner (and a superuser, and any role holding the owner's privileges) is never
refused: the guard asks ``pg_has_role(current_user, owner, 'USAGE')``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from ._names import SheetNames

__all__ = [
    "FENCE_TRIGGERS",
    "clear_rows",
    "guard_ddl",
    "guards_missing",
]

#: (trigger name, table attribute) of the two guard triggers.
FENCE_TRIGGERS: Final = (
    ("sheetplane_fence_status", "sheet_table"),
    ("sheetplane_fence_event", "event_table"),
)

#: The status changes a session's own writes make; every other one is the fence's.
_OWN_TRANSITIONS: Final = (
    "(OLD._status IN ('pending', 'running') AND NEW._status IN ('enriched', 'failed'))"
    " OR (OLD._status = 'stale' AND NEW._status = 'pending')"
)

_IS_OWNER: Final = (
    "pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE')"
)

_STATUS_BODY: Final = f"""
BEGIN
  IF {_IS_OWNER} THEN
    RETURN NEW;
  END IF;
  RAISE EXCEPTION 'only the gateway moves a row from % to %', OLD._status, NEW._status
    USING ERRCODE = 'insufficient_privilege';
END
"""

_EVENT_BODY: Final = f"""
DECLARE
  rows regclass := TG_ARGV[0]::regclass;
  counter bigint;
  allowed boolean;
BEGIN
  IF {_IS_OWNER} THEN
    RETURN NEW;
  END IF;
  allowed := CASE NEW.kind
    WHEN 'append' THEN has_any_column_privilege(rows, 'INSERT')
    WHEN 'upsert' THEN has_any_column_privilege(rows, 'UPDATE')
    WHEN 'complete_map_rows' THEN has_any_column_privilege(rows, 'UPDATE')
    WHEN 'fail_map_rows' THEN has_any_column_privilege(rows, 'UPDATE')
    WHEN 'replace' THEN has_function_privilege(TG_ARGV[2]::regprocedure, 'EXECUTE')
    ELSE false
  END;
  IF NOT allowed THEN
    RAISE EXCEPTION 'a session does not write % events', NEW.kind
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NEW.write_version IS NOT NULL THEN
    EXECUTE format('SELECT coalesce((SELECT write_version FROM %s WHERE id), 0)', TG_ARGV[1])
      INTO counter;
    IF NEW.write_version > counter OR NEW.kind NOT IN ('complete_map_rows', 'fail_map_rows') THEN
      RAISE EXCEPTION 'an event of version % is past the admissions of this sheet',
        NEW.write_version USING ERRCODE = 'insufficient_privilege';
    END IF;
  END IF;
  RETURN NEW;
END
"""


def _function(names: SheetNames, suffix: str) -> sql.Identifier:
    return sql.Identifier(names.schema, f"{names.sheet_table.removesuffix('_rows')}_{suffix}")


def clear_function(names: SheetNames) -> sql.Identifier:
    """The sheet's clear function (``replace``'s delete of every row)."""
    return _function(names, "clear")


def guard_ddl(conn: psycopg.Connection[Any], names: SheetNames) -> list[sql.Composed]:
    """The statements that (re)create the guards; run by the tables' owner under
    the DDL lock and the exclusive writer lock."""
    rows, events = names.ident("sheet_table"), names.ident("event_table")
    status_fn, event_fn, clear = (
        _function(names, "fence"),
        _function(names, "event_fence"),
        clear_function(names),
    )
    pinned = sql.SQL("SET search_path = pg_catalog, pg_temp")
    clear_body = sql.SQL(
        "DECLARE n bigint; BEGIN DELETE FROM {}; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END"
    ).format(rows)
    owner = conn.execute(
        "SELECT relowner::bigint FROM pg_class WHERE oid = %s::regclass", (rows.as_string(conn),)
    ).fetchone()
    assert owner is not None
    arguments = [
        rows.as_string(conn),
        names.ident("summary_table").as_string(conn),
        f"{clear.as_string(conn)}()",
    ]
    return [
        sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql {} AS {}").format(
            status_fn, pinned, sql.Literal(_STATUS_BODY)
        ),
        sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql {} AS {}").format(
            event_fn, pinned, sql.Literal(_EVENT_BODY)
        ),
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}() RETURNS bigint LANGUAGE plpgsql "
            "SECURITY DEFINER {} AS {}"
        ).format(clear, pinned, sql.Literal(clear_body.as_string(conn))),
        sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(clear),
        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
            sql.Identifier(FENCE_TRIGGERS[0][0]), rows
        ),
        # The owner's own writes (admissions re-stamping rows) skip the call: its
        # role is named in the WHEN clause (the function checks the owner again).
        sql.SQL(
            "CREATE TRIGGER {} BEFORE UPDATE OF _status ON {} FOR EACH ROW "
            "WHEN (OLD._status IS DISTINCT FROM NEW._status AND NOT ({}) "
            "AND NOT pg_has_role(current_user, {}::oid, 'USAGE')) EXECUTE FUNCTION {}()"
        ).format(
            sql.Identifier(FENCE_TRIGGERS[0][0]),
            rows,
            sql.SQL(_OWN_TRANSITIONS),
            sql.Literal(int(owner[0])),
            status_fn,
        ),
        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
            sql.Identifier(FENCE_TRIGGERS[1][0]), events
        ),
        sql.SQL(
            "CREATE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}({})"
        ).format(
            sql.Identifier(FENCE_TRIGGERS[1][0]),
            events,
            event_fn,
            sql.SQL(", ").join(map(sql.Literal, arguments)),
        ),
    ]


def guards_missing(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether a guard trigger or the clear function is missing (a sheet made
    before the guards existed: ``ensure_sheet`` adds them)."""
    row = conn.execute(
        "SELECT to_regprocedure(%(clear)s) IS NULL OR (SELECT count(*) FROM pg_trigger"
        " WHERE tgrelid IN (to_regclass(%(rows)s), to_regclass(%(events)s))"
        " AND tgname = ANY(%(triggers)s)) < %(n)s",
        {
            "clear": f"{clear_function(names).as_string(conn)}()",
            "rows": names.ident("sheet_table").as_string(conn),
            "events": names.ident("event_table").as_string(conn),
            "triggers": [name for name, _ in FENCE_TRIGGERS],
            "n": len(FENCE_TRIGGERS),
        },
    ).fetchone()
    return bool(row and row[0])


def clear_rows(conn: psycopg.Connection[Any], names: SheetNames) -> int:
    """Delete every row of the sheet through its clear function (a sheet made
    before it existed: a plain ``DELETE``, which only its owner may run now)."""
    clear = clear_function(names)
    found = conn.execute(
        "SELECT to_regprocedure(%s) IS NOT NULL", (f"{clear.as_string(conn)}()",)
    ).fetchone()
    if found == (True,):
        row = conn.execute(sql.SQL("SELECT {}()").format(clear)).fetchone()
        return int(row[0]) if row else 0
    return conn.execute(sql.SQL("DELETE FROM {}").format(names.ident("sheet_table"))).rowcount
