"""Helpers for the store write tests: raw snapshots of a sheet's tables, read
straight from Postgres so a test sees what is really stored."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from sheetplane._types import SheetRef
from sheetplane.store import SheetStore, sheet_names
from sheetplane.store._counters import STATUS_COUNTER, column_counts, status_counts


async def snapshot(store: SheetStore, sheet: SheetRef) -> dict[str, Any]:
    """Every row (all columns), the summary row, the events, the column summary and
    the counters as a read sums them (base plus log)."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        def rows(table: str, order: str) -> list[tuple[Any, ...]]:
            return conn.execute(
                sql.SQL("SELECT * FROM {} ORDER BY {}").format(names.ident(table), sql.SQL(order))
            ).fetchall()

        return {
            "rows": rows("sheet_table", "_key"),
            "summary": rows("summary_table", "id"),
            "events": rows("event_table", "id"),
            "columns": rows("column_summary_table", "column_name"),
            "counters": (status_counts(conn, names), column_counts(conn, names)),
        }

    return await store.pool.run(run)


async def stored_rows(store: SheetStore, sheet: SheetRef) -> dict[str, dict[str, Any]]:
    """Rows by key, each a dict of every column, and of the two versions ``seq`` holds
    (as ``_write_version`` and ``_admitted_version``)."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
        cur = conn.execute(
            sql.SQL(
                "SELECT *, (seq).write_version AS _write_version, "
                "(seq).admitted_version AS _admitted_version FROM {}"
            ).format(names.ident("sheet_table"))
        )
        assert cur.description is not None
        fields = [column.name for column in cur.description]
        return {record[0]: dict(zip(fields, record, strict=True)) for record in cur.fetchall()}

    return await store.pool.run(run)


async def counters_match_rows(
    store: SheetStore, sheet: SheetRef
) -> tuple[dict[str, int], dict[str, int]]:
    """The summary counters (base plus log), and the same counters recomputed
    with ``GROUP BY _status``."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> tuple[dict[str, int], dict[str, int]]:
        stored = status_counts(conn, names)
        grouped = conn.execute(
            sql.SQL("SELECT _status, count(*) FROM {} GROUP BY _status").format(
                names.ident("sheet_table")
            )
        ).fetchall()
        recount = {"total": 0, "queued": 0, "running": 0, "completed": 0, "failed": 0}
        for status, count in grouped:
            recount[STATUS_COUNTER[status]] += count
            recount["total"] += count
        return stored, recount

    return await store.pool.run(run)


async def column_counts_match(
    store: SheetStore, sheet: SheetRef, columns: list[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """The non-null counts (column summary plus log), and the same counts recomputed."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> tuple[dict[str, int], dict[str, int]]:
        stored = column_counts(conn, names)
        recount = {}
        for column in columns:
            row = conn.execute(
                sql.SQL("SELECT count({}) FROM {}").format(
                    sql.Identifier(column), names.ident("sheet_table")
                )
            ).fetchone()
            assert row is not None
            recount[column] = row[0]
        return {c: stored.get(c, 0) for c in columns}, recount

    return await store.pool.run(run)


async def set_status(store: SheetStore, sheet: SheetRef, key: str, status: str) -> None:
    """Force a row's status (for states no store call produces, like ``stale``); the
    counting triggers keep the summary counters consistent."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> None:
        cur = conn.execute(
            sql.SQL("UPDATE {} SET _status = %s WHERE _key = %s").format(
                names.ident("sheet_table")
            ),
            (status, key),
        )
        assert cur.rowcount == 1

    await store.pool.run(run)
