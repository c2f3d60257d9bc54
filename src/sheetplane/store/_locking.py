"""The sheet's writer lock, and the one order in which every path takes its locks.

Every transaction that writes a sheet takes its locks in this order, and
takes nothing out of it (docs/store.md has the table of paths):

1. the org's DDL key (``pg_advisory_xact_lock``), only for DDL (``ensure_sheet``,
   ``ensure_receipts``, the plays table; all through ``_schema.ensure_ddl``);
   the gateway's role grants take their own grant key;
2. the sheet's writer lock: a table lock on the sheet's lock table, an empty
   table with no columns (and row-level security with no policy) that nothing
   else locks; a writing scoped role holds table-level ``UPDATE`` on it, which
   ``LOCK TABLE`` needs and which changes nothing there. ``exclusive``
   (``EXCLUSIVE`` mode) for admissions,
   append/upsert/replace and DDL on an existing sheet; ``shared`` (``ROW
   SHARE`` mode) for terminal writes, which therefore run side by side while
   an exclusive holder excludes them all. Plain reads (``ACCESS SHARE``)
   conflict with neither. Postgres queues table locks fairly: a waiting
   exclusive request holds back later shared ones, so a stream of terminal
   writes cannot starve an admission;
3. the rows table (the statements' own relation locks; ``ALTER TABLE``'s
   ``ACCESS EXCLUSIVE``, and the ``SHARE UPDATE EXCLUSIVE`` of an admission's
   ``ANALYZE``, only ever under the exclusive writer lock);
4. row locks on sheet rows, in ``_key COLLATE "C"`` order (terminal writes,
   which run side by side, lock the rows they decide on ``FOR UPDATE`` in that
   order, chunk after chunk);
5. the event row (an append; under the exclusive lock when it carries an
   idempotency key);
6. staged admissions: the admission's registry row (a chunk's record takes it
   ``FOR KEY SHARE`` by its foreign key, the chunk's byte reservation updates
   it; begin, commit, abort and expiry update it), then the staging counters
   (``_quotas``): the org's, the org's transaction row, the token's (no row
   shared between orgs: the total is the org counters read without a lock).
   A chunk takes no writer lock; sheet setup locks a live registry (only when
   it adds the quota columns and triggers to an older sheet) before the staging
   table, as a chunk does.

The counters take no row lock: the counting triggers only append to the
sheet's counter log (``_counters``), which has no key, so no statement waits
on another's counter row. Only a compaction deletes log rows, and it holds the
writer lock exclusively (at admission, or the reaper's ``NOWAIT`` try), so no
two compactions, and no compaction and writer, ever wait on each other there.

A transaction that only ever waits for locks later in this order than the
ones it holds cannot be part of a wait cycle, so none of these paths can
deadlock with another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from ._names import SheetNames

__all__ = ["SheetLockMode", "lock_sheet"]

SheetLockMode = Literal["exclusive", "shared"]

_MODES: dict[str, sql.SQL] = {
    "exclusive": sql.SQL("EXCLUSIVE"),
    "shared": sql.SQL("ROW SHARE"),
}


def lock_sheet(conn: psycopg.Connection[Any], names: SheetNames, mode: SheetLockMode) -> None:
    """Take the sheet's writer lock in ``mode`` until the transaction ends.

    ``LOCK TABLE`` in these modes needs table-level ``UPDATE`` on the lock
    table, which every writing role holds.
    """
    conn.execute(
        sql.SQL("LOCK TABLE {} IN {} MODE").format(names.ident("lock_table"), _MODES[mode])
    )
