"""``sheetplane serve --workers 2``: two worker processes answer on one port, each
with its own pool sized from the connection budget, and their session-role
reapers never drop a role twice nor fail."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from _serve_helpers import secret_file_options, serving
from sheetplane import crypto
from sheetplane.gateway.server import ROLE_PREFIX
from sheetplane.store.embedded import EmbeddedPostgres

TOKEN = "tok-workers-3c4d5e6f"
#: A second token of the org: one token may hold only DB_SESSION_MAX_LIVE_PER_TOKEN sessions.
TOKEN_2 = "tok-workers-2-9e0f1a2b"
METRICS_TOKEN = "tok-workers-metrics-7a8b"
ORG = "org-workers"
CONTRACT = {"columns": [{"id": "name", "sqlName": "name", "source": "input"}]}
SESSIONS = 20
DEADLINE_S = 60
#: The deployment's Postgres connections (``--db-connections``), both workers' pools
#: together; the test mints at most this many sessions at once.
DB_CONNECTIONS = 4


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A Postgres no other test mints roles on, so every role reaped here is one of ours."""
    with EmbeddedPostgres(durable=False) as server:
        yield server


def _session_roles(database_url: str) -> list[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", (ROLE_PREFIX,)
        ).fetchall()
    return [str(row[0]) for row in rows]


def _parent_pid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("PPid:")).split()[1])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def _worker_pids(http: httpx.AsyncClient, count: int) -> set[int]:
    """Ask ``/healthz`` on new connections (``http`` keeps none alive; the kernel
    hands each to one worker or another) until ``count`` workers have answered."""
    workers: set[int] = set()
    with trio.fail_after(DEADLINE_S):
        while len(workers) < count:
            workers.add((await http.get("/healthz")).json()["worker"])
    return workers


@pytest.mark.heavy(11)
async def test_two_workers_share_one_port_and_their_reapers_never_conflict(
    own_postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    url = own_postgres.url
    async with serving(
        *secret_file_options(tmp_path, url, {TOKEN: ORG, TOKEN_2: ORG}, METRICS_TOKEN),
        "--workers",
        "2",
        "--db-connections",
        str(DB_CONNECTIONS),
        "--reaper-interval-ms",
        "100",
        tmp_path=tmp_path,
    ) as served:
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=served.base_url, timeout=DEADLINE_S, limits=fresh
        ) as http:
            workers = await _worker_pids(http, 2)
            password = str(psycopg.conninfo.conninfo_to_dict(url)["password"])
            for pid in workers:
                assert await trio.to_thread.run_sync(_parent_pid, pid) == served.process.pid
                # The secrets reached the worker on its stdin: not in its argv nor environment.
                for part in ("cmdline", "environ"):
                    text = await trio.Path(f"/proc/{pid}/{part}").read_bytes()
                    for secret in (password, TOKEN, TOKEN_2, METRICS_TOKEN):
                        assert secret.encode() not in text
            auth = {"authorization": f"Bearer {METRICS_TOKEN}"}
            # Any worker's scrape answers for both: their pools of 4 // 2 sum to 4.
            assert (
                _samples((await http.get("/metrics", headers=auth)).text)[
                    ("sheetplane_pool_connections", (("state", "max"),))
                ]
                == 4
            )

            key = await trio.to_thread.run_sync(crypto.generate_decryption_key)

            # Twenty mints at once queued five deep on each pooled connection: on a
            # loaded machine the last waited past the pool's acquire timeout and was
            # answered 503 back-pressure, as designed. At most as many mints at once
            # as the deployment has connections: each is served in its turn.
            at_once = trio.CapacityLimiter(DB_CONNECTIONS)

            async def mint(index: int) -> None:
                async with at_once:
                    response = await http.post(
                        "/api/v2/plays/internal/runtime",
                        json={
                            "action": "create_db_session",
                            "playName": "p",
                            "target": {
                                "tableNamespace": f"ns{index % 4}",
                                "logicalTable": "sheet_rows",
                            },
                            "operations": ["rows.read"],
                            "sheetContract": CONTRACT,
                            "ttlSeconds": 1,
                            "postgresUrlEncryption": key.encryption_request(),
                        },
                        headers={"authorization": f"Bearer {(TOKEN, TOKEN_2)[index % 2]}"},
                    )
                assert response.status_code == 200, response.text

            async with trio.open_nursery() as nursery:
                for index in range(SESSIONS):
                    nursery.start_soon(mint, index)
            totals = _samples((await http.get("/metrics", headers=auth)).text)
            assert totals[("sheetplane_sessions_minted_total", ())] == SESSIONS
            assert (
                totals[
                    (
                        "sheetplane_requests_total",
                        (("action", "create_db_session"), ("status", "200")),
                    )
                ]
                == SESSIONS
            )
        # Every role expires after a second; the reapers drop them all, each drop
        # in a pass's log line (a pass logs once its transaction is back: waited for).

        def logged_drops() -> int:
            records = served.log_records()
            return sum(r["dropped"] for r in records if r.get("event") == "reaper_pass")

        with trio.fail_after(DEADLINE_S):
            while True:
                roles = await trio.to_thread.run_sync(_session_roles, url)
                if not roles and logged_drops() >= SESSIONS:
                    break
                await trio.sleep(0.1)
    records = served.log_records()
    passes = [r for r in records if r.get("event") == "reaper_pass"]
    assert {r["pid"] for r in passes} == workers
    assert sum(r["dropped"] for r in passes) == SESSIONS
    assert all(r["failed"] == 0 for r in passes)
    problems: list[dict[str, Any]] = [r for r in records if r["level"] in {"warning", "error"}]
    assert problems == [], [r.get("message") for r in problems]
    minted = [r for r in records if r.get("action") == "create_db_session" and r["status"] == 200]
    assert {r["pid"] for r in minted} == workers


async def test_a_worker_that_dies_stops_the_others_and_the_exit_is_1(
    own_postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    async with serving(
        *secret_file_options(tmp_path, own_postgres.url, {TOKEN: ORG}),
        "--workers",
        "2",
        "--db-connections",
        "4",
        tmp_path=tmp_path,
        expect_status=None,
    ) as served:
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=served.base_url, timeout=DEADLINE_S, limits=fresh
        ) as http:
            workers = await _worker_pids(http, 2)
        victim, survivor = sorted(workers)
        os.kill(victim, signal.SIGKILL)
        with trio.fail_after(DEADLINE_S):
            await served.process.wait()
        served.stopped = True
        assert served.process.returncode == 1
        assert not await trio.Path(f"/proc/{survivor}").exists()
