"""A psycopg connection pool driven from trio.

psycopg's async API is asyncio-only, so sheetplane runs the sync driver
(``psycopg_pool.ConnectionPool``) on trio worker threads. One
``trio.CapacityLimiter`` per pool, sized like the pool, admits callers: a
caller holds one token from before it asks for a connection until its worker
thread has really finished (even if the caller was cancelled and stopped
waiting), so the pool never has more threads working on it than connections.

Each ``run(fn)`` takes a connection, runs ``fn(conn)`` inside one transaction
on a worker thread, and gives the connection back. Every connection carries
``statement_timeout`` and ``TimeZone=UTC``. Connects retry on transient errors
along a delay ladder. Errors leave as ``StoreError`` subclasses with the cause
kept and the URL's password (and any other secret of the URL) redacted. Every
error leaves the worker thread without its frames (``sheetplane._threads``:
the traceback kept as a note), so the rows ``fn`` was given or read go when
the thread finishes, whoever keeps the error.

Cancellation reaches Postgres: a cancelled caller sends a cancel request for
the running statement (``Connection.cancel_safe``), re-sending it until the
worker thread returns, then waits for that thread; the transaction is rolled
back, and the connection goes back to the pool only if it is clean (idle),
else it is closed.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import outcome
import psycopg
import trio
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import _tracing, budgets
from .._ints import check_int, is_int
from .._json import decode_body
from .._redact import Redactor
from .._threads import call_frameless, frameless, unwrap
from ..errors import (
    ConnectionSlotsExhaustedError,
    InvalidInputError,
    PoolSaturatedError,
    StatementTimeoutError,
    StoreError,
    StoreUnavailableError,
    TransactionConflictError,
)

__all__ = [
    "ConnectionRunner",
    "PoolSaturatedError",
    "TrioPool",
    "is_login_refused",
    "is_slot_exhaustion",
    "is_transient_connect_error",
    "next_connect_delay_ms",
    "open_pool",
]

T = TypeVar("T")
Conn = psycopg.Connection[Any]


log = logging.getLogger("sheetplane.store")

#: The name of every pool this module opens (psycopg_pool's logs carry it).
_POOL_NAME = "sheetplane"


class _QuietConnectWarnings(logging.Filter):
    """Drops psycopg_pool's warning per failed connect attempt of this module's pools.

    While Postgres is down each pool's background connector logs one warning
    per attempt (and one more when it gives up): with a runner's several
    session pools that flooded stderr. The failure reaches the caller as
    ``StoreUnavailableError`` with the real wait, and each pool logs one
    warning of its own per outage (``sheetplane.store``) instead.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            isinstance(args, tuple)
            and args
            and args[0] == _POOL_NAME
            and isinstance(record.msg, str)
            and record.msg.startswith(("error connecting in", "reconnection attempt in pool"))
        )


logging.getLogger("psycopg.pool").addFilter(_QuietConnectWarnings())


# --- transient errors and redaction ------------------------------------------------------

_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "08000", "08001", "08006"})
#: Aborts that say nothing about the transaction itself: run it again.
_CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})
_TRANSIENT_ERRNOS = frozenset({errno.ECONNRESET, errno.ETIMEDOUT, errno.ECONNREFUSED})
_TRANSIENT_MESSAGE = re.compile(
    r"ECONNRESET|ETIMEDOUT|ECONNREFUSED|connection refused|connection reset|timed out"
    r"|timeout expired|connection (?:terminated|timeout|closed|reset)"
    r"|server closed the connection unexpectedly|the database system is (?:starting|shutting)",
    re.IGNORECASE,
)


#: A server out of connection slots (SQLSTATE 53300, and the texts it sends
#: before a session exists, when psycopg may not carry the SQLSTATE).
_SLOTS_MESSAGE = re.compile(
    r"remaining connection slots are reserved|too many connections|sorry, too many clients",
    re.IGNORECASE,
)


def is_slot_exhaustion(exc: BaseException) -> bool:
    """Whether a connect was refused for lack of connection slots: back-pressure."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate == "53300":
        return True
    return isinstance(exc, psycopg.OperationalError) and bool(_SLOTS_MESSAGE.search(str(exc)))


#: A login the server refused: a wrong password, or a role that does not exist
#: (any more), has expired or was retired (``NOLOGIN``, by the gateway's reclaim)
#: (SQLSTATE 28P01 / 28000; and the texts, for connects that fail before psycopg
#: carries a SQLSTATE).
_LOGIN_REFUSED_SQLSTATES = frozenset({"28P01", "28000"})
_LOGIN_REFUSED_MESSAGE = re.compile(
    r"password authentication failed|role \"[^\"]*\" does not exist"
    r"|role \"[^\"]*\" is not permitted to log in",
    re.IGNORECASE,
)


def is_login_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or the error it was raised from) is a login the server
    refused: a wrong password, or a role that is gone or expired. Never transient
    for the URL that met it; for a scoped session it means the session is gone."""
    for error in (exc, exc.__cause__):
        if not isinstance(error, psycopg.Error | OSError):
            continue
        if getattr(error, "sqlstate", None) in _LOGIN_REFUSED_SQLSTATES:
            return True
        if isinstance(error, psycopg.OperationalError) and _LOGIN_REFUSED_MESSAGE.search(
            str(error)
        ):
            return True
    return False


def next_connect_delay_ms(
    exc: BaseException, failures: int, elapsed_ms: float, delays_ms: Sequence[int], budget_ms: int
) -> int | None:
    """The wait before the next connect attempt after ``failures`` failed ones, or None to stop.

    Transient errors (refused, reset, timed out, 57P01, and a refusal for lack
    of slots, which is back-pressure) take the ladder ``delays_ms``, one
    attempt per rung, and then go on at its last delay for as long as the
    whole connect budget (``budget_ms``, the ladder's attempts at their
    timeout plus its delays) allows: a refused connect returns at once, so the
    rungs alone would be spent in a couple of seconds, less than a restart
    takes. Anything else stops at once, and so does a wait that would end past
    the budget. An empty ladder makes one attempt.
    """
    if not _worth_retrying(exc) or not delays_ms:
        return None
    delay = delays_ms[min(failures, len(delays_ms)) - 1]
    return delay if elapsed_ms + delay < budget_ms else None


def _worth_retrying(exc: BaseException) -> bool:
    return is_slot_exhaustion(exc) or is_transient_connect_error(exc)


def is_transient_connect_error(exc: BaseException) -> bool:
    """Whether a connect failure is worth another attempt (refused, reset, timed out, 57P01)."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate in _TRANSIENT_SQLSTATES:
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    if isinstance(exc, pg_errors.ConnectionTimeout):
        return True
    return isinstance(exc, psycopg.OperationalError | OSError) and bool(
        _TRANSIENT_MESSAGE.search(str(exc))
    )


def server_of(url: str) -> str:
    """``host:port`` (or the socket directory) of a Postgres URL or conninfo, for a
    message: never its user, password or options."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "an unparseable database URL"
    host = str(info.get("host") or info.get("hostaddr") or "localhost")
    return f"{host}:{info.get('port') or 5432}"


def _describe(exc: BaseException, redact: Redactor) -> str:
    text = redact(str(exc).strip()) or type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{text} (SQLSTATE {sqlstate})" if sqlstate else text


def _translate(exc: psycopg.Error, redact: Redactor) -> StoreError:
    """The StoreError for a psycopg error raised while running a statement."""
    text = _describe(exc, redact)
    if isinstance(exc, pg_errors.QueryCanceled) and "statement timeout" in str(exc):
        return StatementTimeoutError(f"statement ran past its timeout: {text}")
    if exc.sqlstate in _CONFLICT_SQLSTATES:
        return TransactionConflictError(
            f"Postgres aborted the transaction on every retry within its budget: {text}"
        )
    if isinstance(exc, psycopg.OperationalError) and (
        exc.sqlstate in _TRANSIENT_SQLSTATES or exc.sqlstate is None
    ):
        return StoreUnavailableError(f"lost the Postgres connection: {text}")
    return StoreError(f"Postgres failed the operation: {text}")


# --- the pool ----------------------------------------------------------------------------


class _Ticket:
    """A limiter token already held by a caller, handed to ``to_thread.run_sync``.

    trio releases it when the thread really finishes, even if the caller was
    cancelled and abandoned the thread.
    """

    def __init__(self, limiter: trio.CapacityLimiter, borrower: object) -> None:
        self._limiter = limiter
        self._borrower = borrower
        self.handed_over = False

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        # trio calls this right before it starts the thread; from here on trio
        # releases the token when the thread finishes.
        self.handed_over = True

    def release_if_kept(self) -> None:
        """Release the token if trio never took it over (cancelled before the thread started)."""
        if not self.handed_over:
            self.handed_over = True
            self._limiter.release_on_behalf_of(self._borrower)

    def release_on_behalf_of(self, borrower: object) -> None:
        self._limiter.release_on_behalf_of(self._borrower)


class _Call:
    """One ``run``'s shared state between the trio task and its worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.wake = threading.Event()  # set on cancel: cuts a conflict-retry delay short
        self.conn: Conn | None = None  # set while fn runs: the connection to cancel
        self.done: trio.Event | None = None  # set by the worker when it has finished
        self.token: trio.lowlevel.TrioToken | None = None


class _Cancelled(Exception):
    """Raised on the worker thread when its caller was cancelled (rolls the transaction back)."""


class ConnectionRunner(Protocol):
    """What the store calls on a pool: run one function on a connection, in one transaction.

    ``TrioPool`` is one; the gateway's admission view of it (every run waits a
    bounded time for a connection, then answers back-pressure) is another.
    """

    async def run(self, fn: Callable[[Conn], T], *, acquire_timeout_ms: int | None = None) -> T:
        """``fn(conn)`` inside one transaction, committed when it returns (``TrioPool.run``)."""
        ...


class TrioPool:
    """A psycopg connection pool used from trio. Create with ``open_pool``."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int,
        statement_timeout_ms: int,
        connect_timeout_ms: int,
        connect_retry_delays_ms: Sequence[int],
    ) -> None:
        check_int("max_connections", max_connections, 1)
        if statement_timeout_ms < 1 or connect_timeout_ms < 1:
            raise InvalidInputError("timeouts must be positive milliseconds")
        self._redact = Redactor(database_urls=[url])
        self._url = url
        self.max_connections = max_connections
        self.statement_timeout_ms = statement_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.connect_retry_delays_ms = tuple(connect_retry_delays_ms)
        self._limiter = trio.CapacityLimiter(max_connections)
        self._runs = 0
        self._cancels = 0
        self._last_connect_error: BaseException | None = None
        self._connect_errors = 0
        self._conflict_retries = 0
        self._slot_refusals = 0
        self._outage = False
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            url,
            connection_class=self._connection_class(),
            kwargs={"autocommit": True},
            min_size=0,
            max_size=max_connections,
            open=False,
            configure=self._configure,
            reconnect_timeout=self.connect_budget_ms / 1000,
            name=_POOL_NAME,
        )

    def __repr__(self) -> str:
        return f"<TrioPool max_connections={self.max_connections}>"

    @property
    def connect_budget_ms(self) -> int:
        """The longest one connect can take: every attempt at its timeout plus every delay."""
        attempts = len(self.connect_retry_delays_ms) + 1
        return self.connect_timeout_ms * attempts + sum(self.connect_retry_delays_ms)

    # --- connecting ---------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        # libpq counts connect_timeout in whole seconds (and at least 2).
        return {"connect_timeout": max(2, -(-self.connect_timeout_ms // 1000))}

    def _connection_class(self) -> type[Conn]:
        pool = self

        class LadderConnection(psycopg.Connection[Any]):
            """Connects along the pool's retry ladder (used by psycopg_pool's workers)."""

            @classmethod
            def connect(cls, conninfo: str = "", **kwargs: Any) -> LadderConnection:
                kwargs = {**pool._connect_kwargs(), **kwargs}
                started = time.monotonic()
                failures = 0
                while True:
                    try:
                        conn = super().connect(conninfo, **kwargs)
                    except Exception as exc:
                        pool._last_connect_error = exc
                        pool._connect_errors += 1
                        failures += 1
                        pool._slot_refusals += is_slot_exhaustion(exc)
                        delay = pool._next_delay_ms(exc, failures, started, time.monotonic())
                        if delay is None:
                            if not is_login_refused(exc):
                                # A refused login is no outage: a scoped session's
                                # role reclaimed or expired; the caller is told.
                                pool._outage_began(exc, failures, started)
                            raise
                        time.sleep(delay / 1000)
                    else:
                        pool._last_connect_error = None
                        pool._outage = False
                        return conn

        return LadderConnection

    def _outage_began(self, exc: BaseException, failures: int, started: float) -> None:
        """Log once per outage (until a connect succeeds) that a connect spent its budget."""
        if self._outage:
            return
        self._outage = True
        waited = round((time.monotonic() - started) * 1000)
        log.warning(
            "no Postgres connection after %d attempt(s) in %d ms: %s",
            failures,
            waited,
            _describe(exc, self._redact),
        )

    def _configure(self, conn: Conn) -> None:
        # jsonb values read as json.loads reads them, by msgspec (a tenth of the
        # time per small cell; the standard library's was a direct read's largest cost).
        set_json_loads(decode_body, conn)
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('TimeZone', 'UTC', false)",
            (f"{self.statement_timeout_ms}ms",),
        )

    def _next_delay_ms(
        self, exc: BaseException, failures: int, started: float, now: float
    ) -> int | None:
        return next_connect_delay_ms(
            exc,
            failures,
            (now - started) * 1000,
            self.connect_retry_delays_ms,
            self.connect_budget_ms,
        )

    async def _probe(self, budget_ms: int | None = None) -> None:
        """Connect once along the ladder (trio sleeps between attempts, so it is cancellable),
        within ``budget_ms`` (default: the pool's connect budget). The first retry logs one
        warning naming the server (never the URL's password), the cause and the budget."""
        budget_ms = self.connect_budget_ms if budget_ms is None else budget_ms
        started = trio.current_time()
        failures = 0
        while True:
            try:
                conn = await trio.to_thread.run_sync(self._connect_once)
            except Exception as exc:
                failures += 1
                now = trio.current_time()
                delay = next_connect_delay_ms(
                    exc, failures, (now - started) * 1000, self.connect_retry_delays_ms, budget_ms
                )
                if delay is not None and failures == 1:
                    log.warning(
                        "Postgres connect to %s failed: %s; retrying for up to %.1f s",
                        server_of(self._url),
                        " ".join(_describe(exc, self._redact).split()),
                        budget_ms / 1000 - (now - started),
                    )
                if delay is None:
                    waited = round((now - started) * 1000)
                    error = ConnectionSlotsExhaustedError if is_slot_exhaustion(exc) else None
                    transient = _worth_retrying(exc)
                    raise (error or StoreUnavailableError)(
                        f"could not connect to Postgres at {server_of(self._url)}"
                        f" ({failures} attempt(s) in {waited} ms): "
                        f"{' '.join(_describe(exc, self._redact).split())}",
                        transient=transient,
                        waited_ms=waited if transient and self.connect_retry_delays_ms else None,
                    ) from exc
                await trio.sleep(delay / 1000)
            else:
                conn.close()
                return

    def _connect_once(self) -> Conn:
        return psycopg.connect(self._url, autocommit=True, **self._connect_kwargs())

    # --- running --------------------------------------------------------------------------

    async def run(self, fn: Callable[[Conn], T], *, acquire_timeout_ms: int | None = None) -> T:
        """Run ``fn(conn)`` on a worker thread inside one transaction; return its result.

        The transaction commits when ``fn`` returns and rolls back when it raises.
        Every statement runs under the pool's statement timeout.

        Raises ``PoolSaturatedError`` if no connection frees within
        ``acquire_timeout_ms`` (``None``: wait as long as it takes),
        ``StoreUnavailableError`` if no connection can be made along the connect
        ladder or the connection is lost, ``StatementTimeoutError`` for a
        statement past its timeout, ``StoreError`` for any other Postgres error.
        Exceptions of ``fn`` that are not psycopg errors pass through unchanged.

        If cancelled while waiting for a connection, nothing runs. If cancelled
        while ``fn`` runs, the running statement is cancelled on the server, the
        transaction rolls back (unless it was already committing), and ``run``
        returns (raising ``trio.Cancelled``) once the worker thread has finished;
        the connection is reused only if it came back clean.
        """
        with _tracing.span(
            f"db {_operation(fn)}",
            {"db.system.name": "postgresql", "db.operation.name": _operation(fn)},
            kind=_tracing.SpanKind.CLIENT,
        ):
            return await self._run(fn, acquire_timeout_ms)

    async def _run(self, fn: Callable[[Conn], T], acquire_timeout_ms: int | None) -> T:
        borrower = object()
        if self._limiter.available_tokens < 1:
            # Every connection is taken: the wait for one is a span of its own.
            with _tracing.span("db slot wait", {"db.system.name": "postgresql"}):
                await self._acquire(borrower, acquire_timeout_ms)
        else:
            await self._acquire(borrower, acquire_timeout_ms)
        self._runs += 1
        call = _Call()
        ticket = _Ticket(self._limiter, borrower)
        try:
            # The ticket is CapacityLimiter-like, which to_thread.run_sync documents as accepted.
            limiter = cast(trio.CapacityLimiter, ticket)
            result = await trio.to_thread.run_sync(
                self._work, fn, call, abandon_on_cancel=True, limiter=limiter
            )
        except BaseException:
            ticket.release_if_kept()
            with trio.CancelScope(shield=True):
                await self._cancel(call)
            raise
        try:
            return unwrap(result)
        finally:
            # This frame is in a raised error's traceback: holding the outcome
            # (and so the error) would make a cycle of it and of every frame.
            del result

    async def _acquire(self, borrower: object, acquire_timeout_ms: int | None) -> None:
        """Take a limiter token for ``borrower``: ``PoolSaturatedError`` past the timeout."""
        if acquire_timeout_ms is None:
            await self._limiter.acquire_on_behalf_of(borrower)
        else:
            if not is_int(acquire_timeout_ms):
                raise InvalidInputError(
                    f"acquire_timeout_ms must be an integer or None, got {acquire_timeout_ms!r}"
                )
            acquired = False
            with trio.move_on_after(max(0, acquire_timeout_ms) / 1000):
                await self._limiter.acquire_on_behalf_of(borrower)
                acquired = True
            if not acquired:
                raise PoolSaturatedError(
                    f"all {self.max_connections} Postgres connections stayed busy "
                    f"for {acquire_timeout_ms} ms"
                )

    async def _cancel(self, call: _Call) -> None:
        """Stop the worker of a cancelled ``run``: cancel its statement until it finishes."""
        self._cancels += 1
        done = trio.Event()
        with call.lock:
            call.cancelled = True
            call.wake.set()
            conn = call.conn
            if conn is None:
                # Still waiting for a connection (it will hand it straight back)
                # or already finished: nothing runs on the server for us.
                return
            call.done = done
            call.token = trio.lowlevel.current_trio_token()
        resend = budgets.POSTGRES_CANCEL_RESEND_MS / 1000
        while not done.is_set():
            with contextlib.suppress(Exception):
                await trio.to_thread.run_sync(
                    lambda: conn.cancel_safe(timeout=self.connect_timeout_ms / 1000)
                )
            with trio.move_on_after(resend):
                await done.wait()

    def _work(self, fn: Callable[[Conn], T], call: _Call) -> outcome.Outcome[T]:
        """The worker thread: get a connection, run ``fn`` in a transaction, give it back."""
        started = time.monotonic()
        try:
            conn = self._getconn(started)
        except PoolTimeout:
            waited = round((time.monotonic() - started) * 1000)
            error = self._last_connect_error
            message = (
                f"no Postgres connection after waiting {waited} ms "
                f"(the connect budget is {self.connect_budget_ms} ms)"
            )
            kind = StoreUnavailableError
            transient = True
            if error is not None:
                message = f"{message}: {_describe(error, self._redact)}"
                transient = _worth_retrying(error)
                if is_slot_exhaustion(error):
                    kind = ConnectionSlotsExhaustedError
            failure = kind(message, transient=transient, waited_ms=waited)
            if error is not None and is_login_refused(error):
                # The cause tells a session manager that its session is gone.
                _chain(failure, error)
            return outcome.Error(frameless(failure))
        except psycopg.Error as exc:
            return outcome.Error(frameless(_chain(_translate(exc, self._redact), exc)))
        with call.lock:
            if call.cancelled:
                self._pool.putconn(conn)
                return outcome.Error(_Cancelled())
            call.conn = conn
        try:
            result = call_frameless(self._transaction, fn, conn, call)
        finally:
            with call.lock:
                call.conn = None
                event, token = call.done, call.token
            self._give_back(conn)
            if event is not None and token is not None:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(event.set)
        if isinstance(result, outcome.Error) and isinstance(result.error, psycopg.Error):
            error = _translate(result.error, self._redact)
            if isinstance(error, StoreUnavailableError) and conn.closed:
                self._sweep()
            return outcome.Error(_chain(error, result.error))
        return result

    def _getconn(self, started: float) -> Conn:
        """A pooled connection within the connect budget; ``PoolTimeout`` when none
        came, or as soon as the pool's connects are refused the login (that does
        not pass: waiting out the budget would only delay the caller's recovery)."""
        deadline = started + self.connect_budget_ms / 1000
        check = budgets.POSTGRES_LOGIN_REFUSAL_CHECK_MS / 1000
        while True:
            left = deadline - time.monotonic()
            try:
                return self._pool.getconn(timeout=max(min(check, left), 0.001))
            except PoolTimeout:
                error = self._last_connect_error
                if left <= check or (error is not None and is_login_refused(error)):
                    raise

    def _sweep(self) -> None:
        """After one pooled connection turned out dead, test the idle ones and replace the dead.

        A server restart or ``pg_terminate_backend`` kills every pooled
        connection at once; without the sweep each of them would fail one
        caller in turn. Only a failing call pays for it, so the hot path keeps
        no check on checkout.
        """
        with contextlib.suppress(Exception):
            self._pool.check()

    def _transaction(self, fn: Callable[[Conn], T], conn: Conn, call: _Call) -> T:
        """Run ``fn`` in a transaction; run it again (rolled back first) when
        Postgres aborts it with a deadlock or serialization failure, along
        ``POSTGRES_CONFLICT_RETRY_DELAYS_MS`` and only while the first attempt
        began less than ``POSTGRES_CONFLICT_RETRY_WINDOW_MS`` ago."""
        started = time.monotonic()
        delays = budgets.POSTGRES_CONFLICT_RETRY_DELAYS_MS
        window = budgets.POSTGRES_CONFLICT_RETRY_WINDOW_MS / 1000
        for attempt in range(len(delays) + 1):
            try:
                with conn.transaction():
                    value = fn(conn)
                    with call.lock:
                        if call.cancelled:
                            raise _Cancelled()
                    return value
            except psycopg.Error as exc:
                if exc.sqlstate not in _CONFLICT_SQLSTATES or attempt == len(delays):
                    raise
                if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
                    raise
                delay = delays[attempt] / 1000
                if time.monotonic() + delay >= started + window:
                    raise
                self._conflict_retries += 1
                if call.wake.wait(delay):
                    raise _Cancelled() from None
        raise AssertionError("unreachable")

    def _give_back(self, conn: Conn) -> None:
        """Return a clean connection to the pool; close any other first (the pool replaces it)."""
        if conn.closed or conn.info.transaction_status != TransactionStatus.IDLE:
            with contextlib.suppress(Exception):
                conn.close()
        self._pool.putconn(conn)

    # --- lifecycle and stats --------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """psycopg_pool's counters plus ``in_use`` (callers holding a connection slot),
        ``runs``, ``cancels``, ``connect_errors``, ``conflict_retries`` and
        ``slot_refusals`` (connects refused for lack of connection slots)."""
        stats = dict(self._pool.get_stats())
        stats["in_use"] = self._limiter.borrowed_tokens
        stats["runs"] = self._runs
        stats["cancels"] = self._cancels
        stats["connect_errors"] = self._connect_errors
        stats["conflict_retries"] = self._conflict_retries
        stats["slot_refusals"] = self._slot_refusals
        return stats

    async def _open(self, connect_budget_ms: int | None = None) -> None:
        await self._probe(connect_budget_ms)
        await trio.to_thread.run_sync(self._pool.open)

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._pool.close)


def _operation(fn: Callable[..., Any]) -> str:
    """The store operation ``fn`` does, for its span: the function that made it
    (``read_rows_batch`` for ``read_rows_batch.<locals>.run``; a partial's function)."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(inner, "__qualname__", None) or type(inner).__name__
    return str(name).split(".<locals>", 1)[0].rsplit(".", 1)[-1]


def _chain(error: StoreError, cause: BaseException) -> StoreError:
    error.__cause__ = cause
    return error


@contextlib.asynccontextmanager
async def open_pool(
    url: str,
    *,
    max_connections: int,
    statement_timeout_ms: int = budgets.POSTGRES_STATEMENT_TIMEOUT_MS,
    connect_timeout_ms: int = budgets.POSTGRES_CONNECT_TIMEOUT_MS,
    connect_retry_delays_ms: Sequence[int] = budgets.POSTGRES_CONNECT_RETRY_DELAYS_MS,
    open_connect_budget_ms: int | None = None,
) -> AsyncIterator[TrioPool]:
    """Open a ``TrioPool`` on ``url``; it is closed when the block exits.

    Opening connects once (along the connect ladder, within
    ``open_connect_budget_ms`` when given, else the whole connect budget) to
    fail early with ``StoreUnavailableError`` when the server cannot be reached
    or refuses the credentials. Closing waits for in-flight workers'
    connections to return (shielded from cancellation).
    """
    if not isinstance(url, str) or not url:
        raise InvalidInputError("database URL must be a non-empty string")
    pool = TrioPool(
        url,
        max_connections=max_connections,
        statement_timeout_ms=statement_timeout_ms,
        connect_timeout_ms=connect_timeout_ms,
        connect_retry_delays_ms=connect_retry_delays_ms,
    )
    await pool._open(open_connect_budget_ms)
    try:
        yield pool
    finally:
        await pool._close()
