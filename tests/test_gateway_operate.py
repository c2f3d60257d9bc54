"""Operating a real ``sheetplane serve`` process: health and readiness through a
Postgres outage, Prometheus metrics that move, JSON logs with request ids and
the traceback of a 500."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from _serve_helpers import Served, SummaryLock, post_action, secret_file_options, serving
from sheetplane import crypto
from sheetplane._threads import THREAD_TRACEBACK_NOTE
from sheetplane._types import SheetRef
from sheetplane.budgets import GATEWAY_READINESS_BUDGET_MS
from sheetplane.gateway.server import running_gateway
from sheetplane.store import sheet_names
from sheetplane.store.embedded import EmbeddedPostgres

TOKEN = "tok-operate-5f6a7b8c"
METRICS_TOKEN = "tok-metrics-9d0e1f2a"
ORG = "org-operate"
PLAY = "p"
CONTRACT = {"columns": [{"id": "name", "sqlName": "name", "source": "input"}]}
#: How long a test waits for a condition it polls (a loaded two-core machine).
DEADLINE_S = 30


@pytest.fixture(scope="module")
def outage_postgres() -> Iterator[EmbeddedPostgres]:
    """A Postgres of this module's own, which a test may stop and start again."""
    with EmbeddedPostgres(durable=False) as server:
        yield server


def secret_files(tmp_path: Path, database_url: str) -> list[str]:
    """``serve`` options that read every secret from a file."""
    return secret_file_options(tmp_path, database_url, {TOKEN: ORG}, METRICS_TOKEN)


async def get(base_url: str, path: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=DEADLINE_S) as http:
        return await http.get(path, headers=headers)


async def wait_for_ready(base_url: str, expected: int) -> httpx.Response:
    """Poll ``/readyz`` until it answers ``expected`` (deadline ``DEADLINE_S``)."""
    with trio.fail_after(DEADLINE_S):
        while True:
            response = await get(base_url, "/readyz")
            if response.status_code == expected:
                return response
            await trio.sleep(GATEWAY_READINESS_BUDGET_MS / 1000 / 4)


# --- health and readiness ---------------------------------------------------------------


async def test_health_and_readiness_follow_postgres_down_and_back(
    outage_postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    async with serving(*secret_files(tmp_path, outage_postgres.url), tmp_path=tmp_path) as served:
        health = await get(served.base_url, "/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        ready = await get(served.base_url, "/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})

        await trio.to_thread.run_sync(outage_postgres.halt)
        try:
            down = await wait_for_ready(served.base_url, 503)
            body = down.json()
            assert set(body) == {"status", "reason", "budget_ms"}
            assert body["status"] == "unready"
            assert body["reason"] in {"store_unavailable", "store_timeout"}
            assert body["budget_ms"] == GATEWAY_READINESS_BUDGET_MS
            # Alive all the same: a load balancer must not restart it for an outage.
            assert (await get(served.base_url, "/healthz")).status_code == 200
        finally:
            await trio.to_thread.run_sync(outage_postgres.resume)
        back = await wait_for_ready(served.base_url, 200)
        assert back.json() == {"status": "ready"}
        summary = await post_action(
            served.base_url, TOKEN, "runtime_sheet_summary", {"tableNamespace": "n"}
        )
        assert summary.status_code == 200
        for probe in ("/healthz", "/readyz"):
            assert ORG not in (await get(served.base_url, probe)).text


async def test_readiness_reports_a_saturated_pool_and_backpressure_counts(
    database_url: str, tmp_path: Path, namespace: str
) -> None:
    sheet = SheetRef(ORG, PLAY, namespace)
    async with (
        serving(
            *secret_files(tmp_path, database_url), "--db-connections", "2", tmp_path=tmp_path
        ) as served,
        httpx.AsyncClient(base_url=served.base_url, timeout=DEADLINE_S) as http,
    ):
        ensure = await post_action(
            served.base_url, TOKEN, "ensure_sheet", {"tableNamespace": namespace}
        )
        assert ensure.status_code == 200
        lock = SummaryLock(database_url, sheet)
        await lock.take()
        answers: list[int] = []
        try:
            async with trio.open_nursery() as nursery:

                async def blocked_summary() -> None:
                    response = await http.post(
                        "/api/v2/plays/internal/runtime",
                        json={
                            "action": "runtime_sheet_summary",
                            "playName": PLAY,
                            "tableNamespace": namespace,
                        },
                        headers={"authorization": f"Bearer {TOKEN}"},
                    )
                    answers.append(response.status_code)

                for _ in range(2):
                    nursery.start_soon(blocked_summary)
                await lock.wait_for_waiters(2)  # both pooled connections are held
                unready = await get(served.base_url, "/readyz")
                assert unready.status_code == 503
                assert unready.json()["reason"] == "pool_saturated"
                pushed_back = await post_action(
                    served.base_url, TOKEN, "runtime_sheet_summary", {"tableNamespace": namespace}
                )
                assert pushed_back.status_code == 503
                assert pushed_back.json()["code"] == "runtime_postgres_admission_backpressure"
                await lock.release()
        finally:
            await lock.release()
        assert answers == [200, 200]
        metrics = await scrape(served)
        assert sample(metrics, "sheetplane_backpressure_total") == 1
        assert sample(metrics, "sheetplane_pool_connections", state="max") == 2
        await wait_for_ready(served.base_url, 200)


# --- metrics ----------------------------------------------------------------------------------


async def scrape(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``, parsed by prometheus-client's own parser."""
    response = await get(served.base_url, "/metrics", authorization=f"Bearer {METRICS_TOKEN}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sample(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def create_session(base_url: str, namespace: str, ttl_seconds: int) -> dict[str, Any]:
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    response = await post_action(
        base_url,
        TOKEN,
        "create_db_session",
        {
            "target": {"tableNamespace": namespace, "logicalTable": "sheet_rows"},
            "operations": ["rows.read"],
            "sheetContract": CONTRACT,
            "ttlSeconds": ttl_seconds,
            "postgresUrlEncryption": key.encryption_request(),
        },
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_metrics_move_as_requests_are_made(
    database_url: str, tmp_path: Path, namespace: str
) -> None:
    async with serving(
        *secret_files(tmp_path, database_url), "--reaper-interval-ms", "200", tmp_path=tmp_path
    ) as served:
        assert (await get(served.base_url, "/metrics")).status_code == 401
        wrong = await get(served.base_url, "/metrics", authorization="Bearer nope")
        assert wrong.status_code == 401
        before = await scrape(served)
        for name in (
            "sheetplane_backpressure_total",
            "sheetplane_sessions_minted_total",
            "sheetplane_session_roles_live",
            "sheetplane_session_roles_reaped_total",
            "sheetplane_read_batch_too_large_total",
            "sheetplane_admissions_total",
        ):
            assert (name, ()) in before, name
        assert sample(before, "sheetplane_pool_connections", state="max") == 8

        rows = [{"_key": f"k{i}", "name": "x" * 1_000_000} for i in range(16)]
        for half in (rows[:8], rows[8:]):
            admitted = await post_action(
                served.base_url,
                TOKEN,
                "start_sheet_dataset",
                {
                    "tableNamespace": namespace,
                    "sheetContract": CONTRACT,
                    "rows": half,
                    "runId": "r",
                },
            )
            assert admitted.status_code == 200, admitted.text
        too_large = await post_action(
            served.base_url,
            TOKEN,
            "runtime_sheet_read_rows_batch",
            {"input": {"tableNamespace": namespace, "pages": [{"limit": 16, "offset": 0}]}},
        )
        assert too_large.status_code == 413
        unauthorized = await post_action(
            served.base_url, "tok-unknown", "runtime_sheet_summary", {"tableNamespace": namespace}
        )
        assert unauthorized.status_code == 401
        unknown = await post_action(served.base_url, TOKEN, f"no_such_action_{ORG}", {})
        assert unknown.status_code == 400
        await create_session(served.base_url, namespace, ttl_seconds=1)

        after = await scrape(served)

        def moved(name: str, **labels: str) -> float:
            return sample(after, name, **labels) - sample(before, name, **labels)

        assert moved("sheetplane_requests_total", action="start_sheet_dataset", status="200") == 2
        assert (
            moved("sheetplane_requests_total", action="runtime_sheet_read_rows_batch", status="413")
            == 1
        )
        assert moved("sheetplane_requests_total", action="none", status="401") == 1
        assert moved("sheetplane_requests_total", action="unknown", status="400") == 1
        assert moved("sheetplane_requests_total", action="create_db_session", status="200") == 1
        assert moved("sheetplane_request_seconds_count", action="start_sheet_dataset") == 2
        assert moved("sheetplane_request_seconds_sum", action="start_sheet_dataset") > 0
        assert moved("sheetplane_admissions_total") == 2
        assert moved("sheetplane_read_batch_too_large_total") == 1
        assert moved("sheetplane_sessions_minted_total") == 1
        assert sample(after, "sheetplane_session_roles_live") >= 1
        assert moved("sheetplane_requests_total", action="metrics", status="200") >= 1
        assert sample(after, "sheetplane_connections_open") >= 1  # the scrape's own
        assert sample(after, "sheetplane_requests_in_flight") == 1  # the scrape itself
        assert sample(after, "sheetplane_draining") == 0
        assert (
            sample(
                after, "sheetplane_request_seconds_bucket", action="start_sheet_dataset", le="30.0"
            )
            == 2
        )
        # No label value names a tenant, a namespace or a token.
        for name, labels in after:
            for _, value in labels:
                for secret in (ORG, namespace, TOKEN, METRICS_TOKEN):
                    assert secret not in value, (name, labels)

        # The session expires after a second; the reaper drops its role.
        with trio.fail_after(DEADLINE_S):
            while True:
                reaped = await scrape(served)
                if sample(reaped, "sheetplane_session_roles_reaped_total") >= 1:
                    break
                await trio.sleep(0.2)
        # Live roles are counted in the whole database (other tests' sessions too):
        # ours is one fewer.
        live_before = sample(after, "sheetplane_session_roles_live")
        assert sample(reaped, "sheetplane_session_roles_live") <= live_before - 1


async def test_metrics_are_off_without_a_metrics_token(database_url: str, tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(database_url)
    async with serving("--database-url-file", str(url_file), tmp_path=tmp_path) as served:
        response = await get(served.base_url, "/metrics", authorization="Bearer anything")
        assert response.status_code == 404


# --- logs ---------------------------------------------------------------------------------------


async def test_a_500_logs_its_traceback_under_its_request_id(
    database_url: str, tmp_path: Path, namespace: str
) -> None:
    sheet = SheetRef(ORG, PLAY, namespace)
    async with serving(*secret_files(tmp_path, database_url), tmp_path=tmp_path) as served:
        ensure = await post_action(
            served.base_url, TOKEN, "ensure_sheet", {"tableNamespace": namespace}
        )
        assert ensure.status_code == 200
        # Break the sheet's summary table behind the gateway's back.
        names = sheet_names(sheet)

        def break_summary() -> None:
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                        sql.Identifier(names.schema, names.summary_table),
                        sql.Identifier(f"{names.summary_table}_moved"),
                    )
                )
                conn.execute(
                    sql.SQL("CREATE TABLE {} (broken integer)").format(
                        sql.Identifier(names.schema, names.summary_table)
                    )
                )

        await trio.to_thread.run_sync(break_summary)
        response = await post_action(
            served.base_url,
            TOKEN,
            "runtime_sheet_summary",
            {"tableNamespace": namespace},
            **{"x-request-id": "req-500-7e8f"},
        )
        assert response.status_code == 500
        assert response.headers["x-request-id"] == "req-500-7e8f"
        assert "Traceback" not in response.text
        fresh = await post_action(
            served.base_url,
            TOKEN,
            "runtime_sheet_summary",
            {"tableNamespace": "n"},
            **{"x-request-id": "not a valid id!"},
        )
        made_up = fresh.headers["x-request-id"]
        assert made_up != "not a valid id!"
        assert len(made_up) == 32
    records = served.log_records()
    errors = [r for r in records if r.get("event") == "internal_error"]
    assert len(errors) == 1
    (error,) = errors
    assert error["request_id"] == "req-500-7e8f"
    assert error["level"] == "error"
    # The Postgres error first (it left the store's worker thread without its
    # frames: their traceback is its note), then the store error's traceback.
    logged = error["traceback"]
    assert logged.startswith("psycopg.errors.UndefinedColumn"), logged
    assert THREAD_TRACEBACK_NOTE in logged and ", in _transaction" in logged, logged
    assert "Traceback (most recent call last)" in logged, logged
    access = [r for r in records if r.get("event") == "request"]
    (line,) = [r for r in access if r["request_id"] == "req-500-7e8f"]
    assert line["status"] == 500
    assert line["action"] == "runtime_sheet_summary"
    assert line["org_id"] == ORG
    assert line["method"] == "POST"
    assert line["duration_ms"] > 0
    assert any(r["request_id"] == made_up and r["status"] == 200 for r in access)
    # Never a token, a URL's password or row data.
    text = served.stderr()
    password = psycopg.conninfo.conninfo_to_dict(database_url)["password"]
    for secret in (TOKEN, METRICS_TOKEN, str(password), database_url):
        assert secret not in text
    assert math.isfinite(line["duration_ms"])


async def test_an_action_past_its_budget_is_cancelled_and_answered_504(
    database_url: str, namespace: str
) -> None:
    sheet = SheetRef(ORG, PLAY, namespace)
    # The sheet is made under the default budget: its DDL may itself take longer than
    # 300 ms on a loaded machine (it did at load 16, answering 504).
    async with running_gateway(database_url, tokens={TOKEN: ORG}) as gw:
        ensure = await post_action(
            gw.base_url, TOKEN, "ensure_sheet", {"tableNamespace": namespace}
        )
        assert ensure.status_code == 200
    async with running_gateway(database_url, tokens={TOKEN: ORG}, action_budget_ms=300) as gw:
        lock = SummaryLock(database_url, sheet)
        await lock.take()
        try:
            response = await post_action(
                gw.base_url, TOKEN, "runtime_sheet_summary", {"tableNamespace": namespace}
            )
            assert response.status_code == 504
            assert response.json() == {
                "error": "runtime_sheet_summary did not finish within 300 ms",
                "code": "gateway_action_timeout",
            }
            # The cancelled action's statement was cancelled on the server too.
            await lock.wait_for_waiters(0, exactly=True)
        finally:
            await lock.release()
