"""SIGTERM drains a real ``sheetplane serve``: in-flight requests finish, new
ones on open connections get 503 with ``retry_after_ms``, the exit is 0 within
the drain budget (non-zero past it), and a rolling restart under a runner's
load loses no request."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from _serve_helpers import (
    Served,
    SummaryLock,
    post_action,
    secret_file_options,
    serving,
    wait_for_log,
)
from sheetplane._types import SheetRef
from sheetplane.budgets import GATEWAY_DRAIN_BUDGET_MS, GATEWAY_DRAIN_RETRY_AFTER_MS
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RUNTIME_PATH

TOKEN = "tok-drain-2b3c4d5e"
METRICS_TOKEN = "tok-drain-metrics-6f7a"
ORG = "org-drain"
PLAY = "p"
CONTRACT = {
    "columns": [
        {"id": "name", "sqlName": "name", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}
DEADLINE_S = 60


def _secrets(tmp_path: Path, database_url: str) -> list[str]:
    return secret_file_options(tmp_path, database_url, {TOKEN: ORG}, METRICS_TOKEN)


def _request(action: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps({"action": action, "playName": PLAY, **body}).encode()
    head = (
        f"POST {RUNTIME_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _read_answer(stream: trio.SocketStream) -> bytes:
    """One whole answer on a keep-alive connection (head, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = await stream.receive_some()
        assert chunk
        body += chunk
    return head + b"\r\n\r\n" + body


async def _in_flight(served: Served, count: int) -> None:
    """Poll ``/metrics`` until ``count`` requests besides the scrape are in flight."""
    async with httpx.AsyncClient(base_url=served.base_url, timeout=DEADLINE_S) as http:
        with trio.fail_after(DEADLINE_S):
            while True:
                text = (
                    await http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
                ).text
                line = next(
                    x for x in text.splitlines() if x.startswith("sheetplane_requests_in_flight ")
                )
                if float(line.split()[1]) >= count + 1:
                    return
                await trio.sleep(0.05)


async def _hang_one_request(served: Served, nursery: trio.Nursery) -> None:
    """Start a request the server never answers (the ``hang`` test fault); return
    once it is in flight."""

    async def hanging() -> None:
        # The server closes it unanswered: what a cancelled request gets.
        with contextlib.suppress(httpx.HTTPError):
            await post_action(
                served.base_url,
                TOKEN,
                "runtime_sheet_summary",
                {"tableNamespace": "n"},
                **{"x-sheetplane-test-fault": "runtime_sheet_summary=hang"},
            )

    nursery.start_soon(hanging)
    await _in_flight(served, 1)


async def test_sigterm_finishes_in_flight_answers_new_requests_503_and_exits_0(
    database_url: str, tmp_path: Path, namespace: str
) -> None:
    async with serving(*_secrets(tmp_path, database_url), tmp_path=tmp_path) as served:
        ensure = await post_action(
            served.base_url, TOKEN, "ensure_sheet", {"tableNamespace": namespace}
        )
        assert ensure.status_code == 200
        lock = SummaryLock(database_url, SheetRef(ORG, PLAY, namespace))
        await lock.take()
        idle = await trio.open_tcp_stream("127.0.0.1", served.port)
        probe = await trio.open_tcp_stream("127.0.0.1", served.port)
        in_flight: list[httpx.Response] = []
        try:
            # Open keep-alive connections, idle after one answer each.
            for stream in (idle, probe):
                await stream.send_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                assert (await _read_answer(stream)).startswith(b"HTTP/1.1 200 ")
            async with trio.open_nursery() as nursery:

                async def slow_summary() -> None:
                    in_flight.append(
                        await post_action(
                            served.base_url,
                            TOKEN,
                            "runtime_sheet_summary",
                            {"tableNamespace": namespace},
                        )
                    )

                nursery.start_soon(slow_summary)
                await lock.wait_for_waiters(1)
                started = time.monotonic()
                served.process.terminate()
                await wait_for_log(served, "drain")
                # A new request on the open connection: 503, retry, connection: close.
                await idle.send_all(_request("runtime_sheet_summary", {"tableNamespace": "n"}))
                answer = await _read_answer(idle)
                head, _, body = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 503 ")
                assert b"connection: close" in head.lower()
                assert json.loads(body) == {
                    "error": "the gateway is draining (shutting down); retry the request",
                    "code": "gateway_draining",
                    "retry_after_ms": GATEWAY_DRAIN_RETRY_AFTER_MS,
                }
                # Readiness too: the load balancer stops sending.
                await probe.send_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
                assert (await _read_answer(probe)).startswith(b"HTTP/1.1 503 ")
                await lock.release()
            with trio.fail_after(GATEWAY_DRAIN_BUDGET_MS / 1000):
                await served.process.wait()
            served.stopped = True
            elapsed = time.monotonic() - started
        finally:
            await lock.release()
            await idle.aclose()
            await probe.aclose()
        assert [r.status_code for r in in_flight] == [200]
        assert served.process.returncode == 0
        assert elapsed < GATEWAY_DRAIN_BUDGET_MS / 1000
        assert any(r.get("event") == "drained" for r in served.log_records())


async def test_past_the_drain_budget_what_is_left_is_cancelled_and_the_exit_is_1(
    database_url: str, tmp_path: Path
) -> None:
    budget_ms = 1_000
    async with (
        serving(
            *_secrets(tmp_path, database_url),
            "--allow-test-faults",
            "--drain-budget-ms",
            str(budget_ms),
            tmp_path=tmp_path,
            expect_status=None,
        ) as served,
        trio.open_nursery() as nursery,
    ):
        await _hang_one_request(served, nursery)
        started = time.monotonic()
        status = await served.stop(timeout_s=DEADLINE_S)
        elapsed = time.monotonic() - started
    assert status == 1
    assert budget_ms / 1000 <= elapsed < budget_ms / 1000 + DEADLINE_S / 4
    incomplete = [r for r in served.log_records() if r.get("event") == "drain_incomplete"]
    assert [r["cancelled"] for r in incomplete] == [1]


async def test_a_second_signal_stops_at_once_with_exit_1(database_url: str, tmp_path: Path) -> None:
    async with (
        serving(
            *_secrets(tmp_path, database_url),
            "--allow-test-faults",
            tmp_path=tmp_path,
            expect_status=None,
        ) as served,
        trio.open_nursery() as nursery,
    ):
        await _hang_one_request(served, nursery)
        served.process.terminate()
        await wait_for_log(served, "drain")
        started = time.monotonic()
        status = await served.stop(timeout_s=DEADLINE_S)
        # Well before the 50 s drain budget would have run out.
        assert time.monotonic() - started < GATEWAY_DRAIN_BUDGET_MS / 1000 / 2
    assert status == 1


async def test_a_rolling_restart_under_a_runners_load_loses_no_request(
    database_url: str, tmp_path: Path, namespace: str
) -> None:
    rows = 240
    async with (
        serving(*_secrets(tmp_path, database_url), "--reuse-port", tmp_path=tmp_path) as old,
        serving(
            *_secrets(tmp_path, database_url),
            "--reuse-port",
            "--port",
            str(old.port),
            tmp_path=tmp_path,
        ) as new,
    ):
        assert new.port == old.port
        async with GatewayClient(old.base_url, TOKEN, play_name=PLAY, org_id=ORG) as client:
            admission = await client.post_action(
                "start_sheet_dataset",
                {
                    "tableNamespace": namespace,
                    "sheetContract": CONTRACT,
                    "rows": [{"_key": f"k{i}", "name": f"n{i}"} for i in range(rows)],
                    "runId": "run-1",
                },
            )
            version = admission["writeVersion"]
            send, receive = trio.open_memory_channel[str](rows)
            for i in range(rows):
                send.send_nowait(f"k{i}")
            send.close()
            done = 0
            restarted = trio.Event()
            stopped: list[tuple[Served, int]] = []

            async def runner_task() -> None:
                nonlocal done
                async for key in receive:
                    await client.post_action(
                        "runtime_sheet_complete_map_rows",
                        {
                            "tableNamespace": namespace,
                            "sheetContract": CONTRACT,
                            "runId": "run-1",
                            "writeVersion": version,
                            "rows": [{"key": key, "data": {"score": 1}}],
                        },
                    )
                    done += 1
                    if done == rows // 3 and not restarted.is_set():
                        restarted.set()

            async def restart_one() -> None:
                await restarted.wait()
                # The kernel spreads connections over the two listeners by a hash
                # (SO_REUSEPORT), and the runner keeps its few connections alive: all
                # of them may have gone to one gateway, which the other never
                # serves until it stops. Restart one that answered part of the load
                # (the first gateway when both did); its log has the writes once
                # they were answered.
                with trio.fail_after(DEADLINE_S):
                    while True:
                        answering = [served for served in (old, new) if _writes(served)]
                        if answering:
                            break
                        await trio.sleep(0.05)  # polls another process's log
                stopping = answering[0]
                status = await stopping.stop(timeout_s=GATEWAY_DRAIN_BUDGET_MS / 1000)
                stopped.append((stopping, status))

            with trio.fail_after(DEADLINE_S * 3):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(restart_one)
                    for _ in range(8):
                        nursery.start_soon(runner_task)
            summary = await client.post_action(
                "runtime_sheet_summary", {"tableNamespace": namespace}
            )
        assert done == rows
        assert [status for _, status in stopped] == [0]
        assert summary["completed"] == rows
        assert summary["total"] == rows
        # Both gateways answered part of the load: the stopped one before its drain,
        # the other (every connection the drain closed came to it) after.
        for served in (old, new):
            assert _writes(served), served.stderr()[-2000:]


def _writes(served: Served) -> list[dict[str, Any]]:
    """The terminal writes ``served`` answered 200 (its structured log)."""
    return [
        r
        for r in served.log_records()
        if r.get("action") == "runtime_sheet_complete_map_rows" and r.get("status") == 200
    ]
