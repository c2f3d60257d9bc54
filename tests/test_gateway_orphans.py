"""No session backend outlives its role unbounded (third tenancy pass, findings 1-3).

A login still authenticating has no role in ``pg_stat_activity`` (``usesysid``
NULL, state ``starting``): a reclaim or a reaper pass that ends a role's backends
by name cannot see it, and once the login looks its role up before the DROP
commits, the backend lives on after the role is gone. Each test holds a login
before its SCRAM client-final message (``_scram_login``), so the race is one
deterministic round, on real Postgres and the real gateway."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from _scram_login import PausedLogin
from _session_helpers import aad_of
from sheetplane import crypto
from sheetplane._types import SheetRef
from sheetplane.budgets import DB_SESSION_MAX_CONNECTIONS, org_connection_budget
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.gateway.server._roles import (
    LEDGER,
    _granted_connections,
    create_session_role,
    drop_role,
    org_session_backends,
)
from sheetplane.store.embedded import EmbeddedPostgres

#: Few enough slots that one session fills an org's budget (6 of 24, a role's limit 4).
MAX_CONNECTIONS = 24
TOKEN_A, ORG_A = "tok-orphan-a-7d1e", "org-orphan-a"
PLAY = "orphans-play"
NAMESPACE = "ns_orphans"
CONTRACT = {"columns": [{"id": "email", "sqlName": "email", "source": "input"}]}


@pytest.fixture(scope="module")
def small_server() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(max_connections=MAX_CONNECTIONS, durable=False) as server:
        yield server


@pytest.fixture
async def gateway(small_server: EmbeddedPostgres) -> AsyncIterator[RunningGateway]:
    async with running_gateway(
        small_server.url, tokens={TOKEN_A: ORG_A}, watchdog_interval_ms=100
    ) as gw:
        response = await post(
            gw, TOKEN_A, "ensure_sheet", tableNamespace=NAMESPACE, sheetContract=CONTRACT
        )
        assert response.status_code == 200, response.text
        yield gw


async def post(gw: RunningGateway, token: str, action: str, **fields: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        return await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": PLAY, **fields},
            headers={"authorization": f"Bearer {token}"},
        )


async def mint(gw: RunningGateway, key: crypto.DecryptionKey) -> dict[str, Any]:
    """The conninfo of a new ``rows.read`` session of org-a."""
    response = await post(
        gw,
        TOKEN_A,
        "create_db_session",
        target={"tableNamespace": NAMESPACE, "logicalTable": "sheet_rows"},
        operations=["rows.read"],
        sheetContract=CONTRACT,
        postgresUrlEncryption=key.encryption_request(),
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    url = crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))
    return dict(conninfo_to_dict(url))


async def pause_login(params: dict[str, Any]) -> PausedLogin:
    return await PausedLogin.begin(
        str(params["host"]),
        int(params["port"]),
        str(params["user"]),
        str(params["password"]),
        str(params["dbname"]),
    )


def orphans(conn: psycopg.Connection[Any]) -> list[int]:
    """Client backends whose role no longer exists."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
        " AND usesysid IS NOT NULL AND usesysid NOT IN (SELECT oid FROM pg_roles)"
    ).fetchall()
    return [int(pid) for (pid,) in rows]


async def waiting_on_a_lock(url: str, like: str) -> None:
    """Return once a backend whose query matches ``like`` waits on a lock."""
    with psycopg.connect(url, autocommit=True) as conn, trio.fail_after(30):
        while True:
            row = conn.execute(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE %s)",
                (like,),
            ).fetchone()
            if row == (True,):
                return
            await trio.sleep(0.01)


async def test_a_login_overlapping_a_reclaim_is_refused_not_left_without_its_role(
    gateway: RunningGateway, small_server: EmbeddedPostgres
) -> None:
    # Finding 1: org-a's only session is idle past the reclaim grace; a login to it
    # has begun (the server read the role's verifier) when a second mint reclaims
    # the role. The reclaim is held after its DROP ROLE, before its commit (a row
    # lock on the role's ledger row), and the login goes on then. Before, the login
    # found its role (the DROP not committed), logged in, and lived on after the
    # commit with no role: nothing counted or bounded it. Now the role's NOLOGIN is
    # committed before its backends are ended and it is dropped: the login is refused.
    budget = org_connection_budget(MAX_CONNECTIONS, 3)
    assert budget < 2 * DB_SESSION_MAX_CONNECTIONS  # one session fills the org
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    first = await mint(gateway, key)
    admin = await trio.to_thread.run_sync(
        lambda: psycopg.connect(small_server.url, autocommit=True)
    )
    holder = await trio.to_thread.run_sync(lambda: psycopg.connect(small_server.url))
    login = await pause_login(first)
    try:
        # Past the reclaim grace at once, instead of waiting it out.
        admin.execute(
            sql.SQL("UPDATE {} SET minted_at = now() - interval '1 minute'").format(LEDGER)
        )
        holder.execute(
            sql.SQL("SELECT FROM {} WHERE role = %s FOR UPDATE").format(LEDGER), (first["user"],)
        )
        minted: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:

            async def second() -> None:
                minted.append(await mint(gateway, key))

            nursery.start_soon(second)
            # The reclaim waits on the held row: its DROP ROLE is done, not committed.
            await waiting_on_a_lock(small_server.url, '%"sessions"%')
            with trio.fail_after(10):
                refused = await login.finish()
            await trio.to_thread.run_sync(holder.rollback)
        assert len(minted) == 1
        assert refused is not None, "the login got a backend of a role being dropped"
        assert "not permitted to log in" in refused
        assert await trio.to_thread.run_sync(orphans, admin) == []
    finally:
        await login.aclose()
        holder.close()
        admin.close()


async def test_the_reaper_refuses_a_login_that_began_before_its_role_expired(
    small_server: EmbeddedPostgres,
) -> None:
    # VALID UNTIL is checked when a login begins, so a login paused across the expiry
    # and finishing inside the reaper's drop (held after its DROP ROLE, before its
    # commit) logged in and was left without its role. The reaper commits NOLOGIN
    # before it ends the role's backends and drops it: the login is refused.
    async with running_gateway(
        small_server.url, tokens={TOKEN_A: ORG_A}, reaper_interval_ms=100
    ) as gw:
        response = await post(
            gw, TOKEN_A, "ensure_sheet", tableNamespace=NAMESPACE, sheetContract=CONTRACT
        )
        assert response.status_code == 200, response.text
        role = await create_session_role(
            gw.state.store,
            SheetRef(ORG_A, PLAY, NAMESPACE),
            ["rows.read"],
            dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10),
        )
        params = dict(conninfo_to_dict(small_server.url))
        params.update(user=role.role, password=role.password)
        login = await pause_login(params)
        admin = await trio.to_thread.run_sync(
            lambda: psycopg.connect(small_server.url, autocommit=True)
        )
        holder = await trio.to_thread.run_sync(lambda: psycopg.connect(small_server.url))
        try:
            holder.execute(
                sql.SQL("SELECT FROM {} WHERE role = %s FOR UPDATE").format(LEDGER), (role.role,)
            )
            admin.execute(
                sql.SQL("ALTER ROLE {} VALID UNTIL '2000-01-01'").format(sql.Identifier(role.role))
            )
            await waiting_on_a_lock(small_server.url, '%"sessions"%')
            with trio.fail_after(10):
                refused = await login.finish()
            await trio.to_thread.run_sync(holder.rollback)
            with trio.fail_after(30):
                while admin.execute(
                    "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s)", (role.role,)
                ).fetchone() == (True,):
                    await gw.state.reaper.wait_for_pass(gw.state.reaper.passes + 1)
            assert refused is not None, "the login got a backend of a role being dropped"
            assert "not permitted to log in" in refused
            assert await trio.to_thread.run_sync(orphans, admin) == []
        finally:
            await login.aclose()
            holder.close()
            admin.close()


def make_orphan_role(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'orphan-pw'").format(sql.Identifier(name))
        )


async def orphan_login(url: str, name: str, drop: Any) -> PausedLogin:
    """A backend of role ``name`` whose role was dropped under its login: ``drop(conn)``
    runs in a transaction that commits once the login has its backend."""
    params = dict(conninfo_to_dict(url))
    params.update(user=name, password="orphan-pw")
    login = await pause_login(params)
    dropper = await trio.to_thread.run_sync(lambda: psycopg.connect(url))
    try:
        drop(dropper)
        with trio.fail_after(10):
            assert await login.finish() is None
        dropper.commit()
    finally:
        dropper.close()
    return login


async def test_the_watchdog_ends_a_backend_whose_role_no_longer_exists(
    gateway: RunningGateway, small_server: EmbeddedPostgres
) -> None:
    # Finding 2: however a backend outlived its role (a drop outside the gateway, or
    # a login past its role check in the instant before NOLOGIN committed), the
    # watchdog ends it within a pass: it selected session backends by role name,
    # and a dropped role has none.
    await trio.to_thread.run_sync(make_orphan_role, small_server.url, "sp_sess_orphan_by_hand")
    login = await orphan_login(
        small_server.url,
        "sp_sess_orphan_by_hand",
        lambda conn: conn.execute(
            "DROP OWNED BY sp_sess_orphan_by_hand; DROP ROLE sp_sess_orphan_by_hand"
        ),
    )
    try:
        progress = gateway.state.reaper
        with trio.fail_after(10):
            await progress.wait_for_watchdog_pass(progress.watchdog_passes + 2)
        assert await login.query("SELECT 1") is not None, "the orphan backend still answers"
        assert progress.ended_by["orphan"] >= 1
    finally:
        await login.aclose()


async def test_the_watchdog_ends_a_login_that_stays_unauthenticated_past_its_bound(
    small_server: EmbeddedPostgres,
) -> None:
    # A backend with no role after the login bound (a login stalled before or
    # after its authentication) is ended; Postgres's own authentication_timeout
    # is a minute.
    async with running_gateway(
        small_server.url,
        tokens={TOKEN_A: ORG_A},
        watchdog_interval_ms=100,
        session_login_timeout_ms=300,
    ) as gw:
        params = dict(conninfo_to_dict(small_server.url))
        params.update(user="postgres", password=params.get("password", ""))
        login = await pause_login(params)
        try:
            progress = gw.state.reaper
            with trio.fail_after(10):
                while progress.ended_by["unauthenticated"] < 1:
                    await progress.wait_for_watchdog_pass(progress.watchdog_passes + 1)
            assert await login.finish() is not None
        finally:
            await login.aclose()


async def test_an_orphan_backend_counts_against_its_orgs_budget_until_it_is_ended(
    small_server: EmbeddedPostgres,
) -> None:
    # Finding 3: an org's budget counted the backends of its roles by role name, so a
    # backend left by a reclaim (its role dropped) counted for nobody, and org-a held
    # 32 connections against its budget of 14. The ledger keeps a dropped role's oid
    # (and its org) while the role's backends live: they count against the org's
    # budget, at mint and in the watchdog, until they are ended.
    async with running_gateway(
        small_server.url, tokens={TOKEN_A: ORG_A}, watchdog_interval_ms=600_000
    ) as gw:
        response = await post(
            gw, TOKEN_A, "ensure_sheet", tableNamespace=NAMESPACE, sheetContract=CONTRACT
        )
        assert response.status_code == 200, response.text
        await gw.state.reaper.wait_for_watchdog_pass(1)  # the one pass of this test
        role = await create_session_role(
            gw.state.store,
            SheetRef(ORG_A, PLAY, NAMESPACE),
            ["rows.read"],
            dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10),
        )
        granted = await gw.state.store.pool.run(lambda c: _granted_connections(c, ORG_A))
        params = dict(conninfo_to_dict(small_server.url))
        params.update(user=role.role, password=role.password)
        login = await pause_login(params)
        dropper = await trio.to_thread.run_sync(lambda: psycopg.connect(small_server.url))
        try:
            drop_role(dropper, role.role)  # as the gateway drops it, not yet committed
            with trio.fail_after(10):
                assert await login.finish() is None
            dropper.commit()
            counted = await gw.state.store.pool.run(
                lambda c: (org_session_backends(c, ORG_A), _granted_connections(c, ORG_A))
            )
            # The watchdog's count, and the mint's: the role's limit is gone, its
            # one backend is not.
            assert counted == (1, granted - DB_SESSION_MAX_CONNECTIONS + 1)
        finally:
            dropper.close()
            await login.aclose()
