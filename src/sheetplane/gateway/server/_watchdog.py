"""The reaper and the watchdog: the server's tasks that bound session roles after minting.

The reaper (:func:`run_reaper`) drops every session role whose ``VALID UNTIL``
has passed (``_roles.drop_role``) and expires abandoned staged admissions. The
watchdog (:func:`run_watchdog`) ends session backends past their time bounds,
past their org's connection budget, past their memory bound, or that ran
``LISTEN`` or ``NOTIFY``. Both log by exception type only and go on.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from typing import Any, Final

import attrs
import psycopg
import trio
from psycopg import sql

from ...budgets import org_connection_budget
from ...store import SheetStore
from ._roles import LEDGER, ROLE_PREFIX, SessionBounds, drop_role

__all__ = [
    "ReaperProgress",
    "backend_memory_readable",
    "end_backends_past_memory",
    "end_backends_past_org_budget",
    "end_notifying_backends",
    "end_overrunning_backends",
    "reap_expired_roles",
    "resolve_org_connection_budget",
    "run_reaper",
    "run_watchdog",
]

log = logging.getLogger("sheetplane.gateway.server")


@attrs.define(eq=False)
class ReaperProgress:
    """What the reaper and the watchdog have done; tests wait on it instead of sleeping."""

    passes: int = 0
    """Completed reaper passes."""
    dropped: int = 0
    """Roles dropped so far."""
    watchdog_passes: int = 0
    """Completed watchdog passes."""
    ended: int = 0
    """Session backends the watchdog ended so far (both kinds)."""
    over_budget: int = 0
    """Of those, backends ended because their org held more than its connection budget."""
    over_memory: int = 0
    """Of those, backends ended because their private memory passed its bound."""
    notifying: int = 0
    """Of those, backends ended because they ran LISTEN or NOTIFY."""
    memory_watch: bool = False
    """Whether the watchdog reads session backends' memory (``run_watchdog``)."""
    expired_admissions: int = 0
    """Abandoned staged admissions expired so far (their staging rows deleted)."""
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def record(self, dropped: int) -> None:
        """Count a finished reaper pass and wake everyone waiting for one."""
        self.passes += 1
        self.dropped += dropped
        self._wake()

    def record_watchdog(self, ended: int, over_budget: int = 0) -> None:
        """Count a finished watchdog pass: ``ended`` backends, ``over_budget`` of them
        for their org's connection budget."""
        self.watchdog_passes += 1
        self.ended += ended
        self.over_budget += over_budget
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for_pass(self, passes: int) -> None:
        """Return once at least ``passes`` reaper passes have completed."""
        while self.passes < passes:
            await self._changed.wait()

    async def wait_for_watchdog_pass(self, passes: int) -> None:
        """Return once at least ``passes`` watchdog passes have completed."""
        while self.watchdog_passes < passes:
            await self._changed.wait()

    async def wait_for_ended(self, ended: int) -> None:
        """Return once the watchdog has ended at least ``ended`` backends."""
        while self.ended < ended:
            await self._changed.wait()


def _expired_roles(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)"
        " AND rolvaliduntil IS NOT NULL AND rolvaliduntil <= now()"
        # Only roles this gateway may drop: a non-superuser gateway holds ADMIN
        # OPTION on the roles it created, not on another gateway's (roles are
        # the cluster's, shared by every database on it).
        " AND pg_has_role(oid, 'MEMBER WITH ADMIN OPTION') ORDER BY rolname",
        (ROLE_PREFIX,),
    ).fetchall()
    return [str(row[0]) for row in rows]


#: The transaction advisory lock one reaper pass holds, so that across every
#: worker and gateway process on a database one pass runs at a time and no two
#: drop the same role. Tenants cannot take it: the hardening revokes every
#: advisory-lock function from ``PUBLIC``.
_REAPER_LOCK_KEY: Final = int.from_bytes(
    hashlib.sha256(b"sheetplane-reaper").digest()[:8], "big", signed=True
)


def _reap(conn: psycopg.Connection[Any]) -> tuple[int, int] | None:
    """One pass in one transaction: (dropped, failed), or None when another pass holds the lock.

    Each role is dropped under its own savepoint, so one failure leaves the
    others dropped (the failed one is tried again next pass).
    """
    row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (_REAPER_LOCK_KEY,)).fetchone()
    if row is None or not row[0]:
        return None
    dropped = failed = 0
    for role in _expired_roles(conn):
        try:
            with conn.transaction():
                drop_role(conn, role)
        except psycopg.Error as exc:
            failed += 1
            log.warning("could not drop expired session role %s: %s", role, type(exc).__name__)
        else:
            dropped += 1
    # Rows of roles dropped some other way (by hand, or before the ledger existed).
    conn.execute(
        sql.SQL(
            "DELETE FROM {} AS l WHERE l.expires_at <= now()"
            " AND NOT EXISTS (SELECT FROM pg_roles WHERE rolname = l.role)"
        ).format(LEDGER)
    )
    return dropped, failed


async def reap_expired_roles(store: SheetStore) -> int:
    """Drop every session role whose ``VALID UNTIL`` has passed; return how many.

    Safe beside other reapers (other workers, other gateways on the database):
    a pass that finds another one running returns 0 at once. If cancelled, the
    pass rolls back whole and its roles stay for the next one.
    """
    outcome = await store.pool.run(_reap)
    if outcome is None:
        return 0
    dropped, failed = outcome
    log.info(
        "session role reaper pass: %d dropped, %d failed",
        dropped,
        failed,
        extra={"event": "reaper_pass", "dropped": dropped, "failed": failed},
    )
    return dropped


async def run_reaper(
    store: SheetStore,
    interval_ms: int,
    progress: ReaperProgress,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Reap expired roles every ``interval_ms`` until cancelled (the server's shutdown).

    A failing pass is logged by exception type only and the loop goes on.
    """
    task_status.started()
    while True:
        dropped = 0
        try:
            dropped = await reap_expired_roles(store)
        except Exception as exc:
            log.warning("session role reaper pass failed: %s", type(exc).__name__)
        try:
            # Staged admissions whose runner died: expired once idle, rows deleted.
            progress.expired_admissions += await store.sweep_admissions()
        except Exception as exc:
            log.warning("staged admission sweep failed: %s", type(exc).__name__)
        progress.record(dropped)
        await trio.sleep(interval_ms / 1000)


_OVERRUNNING = sql.SQL(
    """
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE starts_with(usename, %(prefix)s) AND pid <> pg_backend_pid() AND (
        (state = 'active' AND query_start < clock_timestamp() - %(statement)s)
        OR (state IN ('idle in transaction', 'idle in transaction (aborted)')
            AND state_change < clock_timestamp() - %(idle)s)
        OR xact_start < clock_timestamp() - %(transaction)s)
    """
)


async def end_overrunning_backends(store: SheetStore, bounds: SessionBounds, slack_ms: int) -> int:
    """Terminate every session backend past its bounds (plus ``slack_ms``); return how many.

    Postgres's own timeouts end a session that kept its role defaults first;
    this catches the ones that ``SET`` them away.
    """

    def after(ms: int) -> dt.timedelta:
        return dt.timedelta(milliseconds=ms + slack_ms)

    params = {
        "prefix": ROLE_PREFIX,
        "statement": after(bounds.statement_timeout_ms),
        "idle": after(bounds.idle_in_transaction_timeout_ms),
        "transaction": after(bounds.transaction_timeout_ms),
    }

    def run(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(_OVERRUNNING, params).fetchone()
        return int(row[0]) if row else 0

    return await store.pool.run(run)


#: Every session backend of an org past the org's first ``budget`` connections
#: (oldest first), ended: the newest connections are the excess, and the oldest
#: carry the work already under way.
_PAST_ORG_BUDGET = sql.SQL(
    """
    WITH session AS (
        SELECT a.pid, row_number() OVER (
            PARTITION BY l.org_id ORDER BY a.backend_start, a.pid) AS n
        FROM pg_stat_activity AS a JOIN {ledger} AS l ON l.role = a.usename
        WHERE a.pid <> pg_backend_pid())
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM session
    WHERE n > %(budget)s
    """
).format(ledger=LEDGER)


async def resolve_org_connection_budget(store: SheetStore, configured: int | None) -> int:
    """``configured``, or the budget ``org_connection_budget`` derives from the server.

    Reads ``max_connections``, ``superuser_reserved_connections`` and (Postgres
    16+) ``reserved_connections`` of the server the store is on.
    """
    if configured is not None:
        return configured

    def settings(conn: psycopg.Connection[Any]) -> tuple[int, int]:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int,"
            " current_setting('superuser_reserved_connections')::int"
            " + coalesce(current_setting('reserved_connections', true)::int, 0)"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    return org_connection_budget(*await store.pool.run(settings))


async def end_backends_past_org_budget(store: SheetStore, budget: int) -> int:
    """Terminate each org's newest session backends past ``budget``; return how many.

    Postgres bounds connections per role (``CONNECTION LIMIT``), not per group
    of roles, and an org holds many roles: this is the per-org bound.
    """

    def run(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(_PAST_ORG_BUDGET, {"budget": budget}).fetchone()
        return int(row[0]) if row else 0

    return await store.pool.run(run)


#: Every session backend whose private memory (``RssAnon`` of its process, read
#: on the database server through ``pg_read_file`` of ``/proc/<pid>/status``)
#: is past the bound, ended.
_PAST_MEMORY = sql.SQL(
    r"""
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
        SELECT a.pid, (regexp_match(
            pg_read_file('/proc/' || a.pid || '/status', true),
            'RssAnon:\s+(\d+) kB'))[1]::bigint * 1024 AS private
        FROM pg_stat_activity AS a
        WHERE starts_with(a.usename, %(prefix)s) AND a.pid <> pg_backend_pid()) AS m
    WHERE m.private > %(bound)s
    """
)


async def backend_memory_readable(store: SheetStore) -> bool:
    """Whether the gateway can read a backend's memory on the database server: it may
    ``pg_read_file`` (a superuser, or a member of ``pg_read_server_files``) and the
    server is Linux (``/proc``)."""

    def run(conn: psycopg.Connection[Any]) -> bool:
        try:
            with conn.transaction():
                row = conn.execute(
                    "SELECT pg_read_file('/proc/' || pg_backend_pid() || '/status', true)"
                    " ~ 'RssAnon:'"
                ).fetchone()
        except psycopg.Error:
            return False
        return bool(row and row[0])

    return await store.pool.run(run)


async def end_backends_past_memory(store: SheetStore, bound_bytes: int) -> int:
    """Terminate every session backend holding more than ``bound_bytes`` of private
    memory; return how many. What bounds ``SET work_mem`` (which no grant can
    refuse): its effect, measured."""

    def run(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(_PAST_MEMORY, {"prefix": ROLE_PREFIX, "bound": bound_bytes}).fetchone()
        return int(row[0]) if row else 0

    return await store.pool.run(run)


#: Every session backend whose last statement was a LISTEN or NOTIFY, ended: both
#: need no privilege (``pg_notify()`` is revoked, the commands cannot be), and a
#: channel is the whole database's, every org's.
_NOTIFYING = sql.SQL(
    r"""
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE starts_with(usename, %(prefix)s) AND pid <> pg_backend_pid()
      AND query ~* '(^|;)\s*(LISTEN|NOTIFY)\M'
    """
)


async def end_notifying_backends(store: SheetStore) -> int:
    """Terminate every session backend whose last statement was a ``LISTEN`` or
    ``NOTIFY``; return how many (docs/gateway.md says what this does not catch)."""

    def run(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(_NOTIFYING, {"prefix": ROLE_PREFIX}).fetchone()
        return int(row[0]) if row else 0

    return await store.pool.run(run)


async def run_watchdog(
    store: SheetStore,
    bounds: SessionBounds,
    interval_ms: int,
    progress: ReaperProgress,
    *,
    org_connections: int | None = None,
    memory_bytes: int | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """End overrunning session backends every ``interval_ms`` until cancelled.

    A backend is ended at most one interval (plus one interval of slack, so
    Postgres's own timeout wins when it still applies) after its bound. With
    ``org_connections``, each pass also ends every org's newest session
    backends past that many, so an org is over its budget for at most one
    interval (and one pass) at a time.
    """
    if memory_bytes is not None and not await backend_memory_readable(store):
        log.warning(
            "session backends' memory cannot be read on this database server (a "
            "superuser or pg_read_server_files, and /proc, are needed): it is not bounded",
            extra={"event": "memory_watch_off"},
        )
        memory_bytes = None
    progress.memory_watch = memory_bytes is not None
    task_status.started()
    while True:
        ended = over_budget = over_memory = notifying = 0
        try:
            ended = await end_overrunning_backends(store, bounds, interval_ms)
            if org_connections is not None:
                over_budget = await end_backends_past_org_budget(store, org_connections)
            if memory_bytes is not None:
                over_memory = await end_backends_past_memory(store, memory_bytes)
            notifying = await end_notifying_backends(store)
        except Exception as exc:
            log.warning("session watchdog pass failed: %s", type(exc).__name__)
        for count, what, event in (
            (ended, "past their time bounds", "session_time_bound"),
            (
                over_budget,
                f"past their org's budget of {org_connections} connections",
                "org_connection_budget",
            ),
            (over_memory, f"past {memory_bytes} bytes of private memory", "session_memory_bound"),
            (notifying, "that ran LISTEN or NOTIFY", "session_notify"),
        ):
            if count:
                log.warning(
                    "ended %d session backend(s) %s",
                    count,
                    what,
                    extra={"event": event, "ended": count},
                )
        progress.over_memory += over_memory
        progress.notifying += notifying
        progress.record_watchdog(ended + over_budget + over_memory + notifying, over_budget)
        await trio.sleep(interval_ms / 1000)
