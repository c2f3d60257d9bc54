"""Summary counters as a function of the rows: gateway-owned triggers, an append-only log.

A sheet's status counters (``total``, ``queued``, ``running``, ``completed``,
``failed``) and its per-column non-null counts are not written by any write
path. Statement-level ``AFTER INSERT``, ``UPDATE``, ``DELETE`` and
``TRUNCATE`` triggers on the sheet's rows table compute each statement's
changes from its transition tables (``REFERENCING OLD TABLE`` / ``NEW
TABLE``: ``count(*) FILTER`` by status, ``count(col)`` per column, new minus
old) and append the nonzero ones to the sheet's counter table, one row
``(kind, name, value)`` each. So every statement that changes rows, whichever
path runs it and as whichever role, moves the counters by exactly what it
changed, in its own transaction; nothing else can.

The trigger function (``count_trigger_ddl``) is generated per sheet with
``psycopg.sql`` (the columns it counts are the rows table's, read from the
catalog, regenerated whenever ``ensure_sheet`` adds a column, under the DDL
lock). It is ``SECURITY DEFINER``, owned by the tables' owner (the gateway's
or the store's role), with ``search_path = pg_catalog, pg_temp`` and every
table schema-qualified, and ``EXECUTE`` is revoked from ``PUBLIC``: a scoped
session role's own ``INSERT``/``UPDATE``/``DELETE`` on the rows fires it (firing
a trigger checks no ``EXECUTE`` privilege), but the role holds only
``SELECT`` on the counter, summary and column summary tables, cannot call
the function (Postgres refuses to call a trigger function outside a
trigger), cannot disable the triggers (that needs ownership) and cannot set
``session_replication_role`` (superuser only).

The counter table is an append-only log: no key, no upsert, so a trigger
takes no row lock and two writers never meet on a counter row. The one
exception is ``total``, which only inserts and deletes change: their status
changes go to the summary row instead (one ``UPDATE`` of it per statement that
inserted or deleted rows), so the row's ``total`` is the sheet's row count at
every commit, which the seed's runtime reads directly (``SELECT total FROM
<summary> WHERE play_name = $1 AND table_namespace = $2``). The store's own
inserting writers hold the writer lock exclusively anyway, so only the seed's
statements meet there; status changes (the terminal writes of many workers)
still go to the log. A read sums
the log and adds the base values an older sheet still keeps in the summary
row and the column summary table (``status_counts``, ``column_counts``, one
statement each, so one snapshot). The gateway compacts the log
(``compact_counters``: one statement that deletes the log's rows and inserts
their sums per counter) at every admission, under the exclusive writer lock,
and in the reaper's pass when a sheet's log is longer than
``COUNTER_LOG_COMPACT_ROWS`` (taking the writer lock with ``NOWAIT``, so it
never queues ahead of a writer), so a read sums a bounded number of rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from ..budgets import COUNTER_LOG_COMPACT_ROWS

if TYPE_CHECKING:
    from ._names import SheetNames

__all__ = [
    "COUNT_TRIGGERS",
    "STATUS_COUNTER",
    "STATUS_COUNTERS",
    "column_counts",
    "compact_counters",
    "compact_if_long",
    "count_trigger_ddl",
    "fold_status_log",
    "status_counts",
]

#: The status counters, in the summary table's column order.
STATUS_COUNTERS = ("total", "queued", "running", "completed", "failed")

#: Which summary counter a row status counts in (``queued`` holds pending and
#: stale; ``total`` counts every row).
STATUS_COUNTER: Mapping[str, str] = {
    "pending": "queued",
    "stale": "queued",
    "running": "running",
    "enriched": "completed",
    "failed": "failed",
}

#: The stored ``_status`` values each status counter but ``total`` counts.
_COUNTED: dict[str, tuple[str, ...]] = {
    counter: tuple(status for status, name in STATUS_COUNTER.items() if name == counter)
    for counter in STATUS_COUNTERS[1:]
}

#: The counting triggers on a sheet's rows table: (name, event, transition tables).
COUNT_TRIGGERS: tuple[tuple[str, str, str], ...] = (
    ("sheetplane_count_insert", "INSERT", "REFERENCING NEW TABLE AS sheetplane_new"),
    (
        "sheetplane_count_update",
        "UPDATE",
        "REFERENCING OLD TABLE AS sheetplane_old NEW TABLE AS sheetplane_new",
    ),
    ("sheetplane_count_delete", "DELETE", "REFERENCING OLD TABLE AS sheetplane_old"),
    ("sheetplane_count_truncate", "TRUNCATE", ""),
)


def _signed_rows(sources: Sequence[tuple[int, str]], columns: Sequence[str]) -> sql.Composable:
    """``SELECT sign, _status, (col IS NOT NULL)...`` over each transition table, UNION
    ALL; the flags are named by position (``f0``...), so no column name can clash."""
    flags = sql.SQL("").join(
        sql.SQL(", ({} IS NOT NULL) AS {}").format(sql.Identifier(name), sql.Identifier(f"f{i}"))
        for i, name in enumerate(columns)
    )
    return sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT {sign} AS s, _status{flags} FROM {table}").format(
            sign=sql.Literal(sign), flags=flags, table=sql.Identifier(table)
        )
        for sign, table in sources
    )


def _log_deltas(
    names: SheetNames,
    sources: Sequence[tuple[int, str]],
    columns: Sequence[str],
    *,
    base: bool = False,
) -> sql.Composable:
    """The statement that appends the nonzero signed sums over ``sources`` to the log.

    With ``base`` (an insert or a delete: the statements that change ``total``),
    the status sums are added to the summary row instead, in the same statement,
    so the row's ``total`` is the sheet's row count at every commit (the seed's
    runtime reads it there); only the columns' sums go to the log.
    """
    aggregates: list[sql.Composable] = [sql.SQL("sum(s)")]
    aggregates += [
        sql.SQL("sum(s) FILTER (WHERE _status IN ({}))").format(
            sql.SQL(", ").join(map(sql.Literal, _COUNTED[name]))
        )
        for name in STATUS_COUNTERS[1:]
    ]
    aggregates += [
        sql.SQL("sum(s) FILTER (WHERE {})").format(sql.Identifier(f"f{i}"))
        for i in range(len(columns))
    ]
    labels = [("status", name) for name in STATUS_COUNTERS] + [("column", n) for n in columns]
    indexed = list(enumerate(labels))
    if base:
        indexed = indexed[len(STATUS_COUNTERS) :]
    values = sql.SQL(", ").join(
        sql.SQL("({}, {}, n.{})").format(
            sql.Literal(kind), sql.Literal(name), sql.Identifier(f"c{index}")
        )
        for index, (kind, name) in indexed
    )
    sums = sql.SQL("(SELECT {aggregates} FROM ({rows}) AS r)").format(
        aggregates=sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(agg, sql.Identifier(f"c{index}"))
            for index, agg in enumerate(aggregates)
        ),
        rows=_signed_rows(sources, columns),
    )
    log = sql.SQL(
        "INSERT INTO {log} (kind, name, value) SELECT d.kind, d.name, d.value "
        "FROM {n} AS n "
        "CROSS JOIN LATERAL (VALUES {values}) AS d(kind, name, value) WHERE d.value <> 0"
    )
    if not base:
        return log.format(log=names.ident("counter_table"), n=sums, values=values)
    deltas = [
        (sql.Identifier(name), sql.SQL("coalesce(n.{}, 0)").format(sql.Identifier(f"c{index}")))
        for index, name in enumerate(STATUS_COUNTERS)
    ]
    update = sql.SQL("UPDATE {summary} AS s SET {sets} FROM n WHERE s.id AND ({changed})").format(
        summary=names.ident("summary_table"),
        sets=sql.SQL(", ").join(
            sql.SQL("{c} = s.{c} + {d}").format(c=column, d=delta) for column, delta in deltas
        ),
        changed=sql.SQL(" OR ").join(sql.SQL("{} <> 0").format(d) for _, d in deltas),
    )
    if not columns:
        return sql.SQL("WITH n AS {n} {update}").format(n=sums, update=update)
    return sql.SQL("WITH n AS {n}, base AS ({update} RETURNING 1) {log}").format(
        n=sums,
        update=update,
        log=log.format(log=names.ident("counter_table"), n=sql.SQL("n"), values=values),
    )


def _cancel_all(names: SheetNames) -> sql.Composable:
    """After a ``TRUNCATE``: zero the summary row's status counters and append the
    negation of every other counter (the log's, and the column summary's base)."""
    return sql.SQL(
        "UPDATE {summary} SET {zeros} WHERE id; "
        "INSERT INTO {log} (kind, name, value) SELECT kind, name, -sum(value) FROM ({parts}) AS p "
        "GROUP BY kind, name HAVING sum(value) <> 0"
    ).format(
        summary=names.ident("summary_table"),
        zeros=sql.SQL(", ").join(
            sql.SQL("{} = 0").format(sql.Identifier(name)) for name in STATUS_COUNTERS
        ),
        log=names.ident("counter_table"),
        parts=sql.SQL(
            "SELECT 'column' AS kind, column_name AS name, non_null AS value FROM {colsum} "
            "UNION ALL SELECT kind, name, value FROM {log}"
        ).format(colsum=names.ident("column_summary_table"), log=names.ident("counter_table")),
    )


def fold_status_log(names: SheetNames) -> sql.Composed:
    """Move the log's status entries into the summary row (sum unchanged): a sheet
    whose inserts and deletes counted in the log before they counted in the row.
    Run under the exclusive writer lock."""
    return sql.SQL(
        "WITH moved AS (DELETE FROM {log} WHERE kind = 'status' RETURNING name, value), "
        "sums AS (SELECT {sums} FROM moved) "
        "UPDATE {summary} AS s SET {sets} FROM sums WHERE s.id"
    ).format(
        log=names.ident("counter_table"),
        summary=names.ident("summary_table"),
        sums=sql.SQL(", ").join(
            sql.SQL("coalesce(sum(value) FILTER (WHERE name = {}), 0) AS {}").format(
                sql.Literal(name), sql.Identifier(name)
            )
            for name in STATUS_COUNTERS
        ),
        sets=sql.SQL(", ").join(
            sql.SQL("{c} = s.{c} + sums.{c}").format(c=sql.Identifier(name))
            for name in STATUS_COUNTERS
        ),
    )


def count_trigger_ddl(
    conn: psycopg.Connection[Any], names: SheetNames, columns: Sequence[str]
) -> list[sql.Composed]:
    """The statements that (re)create the sheet's counting function and triggers,
    counting ``columns`` (the rows table's physical columns). Run by the tables'
    owner under the DDL lock and the exclusive writer lock."""
    new, old = "sheetplane_new", "sheetplane_old"
    body = sql.SQL(
        "BEGIN\n"
        "  IF TG_OP = 'INSERT' THEN {insert};\n"
        "  ELSIF TG_OP = 'UPDATE' THEN {update};\n"
        "  ELSIF TG_OP = 'DELETE' THEN {delete};\n"
        "  ELSE {truncate};\n"
        "  END IF;\n"
        "  RETURN NULL;\n"
        "END"
    ).format(
        insert=_log_deltas(names, [(1, new)], columns, base=True),
        update=_log_deltas(names, [(1, new), (-1, old)], columns),
        delete=_log_deltas(names, [(-1, old)], columns, base=True),
        truncate=_cancel_all(names),
    )
    function = sql.Identifier(names.schema, names.count_function)
    rows = names.ident("sheet_table")
    statements: list[sql.Composed] = [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql "
            "SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS {body}"
        ).format(fn=function, body=sql.Literal(body.as_string(conn))),
        sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(function),
    ]
    for trigger, event, referencing in COUNT_TRIGGERS:
        statements += [
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(trigger), rows),
            sql.SQL(
                "CREATE TRIGGER {trigger} AFTER {event} ON {rows} {referencing} "
                "FOR EACH STATEMENT EXECUTE FUNCTION {fn}()"
            ).format(
                trigger=sql.Identifier(trigger),
                event=sql.SQL(event),
                rows=rows,
                referencing=sql.SQL(referencing),
                fn=function,
            ),
        ]
    return statements


def compact_counters(conn: psycopg.Connection[Any], names: SheetNames) -> None:
    """Replace the log's rows by one row per counter holding their sum (none for 0).

    One statement, so one snapshot: rows other transactions append meanwhile
    are not seen and stay. The caller holds the sheet's writer lock
    exclusively, so two compactions never delete the same rows.
    """
    conn.execute(
        sql.SQL(
            "WITH moved AS (DELETE FROM {log} RETURNING kind, name, value) "
            "INSERT INTO {log} (kind, name, value) SELECT kind, name, sum(value) FROM moved "
            "GROUP BY kind, name HAVING sum(value) <> 0"
        ).format(log=names.ident("counter_table"))
    )


def compact_if_long(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """The reaper's compaction: when the log holds more than ``COUNTER_LOG_COMPACT_ROWS``
    rows, take the writer lock exclusively with ``NOWAIT`` and compact. Returns
    whether it compacted; raises ``psycopg.errors.LockNotAvailable`` (the
    caller's transaction is then aborted) when a writer holds the lock."""
    long = conn.execute(
        sql.SQL("SELECT count(*) > %s FROM (SELECT FROM {} LIMIT %s) AS l").format(
            names.ident("counter_table")
        ),
        (COUNTER_LOG_COMPACT_ROWS, COUNTER_LOG_COMPACT_ROWS + 1),
    ).fetchone()
    if long != (True,):
        return False
    conn.execute(
        sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE NOWAIT").format(names.ident("lock_table"))
    )
    compact_counters(conn, names)
    return True


def status_counts(
    conn: psycopg.Connection[Any], names: SheetNames, *, log: bool = True
) -> dict[str, int]:
    """The status counters: the summary row's base plus the log (unless ``log`` is
    False: a sheet without a counter table yet), zeros without a row."""
    base = sql.SQL(", ").join(
        sql.SQL("sum({})").format(sql.Identifier(name)) for name in STATUS_COUNTERS
    )
    parts = [
        sql.SQL("SELECT {} FROM {} WHERE id").format(
            sql.SQL(", ").join(sql.Identifier(name) for name in STATUS_COUNTERS),
            names.ident("summary_table"),
        )
    ]
    if log:
        parts.append(
            sql.SQL("SELECT {} FROM {} WHERE kind = 'status'").format(
                sql.SQL(", ").join(
                    sql.SQL("CASE WHEN name = {} THEN value ELSE 0 END").format(sql.Literal(name))
                    for name in STATUS_COUNTERS
                ),
                names.ident("counter_table"),
            )
        )
    row = conn.execute(
        sql.SQL("SELECT {} FROM ({}) AS parts").format(base, sql.SQL(" UNION ALL ").join(parts))
    ).fetchone()
    assert row is not None
    return {name: int(value or 0) for name, value in zip(STATUS_COUNTERS, row, strict=True)}


def column_counts(conn: psycopg.Connection[Any], names: SheetNames) -> dict[str, int]:
    """Non-null counts by sql name: the column summary's base plus the log."""
    rows = conn.execute(
        sql.SQL(
            "SELECT name, sum(value)::bigint FROM ("
            "  SELECT column_name AS name, non_null AS value FROM {colsum}"
            "  UNION ALL SELECT name, value FROM {counts} WHERE kind = 'column'"
            ") AS parts GROUP BY name"
        ).format(colsum=names.ident("column_summary_table"), counts=names.ident("counter_table"))
    ).fetchall()
    return {str(name): int(value) for name, value in rows}
