"""One org's connections are bounded as a whole, on a real server with few slots:
an org that opens a connection on every session it holds is cut back to its
budget (newest first) within one watchdog period, its further mints are refused
429, and another org's new session connects and works meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import sql

from _session_helpers import aad_of
from sheetplane import crypto
from sheetplane.budgets import (
    DB_SESSION_MAX_CONNECTIONS,
    DB_SESSION_WATCHDOG_INTERVAL_MS,
    org_connection_budget,
)
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.store.embedded import EmbeddedPostgres

#: Few enough slots that one org's sessions could take every one of them.
MAX_CONNECTIONS = 24
#: Postgres's default ``superuser_reserved_connections``.
SUPERUSER_RESERVED = 3
TOKEN_A, ORG_A = "tok-conn-a-51f0", "org-conn-a"
TOKEN_B, ORG_B = "tok-conn-b-9c2e", "org-conn-b"
PLAY = "connections-play"
NAMESPACE = "ns_connections"
CONTRACT = {"columns": [{"id": "email", "sqlName": "email", "source": "input"}]}


@pytest.fixture
def small_server() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(max_connections=MAX_CONNECTIONS, durable=False) as server:
        yield server


async def post(gw: RunningGateway, token: str, action: str, **fields: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        return await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": PLAY, **fields},
            headers={"authorization": f"Bearer {token}"},
        )


def mint_fields(key: crypto.DecryptionKey) -> dict[str, Any]:
    return {
        "target": {"tableNamespace": NAMESPACE, "logicalTable": "sheet_rows"},
        "operations": ["rows.read"],
        "sheetContract": CONTRACT,
        "postgresUrlEncryption": key.encryption_request(),
    }


async def mint(
    gw: RunningGateway, token: str, key: crypto.DecryptionKey
) -> tuple[str, sql.Identifier]:
    """``(url, sheet table)`` of a new ``rows.read`` session."""
    response = await post(gw, token, "create_db_session", **mint_fields(key))
    assert response.status_code == 200, response.text
    answer = response.json()
    url = crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))
    postgres = answer["postgres"]
    return url, sql.Identifier(postgres["schema"], postgres["sheetTable"])


def try_connect(url: str) -> psycopg.Connection[Any] | None:
    """A connection, or None when the server (or the role's limit) refuses one."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        return None


def alive(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


async def org_backends(gw: RunningGateway, org: str) -> int:
    def count(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity a JOIN sheetplane_gateway.sessions l"
            " ON l.role = a.usename WHERE l.org_id = %s",
            (org,),
        ).fetchone()
        assert row is not None
        return int(row[0])

    return await gw.state.store.pool.run(count)


def test_the_org_budget_is_half_the_session_slots_left_and_never_below_one_session() -> None:
    # docs/budgets.md: Postgres's default 100 slots, the embedded server's 200, this file's 24.
    assert [org_connection_budget(n, 3) for n in (100, 200, 24)] == [44, 94, 6]
    assert org_connection_budget(12, 3) == DB_SESSION_MAX_CONNECTIONS


async def test_an_org_past_its_connection_budget_is_cut_back_newest_first_and_another_org_connects(
    small_server: EmbeddedPostgres,
) -> None:
    budget = org_connection_budget(MAX_CONNECTIONS, SUPERUSER_RESERVED)
    async with running_gateway(small_server.url, tokens={TOKEN_A: ORG_A, TOKEN_B: ORG_B}) as gw:
        assert gw.state.caps.connections_per_org == budget == 6
        for token in (TOKEN_A, TOKEN_B):
            response = await post(
                gw, token, "ensure_sheet", tableNamespace=NAMESPACE, sheetContract=CONTRACT
            )
            assert response.status_code == 200, response.text
        key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
        # org-a's sessions could hold every slot the server has for non-superusers.
        sessions = -(-(MAX_CONNECTIONS - SUPERUSER_RESERVED) // DB_SESSION_MAX_CONNECTIONS)
        urls = [(await mint(gw, TOKEN_A, key))[0] for _ in range(sessions)]
        held: list[psycopg.Connection[Any]] = []
        try:
            for url in urls:  # as many connections on each as its role's limit allows
                for _ in range(DB_SESSION_MAX_CONNECTIONS):
                    conn = await trio.to_thread.run_sync(try_connect, url)
                    if conn is not None:
                        held.append(conn)
            assert len(held) > budget  # org-a got past its budget, at least for a while
            opened = trio.current_time()
            # The watchdog ends the excess within one of its periods (and its pass).
            period_s = DB_SESSION_WATCHDOG_INTERVAL_MS / 1000
            with trio.fail_after(2 * period_s + 5):
                while await org_backends(gw, ORG_A) > budget:
                    passes = gw.state.reaper.watchdog_passes
                    await gw.state.reaper.wait_for_watchdog_pass(passes + 1)
            took = trio.current_time() - opened
            print(f"org-a held {len(held)} connections, cut to {budget} in {took:.2f} s")
            assert gw.state.reaper.over_budget >= len(held) - budget
            ended = gw.state.metrics.registry.get_sample_value(
                "sheetplane_session_backends_ended_total", {"reason": "org_budget"}
            )
            assert ended == gw.state.reaper.over_budget
            # Newest first: the oldest connections carry on.
            survivors = [await trio.to_thread.run_sync(alive, c) for c in held]
            assert survivors == [True] * budget + [False] * (len(held) - budget)
            # At its budget, org-a's next mint is refused, with a delay to retry after.
            refused = await post(gw, TOKEN_A, "create_db_session", **mint_fields(key))
            assert refused.status_code == 429, refused.text
            assert refused.json()["code"] == "runtime_db_session_cap"
            assert "connections" in refused.json()["error"]
            assert refused.json()["retry_after_ms"] > 0
            # org-b's new session connects at once (no retry) and reads its sheet.
            url_b, table_b = await mint(gw, TOKEN_B, key)
            conn_b = await trio.to_thread.run_sync(try_connect, url_b)
            assert conn_b is not None, "org-b could not connect"
            with conn_b:
                rows = await trio.to_thread.run_sync(
                    lambda: conn_b.execute(
                        sql.SQL("SELECT count(*) FROM {}").format(table_b)
                    ).fetchall()
                )
            assert rows == [(0,)]
        finally:
            for conn in held:
                await trio.to_thread.run_sync(conn.close)
