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

from ...budgets import DB_SESSION_LOGIN_TIMEOUT_MS, org_connection_budget
from ...store import SheetStore
from ._roles import LEDGER, ORG_BACKENDS, ROLE_PREFIX, SessionBounds, drop_role, retire_roles

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


#: Why the watchdog ended a backend: the metric's ``reason`` label, the progress
#: counter, and the log line's event and words.
REASONS: Final = {
    "time_bound": ("session_time_bound", "past their time bounds"),
    "orphan": ("session_orphan", "whose role no longer exists"),
    "unauthenticated": ("session_unauthenticated", "with no role past the login bound"),
    "parallel": ("session_parallel", "that ran a parallel query"),
    "org_budget": ("org_connection_budget", "past their org's connection budget"),
    "memory": ("session_memory_bound", "past their private memory bound"),
    "org_memory": ("org_memory_bound", "past their org's memory bound, newest first"),
    "notify": ("session_notify", "that ran LISTEN or NOTIFY"),
}


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
    """Session backends the watchdog ended so far (every reason)."""
    ended_by: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(REASONS, 0))
    """Of those, how many for each reason of ``REASONS``."""
    longest_pass_s: float = 0.0
    """The longest watchdog pass so far, in seconds: what a backend's bound may be
    late by, beyond its intervals, on this server as busy as it has been."""
    longest_statement_s: float = 0.0
    """How long the longest statement the watchdog ended for its time had run, in
    seconds (the database server's clock): at most its bound, the slack and one
    interval, and ``longest_pass_s``."""
    memory_watch: bool = False
    """Whether the watchdog reads session backends' memory (``run_watchdog``)."""
    expired_admissions: int = 0
    """Abandoned staged admissions expired so far (their staging rows deleted)."""
    _changed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def over_budget(self) -> int:
        """Backends ended because their org held more than its connection budget."""
        return self.ended_by["org_budget"]

    @property
    def over_memory(self) -> int:
        """Backends ended because their private memory passed its bound."""
        return self.ended_by["memory"]

    @property
    def notifying(self) -> int:
        """Backends ended because they ran LISTEN or NOTIFY."""
        return self.ended_by["notify"]

    def record(self, dropped: int) -> None:
        """Count a finished reaper pass and wake everyone waiting for one."""
        self.passes += 1
        self.dropped += dropped
        self._wake()

    def record_watchdog(self, ended: dict[str, int], seconds: float = 0.0) -> None:
        """Count a finished watchdog pass that took ``seconds`` and ended ``ended``
        backends (by reason)."""
        self.watchdog_passes += 1
        for reason, count in ended.items():
            self.ended_by[reason] += count
            self.ended += count
        self.longest_pass_s = max(self.longest_pass_s, seconds)
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


def _expired_roles(conn: psycopg.Connection[Any], *, can_login: bool) -> list[str]:
    rows = conn.execute(
        "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)"
        " AND rolvaliduntil IS NOT NULL AND rolvaliduntil <= now() AND rolcanlogin = %s"
        # Only roles this gateway may drop: a non-superuser gateway holds ADMIN
        # OPTION on the roles it created, not on another gateway's (roles are
        # the cluster's, shared by every database on it).
        " AND pg_has_role(oid, 'MEMBER WITH ADMIN OPTION') ORDER BY rolname",
        (ROLE_PREFIX, can_login),
    ).fetchall()
    return [str(row[0]) for row in rows]


#: The transaction advisory lock one reaper pass holds, so that across every
#: worker and gateway process on a database one pass runs at a time and no two
#: drop the same role. Tenants cannot take it: the hardening revokes every
#: advisory-lock function from ``PUBLIC``.
_REAPER_LOCK_KEY: Final = int.from_bytes(
    hashlib.sha256(b"sheetplane-reaper").digest()[:8], "big", signed=True
)


def _retire_expired(conn: psycopg.Connection[Any]) -> int:
    """NOLOGIN on every expired role that may still log in, committed before any is
    dropped: ``VALID UNTIL`` is checked only when a login begins, so a login begun
    before the expiry would otherwise get a backend of a role being dropped."""
    row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (_REAPER_LOCK_KEY,)).fetchone()
    if row is None or not row[0]:
        return 0  # another pass runs
    return len(retire_roles(conn, _expired_roles(conn, can_login=True)))


def _reap(conn: psycopg.Connection[Any]) -> tuple[int, int] | None:
    """One pass in one transaction: (dropped, failed), or None when another pass holds the lock.

    Each role (retired by ``_retire_expired`` in a committed transaction before)
    is dropped under its own savepoint, so one failure leaves the others dropped
    (the failed one is tried again next pass).
    """
    row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (_REAPER_LOCK_KEY,)).fetchone()
    if row is None or not row[0]:
        return None
    dropped = failed = 0
    for role in _expired_roles(conn, can_login=False):
        try:
            with conn.transaction():
                drop_role(conn, role)
        except psycopg.Error as exc:
            failed += 1
            log.warning("could not drop expired session role %s: %s", role, type(exc).__name__)
        else:
            dropped += 1
    # Rows of dropped roles (by the gateway, by hand, or before the ledger existed)
    # once no backend of theirs is left: until then the backends count against the org.
    conn.execute(
        sql.SQL(
            "DELETE FROM {} AS l WHERE l.expires_at <= now()"
            " AND NOT EXISTS (SELECT FROM pg_roles WHERE rolname = l.role)"
            " AND NOT EXISTS (SELECT FROM pg_stat_activity AS a WHERE a.usesysid = l.role_oid)"
        ).format(LEDGER)
    )
    return dropped, failed


async def reap_expired_roles(store: SheetStore) -> int:
    """Drop every session role whose ``VALID UNTIL`` has passed; return how many.

    Safe beside other reapers (other workers, other gateways on the database):
    a pass that finds another one running returns 0 at once. If cancelled, the
    pass rolls back whole and its roles stay for the next one.
    """
    await store.pool.run(_retire_expired)  # committed before the drops
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
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)),
        coalesce(max(extract(epoch FROM clock_timestamp() - query_start))
            FILTER (WHERE state = 'active'), 0)
    FROM pg_stat_activity
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
    return (await _end_overrunning(store, bounds, slack_ms))[0]


async def _end_overrunning(
    store: SheetStore, bounds: SessionBounds, slack_ms: int
) -> tuple[int, float]:
    """``end_overrunning_backends``, and how long the longest statement it ended had
    run (seconds, on the database server's clock; 0 when it ended none)."""

    def after(ms: int) -> dt.timedelta:
        return dt.timedelta(milliseconds=ms + slack_ms)

    params = {
        "prefix": ROLE_PREFIX,
        "statement": after(bounds.statement_timeout_ms),
        "idle": after(bounds.idle_in_transaction_timeout_ms),
        "transaction": after(bounds.transaction_timeout_ms),
    }

    def run(conn: psycopg.Connection[Any]) -> tuple[int, float]:
        row = conn.execute(_OVERRUNNING, params).fetchone()
        return (int(row[0]), float(row[1])) if row else (0, 0.0)

    return await store.pool.run(run)


#: Every session backend of an org past the org's first ``budget`` connections
#: (oldest first), ended: the newest connections are the excess, and the oldest
#: carry the work already under way.
_PAST_ORG_BUDGET = sql.SQL(
    """
    WITH session AS (
        SELECT a.pid, row_number() OVER (
            PARTITION BY a.org_id ORDER BY a.backend_start, a.pid) AS n
        FROM ({backends}) AS a)
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM session
    WHERE n > %(budget)s
    """
).format(backends=ORG_BACKENDS)


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
#: on the database server through ``pg_read_file`` of ``/proc/<pid>/status``) is
#: past the backend bound, ended; then, in each org, the backends (oldest first)
#: whose running total of the rest passes the org bound: the newest are ended.
_PAST_MEMORY = sql.SQL(
    r"""
    WITH m AS (
        SELECT a.pid, a.backend_start, l.org_id, coalesce((regexp_match(
            pg_read_file('/proc/' || a.pid || '/status', true),
            'RssAnon:\s+(\d+) kB'))[1]::bigint * 1024, 0) AS private
        FROM pg_stat_activity AS a LEFT JOIN {ledger} AS l ON l.role_oid = a.usesysid
        WHERE (starts_with(a.usename, %(prefix)s) OR l.org_id IS NOT NULL)
          AND a.pid <> pg_backend_pid()),
    r AS (
        SELECT pid, private, org_id, sum(
            CASE WHEN private > %(bound)s THEN 0 ELSE private END) OVER (
            PARTITION BY org_id ORDER BY backend_start, pid) AS running
        FROM m)
    SELECT
        count(*) FILTER (WHERE CASE WHEN private > %(bound)s
            THEN pg_terminate_backend(pid) ELSE false END),
        count(*) FILTER (WHERE CASE WHEN private <= %(bound)s AND org_id IS NOT NULL
            AND running > %(org_bound)s THEN pg_terminate_backend(pid) ELSE false END)
    FROM r
    """
).format(ledger=LEDGER)


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


async def end_backends_past_memory(
    store: SheetStore, bound_bytes: int, org_bound_bytes: int
) -> tuple[int, int]:
    """Terminate every session backend holding more than ``bound_bytes`` of private
    memory, then each org's newest backends past ``org_bound_bytes`` together;
    return how many of each. What bounds ``SET work_mem`` (which no grant can
    refuse): its effect, measured."""

    def run(conn: psycopg.Connection[Any]) -> tuple[int, int]:
        params = {"prefix": ROLE_PREFIX, "bound": bound_bytes, "org_bound": org_bound_bytes}
        row = conn.execute(_PAST_MEMORY, params).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    return await store.pool.run(run)


#: Client backends whose role no longer exists (a login that looked its role up in
#: the instant before its drop committed, or a role dropped outside the gateway):
#: nothing else bounds them, for every other rule finds a backend by its role.
_ORPHANED = sql.SQL(
    """
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity AS a
    WHERE a.backend_type IN ('client backend', 'parallel worker') AND a.usesysid IS NOT NULL
      AND a.pid <> pg_backend_pid()
      AND NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.oid = a.usesysid)
    """
)

#: Client backends still without a role past the login bound: a login stalled
#: in or after its authentication. Only a superuser may end them (Postgres treats
#: a backend with no role as a superuser's).
_UNAUTHENTICATED = sql.SQL(
    """
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE backend_type = 'client backend' AND usesysid IS NULL
      AND pid <> pg_backend_pid() AND backend_start < clock_timestamp() - %(login)s
    """
)

#: Session backends leading parallel workers, ended with their workers: a parallel
#: hash join's table lives in shared memory (1 GiB per process, 4 MiB private), which
#: the private-memory bound does not see. Session roles default to no parallel
#: workers (``max_parallel_workers_per_gather = 0``); only a role that raised it
#: gets one, and Postgres offers no setting a role cannot raise.
_PARALLEL = sql.SQL(
    """
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
        SELECT DISTINCT leader_pid AS pid FROM pg_stat_activity
        WHERE backend_type = 'parallel worker' AND starts_with(usename, %(prefix)s)
          AND leader_pid IS NOT NULL AND leader_pid <> pg_backend_pid()) AS p
    """
)


async def gateway_is_superuser(store: SheetStore) -> bool:
    """Whether the gateway's role is a superuser (it may end backends with no role)."""

    def run(conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        return bool(row and row[0])

    return await store.pool.run(run)


async def _count(
    store: SheetStore, statement: sql.SQL | sql.Composed, params: dict[str, Any]
) -> int:
    def run(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(statement, params).fetchone()
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
    return await _count(store, _NOTIFYING, {"prefix": ROLE_PREFIX})


async def run_watchdog(
    store: SheetStore,
    bounds: SessionBounds,
    interval_ms: int,
    progress: ReaperProgress,
    *,
    org_connections: int | None = None,
    memory_bytes: int | None = None,
    org_memory_bytes: int | None = None,
    login_timeout_ms: int = DB_SESSION_LOGIN_TIMEOUT_MS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """End session backends past their bounds every ``interval_ms`` until cancelled.

    Passes start ``interval_ms`` apart (a pass longer than that starts the next at
    once). A statement or transaction past its time bound is ended within two
    intervals and one pass of it (one interval of slack, so Postgres's own timeout
    wins when it still applies; ``progress.longest_pass_s`` is the pass). Each pass
    also ends backends whose role no longer exists, backends with no role past
    ``login_timeout_ms`` (a superuser gateway only), session backends leading
    parallel workers, and, with ``org_connections``, every org's newest session
    backends past that many; with ``memory_bytes`` (and ``org_memory_bytes``,
    default ``memory_bytes`` times a role's connection limit), backends past their
    private memory bound and each org's newest past the org's.
    """
    if memory_bytes is not None and not await backend_memory_readable(store):
        log.warning(
            "session backends' memory cannot be read on this database server (a "
            "superuser or pg_read_server_files, and /proc, are needed): it is not bounded",
            extra={"event": "memory_watch_off"},
        )
        memory_bytes = None
    progress.memory_watch = memory_bytes is not None
    superuser = await gateway_is_superuser(store)
    if memory_bytes is not None and org_memory_bytes is None:
        org_memory_bytes = memory_bytes * bounds.max_connections
    login = {"login": dt.timedelta(milliseconds=login_timeout_ms)}
    task_status.started()
    while True:
        started = trio.current_time()
        ended = dict.fromkeys(REASONS, 0)
        try:
            ended["time_bound"], ran = await _end_overrunning(store, bounds, interval_ms)
            progress.longest_statement_s = max(progress.longest_statement_s, ran)
            ended["orphan"] = await _count(store, _ORPHANED, {})
            if superuser:
                ended["unauthenticated"] = await _count(store, _UNAUTHENTICATED, login)
            ended["parallel"] = await _count(store, _PARALLEL, {"prefix": ROLE_PREFIX})
            if org_connections is not None:
                ended["org_budget"] = await end_backends_past_org_budget(store, org_connections)
            if memory_bytes is not None and org_memory_bytes is not None:
                ended["memory"], ended["org_memory"] = await end_backends_past_memory(
                    store, memory_bytes, org_memory_bytes
                )
            ended["notify"] = await end_notifying_backends(store)
        except Exception as exc:
            log.warning("session watchdog pass failed: %s", repr(exc))
        for reason, count in ended.items():
            if count:
                event, what = REASONS[reason]
                log.warning(
                    "ended %d session backend(s) %s",
                    count,
                    what,
                    extra={"event": event, "ended": count},
                )
        progress.record_watchdog(ended, trio.current_time() - started)
        await trio.sleep_until(started + interval_ms / 1000)
