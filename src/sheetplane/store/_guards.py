"""The fence's guards: what a role that is not the gateway may not do to a sheet
even where its grants let the statement through.

Session roles (``_grants``) write their own sheet by column
grants (what the store's and the seed's write statements name), and a write
session is a member of the sheet's owner role (``store._ownership``), so the
seed's ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` passes its ownership
check. A grant cannot say which values, so guards owned by the gateway decide
what the fence decides:

* row triggers on the rows table refuse every ``_status`` change except the
  ones a runner's own writes make: ``pending``/``running``/``failed`` to
  ``enriched``/``failed`` (a terminal write; the seed completes its failed rows
  again) and ``stale`` to ``pending`` (an upsert reopening a row), and any new
  row that does not start ``pending``. No row becomes ``stale`` or
  ``running``: those are the admissions' (the gateway's) to decide. The
  ``WHEN`` clauses let every allowed change, and every change by the gateway,
  through without calling anything, so the fenced writes and the admissions
  pay nothing;
* a row trigger on the event table refuses an event whose kind the role's
  grants do not write (``row``, the seed's per-row events, and ``append``
  need ``INSERT`` on the rows, ``upsert``, ``complete_map_rows`` and
  ``fail_map_rows`` need ``UPDATE``, ``replace`` needs the clear function),
  any event carrying a write version above the sheet's admission counter (an
  ``admission`` event is never a session's), and the deletion of any event but
  the seed's per-row ones (a replace clears those);
* row triggers on the summary and column summary tables keep their counters
  the store's: a session's insert into the summary (the seed's upsert after
  each write) and its reset to zero (the seed's replace) are dropped, any other
  write is refused;
* the store's own ``replace`` deletes the rows through the clear function, a
  ``SECURITY DEFINER`` function of the gateway;
* a statement trigger on the rows table refuses an insert by a role that is
  not the gateway of any row stamped with a write version (or an admitted
  version) other than the one its own transaction took. A ``rows.admit``
  session (the direct road's admission in one transaction,
  ``store/_direct.py``) takes that version through the begin function, a
  ``SECURITY DEFINER`` function of the gateway that takes the writer lock
  exclusively and the sheet's next version, and leaves a row in the sheet's
  lock table (columnless, row-level security with no policy: no session sees
  or writes a row of it) whose ``xmin`` is the transaction's id; the taken
  function (the gateway's) answers the version only to the transaction that
  left that row. The session ``COPY``s its rows stamped with it; the finish
  function (the gateway's) removes the row, records the admission's event,
  compacts the counters and analyzes a grown sheet. Every other role inserts
  rows of version 0 (the columns' defaults).

A guard refuses with ``insufficient_privilege`` (42501), as a grant does. The
gateway (and a superuser) is never refused: the guard asks
``pg_has_role(current_user, gateway, 'USAGE')``, the gateway being the owner of
the sheet's event table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg import sql

from ..budgets import ADMISSION_ANALYZE_MIN_ROWS, ADMISSION_ANALYZE_STATISTICS_TARGET
from ._counters import STATUS_COUNTERS

if TYPE_CHECKING:
    from ._names import SheetNames

__all__ = [
    "FENCE_TRIGGERS",
    "admit_ddl",
    "admit_functions",
    "clear_rows",
    "guard_ddl",
    "guards_missing",
]

#: (trigger name, table attribute) of the guard triggers.
FENCE_TRIGGERS: Final = (
    ("sheetplane_fence_status", "sheet_table"),
    ("sheetplane_fence_insert", "sheet_table"),
    ("sheetplane_fence_event", "event_table"),
    ("sheetplane_fence_event_delete", "event_table"),
    ("sheetplane_fence_base", "summary_table"),
    ("sheetplane_fence_base", "column_summary_table"),
    ("sheetplane_fence_admit", "sheet_table"),
)

#: The transition table of the admit guard (the rows one insert statement added).
_ADMITTED: Final = "sheetplane_admitted"

#: The status changes a session's own writes make; every other one is the fence's.
#: A failed row may be completed again: the seed's runtime admits its failed rows
#: again without resetting them and completes them unfenced.
_OWN_TRANSITIONS: Final = (
    "(OLD._status IN ('pending', 'running', 'failed') AND NEW._status IN ('enriched', 'failed'))"
    " OR (OLD._status = 'stale' AND NEW._status = 'pending')"
)

#: Whether the current role is the gateway (the owner of the sheet's event table,
#: passed as the trigger's first argument): the rows table is owned by the sheet's
#: owner role (``store._ownership``), whose members include write sessions.
_IS_GATEWAY: Final = "pg_has_role(current_user, TG_ARGV[0]::oid, 'USAGE')"

_IS_OWNER: Final = (
    "pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE')"
)

_STATUS_BODY: Final = f"""
BEGIN
  IF {_IS_GATEWAY} THEN
    RETURN NEW;
  END IF;
  IF TG_OP = 'INSERT' THEN
    RAISE EXCEPTION 'only the gateway inserts a row as %', NEW._status
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RAISE EXCEPTION 'only the gateway moves a row from % to %', OLD._status, NEW._status
    USING ERRCODE = 'insufficient_privilege';
END
"""

#: The summary row and the column summary hold the store's counters (its counting
#: triggers keep them): a session's own writes to them change nothing. The seed's
#: runtime upserts the summary after each write and zeroes it on replace; those
#: statements run and are dropped row by row (an insert and a reset to zero);
#: any other change is refused.
_BASE_BODY: Final = f"""
BEGIN
  IF {_IS_GATEWAY} THEN
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
  END IF;
  IF TG_ARGV[1] = 'summary' THEN
    IF TG_OP = 'INSERT' THEN
      RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
      IF NEW.total = 0 AND NEW.queued = 0 AND NEW.running = 0 AND NEW.completed = 0
          AND NEW.failed = 0 THEN
        RETURN NULL;
      END IF;
    END IF;
  END IF;
  RAISE EXCEPTION 'only the gateway writes the counters of a sheet'
    USING ERRCODE = 'insufficient_privilege';
END
"""

_ADMIT_BODY: Final = f"""
DECLARE
  taken bigint;
BEGIN
  IF {_IS_GATEWAY} THEN
    RETURN NULL;
  END IF;
  IF NOT EXISTS (SELECT FROM {_ADMITTED} AS r
      WHERE (r.seq).write_version <> 0 OR (r.seq).admitted_version IS NOT NULL) THEN
    RETURN NULL;
  END IF;
  -- Only a role granted the taken function (rows.admit) stamps versions at all.
  EXECUTE format('SELECT %s()', TG_ARGV[1]) INTO taken;
  IF EXISTS (SELECT FROM {_ADMITTED} AS r WHERE NOT coalesce(
      ((r.seq).write_version = 0 AND (r.seq).admitted_version IS NULL)
      OR ((r.seq).write_version = taken AND (r.seq).admitted_version = taken), false)) THEN
    RAISE EXCEPTION 'only the admission that took a write version stamps rows with it'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NULL;
END
"""

_EVENT_BODY: Final = f"""
DECLARE
  rows regclass := TG_ARGV[0]::regclass;
  counter bigint;
  allowed boolean;
BEGIN
  IF {_IS_OWNER} THEN
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
  END IF;
  IF TG_OP = 'DELETE' THEN
    -- The seed's per-row events (they name their play) go with a replace; the
    -- store's own events (its idempotency keys) stay.
    IF OLD.play_name IS NULL THEN
      RAISE EXCEPTION 'a session deletes only per-row events'
        USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN OLD;
  END IF;
  allowed := CASE NEW.kind
    WHEN 'row' THEN has_any_column_privilege(rows, 'INSERT')
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


def admit_functions(names: SheetNames) -> tuple[sql.Identifier, sql.Identifier, sql.Identifier]:
    """The sheet's admission functions (begin, taken, finish) of the direct road's
    admission in one transaction (``store/_direct.py``)."""
    return (
        _function(names, "admit_begin"),
        _function(names, "admit_taken"),
        _function(names, "admit_finish"),
    )


def guard_ddl(conn: psycopg.Connection[Any], names: SheetNames) -> list[sql.Composed]:
    """The statements that (re)create the guards; run by the gateway under the DDL
    lock and the exclusive writer lock."""
    rows, events = names.ident("sheet_table"), names.ident("event_table")
    status_fn, event_fn, base_fn, admit_fn, clear = (
        _function(names, "fence"),
        _function(names, "event_fence"),
        _function(names, "base_fence"),
        _function(names, "admit_fence"),
        clear_function(names),
    )
    pinned = sql.SQL("SET search_path = pg_catalog, pg_temp")
    clear_body = sql.SQL(
        "DECLARE n bigint; BEGIN DELETE FROM {}; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END"
    ).format(rows)
    # The gateway: the event table's owner (the rows table's is the sheet's owner role).
    owner = conn.execute(
        "SELECT relowner::bigint FROM pg_class WHERE oid = %s::regclass",
        (events.as_string(conn),),
    ).fetchone()
    assert owner is not None
    gateway = sql.Literal(int(owner[0]))
    not_gateway = sql.SQL("NOT pg_has_role(current_user, {}::oid, 'USAGE')").format(gateway)
    arguments = [
        rows.as_string(conn),
        names.ident("summary_table").as_string(conn),
        f"{clear.as_string(conn)}()",
    ]
    statements = [
        sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql {} AS {}").format(
            function, pinned, sql.Literal(body)
        )
        for function, body in (
            (status_fn, _STATUS_BODY),
            (event_fn, _EVENT_BODY),
            (base_fn, _BASE_BODY),
            (admit_fn, _ADMIT_BODY),
        )
    ]
    statements += [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}() RETURNS bigint LANGUAGE plpgsql "
            "SECURITY DEFINER {} AS {}"
        ).format(clear, pinned, sql.Literal(clear_body.as_string(conn))),
        sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(clear),
    ]
    for name, attr in FENCE_TRIGGERS:
        statements.append(
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                sql.Identifier(name), names.ident(attr)
            )
        )
    statements += [
        # The gateway's own writes (admissions re-stamping rows) skip the call: its
        # role is named in the WHEN clause (the function checks it again).
        sql.SQL(
            "CREATE TRIGGER sheetplane_fence_status BEFORE UPDATE OF _status ON {} FOR EACH ROW "
            "WHEN (OLD._status IS DISTINCT FROM NEW._status AND NOT ({}) AND {}) "
            "EXECUTE FUNCTION {}({})"
        ).format(rows, sql.SQL(_OWN_TRANSITIONS), not_gateway, status_fn, gateway),
        # A session's new row starts pending, as the seed's and the store's writes make it.
        sql.SQL(
            "CREATE TRIGGER sheetplane_fence_insert BEFORE INSERT ON {} FOR EACH ROW "
            "WHEN (NEW._status IS DISTINCT FROM 'pending' AND {}) EXECUTE FUNCTION {}({})"
        ).format(rows, not_gateway, status_fn, gateway),
        sql.SQL(
            "CREATE TRIGGER sheetplane_fence_event BEFORE INSERT ON {} FOR EACH ROW "
            "EXECUTE FUNCTION {}({})"
        ).format(events, event_fn, sql.SQL(", ").join(map(sql.Literal, arguments))),
        sql.SQL(
            "CREATE TRIGGER sheetplane_fence_event_delete BEFORE DELETE ON {} FOR EACH ROW "
            "WHEN ({}) EXECUTE FUNCTION {}({})"
        ).format(events, not_gateway, event_fn, sql.SQL(", ").join(map(sql.Literal, arguments))),
    ]
    # One pass over an insert's new rows, and only for a role that is not the gateway
    # (the gateway returns at once): a plain insert's rows carry version 0.
    statements.append(
        sql.SQL(
            "CREATE TRIGGER sheetplane_fence_admit AFTER INSERT ON {} REFERENCING NEW TABLE "
            "AS {} FOR EACH STATEMENT EXECUTE FUNCTION {}({}, {})"
        ).format(
            rows,
            sql.Identifier(_ADMITTED),
            admit_fn,
            gateway,
            sql.Literal(admit_functions(names)[1].as_string(conn)),
        )
    )
    for attr, kind in (("summary_table", "summary"), ("column_summary_table", "column_summary")):
        statements.append(
            sql.SQL(
                "CREATE TRIGGER sheetplane_fence_base BEFORE INSERT OR UPDATE OR DELETE ON {} "
                "FOR EACH ROW WHEN ({}) EXECUTE FUNCTION {}({}, {})"
            ).format(names.ident(attr), not_gateway, base_fn, gateway, sql.Literal(kind))
        )
    return statements


_PINNED: Final = sql.SQL("SET search_path = pg_catalog, pg_temp")


def admit_ddl(conn: psycopg.Connection[Any], names: SheetNames) -> list[sql.Composed]:
    """The statements that (re)create the sheet's begin and finish functions of the direct
    road's admission in one transaction (``store/_direct.py``); run by the gateway
    under the DDL lock and the exclusive writer lock."""
    begin, taken, finish = admit_functions(names)
    summary, rows = names.ident("summary_table"), names.ident("sheet_table")
    counters, lock = names.ident("counter_table"), names.ident("lock_table")
    # The marker: a row of the lock table this transaction wrote (no session sees it).
    marked = sql.SQL(
        "EXISTS (SELECT FROM {} AS l WHERE l.xmin = pg_current_xact_id()::xid)"
    ).format(lock)
    begin_body = sql.SQL(
        "BEGIN\n"
        "  LOCK TABLE {lock} IN EXCLUSIVE MODE;\n"
        "  DELETE FROM {lock};\n"
        "  INSERT INTO {lock} DEFAULT VALUES;\n"
        "  INSERT INTO {summary} AS s (id, write_version, updated_at) VALUES (true, 1, now())\n"
        "    ON CONFLICT (id) DO UPDATE SET write_version = s.write_version + 1,\n"
        "    updated_at = now() RETURNING s.write_version INTO taken_version;\n"
        "  was_empty := NOT EXISTS (SELECT FROM {rows});\n"
        "END"
    ).format(lock=lock, summary=summary, rows=rows)
    taken_body = sql.SQL(
        "SELECT s.write_version FROM {summary} AS s WHERE s.id AND {marked}"
    ).format(summary=summary, marked=marked)
    total = sql.SQL(
        "coalesce((SELECT s.total FROM {summary} AS s WHERE s.id), 0) + coalesce("
        "(SELECT sum(c.value) FROM {counters} AS c WHERE c.kind = 'status' AND c.name = {t}), 0)"
    ).format(summary=summary, counters=counters, t=sql.Literal(STATUS_COUNTERS[0]))
    finish_body = sql.SQL(
        "BEGIN\n"
        "  SELECT s.write_version INTO taken_version FROM {summary} AS s\n"
        "    WHERE s.id AND {marked};\n"
        "  IF taken_version IS NULL THEN\n"
        "    RAISE EXCEPTION 'no admission began in this transaction'\n"
        "      USING ERRCODE = 'insufficient_privilege';\n"
        "  END IF;\n"
        "  DELETE FROM {lock};\n"
        "  WITH moved AS (DELETE FROM {counters} RETURNING kind, name, value)\n"
        "    INSERT INTO {counters} (kind, name, value) SELECT kind, name, sum(value)\n"
        "    FROM moved GROUP BY kind, name HAVING sum(value) <> 0;\n"
        "  sheet_rows := {total};\n"
        "  INSERT INTO {events} (kind, run_id, write_version, row_count)\n"
        "    VALUES ('admission', run_id, taken_version, sheet_rows);\n"
        "  IF sheet_rows >= {analyze_min} THEN\n"
        "    PERFORM set_config('default_statistics_target', {target}, true);\n"
        "    ANALYZE {rows};\n"
        "  END IF;\n"
        "END"
    ).format(
        summary=summary,
        marked=marked,
        lock=lock,
        counters=counters,
        total=total,
        events=names.ident("event_table"),
        analyze_min=sql.Literal(ADMISSION_ANALYZE_MIN_ROWS),
        target=sql.Literal(str(ADMISSION_ANALYZE_STATISTICS_TARGET)),
        rows=rows,
    )
    return [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}(OUT taken_version bigint, OUT was_empty boolean) "
            "LANGUAGE plpgsql SECURITY DEFINER {} AS {}"
        ).format(begin, _PINNED, sql.Literal(begin_body.as_string(conn))),
        sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(begin),
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}() RETURNS bigint LANGUAGE sql STABLE "
            "SECURITY DEFINER {} AS {}"
        ).format(taken, _PINNED, sql.Literal(taken_body.as_string(conn))),
        sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(taken),
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}(run_id text, OUT taken_version bigint, "
            "OUT sheet_rows bigint) LANGUAGE plpgsql SECURITY DEFINER {} AS {}"
        ).format(finish, _PINNED, sql.Literal(finish_body.as_string(conn))),
        sql.SQL("REVOKE ALL ON FUNCTION {}(text) FROM PUBLIC").format(finish),
    ]


def guards_missing(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether a guard trigger, the clear function or an admission function is missing
    (a sheet made before they existed: ``ensure_sheet`` adds them)."""
    begin, taken, finish = admit_functions(names)
    row = conn.execute(
        "SELECT to_regprocedure(%(clear)s) IS NULL OR to_regprocedure(%(begin)s) IS NULL"
        " OR to_regprocedure(%(taken)s) IS NULL OR to_regprocedure(%(finish)s) IS NULL"
        " OR (SELECT count(*) FROM pg_trigger"
        " WHERE tgrelid = ANY(%(tables)s::regclass[]) AND tgname = ANY(%(triggers)s)) < %(n)s",
        {
            "clear": f"{clear_function(names).as_string(conn)}()",
            "begin": f"{begin.as_string(conn)}()",
            "taken": f"{taken.as_string(conn)}()",
            "finish": f"{finish.as_string(conn)}(text)",
            "tables": sorted({names.ident(attr).as_string(conn) for _, attr in FENCE_TRIGGERS}),
            "triggers": sorted({name for name, _ in FENCE_TRIGGERS}),
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
