"""The privileges a scoped session role is granted, per operation, on one sheet's tables.

They mirror the schema (``_schema``, ``_seedlayout``, ``_shares``): a role gets
``USAGE`` on the org's schema (granted by the gateway) and only what the
requested operations need, on only that sheet's tables:

==================  ==========================================================
operation           privileges
==================  ==========================================================
``rows.read``       sheet: SELECT; summary, column summary, counters: SELECT
``rows.append``     sheet: SELECT, INSERT by column
``rows.upsert``     sheet: SELECT, INSERT and UPDATE by column
``rows.replace``    as ``rows.upsert``, DELETE, and EXECUTE on the clear function
``rows.admit``      sheet: SELECT, INSERT by column with ``seq`` (the row's
                    write and admitted versions); EXECUTE on the sheet's admission
                    functions (the direct road's admission in one transaction)
``rows.stage``      the chunk table: INSERT by column; the staging table: INSERT
``rows.claim``      EXECUTE on the sheet's share functions
==================  ==========================================================

The rows are granted by column (``_sheet_grants``): never ``seq`` (the row's
write and admitted versions) or the other columns only admissions set (but to
``rows.admit``, whose rows the admit guard holds to the version its own
transaction took), and no table-level UPDATE; only
``rows.replace`` holds DELETE (the seed's replace deletes the rows itself:
docs/gateway.md states what that lets through). The guard triggers of
``_guards`` refuse the status changes and events the fence decides.

Every write operation also gets what the store's write path and the seed's
direct-road statements touch besides the sheet table, column by column:
SELECT and INSERT on the event table (the store's columns and the seed's
per-row ones) with USAGE on the event id sequence, INSERT and UPDATE of the
seed's columns on the summary (its upsert after each write; the summary's
guard drops them), ``rows.replace`` DELETE on the event and column summary
tables (the seed's replace), and table-level UPDATE on the sheet's lock
table, an empty table without columns whose table lock is the sheet's writer
lock (``LOCK TABLE`` needs table-level UPDATE, which changes nothing there).
No role writes a counter, the summary's ``write_version`` (which only the
gateway's admissions move) or a column summary: the counters move by the
sheet's counting triggers (``_counters``), functions owned by the gateway
that count what each statement changed in the rows, whoever ran it. Nothing
else: no other sheet, no receipts, no TRUNCATE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from psycopg import sql

from ._guards import admit_functions, clear_function
from ._names import SheetNames
from ._seedlayout import SEED_EVENT_COLUMNS, SEED_SUMMARY_COLUMNS
from ._shares import share_signatures

__all__ = ["ROW_WRITES", "session_grants"]

Privilege = Literal["SELECT", "INSERT", "UPDATE", "DELETE"]

_SHEET_PRIVILEGES: Final[dict[str, frozenset[Privilege]]] = {
    "rows.read": frozenset({"SELECT"}),
    "rows.append": frozenset({"SELECT", "INSERT"}),
    "rows.upsert": frozenset({"SELECT", "INSERT", "UPDATE"}),
    "rows.replace": frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"}),
    "rows.admit": frozenset({"SELECT", "INSERT"}),
    "rows.stage": frozenset(),
    "rows.claim": frozenset(),
}
#: Operations that write the sheet's rows (and so its events and counters).
ROW_WRITES: Final = frozenset({"rows.append", "rows.upsert", "rows.replace"})
#: What ``rows.stage`` inserts into the chunk table (``created_at`` is the server's).
_CHUNK_INSERT_COLUMNS: Final = ("admission_id", "seq", "first_position", "row_count")


#: What the store's write path inserts into the event table, by column, so no
#: scoped role can forge the events' ``id`` and ``created_at``.
_EVENT_INSERT_COLUMNS: Final = ("kind", "run_id", "write_version", "idempotency_key", "row_count")

#: A privilege on a whole table (``()``) or on the named columns only.
Grant = tuple[Privilege, tuple[str, ...]]


#: The rows' system columns a direct write inserts (status and version take their
#: defaults, 'pending' and 0), and those a write's UPDATE sets: a fenced terminal
#: write (status, run id, error, cell meta) and an upsert's merge (status, for a
#: stale row reopened). ``seq`` (the versions), ``_key`` (on
#: UPDATE), ``_input_index`` (on UPDATE), ``_created_at``, ``_stage`` and
#: ``_provider`` are the gateway's only. The contract's columns are added to both.
_ROW_INSERT_COLUMNS: Final = ("_key", "_status", "_run_id", "_input_index")
#: What only ``rows.admit`` inserts besides (held to its own version by the admit guard).
_ROW_VERSION_COLUMNS: Final = ("seq",)
_ROW_UPDATE_COLUMNS: Final = (
    "_status",
    "_run_id",
    "_error",
    "_updated_at",
    "_cell_meta",
    "_input_index",
)
#: The summary's counters the seed's statements update (its upsert after each
#: write, its replace's reset): the guards drop both (``store._guards``).
_SUMMARY_UPDATE_COLUMNS: Final = (
    "total",
    "queued",
    "running",
    "completed",
    "failed",
    "_updated_at",
)


def _sheet_grants(
    sheet: set[Privilege], columns: Sequence[str], *, admits: bool = False
) -> list[Grant]:
    """The rows table's grants: SELECT on the table, INSERT and UPDATE by column.

    No table-level UPDATE or DELETE: either lets ``LOCK TABLE ... IN ACCESS
    EXCLUSIVE MODE`` through (Postgres checks table-level privileges only for
    it), which would hold every reader of the sheet. ``rows.replace`` deletes
    through the sheet's clear function instead (``store._guards``), and the
    guard triggers refuse the status changes and events the fence decides.
    """
    grants: list[Grant] = [("SELECT", ())] if "SELECT" in sheet else []
    if "INSERT" in sheet:
        # rows.admit: the write version and the admitted version too (the admit guard).
        stamped = _ROW_VERSION_COLUMNS if admits else ()
        grants.append(("INSERT", (*_ROW_INSERT_COLUMNS, *stamped, *columns)))
    if "UPDATE" in sheet:
        grants.append(("UPDATE", (*_ROW_UPDATE_COLUMNS, *columns)))
    if "DELETE" in sheet:
        # The seed's replace deletes every row itself (``DELETE FROM <rows>``).
        grants.append(("DELETE", ()))
    return grants


def _function_grants(names: SheetNames, operations: Sequence[str]) -> list[sql.Composed]:
    """``rows.replace``'s EXECUTE on the sheet's clear function (no DELETE on the rows),
    and ``rows.claim``'s on the sheet's share functions (no privilege on the shares
    table: a claim is for the sheet's current attempt, a renewal or release needs the
    share's token, ``store/_shares.py``)."""
    grants = []
    if "rows.replace" in operations:
        grants.append(sql.SQL("GRANT EXECUTE ON FUNCTION {}()").format(clear_function(names)))
    if "rows.admit" in operations:
        # The writer lock and the version are taken, and the admission's event
        # recorded, by the gateway's functions (``_guards.admit_ddl``).
        begin, taken, finish = admit_functions(names)
        grants += [
            sql.SQL("GRANT EXECUTE ON FUNCTION {}()").format(begin),
            sql.SQL("GRANT EXECUTE ON FUNCTION {}()").format(taken),
            sql.SQL("GRANT EXECUTE ON FUNCTION {}(text)").format(finish),
        ]
    if "rows.claim" in operations:
        grants += [
            sql.SQL("GRANT EXECUTE ON FUNCTION {}").format(signature)
            for signature in share_signatures(names)
        ]
    return grants


def _grants(
    names: SheetNames, operations: Sequence[str], columns: Sequence[str] = ()
) -> list[tuple[str, list[Grant]]]:
    """``[(table attribute, grants)]`` for ``operations``, in a stable order;
    ``columns`` are the sheet's contract columns (the rows table's physical ones)."""
    sheet: set[Privilege] = set()
    for op in operations:
        sheet |= _SHEET_PRIVILEGES[op]
    tables: dict[str, list[Grant]] = {
        "sheet_table": _sheet_grants(sheet, columns, admits="rows.admit" in operations),
        "summary_table": [("SELECT", ())],
        "column_summary_table": [("SELECT", ())],
        "counter_table": [("SELECT", ())],
        # The sheet's column ids and logical names (kept out of catalog comments).
        "meta_table": [("SELECT", ())],
    }
    if not tables["sheet_table"]:
        del tables["sheet_table"]
    if "rows.stage" in operations:
        # Staged admission's chunks: record the chunk (ON CONFLICT DO NOTHING needs
        # INSERT only; its foreign key is checked as the table owner), COPY the rows.
        # Nothing to read, nothing on the sheet's rows: the commit is the gateway's.
        tables["stage_chunks_table"] = [("INSERT", _CHUNK_INSERT_COLUMNS)]
        tables["staging_table"] = [("INSERT", ())]
    if any(op in ROW_WRITES for op in operations):
        # Idempotency keys: the write path reads them and records its own event; the
        # seed's statements record one event per row, by its own columns.
        tables["event_table"] = [
            ("SELECT", ()),
            ("INSERT", (*_EVENT_INSERT_COLUMNS, *SEED_EVENT_COLUMNS)),
        ]
        # The seed's summary upsert (and replace's reset): inserted and updated by
        # column, dropped by the summary's guard (the counting triggers keep it).
        tables["summary_table"] = [
            ("SELECT", ()),
            ("INSERT", SEED_SUMMARY_COLUMNS),
            ("UPDATE", _SUMMARY_UPDATE_COLUMNS),
        ]
        if "rows.replace" in operations:
            # The seed's replace clears its per-row events and the column summary's
            # rows of its play (the guards let only those go).
            tables["event_table"].append(("DELETE", ()))
            tables["column_summary_table"] = [("SELECT", ()), ("DELETE", ())]
        # The writer lock is LOCK TABLE on the lock table (table-level UPDATE, on a
        # table with no rows, no columns and no INSERT grant). Counters: SELECT only;
        # the gateway-owned counting triggers move them.
        tables["lock_table"] = [("UPDATE", ())]
    return list(tables.items())


def _grant_sql(grant: Grant) -> sql.Composable:
    privilege, columns = grant
    if not columns:
        return sql.SQL(privilege)
    return sql.SQL("{} ({})").format(
        sql.SQL(privilege), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )


def session_grants(
    role: sql.Identifier, names: SheetNames, operations: Sequence[str], columns: Sequence[str] = ()
) -> list[sql.Composed]:
    """The ``GRANT`` statements that give ``role`` what ``operations`` need on the sheet
    ``names`` (its tables, then its functions); ``columns`` are the sheet's contract
    columns, granted by name."""
    statements = [
        sql.SQL("GRANT {privileges} ON TABLE {table} TO {role}").format(
            privileges=sql.SQL(", ").join(_grant_sql(g) for g in grants),
            table=names.ident(attr),
            role=role,
        )
        for attr, grants in _grants(names, operations, columns)
    ]
    statements += [
        sql.SQL("{} TO {}").format(grant, role) for grant in _function_grants(names, operations)
    ]
    return statements
