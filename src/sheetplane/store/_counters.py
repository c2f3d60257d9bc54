"""Summary counters without a hot row: sharded counter rows, summed on read.

A sheet's status counters (``total``, ``queued``, ``running``, ``completed``,
``failed``) and its per-column non-null counts used to live in one summary
row (and one row per column) that every write updated, so every writer of a
sheet queued on those rows until the one before it committed. Now each write
adds its changes to rows of the counter table, keyed ``(kind, name, shard)``:
``kind`` is ``status`` or ``column``, ``name`` the counter or the column's sql
name, and ``shard`` one of ``SUMMARY_COUNTER_SHARDS``, drawn at random once per
transaction. Two writers collide only when they draw the same shard, and then
only for the last statement of the later one's transaction. A read sums the
shards and adds the base values still kept in the summary row and the column
summary table (a sheet written before the counter table existed keeps its
counts there), in one statement, so it sees one snapshot.

The counters stay exact and transactional: the changes commit or roll back
with the rows they count.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from ..budgets import SUMMARY_COUNTER_SHARDS
from ._schema import SheetNames

__all__ = ["STATUS_COUNTERS", "apply_deltas", "column_counts", "reset_counters", "status_counts"]

#: The status counters, in the summary table's column order.
STATUS_COUNTERS = ("total", "queued", "running", "completed", "failed")

_random = random.Random()


def apply_deltas(
    conn: psycopg.Connection[Any],
    names: SheetNames,
    status: Mapping[str, int],
    columns: Mapping[str, int] | None = None,
) -> None:
    """Add ``status`` (counter name -> change) and ``columns`` (sql name -> change
    of its non-null count) to the sheet's counters, inside the caller's transaction.

    The one way every write path moves counters. Call it once per transaction,
    after the rows are written: it takes the last locks of the lock order (one
    shard's counter rows, in ``(kind, name)`` order), so two transactions that
    draw the same shard wait for each other only at their very end, and never
    in a cycle. Zero changes are skipped; nothing at all runs when every
    change is zero. The caller must hold the sheet's writer lock (shared or
    exclusive).
    """
    changes = sorted(
        [("status", name, value) for name, value in status.items() if value]
        + [("column", name, value) for name, value in (columns or {}).items() if value]
    )
    if not changes:
        return
    unknown = [
        name for kind, name, _ in changes if kind == "status" and name not in STATUS_COUNTERS
    ]
    if unknown:
        raise ValueError(f"not status counters: {unknown!r}")
    shard = _random.randrange(SUMMARY_COUNTER_SHARDS)
    conn.execute(
        sql.SQL(
            "INSERT INTO {tbl} AS c (kind, name, shard, value) "
            "SELECT kind, name, %(shard)s, value "
            "FROM unnest(%(kinds)s::text[], %(names)s::text[], %(values)s::bigint[]) "
            "AS d(kind, name, value) ORDER BY kind, name "
            "ON CONFLICT (kind, name, shard) DO UPDATE SET value = c.value + EXCLUDED.value"
        ).format(tbl=names.ident("counter_table")),
        {
            "shard": shard,
            "kinds": [kind for kind, _, _ in changes],
            "names": [name for _, name, _ in changes],
            "values": [value for _, _, value in changes],
        },
    )


def reset_counters(conn: psycopg.Connection[Any], names: SheetNames) -> None:
    """Zero every counter (``replace_rows``); the caller holds the exclusive writer lock."""
    zeroes = sql.SQL(", ").join(
        sql.SQL("{} = 0").format(sql.Identifier(name)) for name in STATUS_COUNTERS
    )
    conn.execute(
        sql.SQL("UPDATE {} SET {}, updated_at = now() WHERE id").format(
            names.ident("summary_table"), zeroes
        )
    )
    conn.execute(sql.SQL("DELETE FROM {}").format(names.ident("column_summary_table")))
    conn.execute(sql.SQL("DELETE FROM {}").format(names.ident("counter_table")))


def status_counts(
    conn: psycopg.Connection[Any], names: SheetNames, *, shards: bool = True
) -> dict[str, int]:
    """The status counters: the summary row's base plus every shard (unless
    ``shards`` is False: a sheet without a counter table yet), zeros without a row."""
    base = sql.SQL(", ").join(
        sql.SQL("sum({})").format(sql.Identifier(name)) for name in STATUS_COUNTERS
    )
    parts = [
        sql.SQL("SELECT {} FROM {} WHERE id").format(
            sql.SQL(", ").join(sql.Identifier(name) for name in STATUS_COUNTERS),
            names.ident("summary_table"),
        )
    ]
    if shards:
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
    """Non-null counts by sql name: the column summary's base plus every shard."""
    rows = conn.execute(
        sql.SQL(
            "SELECT name, sum(value)::bigint FROM ("
            "  SELECT column_name AS name, non_null AS value FROM {colsum}"
            "  UNION ALL SELECT name, value FROM {counts} WHERE kind = 'column'"
            ") AS parts GROUP BY name"
        ).format(colsum=names.ident("column_summary_table"), counts=names.ident("counter_table"))
    ).fetchall()
    return {str(name): int(value) for name, value in rows}
