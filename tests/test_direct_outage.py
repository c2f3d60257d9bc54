"""A direct runner meeting a stopped Postgres reports it within the connect budget.

The runner's pooled connections die with the server; its next connect is
refused at once, tried again until ``POSTGRES_CONNECT_BUDGET_MS`` is spent,
and then the call fails with ``StoreUnavailableError`` stating the real wait.
Before, the direct road's retries started the whole connect wait again after
each spent one: a stopped server took about 94 s (four connect budgets) to
report, and psycopg_pool's warning per failed connect attempt filled stderr.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator

import pytest
import trio
import trio.lowlevel

from _runtime_helpers import CONTRACT, counting_gateway, runtime
from sheetplane import budgets
from sheetplane.errors import StoreUnavailableError
from sheetplane.runtime import CompleteRow
from sheetplane.store.embedded import EmbeddedPostgres

#: Concurrent writers of the runner.
WRITERS = 4
ROWS = 5_000
#: Slack past the budget: the ladder delay before the connect wait, the
#: in-flight statement's failure, the thread hand-offs of a loaded CI machine.
SLACK_S = 6.0


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(durable=False) as server:
        yield server


@pytest.mark.heavy(25)
async def test_a_direct_runner_reports_postgres_down_within_the_connect_budget(
    own_server: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    failures: list[tuple[float, StoreUnavailableError]] = []
    writing, all_failed = trio.Event(), trio.Event()
    written = 0
    halted_at = 0.0
    async with (
        counting_gateway(own_server.url) as gateway,
        runtime(gateway, "direct", play=f"play-{uuid.uuid4().hex[:8]}") as rt,
    ):
        writer = rt.writer(f"ns_{uuid.uuid4().hex[:10]}", CONTRACT)
        admission = await writer.start([{"text": f"row {i}"} for i in range(ROWS)])
        keys = [row["_key"] async for row in admission.pending()]
        caplog.clear()

        async def write(part: list[str]) -> None:
            nonlocal written
            for key in part:
                try:
                    await writer.complete([CompleteRow(key, {"words": 2})])
                except StoreUnavailableError as exc:
                    failures.append((time.monotonic(), exc))
                    if len(failures) == WRITERS:
                        all_failed.set()
                    return
                written += 1
                if written == 2 * WRITERS:
                    writing.set()

        async with trio.open_nursery() as nursery:
            for i in range(WRITERS):
                nursery.start_soon(write, keys[i::WRITERS])
            await writing.wait()
            await trio.to_thread.run_sync(own_server.halt)
            halted_at = time.monotonic()
            with trio.fail_after(budgets.POSTGRES_CONNECT_BUDGET_MS / 1000 * 2 + SLACK_S):
                await all_failed.wait()
        await trio.to_thread.run_sync(own_server.resume)
    budget_s = budgets.POSTGRES_CONNECT_BUDGET_MS / 1000
    assert len(failures) == WRITERS
    for failed_at, exc in failures:
        assert failed_at - halted_at <= budget_s + SLACK_S, (failed_at - halted_at, str(exc))
        # The message states the real wait: at least the connect budget, waited once.
        waited = [int(ms) for ms in re.findall(r"(\d+) ms", str(exc))]
        assert waited and max(waited) >= budgets.POSTGRES_CONNECT_BUDGET_MS, str(exc)
        assert exc.waited_ms is not None and exc.waited_ms <= (budget_s + SLACK_S) * 1000
    # No warning per failed connect attempt; one per dead pooled connection at most
    # (the gateway's pool and the runner's session pool), and one per pool and outage.
    psycopg_logs = [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
    attempts = [m for m in psycopg_logs if "error connecting" in m or "reconnection" in m]
    assert attempts == [], attempts[:3]
    pooled = budgets.GATEWAY_DB_CONNECTION_BUDGET + budgets.DB_SESSION_MAX_CONNECTIONS
    assert len(psycopg_logs) <= pooled, psycopg_logs[:3]
    outages = [r for r in caplog.records if r.name == "sheetplane.store"]
    assert 1 <= len(outages) <= 2
