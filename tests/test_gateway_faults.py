"""Test faults: the header grammar, the schedule, and every kind through the real server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from sheetplane._types import CompleteRow, ContractColumn, SheetContract, SheetRef
from sheetplane.budgets import (
    MAX_ATTEMPTS,
    READ_BATCH_MAX_RESPONSE_BYTES,
    REQUEST_TIMEOUT_MS,
    RETRY_DELAYS_MS,
)
from sheetplane.errors import InvalidInputError, ReadBatchTooLargeError, TransientGatewayError
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.faults import (
    FAULT_HEADER,
    FAULT_KINDS,
    FaultSchedule,
    FaultSpec,
    format_fault_header,
    parse_fault_header,
)
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.pages import PageRequest
from sheetplane.store import superseded_rows

# --- the header grammar and the schedule (no I/O) ---------------------------------------


def test_parse_header_with_counts_defaults_and_nonce() -> None:
    specs = parse_fault_header("runtime_sheet_read_rows_batch=503:2, ensure_sheet=reset; nonce=abc")
    assert specs == (
        FaultSpec("runtime_sheet_read_rows_batch", "503", 2),
        FaultSpec("ensure_sheet", "reset", 1),
    )


@pytest.mark.parametrize(
    "value",
    ["", "ensure_sheet", "ensure_sheet=teapot", "ensure_sheet=503:x", "ensure_sheet=503:0", ";"],
)
def test_malformed_header_is_refused(value: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_fault_header(value)


def test_format_round_trips_every_kind() -> None:
    specs = tuple(
        FaultSpec(f"action_{i}", kind, i + 1) for i, kind in enumerate(sorted(FAULT_KINDS))
    )
    assert parse_fault_header(format_fault_header(specs, nonce="n1")) == specs


def test_schedule_counts_down_in_order_and_only_for_its_action() -> None:
    schedule = FaultSchedule()
    schedule.arm("read=503:2, read=reset, other=hang")
    assert schedule.pending("read") == 3
    assert [schedule.take("read") for _ in range(4)] == ["503", "503", "reset", None]
    assert schedule.take("unrelated") is None
    assert schedule.take("other") == "hang"
    assert schedule.take("other") is None


def test_same_header_value_arms_once_and_a_new_nonce_arms_again() -> None:
    schedule = FaultSchedule()
    schedule.arm("read=502")
    schedule.arm("read=502")  # a retry carrying the same header
    assert schedule.pending("read") == 1
    assert schedule.take("read") == "502"
    schedule.arm("read=502")
    assert schedule.take("read") is None
    schedule.arm("read=502; nonce=2")
    assert schedule.take("read") == "502"


def test_malformed_header_arms_nothing() -> None:
    schedule = FaultSchedule()
    with pytest.raises(InvalidInputError):
        schedule.arm("read=503, read=bogus")
    assert schedule.pending("read") == 0


# --- every kind through the real server ------------------------------------------------------

TOKEN = "tok-faults-9a8b7c6d"
ORG = "acme"
PLAY = "enrich-leads"
CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)
SUMMARY = "runtime_sheet_summary"
BATCH = "runtime_sheet_read_rows_batch"


class Counting(httpx.AsyncBaseTransport):
    """A real HTTP transport that records the action of every request it sends."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.actions: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.actions.append(json.loads(request.content)["action"])
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@pytest.fixture
async def faulty(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}, allow_test_faults=True) as gw:
        yield gw


async def seed(gw: RunningGateway, namespace: str, n: int = 10) -> None:
    sheet = SheetRef(ORG, PLAY, namespace)
    rows = [{"_key": f"k{i:03d}", "email": f"u{i}@example.com"} for i in range(n)]
    await gw.state.store.start_dataset(sheet, rows, "run-1", CONTRACT)


def client(gw: RunningGateway, transport: Counting, fault: str | None) -> GatewayClient:
    headers = {FAULT_HEADER: fault} if fault is not None else None
    return GatewayClient(gw.base_url, TOKEN, play_name=PLAY, transport=transport, headers=headers)


async def raw_post(gw: RunningGateway, action: str, fault: str, **fields: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=1.0) as http:
        return await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": PLAY, **fields},
            headers={"authorization": f"Bearer {TOKEN}", FAULT_HEADER: fault},
        )


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [
        ("502", 502, "test_fault"),
        ("503", 503, "test_fault"),
        ("504", 504, "test_fault"),
        ("backpressure", 503, "runtime_postgres_admission_backpressure"),
        ("413", 413, "runtime_sheet_read_batch_too_large"),
        ("unsupported", 400, "unsupported_action"),
    ],
)
async def test_status_faults_on_the_wire(
    faulty: RunningGateway, namespace: str, kind: str, status: int, code: str
) -> None:
    response = await raw_post(faulty, SUMMARY, f"{SUMMARY}={kind}", tableNamespace=namespace)
    assert response.status_code == status
    assert response.json()["code"] == code
    if kind == "unsupported":
        assert response.json()["error"] == f"Unsupported runtime data-plane action: {SUMMARY}"
    # Armed once: the next request (same header) is answered normally.
    again = await raw_post(faulty, SUMMARY, f"{SUMMARY}={kind}", tableNamespace=namespace)
    assert again.status_code == 200


async def test_body_and_connection_faults_on_the_wire(
    faulty: RunningGateway, namespace: str
) -> None:
    malformed = await raw_post(faulty, SUMMARY, f"{SUMMARY}=malformed", tableNamespace=namespace)
    assert malformed.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        malformed.json()
    with pytest.raises(httpx.RemoteProtocolError, match=r"incomplete|complete message body"):
        await raw_post(faulty, SUMMARY, f"{SUMMARY}=truncated", tableNamespace=namespace)
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        await raw_post(faulty, SUMMARY, f"{SUMMARY}=reset", tableNamespace=namespace)
    with pytest.raises(httpx.ReadTimeout):
        await raw_post(faulty, SUMMARY, f"{SUMMARY}=hang", tableNamespace=namespace)


@pytest.mark.parametrize(
    "kind", ["502", "503", "504", "backpressure", "reset", "truncated", "malformed"]
)
async def test_client_retries_transient_faults_to_success(
    faulty: RunningGateway, namespace: str, kind: str
) -> None:
    await seed(faulty, namespace, 3)
    transport = Counting()
    async with client(faulty, transport, f"{SUMMARY}={kind}:2") as gateway_client:
        summary = await gateway_client.summary(namespace)
    assert summary.total == 3
    assert transport.actions == [SUMMARY] * 3
    assert faulty.state.faults.pending(SUMMARY) == 0


@pytest.mark.heavy(16)
async def test_client_times_out_a_hung_attempt_then_retries(
    faulty: RunningGateway, namespace: str, mock_clock: trio.testing.MockClock
) -> None:
    await seed(faulty, namespace, 3)
    # Virtual time moves only when every task has been idle for a while in real
    # time, i.e. while the client waits on the hung attempt or the ladder.
    mock_clock.autojump_threshold = 0.5
    transport = Counting()
    start = trio.current_time()
    async with client(faulty, transport, f"{SUMMARY}=hang") as gateway_client:
        summary = await gateway_client.summary(namespace)
    assert summary.total == 3
    assert transport.actions == [SUMMARY, SUMMARY]
    assert trio.current_time() - start == pytest.approx(
        (REQUEST_TIMEOUT_MS + RETRY_DELAYS_MS[0]) / 1000
    )


async def test_client_gives_up_after_the_ladder(
    faulty: RunningGateway, namespace: str, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.2
    transport = Counting()
    start = trio.current_time()
    async with client(faulty, transport, f"{SUMMARY}=502:{MAX_ATTEMPTS}") as gateway_client:
        with pytest.raises(TransientGatewayError) as caught:
            await gateway_client.summary(namespace)
    assert caught.value.status == 502
    assert transport.actions == [SUMMARY] * MAX_ATTEMPTS
    assert trio.current_time() - start == pytest.approx(sum(RETRY_DELAYS_MS) / 1000)


async def test_413_on_a_batch_read_is_raised_not_retried(
    faulty: RunningGateway, namespace: str
) -> None:
    await seed(faulty, namespace, 3)
    transport = Counting()
    async with client(faulty, transport, f"{BATCH}=413") as gateway_client:
        with pytest.raises(ReadBatchTooLargeError) as caught:
            await gateway_client.read_rows_batch(namespace, [PageRequest(2, 0)])
    assert caught.value.observed_bytes == READ_BATCH_MAX_RESPONSE_BYTES + 1
    assert transport.actions == [BATCH]


async def test_unsupported_batch_falls_back_to_single_page_reads(
    faulty: RunningGateway, namespace: str
) -> None:
    await seed(faulty, namespace, 10)
    transport = Counting()
    requests = [PageRequest(4, 0), PageRequest(4, 4), PageRequest(4, 8)]
    async with client(faulty, transport, f"{BATCH}=unsupported") as gateway_client:
        pages = await gateway_client.read_rows_batch(namespace, requests)
        assert transport.actions == [BATCH] + ["runtime_sheet_read_rows"] * 3
        again = await gateway_client.read_rows_batch(namespace, requests)
    assert transport.actions[-1] == BATCH  # the fault was used up: batch reads work again
    assert pages == again
    assert [row["_key"] for page in pages for row in page.rows] == [f"k{i:03d}" for i in range(10)]


async def test_faults_are_ignored_without_the_flag(database_url: str, namespace: str) -> None:
    async with running_gateway(database_url, tokens={TOKEN: ORG}) as plain:
        await seed(plain, namespace, 2)
        for kind in ("502", "reset", "hang", "bogus"):
            response = await raw_post(
                plain, SUMMARY, f"{SUMMARY}={kind}:3", tableNamespace=namespace
            )
            assert response.status_code == 200
            assert response.json()["total"] == 2
        assert plain.state.faults.pending(SUMMARY) == 0


async def test_malformed_fault_header_is_a_400_with_the_flag(
    faulty: RunningGateway, namespace: str
) -> None:
    response = await raw_post(faulty, SUMMARY, f"{SUMMARY}=bogus", tableNamespace=namespace)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_test_fault"


# --- legacy mode, through the client ------------------------------------------------------------


async def test_legacy_gateway_through_the_client(database_url: str, namespace: str) -> None:
    async with running_gateway(database_url, tokens={TOKEN: ORG}, legacy=True) as legacy:
        transport = Counting()
        async with client(legacy, transport, None) as gateway_client:
            first = await gateway_client.start_sheet_dataset(
                namespace,
                CONTRACT,
                [{"_key": "a", "email": "a@x"}, {"_key": "b", "email": "b@x"}],
                "run-1",
            )
            pages = await gateway_client.read_rows_batch(
                namespace, [PageRequest(1, 0), PageRequest(1, 1)]
            )
            assert [p.rows[0]["_key"] for p in pages] == ["a", "b"]
            assert transport.actions[-3:] == [
                BATCH,
                "runtime_sheet_read_rows",
                "runtime_sheet_read_rows",
            ]

            await gateway_client.start_sheet_dataset(
                namespace, CONTRACT, [{"_key": "a", "email": "a@x"}], "run-2"
            )
            result = await gateway_client.complete_map_rows(
                namespace,
                CONTRACT,
                [CompleteRow("a", {"score": 1})],
                run_id="run-1",
                write_version=first.write_version,
            )
    assert result.committed_keys == ()
    assert [(row.key, row.reason) for row in superseded_rows(result)] == [("a", "unreported")]
