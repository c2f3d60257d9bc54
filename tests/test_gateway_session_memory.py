"""Session backends' memory is bounded per org, and parallel query (whose shared
memory the private-memory bound does not see) is out of session roles' reach
(third tenancy pass, findings 2 and 5)."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio

from _session_helpers import aad_of
from sheetplane import crypto
from sheetplane.budgets import MiB
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway

TOKEN = "tok-memory-3b9f"
PLAY = "memory-play"
CONTRACT = {"columns": [{"id": "email", "sqlName": "email", "source": "input"}]}
#: A small bound for the tests (the budgets' are 240 MiB a backend, 960 MiB an org).
BOUND = 64 * MiB
#: A cursor WITH HOLD keeps its whole result in the backend's private memory
#: (under a large work_mem) while the session sits idle: about 40 MiB here.
HOLD_40_MIB = (
    "DECLARE held CURSOR WITH HOLD FOR SELECT repeat('x', 1000) FROM generate_series(1, 40000)"
)
#: A parallel-safe statement that runs for minutes.
LONG = "SELECT count(*) FROM generate_series(1, 3000000000)"


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    # An org of its own: this gateway cannot reclaim the sessions the shared one minted.
    async with running_gateway(
        database_url,
        tokens={TOKEN: f"org-memory-{uuid.uuid4().hex[:8]}"},
        watchdog_interval_ms=100,
        session_max_backend_memory_bytes=BOUND,
        session_max_org_memory_bytes=BOUND,
    ) as gw:
        assert gw.state.reaper.memory_watch
        yield gw


@pytest.fixture
async def plain_gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    """The budgets' memory bounds (a leader and its worker stay far under them)."""
    async with running_gateway(
        database_url,
        tokens={TOKEN: f"org-memory-{uuid.uuid4().hex[:8]}"},
        watchdog_interval_ms=100,
    ) as gw:
        yield gw


async def session_url(gw: RunningGateway) -> str:
    namespace = f"ns_{uuid.uuid4().hex[:12]}"
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:

        async def act(action: str, **fields: Any) -> Any:
            response = await http.post(
                RUNTIME_PATH,
                json={"action": action, "playName": PLAY, **fields},
                headers={"authorization": f"Bearer {TOKEN}"},
            )
            assert response.status_code == 200, response.text
            return response.json()

        await act("ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
        answer = await act(
            "create_db_session",
            target={"tableNamespace": namespace, "logicalTable": "sheet_rows"},
            operations=["rows.read"],
            sheetContract=CONTRACT,
            postgresUrlEncryption=key.encryption_request(),
        )
    return crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))


def alive(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def run_parallel(url: str) -> BaseException | None:
    """As the role: raise its parallel workers, run a long parallel statement; the
    error that ended it."""
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SHOW max_parallel_workers_per_gather").fetchone() == ("0",)
        for statement in (
            "SET max_parallel_workers_per_gather = 2",
            "SET debug_parallel_query = on",
            "SET statement_timeout = 0",
        ):
            conn.execute(statement)
        plan = conn.execute("EXPLAIN " + LONG).fetchall()
        assert any("Gather" in row[0] for row in plan), plan
        try:
            conn.execute(LONG)
        except psycopg.OperationalError as exc:
            return exc
    return None


async def test_a_session_that_raises_its_parallel_workers_is_ended_with_them(
    plain_gateway: RunningGateway,
) -> None:
    """A ``rows.read`` session with parallel settings got a Parallel Hash Join whose
    table (1,037 MiB per process) lives in shared memory, which the private-memory
    bound does not read: it ran to completion. Session roles default to no
    parallel workers; one that raises them is ended, with its workers, within a
    pass of its first worker (before, the statement ran on)."""
    url = await session_url(plain_gateway)
    with trio.fail_after(10):
        ended = await trio.to_thread.run_sync(run_parallel, url, abandon_on_cancel=True)
    assert isinstance(ended, psycopg.errors.AdminShutdown), ended
    # The pass counts what it ended once it is over, which may be after the session
    # saw its end: waited for, not read at once.
    progress = plain_gateway.state.reaper
    with trio.fail_after(10):
        while progress.ended_by["parallel"] < 1:
            await progress.wait_for_watchdog_pass(progress.watchdog_passes + 1)


async def test_an_orgs_sessions_past_its_memory_bound_together_are_ended_newest_first(
    gateway: RunningGateway,
) -> None:
    """The memory bound was per backend: an org could hold its whole connection
    budget each just under it (10-30 GiB). Two backends of one org, each holding
    about 40 MiB idle (under the 64 MiB backend bound), pass the org's 64 MiB
    together: the newer is ended, the older carries on."""
    url = await session_url(gateway)
    connect = functools.partial(psycopg.connect, url, autocommit=True)
    older = await trio.to_thread.run_sync(connect)
    newer = await trio.to_thread.run_sync(connect)
    progress = gateway.state.reaper
    try:
        for conn in (older, newer):
            await trio.to_thread.run_sync(conn.execute, "SET work_mem = '1GB'")
        await trio.to_thread.run_sync(older.execute, HOLD_40_MIB)
        with trio.fail_after(10):
            await progress.wait_for_watchdog_pass(progress.watchdog_passes + 2)
        assert await trio.to_thread.run_sync(alive, older)  # one alone is under both bounds
        # Ended while it builds the cursor, or on a pass once it holds it.
        with contextlib.suppress(psycopg.OperationalError):
            await trio.to_thread.run_sync(newer.execute, HOLD_40_MIB)
        with trio.fail_after(10):
            while progress.ended_by["org_memory"] < 1:
                await progress.wait_for_watchdog_pass(progress.watchdog_passes + 1)
        assert not await trio.to_thread.run_sync(alive, newer)
        assert await trio.to_thread.run_sync(alive, older)
        assert progress.ended_by["memory"] == 0
    finally:
        for conn in (older, newer):
            await trio.to_thread.run_sync(conn.close)
