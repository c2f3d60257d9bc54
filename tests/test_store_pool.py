"""TrioPool on a real Postgres: transactions, cancellation, timeouts, saturation, connects."""

from __future__ import annotations

import re
import socket
import threading
import time
import traceback
import uuid
import weakref
from typing import Any

import psycopg
import psycopg.sql
import pytest
import trio
import trio.testing
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sheetplane import budgets
from sheetplane._threads import THREAD_TRACEBACK_NOTE
from sheetplane.errors import (
    InvalidInputError,
    StatementTimeoutError,
    StoreError,
    StoreUnavailableError,
)
from sheetplane.store import PoolSaturatedError, TrioPool, open_pool
from sheetplane.store._pool import is_login_refused

Conn = psycopg.Connection[Any]
#: How soon a cancelled run returns. The statements the cancel tests cut run
#: ``pg_sleep(30)``: a cancel that never reached the server would wait them out, so the
#: bound sits far below 30 s and far above a loaded machine's round trip (a cancel
#: connection and a thread hand-off, milliseconds when quiet).
CANCELLED_WITHIN_S = 10.0


def _password(url: str) -> str:
    return str(conninfo_to_dict(url).get("password") or "")


def _active_with(url: str, marker: str) -> int:
    """How many server backends are running a statement that contains ``marker``."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE state = 'active' AND pid <> pg_backend_pid() AND position(%s in query) > 0",
            (marker,),
        ).fetchone()
        assert row is not None
        return int(row[0])


async def _wait_until_active(url: str, marker: str) -> None:
    """Poll the server until the statement runs there: it is the server's state we
    synchronise on, and the server offers no event to wait for."""
    with trio.fail_after(10):
        while await trio.to_thread.run_sync(_active_with, url, marker) == 0:  # noqa: ASYNC110
            await trio.sleep(0.01)


def _assert_idle(pool: TrioPool) -> None:
    stats = pool.stats()
    assert stats["in_use"] == 0
    assert stats["requests_waiting"] == 0
    assert stats["pool_size"] <= pool.max_connections


async def test_run_commits_on_return_and_rolls_back_on_error(database_url: str) -> None:
    table = f"pool_tx_{uuid.uuid4().hex}"
    async with open_pool(database_url, max_connections=2) as pool:
        await pool.run(lambda c: c.execute(f"CREATE TABLE {table} (v int)"))
        await pool.run(lambda c: c.execute(f"INSERT INTO {table} VALUES (1)"))

        class Boom(Exception):
            pass

        def insert_then_fail(conn: Conn) -> None:
            conn.execute(f"INSERT INTO {table} VALUES (2)")
            raise Boom

        with pytest.raises(Boom):
            await pool.run(insert_then_fail)
        rows = await pool.run(lambda c: c.execute(f"SELECT v FROM {table}").fetchall())
        assert rows == [(1,)]
        await pool.run(lambda c: c.execute(f"DROP TABLE {table}"))
        _assert_idle(pool)


class _Rows:
    """Stands for the rows a worker thread's frames hold."""


async def test_an_error_leaves_the_worker_thread_without_its_frames_but_keeps_their_traceback(
    database_url: str,
) -> None:
    """Before, a Postgres error (as the store error's cause) or an error of ``fn``
    kept through its traceback every frame of the worker thread, and with them the
    rows those frames held, for as long as anything kept the error."""
    alive: list[weakref.ref[_Rows]] = []

    def failing_in_postgres(conn: Conn) -> None:
        rows = _Rows()
        alive.append(weakref.ref(rows))
        conn.execute("SELECT 1/0")

    def refusing(conn: Conn) -> None:
        rows = _Rows()
        alive.append(weakref.ref(rows))
        raise InvalidInputError("refused")

    async with open_pool(database_url, max_connections=1) as pool:
        with pytest.raises(StoreError) as failed:
            await pool.run(failing_in_postgres)
        with pytest.raises(InvalidInputError) as refused:
            await pool.run(refusing)
        # Both errors are still held here; the rows of their threads are gone.
        assert [ref() for ref in alive] == [None, None]
    # Where they were raised is still in their tracebacks' text (what the log shows).
    logged = "".join(traceback.format_exception(failed.value))
    assert THREAD_TRACEBACK_NOTE in logged, logged
    assert ", in failing_in_postgres" in logged and "division by zero" in logged, logged
    assert "in refusing" in "".join(traceback.format_exception(refused.value))


async def test_connections_carry_statement_timeout_and_utc(database_url: str) -> None:
    async with open_pool(database_url, max_connections=1, statement_timeout_ms=1234) as pool:
        row = await pool.run(
            lambda c: c.execute(
                "SELECT current_setting('statement_timeout'), current_setting('TimeZone')"
            ).fetchone()
        )
    assert row == ("1234ms", "UTC")


async def test_cancel_during_long_statement_reaches_the_server(database_url: str) -> None:
    marker = f"sp_cancel_{uuid.uuid4().hex}"
    async with open_pool(database_url, max_connections=2) as pool:
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            returned_after: list[float] = []

            async def sleeper() -> None:
                with scope:
                    await pool.run(lambda c: c.execute(f"SELECT pg_sleep(30) /* {marker} */"))
                returned_after.append(time.monotonic())

            nursery.start_soon(sleeper)
            await _wait_until_active(database_url, marker)
            cancelled_at = time.monotonic()
            scope.cancel()

        assert returned_after, "the cancelled run never returned"
        assert returned_after[0] - cancelled_at < CANCELLED_WITHIN_S
        # run() waited for its worker, so the statement is already gone on the server.
        assert await trio.to_thread.run_sync(_active_with, database_url, marker) == 0
        assert pool.stats()["cancels"] == 1
        _assert_idle(pool)
        # Still usable, and by no more connections than it had.
        assert await pool.run(lambda c: c.execute("SELECT 41 + 1").fetchone()) == (42,)
        _assert_idle(pool)
        assert pool.stats()["pool_size"] <= 2


async def test_cancel_is_resent_when_the_first_one_is_swallowed(database_url: str) -> None:
    marker = f"sp_resend_{uuid.uuid4().hex}"
    swallowed = threading.Event()

    def stubborn(conn: Conn) -> None:
        try:
            with conn.transaction():
                conn.execute(f"SELECT pg_sleep(30) /* {marker} first */")
        except pg_errors.QueryCanceled:
            swallowed.set()
        conn.execute(f"SELECT pg_sleep(30) /* {marker} second */")

    async with open_pool(database_url, max_connections=1) as pool:
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:

            async def runner() -> None:
                with scope:
                    await pool.run(stubborn)

            nursery.start_soon(runner)
            await _wait_until_active(database_url, f"{marker} first")
            started = time.monotonic()
            scope.cancel()
        elapsed = time.monotonic() - started
        assert swallowed.is_set()
        assert elapsed < CANCELLED_WITHIN_S
        assert await trio.to_thread.run_sync(_active_with, database_url, marker) == 0
        _assert_idle(pool)
        assert await pool.run(lambda c: c.execute("SELECT 1").fetchone()) == (1,)


async def test_cancelled_run_commits_nothing(database_url: str) -> None:
    table = f"pool_cancel_{uuid.uuid4().hex}"
    marker = f"sp_nocommit_{uuid.uuid4().hex}"
    async with open_pool(database_url, max_connections=2) as pool:
        await pool.run(lambda c: c.execute(f"CREATE TABLE {table} (v int)"))

        def insert_then_sleep(conn: Conn) -> None:
            conn.execute(f"INSERT INTO {table} VALUES (1)")
            conn.execute(f"SELECT pg_sleep(30) /* {marker} */")

        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def runner() -> None:
                with scope:
                    await pool.run(insert_then_sleep)

            nursery.start_soon(runner)
            await _wait_until_active(database_url, marker)
            scope.cancel()
        assert await pool.run(lambda c: c.execute(f"SELECT count(*) FROM {table}").fetchone()) == (
            0,
        )
        await pool.run(lambda c: c.execute(f"DROP TABLE {table}"))


async def test_cancelled_before_the_thread_starts_keeps_no_slot(database_url: str) -> None:
    async with open_pool(database_url, max_connections=1) as pool:
        with trio.CancelScope() as scope:
            scope.cancel()
            await pool.run(lambda c: c.execute("SELECT 1"))
        assert scope.cancelled_caught
        _assert_idle(pool)
        assert await pool.run(lambda c: c.execute("SELECT 2").fetchone()) == (2,)


async def test_statement_timeout_maps_to_statement_timeout_error(database_url: str) -> None:
    async with open_pool(database_url, max_connections=1, statement_timeout_ms=50) as pool:
        with pytest.raises(StatementTimeoutError) as caught:
            await pool.run(lambda c: c.execute("SELECT pg_sleep(5)"))
        assert isinstance(caught.value.__cause__, pg_errors.QueryCanceled)
        assert caught.value.code == "statement_timeout"
        _assert_idle(pool)
        assert await pool.run(lambda c: c.execute("SELECT 3").fetchone()) == (3,)


async def test_saturated_pool_raises_after_acquire_timeout(database_url: str) -> None:
    release = threading.Event()
    async with open_pool(database_url, max_connections=1) as pool:
        async with trio.open_nursery() as nursery:

            def hold(conn: Conn) -> None:
                conn.execute("SELECT 1")
                release.wait()

            nursery.start_soon(pool.run, hold)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.stats()["in_use"] == 1
            started = time.monotonic()
            with pytest.raises(PoolSaturatedError) as caught:
                await pool.run(lambda c: None, acquire_timeout_ms=100)
            assert time.monotonic() - started >= 0.1
            assert "stayed busy for 100 ms" in str(caught.value)
            release.set()
        _assert_idle(pool)
        # Without a timeout a caller simply waits its turn.
        assert await pool.run(lambda c: 7, acquire_timeout_ms=1_000) == 7


async def test_cancel_while_waiting_for_a_slot_takes_nothing(database_url: str) -> None:
    release = threading.Event()
    async with open_pool(database_url, max_connections=1) as pool:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run, lambda c: release.wait())
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(0.05) as scope:
                await pool.run(lambda c: pytest.fail("a cancelled waiter must not run"))
            assert scope.cancelled_caught
            release.set()
        _assert_idle(pool)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_connect_failure_runs_the_ladder_then_raises_unavailable() -> None:
    # A refused connect fails at once: past the ladder's rungs it goes on at the
    # last delay until the connect budget (3 x 1,000 + 60 ms) is spent.
    secret = f"pw-{uuid.uuid4().hex}"
    url = f"postgresql://someone:{secret}@127.0.0.1:{_closed_port()}/db"
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        async with open_pool(
            url, max_connections=1, connect_timeout_ms=1_000, connect_retry_delays_ms=(20, 40)
        ):
            pytest.fail("opened a pool on a closed port")
    waited = time.monotonic() - started
    assert 3.0 - 0.04 <= waited < 3.06 + 2.0
    message = str(caught.value)
    attempts = int(re.search(r"\((\d+) attempt\(s\) in (\d+) ms\)", message)[1])  # type: ignore[index]
    assert attempts > 3
    assert caught.value.waited_ms is not None and caught.value.waited_ms >= 2_960
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    for text in (message, repr(caught.value)):
        assert secret not in text
        assert url not in text


async def test_refused_credentials_fail_at_once_without_the_password(database_url: str) -> None:
    params = conninfo_to_dict(database_url)
    secret = f"wrong-{uuid.uuid4().hex}"
    params["password"] = secret
    bad = make_conninfo(**params)
    with pytest.raises(StoreUnavailableError) as caught:
        async with open_pool(bad, max_connections=1, connect_retry_delays_ms=(5_000,)):
            pytest.fail("opened a pool with a wrong password")
    assert "1 attempt(s)" in str(caught.value)
    assert "password authentication failed" in str(caught.value)
    assert secret not in str(caught.value)


async def test_store_errors_redact_the_password(database_url: str) -> None:
    password = _password(database_url)
    assert password, "the test server must use password authentication"
    async with open_pool(database_url, max_connections=1) as pool:
        with pytest.raises(StoreError) as caught:
            # The server echoes the bad input (the password) in its message.
            await pool.run(lambda c: c.execute("SELECT %s::int", (password,)))
    message = str(caught.value)
    assert "[redacted]" in message
    assert password not in message
    assert "22P02" in message
    assert type(caught.value) is StoreError


async def test_concurrent_runs_share_a_bounded_pool(database_url: str) -> None:
    results: list[int] = []
    async with open_pool(database_url, max_connections=3) as pool:
        async with trio.open_nursery() as nursery:
            for n in range(12):

                async def one(n: int = n) -> None:
                    row = await pool.run(lambda c: c.execute("SELECT %s::int", (n,)).fetchone())
                    assert row is not None
                    results.append(row[0])

                nursery.start_soon(one)
        stats = pool.stats()
        assert stats["pool_size"] <= 3
        assert stats["runs"] == 12
        _assert_idle(pool)
    assert sorted(results) == list(range(12))


async def test_terminated_backends_fail_one_caller_not_every_pooled_connection(
    database_url: str,
) -> None:
    # pg_terminate_backend (or a server restart) kills every pooled connection
    # at once. The first caller to find a dead one sweeps the idle rest, so the
    # callers after it get fresh connections instead of one failure each.
    marker = f"sweep_{uuid.uuid4().hex[:12]}"
    url = make_conninfo(database_url, application_name=marker)
    size = 4
    barrier = threading.Barrier(size)

    def hold(conn: Conn) -> int:
        barrier.wait(timeout=10)
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])

    async with open_pool(url, max_connections=size) as pool:
        pids: list[int] = []

        async def warm() -> None:
            pids.append(await pool.run(hold))

        async with trio.open_nursery() as nursery:
            for _ in range(size):
                nursery.start_soon(warm)
        assert len(set(pids)) == size

        def terminate() -> int:
            with psycopg.connect(database_url, autocommit=True) as admin:
                rows = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (marker,),
                ).fetchall()
            return len(rows)

        assert await trio.to_thread.run_sync(terminate) == size

        failures = 0
        for _ in range(size):
            try:
                await pool.run(lambda c: c.execute("SELECT 1").fetchone())
            except StoreUnavailableError:
                failures += 1
        assert failures <= 1
        assert await pool.run(lambda c: c.execute("SELECT 1").fetchone()) == (1,)


async def test_a_login_refused_after_the_pool_opened_fails_its_caller_at_once_without_the_role(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A scoped session's role reclaimed (dropped) after its pool opened: the pool's
    # next connect is refused the login. Before, the caller waited out the whole
    # connect budget (22.5 s) for a connection that could never come, and the
    # message named the role (half a session's credentials).
    role, password = f"refused_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(role), psycopg.sql.Literal(password)
            )
        )
    url = make_conninfo(database_url, user=role, password=password)
    try:
        async with open_pool(url, max_connections=1) as pool:
            # Opening connected once and let the connection go: the pool holds none.
            with psycopg.connect(database_url, autocommit=True) as admin:
                admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))
            with trio.fail_after(budgets.POSTGRES_CONNECT_BUDGET_MS / 1000 / 4):
                with pytest.raises(StoreUnavailableError) as caught:
                    await pool.run(lambda conn: conn.execute("SELECT 1").fetchone())
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(psycopg.sql.Identifier(role))
            )
    assert is_login_refused(caught.value)
    assert not caught.value.transient
    for text in (str(caught.value), repr(caught.value), caplog.text):
        assert role not in text
        assert password not in text
    assert "[redacted]" in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        'FATAL:  password authentication failed for user "sp_sess_a"',
        'FATAL:  role "sp_sess_a" does not exist',
        # A role the gateway retired (NOLOGIN) when it reclaimed the session.
        'FATAL:  role "sp_sess_a" is not permitted to log in',
    ],
)
def test_a_refused_login_is_recognised_by_its_text(text: str) -> None:
    assert is_login_refused(psycopg.OperationalError(f"connection failed: {text}"))
    assert not is_login_refused(psycopg.OperationalError("connection failed: timeout expired"))
