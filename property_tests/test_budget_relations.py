"""The relations between budgets, exercised with the real client and session
manager under arbitrary fault schedules and timings in virtual time.

``sheetplane.budgets`` asserts the arithmetic at import; these properties
check that the code actually lives inside it:

* a lease outlives the longest call made under it: a renewal call started
  on schedule (or one renewal period late) ends before the lease expires,
  whatever the gateway does;
* a reused session outlives the longest operation: every session the
  manager hands out, at any moment, has more than
  ``POSTGRES_OPERATION_BUDGET_MS`` left;
* a server-sent Retry-After, however large, cannot stretch a call past
  ``CALL_BUDGET_MS``;
* the response budget leaves room under the transport ceiling, and the body
  reader refuses exactly the bodies over their action's budget.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from sheetplane import ResponseTooLargeError, SheetplaneError
from sheetplane.budgets import (
    ACTION_MAX_RESPONSE_BYTES,
    CALL_BUDGET_MS,
    DB_SESSION_RENEWAL_WINDOW_MS,
    DB_SESSION_TTL_MS,
    MAX_RETRY_AFTER_MS,
    POSTGRES_OPERATION_BUDGET_MS,
    READ_BATCH_MAX_RESPONSE_BYTES,
    RESPONSE_ENVELOPE_HEADROOM_BYTES,
    SHEET_ATTEMPT_LEASE_RENEWAL_MS,
    SHEET_ATTEMPT_LEASE_TTL_MS,
    TRANSPORT_CEILING_BYTES,
    WORK_RECEIPT_LEASE_RENEWAL_MS,
    WORK_RECEIPT_LEASE_TTL_MS,
    MiB,
)
from sheetplane.crypto import encrypt_postgres_url, generate_decryption_key, session_aad
from sheetplane.gateway._body import read_bounded, response_byte_limit
from sheetplane.gateway.client import GatewayClient
from sheetplane.sessions import AccessShape, SessionLimits, SessionManager

from ._fault_transport import FaultTransport, faults

EPOCH = 1_900_000_000.0
KEY = generate_decryption_key()


def run_virtual(fn: Any) -> Any:
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


async def call_under_faults(schedule: list[tuple[Any, ...]], start: float) -> float:
    """Run one call starting at ``start``; return when it ended."""
    transport = FaultTransport(schedule)
    await trio.sleep_until(start)
    async with GatewayClient(
        "http://gw.test", "t", play_name="p", transport=httpx.MockTransport(transport.handle)
    ) as client:
        with contextlib.suppress(SheetplaneError):
            await client.post_action("complete_work_receipt", {})
    assert all(t < start + CALL_BUDGET_MS / 1000 for t, _, _ in transport.seen)
    return trio.current_time()


@settings(max_examples=100, deadline=None)
@given(
    schedule=st.lists(faults.filter(lambda f: f[0] not in ("413", "unsupported")), max_size=6),
    lease=st.sampled_from(
        [
            (SHEET_ATTEMPT_LEASE_TTL_MS, SHEET_ATTEMPT_LEASE_RENEWAL_MS),
            (WORK_RECEIPT_LEASE_TTL_MS, WORK_RECEIPT_LEASE_RENEWAL_MS),
        ]
    ),
    lateness=st.floats(0, 1),
)
def test_a_lease_outlives_the_longest_call_made_under_it(
    schedule: list[tuple[Any, ...]], lease: tuple[int, int], lateness: float
) -> None:
    ttl_ms, renewal_ms = lease
    # The renewal is due at renewal_ms and may start up to one renewal period late.
    start = (renewal_ms + lateness * renewal_ms) / 1000

    async def main() -> float:
        return await call_under_faults(schedule, start)

    end = run_virtual(main)
    assert end <= ttl_ms / 1000


@settings(max_examples=100, deadline=None)
@given(
    retry_afters=st.lists(st.none() | st.integers(0, 10**15), min_size=1, max_size=8),
    slow=st.lists(st.integers(0, 29), max_size=8),
)
def test_retry_after_cannot_stretch_a_call_past_its_budget(
    retry_afters: list[int | None], slow: list[int]
) -> None:
    schedule: list[tuple[Any, ...]] = []
    for i, ra in enumerate(retry_afters):
        if i < len(slow):
            schedule.append(("slow", slow[i] + 0.000123))
        schedule.append(("backpressure", ra))

    async def main() -> float:
        return await call_under_faults(schedule, 0.0)

    end = run_virtual(main)
    assert end <= CALL_BUDGET_MS / 1000
    assert MAX_RETRY_AFTER_MS < CALL_BUDGET_MS


def _mint_handler(request_body: dict[str, Any], now: float) -> dict[str, Any]:
    expires_at = dt.datetime.fromtimestamp(now + request_body["ttlSeconds"], dt.UTC).isoformat()
    target = request_body["target"]
    operations = sorted(request_body["operations"])
    aad = session_aad(
        org_id="org",
        play_name="p",
        table_namespace=target["tableNamespace"],
        logical_table=target["logicalTable"],
        operations=operations,
        expires_at=expires_at,
    )
    jwk = request_body["postgresUrlEncryption"]["publicKeyJwk"]
    return {
        "expiresAt": expires_at,
        "playName": "p",
        "target": {"orgId": "org", **target},
        "operations": operations,
        "limits": request_body.get("limits", {}),
        "postgres": dict.fromkeys(
            ["schema", "sheetTable", "eventTable", "summaryTable", "columnSummaryTable"], "x"
        ),
        "encryptedPostgresUrl": encrypt_postgres_url("postgresql://r:pw@h/db", jwk, aad),
    }


@settings(max_examples=60, deadline=None)
@given(
    gaps_ms=st.lists(st.integers(0, DB_SESSION_TTL_MS), min_size=1, max_size=12),
    shapes=st.lists(st.sampled_from([1, 2, 3]), min_size=12, max_size=12),
)
def test_a_reused_session_outlives_the_longest_operation(
    gaps_ms: list[int], shapes: list[int]
) -> None:
    def wall() -> float:
        return EPOCH + trio.current_time()

    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=_mint_handler(json.loads(await request.aread()), wall()))

    async def main() -> list[tuple[float, float]]:
        handed: list[tuple[float, float]] = []
        client = GatewayClient(
            "http://gw.test", "t", play_name="p", transport=httpx.MockTransport(handle)
        )
        async with client, SessionManager(client, clock=wall, decryption_key=KEY) as manager:
            for gap, shape_id in zip(gaps_ms, shapes, strict=False):
                await trio.sleep(gap / 1000)
                shape = AccessShape(
                    "leads", ("rows.read",), limits=SessionLimits(max_rows=shape_id)
                )
                session = await manager.session(shape)
                handed.append((wall(), session.expires_at_epoch))
        return handed

    for handed_at, expires in run_virtual(main):
        remaining_ms = (expires - handed_at) * 1000
        assert remaining_ms > DB_SESSION_RENEWAL_WINDOW_MS
        # Whole milliseconds: the wire's ISO expiry may round the instant down.
        assert remaining_ms > POSTGRES_OPERATION_BUDGET_MS


def test_budget_constants_leave_room_under_the_transport_ceiling() -> None:
    for action in ("runtime_sheet_read_rows_batch", "runtime_sheet_read_rows", "ensure_sheet"):
        assert response_byte_limit(action) <= TRANSPORT_CEILING_BYTES
    assert (
        response_byte_limit("runtime_sheet_read_rows_batch")
        == READ_BATCH_MAX_RESPONSE_BYTES + RESPONSE_ENVELOPE_HEADROOM_BYTES
    )
    assert RESPONSE_ENVELOPE_HEADROOM_BYTES >= TRANSPORT_CEILING_BYTES // 8


_CHUNK = b"\0" * (256 * 1024)


@settings(max_examples=25, deadline=None)
@given(
    action=st.sampled_from(["runtime_sheet_read_rows_batch", "runtime_sheet_summary"]),
    delta=st.integers(-3, 3) | st.integers(-2 * MiB, 2 * MiB),
    declare=st.booleans(),
)
def test_the_reader_refuses_exactly_the_bodies_over_budget(
    action: str, delta: int, declare: bool
) -> None:
    limit = response_byte_limit(action)
    size = limit + delta

    async def body() -> AsyncIterator[bytes]:
        left = size
        while left > 0:
            yield _CHUNK[: min(left, len(_CHUNK))]
            left -= len(_CHUNK)

    headers = {"content-length": str(size)} if declare else {}

    async def main() -> int | ResponseTooLargeError:
        response = httpx.Response(200, content=body(), headers=headers)
        try:
            return len(await read_bounded(response, action, limit))
        except ResponseTooLargeError as exc:
            return exc

    outcome = run_virtual(main)
    if size <= limit:
        assert outcome == size
    else:
        assert isinstance(outcome, ResponseTooLargeError)
        assert outcome.limit_bytes == limit
        assert limit < outcome.observed_bytes <= size
        assert outcome.limit_bytes <= ACTION_MAX_RESPONSE_BYTES
