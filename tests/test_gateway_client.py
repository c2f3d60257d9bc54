"""GatewayClient against a scripted transport, in virtual time.

Every timing assertion is exact: ``autojump_clock`` starts at 0 and the
client's waits come only from the budgets.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import math
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from _seed_transient import EXAMPLES
from sheetplane import (
    BackpressureError,
    GatewayAuthError,
    GatewayError,
    GatewayProtocolError,
    GatewayTimeoutError,
    GatewayUnreachableError,
    InvalidInputError,
    ReadBatchTooLargeError,
    ResponseTooLargeError,
    TransientGatewayError,
    UnsupportedActionError,
    protocol,
)
from sheetplane._types import (
    CompleteRow,
    ContractColumn,
    FailRow,
    ResolvedPlay,
    SheetContract,
    StaleRow,
)
from sheetplane.budgets import (
    ACTION_MAX_RESPONSE_BYTES,
    CALL_BUDGET_MS,
    DEFAULT_RETRY_AFTER_MS,
    GATEWAY_RECONNECT_BASE_MS,
    GATEWAY_RECONNECT_CAP_MS,
    MAX_RETRY_AFTER_MS,
    READ_BATCH_MAX_RESPONSE_BYTES,
    REQUEST_TIMEOUT_MS,
    RETRY_DELAYS_MS,
    MiB,
)
from sheetplane.gateway.client import GatewayClient, tls_context
from sheetplane.pages import Page, PageRequest
from sheetplane.protocol import prepare_chunk

TOKEN = "exec-token-0123456789"
BASE = "http://gateway.test"
URL = BASE + "/api/v2/plays/internal/runtime"
CONTRACT = SheetContract((ContractColumn("email", "email", "input"),))

Reply = Callable[[httpx.Request], Awaitable[httpx.Response]]


@attrs.define
class Script:
    """A transport that plays one reply per request, then ``default``, recording each request."""

    replies: list[Reply] = attrs.field(factory=list)
    default: Reply | None = None
    seen: list[tuple[float, dict[str, Any], httpx.Headers]] = attrs.field(factory=list)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        self.seen.append((trio.current_time(), body, request.headers))
        reply = self.replies.pop(0) if self.replies else self.default
        assert reply is not None, "unexpected request"
        return await reply(request)

    @property
    def times(self) -> list[float]:
        return [t for t, _, _ in self.seen]

    @property
    def actions(self) -> list[str]:
        return [body["action"] for _, body, _ in self.seen]

    def client(self, **kwargs: Any) -> GatewayClient:
        return GatewayClient(
            BASE + "/",
            TOKEN,
            play_name="enrich-leads",
            transport=httpx.MockTransport(self.handle),
            **kwargs,
        )


def ok(body: Any, status: int = 200, **kwargs: Any) -> Reply:
    async def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body, **kwargs)

    return reply


def status(code: int, body: Any = None, **kwargs: Any) -> Reply:
    async def reply(request: httpx.Request) -> httpx.Response:
        if body is None:
            return httpx.Response(code, text="<html>bad gateway</html>", **kwargs)
        return httpx.Response(code, json=body, **kwargs)

    return reply


def raises(exc: type[httpx.TransportError], text: str = "ECONNRESET") -> Reply:
    async def reply(request: httpx.Request) -> httpx.Response:
        raise exc(text, request=request)

    return reply


async def hang(request: httpx.Request) -> httpx.Response:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def drip(interval: float) -> Reply:
    """A 200 whose body arrives one byte per ``interval`` seconds, forever."""

    async def reply(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b'{"ok":'
            while True:
                await trio.sleep(interval)
                yield b" "

        return httpx.Response(200, content=body())

    return reply


def truncated() -> Reply:
    """A 200 whose connection drops mid-body."""

    async def reply(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b'{"pages":[{"rows":'
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body", request=request
            )

        return httpx.Response(200, content=body())

    return reply


def ladder_times(failures: int) -> list[float]:
    times = [0.0]
    for delay in RETRY_DELAYS_MS[: failures - 1]:
        times.append(times[-1] + delay / 1000)
    return times


# --- the one path ------------------------------------------------------------------


async def test_post_action_sends_action_play_and_bearer(autojump_clock: Any) -> None:
    script = Script([ok({"total": 1})])
    async with script.client() as client:
        assert await client.post_action("runtime_sheet_summary", {"tableNamespace": "t"}) == {
            "total": 1
        }
    (_, body, headers), *_ = script.seen
    assert body == {
        "tableNamespace": "t",
        "action": "runtime_sheet_summary",
        "playName": "enrich-leads",
    }
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    "bad",
    [
        {"x": math.nan},
        {"x": [math.inf]},
        {"x": {"nested": -math.inf}},
        {"x": {1: "a non-string key"}},
        {"x": "a lone \ud800 surrogate"},
    ],
)
async def test_a_body_json_cannot_carry_is_refused_before_sending(bad: Any) -> None:
    # orjson would write NaN as null and the standard library would write a bare
    # NaN token: neither may reach the wire.
    script = Script()
    async with script.client() as client:
        with pytest.raises(InvalidInputError):
            await client.post_action("runtime_sheet_summary", {"tableNamespace": "t", **bad})
    assert script.seen == []


async def test_the_body_is_compact_json(autojump_clock: Any) -> None:
    sent: list[bytes] = []

    async def record(request: httpx.Request) -> httpx.Response:
        sent.append(await request.aread())
        return httpx.Response(200, json={})

    client = GatewayClient(BASE, TOKEN, play_name="p", transport=httpx.MockTransport(record))
    async with client:
        await client.post_action("runtime_sheet_summary", {"tableNamespace": "t", "n": 2**70})
    assert sent == [
        b'{"tableNamespace":"t","n":1180591620717411303424,'
        b'"action":"runtime_sheet_summary","playName":"p"}'
    ]


async def test_extra_headers_travel_with_every_request(autojump_clock: Any) -> None:
    script = Script([status(502), ok({})])
    async with script.client(headers={"X-Sheetplane-Test-Fault": "a=502"}) as client:
        await client.post_action("ensure_sheet", {})
    assert [h["x-sheetplane-test-fault"] for _, _, h in script.seen] == ["a=502", "a=502"]
    with pytest.raises(InvalidInputError):
        Script().client(headers={"Authorization": "Bearer other"})


async def test_url_and_token_digest() -> None:
    client = Script().client()
    assert client.url == URL
    assert client.token_digest == hashlib.sha256(TOKEN.encode()).hexdigest()
    assert TOKEN not in repr(client)


async def test_502_is_retried_after_the_first_rung(autojump_clock: Any) -> None:
    script = Script([status(502), ok({"ok": True})])
    async with script.client() as client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    assert script.times == [0.0, RETRY_DELAYS_MS[0] / 1000]


@pytest.mark.parametrize("code", [502, 503, 504])
async def test_transient_statuses_climb_the_whole_ladder(autojump_clock: Any, code: int) -> None:
    script = Script(default=status(code))
    async with script.client() as client:
        with pytest.raises(TransientGatewayError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert type(excinfo.value) is TransientGatewayError
    assert excinfo.value.status == code
    assert script.times == ladder_times(len(RETRY_DELAYS_MS) + 1)
    assert trio.current_time() == script.times[-1]


@pytest.mark.parametrize(
    "fault",
    [raises(httpx.ConnectError), raises(httpx.ReadError), raises(httpx.ConnectTimeout)],
)
async def test_transport_failures_are_retried(autojump_clock: Any, fault: Reply) -> None:
    # Off the ladder: a jittered back-off from half to all of its first delay, doubling.
    script = Script([fault, fault, ok({"ok": True})])
    async with script.client() as client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    first, second = (b - a for a, b in itertools.pairwise(script.times))
    base = GATEWAY_RECONNECT_BASE_MS / 1000
    assert base / 2 <= first <= base and base <= second <= 2 * base


async def test_transport_failures_exhausted_keep_their_kind(autojump_clock: Any) -> None:
    # A gateway that has answered once, then cannot be reached.
    script = Script(
        [ok({"ok": True})], default=raises(httpx.ConnectError, "[Errno 111] ECONNREFUSED")
    )
    async with script.client() as client:
        await client.post_action("ensure_sheet", {})
        with pytest.raises(TransientGatewayError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert type(excinfo.value) is TransientGatewayError
    assert excinfo.value.status == 0
    assert "ConnectError" in str(excinfo.value) and "ECONNREFUSED" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, httpx.ConnectError)


async def test_a_gateway_that_cannot_be_reached_is_retried_for_the_whole_budget(
    autojump_clock: Any,
) -> None:
    # A refused connect fails at once: the five-attempt ladder was spent in 3.75 s while
    # a restarted gateway needs a few seconds; now the whole call budget is used, once a
    # gateway has answered this client (a restart, not a wrong URL).
    script = Script(
        [ok({"ok": True})], default=raises(httpx.ConnectError, "[Errno 111] ECONNREFUSED")
    )
    async with script.client() as client:
        await client.post_action("ensure_sheet", {})
        start = trio.current_time()
        with pytest.raises(TransientGatewayError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert not isinstance(excinfo.value, GatewayUnreachableError)
    gaps = [b - a for a, b in itertools.pairwise(script.times[1:])]
    assert max(gaps) <= GATEWAY_RECONNECT_CAP_MS / 1000
    assert script.times[-1] - start > CALL_BUDGET_MS / 1000 - GATEWAY_RECONNECT_CAP_MS / 1000
    assert trio.current_time() - start < CALL_BUDGET_MS / 1000
    assert excinfo.value.status == 0
    assert "ConnectError" in str(excinfo.value) and "ECONNREFUSED" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, httpx.ConnectError)


async def test_backpressure_waits_its_retry_after(autojump_clock: Any) -> None:
    pressure = {"error": "pool saturated", "code": "runtime_postgres_admission_backpressure"}
    script = Script(
        [
            status(503, {**pressure, "retry_after_ms": 1_200}),
            status(503, pressure),
            ok({"ok": True}),
        ]
    )
    async with script.client() as client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    first = 1_200 / 1000
    assert script.times == [0.0, first, first + DEFAULT_RETRY_AFTER_MS / 1000]


async def test_backpressure_exhausted_raises_backpressure_error(autojump_clock: Any) -> None:
    script = Script(
        default=status(
            503,
            {
                "error": "busy",
                "code": "runtime_postgres_admission_backpressure",
                "retry_after_ms": 100,
            },
        )
    )
    async with script.client() as client:
        with pytest.raises(BackpressureError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert excinfo.value.retry_after_ms == 100
    assert excinfo.value.gateway_code == "runtime_postgres_admission_backpressure"
    assert script.times == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


async def test_huge_retry_after_is_clamped(autojump_clock: Any) -> None:
    script = Script(
        [
            status(503, {"error": "x", "retry_after_ms": 10**12}),
            status(502, headers={"retry-after": "99999"}),
            status(502, headers={"retry-after": "3"}),
            ok({"ok": True}),
        ]
    )
    async with script.client() as client:
        await client.post_action("ensure_sheet", {})
    clamp = MAX_RETRY_AFTER_MS / 1000
    assert script.times == [0.0, clamp, 2 * clamp, 2 * clamp + 3.0]


async def test_hanging_gateway_times_out_each_attempt_within_the_call_budget(
    autojump_clock: Any,
) -> None:
    script = Script(default=hang)
    async with script.client() as client:
        with pytest.raises(GatewayTimeoutError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert "did not finish within 30000 ms" in str(excinfo.value)
    timeout = REQUEST_TIMEOUT_MS / 1000
    expected = [0.0]
    for delay in RETRY_DELAYS_MS:
        expected.append(expected[-1] + timeout + delay / 1000)
    assert script.times == pytest.approx(expected)
    assert trio.current_time() == pytest.approx(CALL_BUDGET_MS / 1000)


async def test_slow_drip_body_cannot_outlive_the_attempt_timeout(autojump_clock: Any) -> None:
    script = Script([drip(1.0), ok({"ok": True})])
    async with script.client() as client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    assert script.times == [0.0, REQUEST_TIMEOUT_MS / 1000 + RETRY_DELAYS_MS[0] / 1000]


async def test_retry_after_never_stretches_a_call_past_its_budget(autojump_clock: Any) -> None:
    # Four answers that each take 29.9 s and ask for the longest wait: the
    # fifth attempt starts at 4 * 33.9 s and is cut at the call's deadline.
    async def slow_pressure(request: httpx.Request) -> httpx.Response:
        await trio.sleep(29.9)
        return httpx.Response(503, json={"error": "busy", "retry_after_ms": 10**9})

    script = Script([slow_pressure] * 4 + [hang])
    async with script.client() as client:
        with pytest.raises(GatewayTimeoutError):
            await client.post_action("ensure_sheet", {})
    step = 29.9 + MAX_RETRY_AFTER_MS / 1000
    assert script.times == pytest.approx([0.0, step, 2 * step, 3 * step, 4 * step])
    assert trio.current_time() == pytest.approx(CALL_BUDGET_MS / 1000)


@pytest.mark.parametrize("text", [text for examples in EXAMPLES.values() for text in examples])
async def test_transient_messages_are_retried(autojump_clock: Any, text: str) -> None:
    script = Script([status(500, {"error": text}), ok({"ok": True})])
    async with script.client() as client:
        await client.post_action("ensure_sheet", {})
    assert len(script.seen) == 2


async def test_transient_message_in_details_is_retried(autojump_clock: Any) -> None:
    script = Script([status(500, {"error": "boom", "debug_error": "fetch failed"}), ok({})])
    async with script.client() as client:
        await client.post_action("ensure_sheet", {})
    assert len(script.seen) == 2


async def test_other_errors_map_to_gateway_error_with_error_and_details(
    autojump_clock: Any,
) -> None:
    script = Script(
        [
            status(
                400,
                {
                    "error": "tableNamespace is required",
                    "code": "bad_request",
                    "details": "input.tableNamespace",
                },
            )
        ]
    )
    async with script.client() as client:
        with pytest.raises(GatewayError) as excinfo:
            await client.post_action("runtime_sheet_summary", {})
    error = excinfo.value
    assert type(error) is GatewayError
    assert (error.status, error.gateway_code, error.details) == (
        400,
        "bad_request",
        "input.tableNamespace",
    )
    assert str(error) == (
        "HTTP 400: runtime_sheet_summary: tableNamespace is required [bad_request] "
        "(input.tableNamespace)"
    )
    assert len(script.seen) == 1


async def test_debug_error_is_used_when_details_is_absent(autojump_clock: Any) -> None:
    script = Script([status(500, {"error": "internal", "debug_error": "KeyError: 'x'"})])
    async with script.client() as client:
        with pytest.raises(GatewayError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert excinfo.value.details == "KeyError: 'x'"


@pytest.mark.parametrize("code", [401, 403])
async def test_auth_errors_are_not_retried_and_never_show_the_token(
    autojump_clock: Any, code: int
) -> None:
    script = Script(
        [status(code, {"error": f"invalid token {TOKEN}", "details": {"token": TOKEN}})]
    )
    async with script.client() as client:
        with pytest.raises(GatewayAuthError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert excinfo.value.status == code
    assert TOKEN not in str(excinfo.value) and TOKEN not in repr(excinfo.value.details)
    assert "[redacted]" in str(excinfo.value)
    assert len(script.seen) == 1


async def test_unsupported_action(autojump_clock: Any) -> None:
    script = Script([status(400, {"error": "Unsupported runtime data-plane action: x"})])
    async with script.client() as client:
        with pytest.raises(UnsupportedActionError):
            await client.post_action("x", {})
    assert len(script.seen) == 1


# --- the bounded body ------------------------------------------------------------------


async def test_declared_length_over_budget_is_refused(autojump_clock: Any) -> None:
    declared = ACTION_MAX_RESPONSE_BYTES + 1
    streamed: list[int] = []

    async def reply(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            streamed.append(1)
            yield b"{}"

        return httpx.Response(200, content=body(), headers={"content-length": str(declared)})

    script = Script([reply])
    async with script.client() as client:
        with pytest.raises(ResponseTooLargeError) as excinfo:
            await client.post_action("runtime_sheet_summary", {})
    big = excinfo.value
    assert (big.limit_bytes, big.observed_bytes) == (ACTION_MAX_RESPONSE_BYTES, declared)
    assert streamed == []
    assert len(script.seen) == 1


def gzip_reply(payload: bytes, *, chunk: int = 64 * 1024, encoding: str = "gzip") -> Reply:
    """A 200 whose gzip body arrives in network-sized chunks."""

    async def reply(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            for start in range(0, len(payload), chunk):
                yield payload[start : start + chunk]

        return httpx.Response(200, content=body(), headers={"content-encoding": encoding})

    return reply


async def test_compression_bomb_stops_at_the_budget(autojump_clock: Any) -> None:
    inflated = b"[" + b"0," * (ACTION_MAX_RESPONSE_BYTES // 2 + MiB) + b"0]"
    bomb = gzip.compress(inflated, 9)
    assert len(bomb) < MiB
    # Delivered as one chunk: httpx's own decoder would inflate all of it at once.
    script = Script([gzip_reply(bomb, chunk=len(bomb))])
    async with script.client() as client:
        with pytest.raises(ResponseTooLargeError) as excinfo:
            await client.post_action("runtime_sheet_summary", {})
    assert excinfo.value.limit_bytes == ACTION_MAX_RESPONSE_BYTES
    assert excinfo.value.observed_bytes == ACTION_MAX_RESPONSE_BYTES + 1
    assert script.seen[0][2]["accept-encoding"] == "gzip, deflate"


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_compressed_answers_decode(autojump_clock: Any, encoding: str) -> None:
    payload = json.dumps({"total": 3, "pad": "x" * 300_000}).encode()
    packed = gzip.compress(payload) if encoding == "gzip" else zlib.compress(payload)
    script = Script([gzip_reply(packed, chunk=1000, encoding=encoding)])
    async with script.client() as client:
        answer = await client.post_action("runtime_sheet_summary", {})
    assert answer["total"] == 3 and len(answer["pad"]) == 300_000


async def test_unrequested_or_corrupt_codings_are_protocol_errors(autojump_clock: Any) -> None:
    script = Script([gzip_reply(b"xx", encoding="br"), gzip_reply(b"not gzip at all")])
    async with script.client() as client:
        with pytest.raises(GatewayProtocolError, match="not requested"):
            await client.post_action("runtime_sheet_summary", {})
        with pytest.raises(GatewayProtocolError, match="does not decompress"):
            await client.post_action("runtime_sheet_summary", {})
    assert len(script.seen) == 2


async def test_truncated_gzip_body_is_retried(autojump_clock: Any) -> None:
    packed = gzip.compress(json.dumps({"ok": True, "pad": "y" * 10_000}).encode())
    script = Script([gzip_reply(packed[: len(packed) // 2]), ok({"ok": True})])
    async with script.client() as client:
        assert (await client.post_action("ensure_sheet", {}))["ok"] is True
    assert len(script.seen) == 2


async def test_truncated_body_is_retried_then_reported(autojump_clock: Any) -> None:
    script = Script([truncated(), ok({"ok": True})])
    async with script.client() as client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    assert len(script.seen) == 2

    script = Script(default=truncated())
    start = trio.current_time()
    async with script.client() as client:
        with pytest.raises(TransientGatewayError, match="RemoteProtocolError"):
            await client.post_action("ensure_sheet", {})
    assert [t - start for t in script.times] == ladder_times(5)


async def test_malformed_json_is_retried_then_a_protocol_error(autojump_clock: Any) -> None:
    async def cut(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"ok": tr')

    script = Script(default=cut)
    async with script.client() as client:
        with pytest.raises(GatewayProtocolError, match="not JSON"):
            await client.post_action("ensure_sheet", {})
    assert script.times == ladder_times(5)


async def test_a_json_answer_that_is_not_an_object_is_not_retried(autojump_clock: Any) -> None:
    script = Script([ok([1, 2])])
    async with script.client() as client:
        with pytest.raises(GatewayProtocolError, match="not a JSON object"):
            await client.post_action("ensure_sheet", {})
    assert len(script.seen) == 1


async def test_cancelled_call_sends_nothing_more(autojump_clock: Any) -> None:
    script = Script(default=hang)
    async with script.client() as client:
        with trio.move_on_after(10):
            await client.post_action("ensure_sheet", {})
        await trio.sleep(CALL_BUDGET_MS / 1000)
    assert script.times == [0.0]


async def test_client_outside_async_with_refuses() -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await Script().client().post_action("ensure_sheet", {})


def test_constructor_checks() -> None:
    with pytest.raises(InvalidInputError):
        GatewayClient(BASE, " ", play_name="p")
    with pytest.raises(InvalidInputError):
        GatewayClient("", TOKEN, play_name="p")


# --- batch reads ----------------------------------------------------------------------------


def page_json(request: PageRequest, rows: int | None = None) -> dict[str, Any]:
    count = request.limit if rows is None else rows
    return {
        "rows": [{"_key": f"k{request.offset + i}"} for i in range(count)],
        "limit": request.limit,
        "offset": request.offset,
    }


REQUESTS = [PageRequest(limit=3, offset=0), PageRequest(limit=3, offset=3)]


async def test_batch_read_positional(autojump_clock: Any) -> None:
    script = Script([ok({"pages": [page_json(r) for r in REQUESTS]})])
    async with script.client() as client:
        pages = await client.read_rows_batch("leads", REQUESTS, run_id="r1", row_mode="all")
    assert pages == [
        Page(rows=tuple({"_key": f"k{i}"} for i in range(3)), limit=3, offset=0),
        Page(rows=tuple({"_key": f"k{i}"} for i in range(3, 6)), limit=3, offset=3),
    ]
    (_, body, _), *_ = script.seen
    assert body["input"] == {
        "tableNamespace": "leads",
        "runId": "r1",
        "rowMode": "all",
        "pages": [{"limit": 3, "offset": 0}, {"limit": 3, "offset": 3}],
    }


@pytest.mark.parametrize(
    "answer",
    [
        {"pages": [page_json(REQUESTS[0])]},
        {"pages": [page_json(REQUESTS[1]), page_json(REQUESTS[0])]},
        {"pages": [page_json(REQUESTS[0]), {**page_json(REQUESTS[1]), "limit": 4}]},
        {"pages": [page_json(REQUESTS[0]), {**page_json(REQUESTS[1]), "offset": "3"}]},
        {"pages": [page_json(REQUESTS[0]), {**page_json(REQUESTS[1]), "rows": [{}] * 4}]},
        {"pages": [page_json(REQUESTS[0]), {**page_json(REQUESTS[1]), "rows": [{}, []]}]},
        {"pages": [page_json(REQUESTS[0]), None]},
        {"pages": "no"},
        {},
    ],
)
async def test_batch_answer_not_correlated_is_a_protocol_error_and_not_read_again(
    autojump_clock: Any, answer: dict[str, Any]
) -> None:
    script = Script([ok(answer)])
    async with script.client() as client:
        with pytest.raises(GatewayProtocolError):
            await client.read_rows_batch("leads", REQUESTS)
    assert script.actions == ["runtime_sheet_read_rows_batch"]


async def test_legacy_gateway_falls_back_to_single_pages(autojump_clock: Any) -> None:
    script = Script(
        [
            status(400, {"error": "Unsupported runtime data-plane action"}),
            ok(page_json(REQUESTS[0])),
            ok(page_json(REQUESTS[1], rows=1)),
        ]
    )
    async with script.client() as client:
        pages = await client.read_rows_batch("leads", REQUESTS, run_id="r1")
    assert [len(p.rows) for p in pages] == [3, 1]
    assert script.actions == [
        "runtime_sheet_read_rows_batch",
        "runtime_sheet_read_rows",
        "runtime_sheet_read_rows",
    ]
    assert [body["input"] for _, body, _ in script.seen[1:]] == [
        {"tableNamespace": "leads", "runId": "r1", "limit": 3, "offset": 0},
        {"tableNamespace": "leads", "runId": "r1", "limit": 3, "offset": 3},
    ]


async def test_413_raises_read_batch_too_large(autojump_clock: Any) -> None:
    script = Script(
        [
            status(
                413,
                {
                    "error": "too large",
                    "code": "runtime_sheet_read_batch_too_large",
                    "observed_bytes": 13 * MiB,
                },
            )
        ]
    )
    async with script.client() as client:
        with pytest.raises(ReadBatchTooLargeError) as excinfo:
            await client.read_rows_batch("leads", REQUESTS)
    assert excinfo.value.observed_bytes == 13 * MiB
    assert len(script.seen) == 1


async def test_413_without_observed_bytes_reports_just_over_the_budget(
    autojump_clock: Any,
) -> None:
    script = Script([status(413, {"error": "x", "code": "runtime_sheet_read_batch_too_large"})])
    async with script.client() as client:
        with pytest.raises(ReadBatchTooLargeError) as excinfo:
            await client.read_rows_batch("leads", REQUESTS)
    assert excinfo.value.observed_bytes == READ_BATCH_MAX_RESPONSE_BYTES + 1


async def test_batch_pages_over_budget_raise_read_batch_too_large(autojump_clock: Any) -> None:
    big = "x" * (READ_BATCH_MAX_RESPONSE_BYTES // 2)
    request = [PageRequest(limit=2, offset=0)]
    answer = {"pages": [{"rows": [{"v": big}, {"v": big}], "limit": 2, "offset": 0}]}
    script = Script([ok(answer)])
    async with script.client() as client:
        with pytest.raises(ReadBatchTooLargeError) as excinfo:
            await client.read_rows_batch("leads", request)
    assert excinfo.value.observed_bytes > READ_BATCH_MAX_RESPONSE_BYTES
    assert len(script.seen) == 1


async def test_batch_read_checks_its_arguments(autojump_clock: Any) -> None:
    async with Script().client() as client:
        with pytest.raises(InvalidInputError):
            await client.read_rows_batch("leads", [])
        with pytest.raises(InvalidInputError):
            await client.read_rows_batch("leads", [PageRequest(1, i) for i in range(5)])
        with pytest.raises(InvalidInputError):
            await client.read_rows_batch("leads", [PageRequest(10_000, 0)])


# --- typed helpers -------------------------------------------------------------------------


async def test_ensure_sheet_and_summary(autojump_clock: Any) -> None:
    script = Script(
        [
            ok({"ok": True}),
            ok({"total": 5, "queued": 1, "running": 1, "completed": 2, "failed": 1}),
        ]
    )
    async with script.client(user_email=" a@b.c ") as client:
        await client.ensure_sheet("leads", CONTRACT)
        summary = await client.summary("leads")
    assert (summary.total, summary.queued, summary.completed) == (5, 1, 2)
    assert script.seen[0][1] == {
        "tableNamespace": "leads",
        "sheetContract": {"columns": [{"id": "email", "sqlName": "email", "source": "input"}]},
        "userEmail": "a@b.c",
        "action": "ensure_sheet",
        "playName": "enrich-leads",
    }


async def test_start_sheet_dataset(autojump_clock: Any) -> None:
    script = Script(
        [
            ok(
                {
                    "inserted": 1,
                    "skipped": 1,
                    "pendingRows": [{"_key": "a", "email": "x"}],
                    "completedRows": [{"_key": "b", "email": "y", "score": 1}],
                    "tableNamespace": "leads",
                    "writeVersion": 7,
                }
            )
        ]
    )
    async with script.client() as client:
        admission = await client.start_sheet_dataset(
            "leads", CONTRACT, [{"email": "x"}, {"email": "y"}], "run-1"
        )
    assert admission.write_version == 7
    assert admission.pending_rows == ({"_key": "a", "email": "x"},)
    assert script.seen[0][1]["rows"] == [{"email": "x"}, {"email": "y"}]
    assert script.seen[0][1]["runId"] == "run-1"


async def test_start_sheet_dataset_rejects_rows_without_keys(autojump_clock: Any) -> None:
    answer = {
        "inserted": 1,
        "skipped": 0,
        "pendingRows": [{"email": "x"}],
        "completedRows": [],
        "tableNamespace": "leads",
        "writeVersion": 1,
    }
    async with Script([ok(answer)]).client() as client:
        with pytest.raises(GatewayProtocolError, match="_key"):
            await client.start_sheet_dataset("leads", CONTRACT, [{"email": "x"}], "run-1")


async def test_complete_map_rows_with_stale_reasons(autojump_clock: Any) -> None:
    script = Script(
        [
            ok(
                {
                    "committedKeys": ["a"],
                    "staleKeys": ["b", "c"],
                    "staleRows": [
                        {"key": "b", "reason": "newer_write_version", "rowVersionStamp": 9}
                    ],
                    "updated": 1,
                }
            )
        ]
    )
    async with script.client() as client:
        result = await client.complete_map_rows(
            "leads",
            CONTRACT,
            [CompleteRow("a", {"score": 1}, {"score": {"source": "x"}}), CompleteRow("b", {})],
            run_id="run-1",
            write_version=7,
        )
    assert result.committed_keys == ("a",)
    assert result.stale_rows == (
        StaleRow("b", "newer_write_version", 9),
        StaleRow("c", "unreported", None),
    )
    sent = script.seen[0][1]
    assert sent["writeVersion"] == 7
    assert sent["rows"] == [
        {"key": "a", "data": {"score": 1}, "cellMetaPatch": {"score": {"source": "x"}}},
        {"key": "b", "data": {}},
    ]


async def test_legacy_terminal_write_reports_unreported(autojump_clock: Any) -> None:
    script = Script([ok({"committedKeys": [], "staleKeys": ["a"], "updated": 0})])
    async with script.client() as client:
        result = await client.fail_map_rows(
            "leads", CONTRACT, [FailRow("a", "boom", {"p": 1})], run_id="r", write_version=None
        )
    assert result.stale_rows == (StaleRow("a", "unreported", None),)
    sent = script.seen[0][1]
    assert "writeVersion" not in sent
    assert sent["rows"] == [{"key": "a", "error": "boom", "data": {"p": 1}}]


async def test_terminal_write_with_unknown_reason_is_a_protocol_error(autojump_clock: Any) -> None:
    answer = {
        "committedKeys": [],
        "staleKeys": ["a"],
        "staleRows": [{"key": "a", "reason": "gremlins"}],
        "updated": 0,
    }
    async with Script([ok(answer)]).client() as client:
        with pytest.raises(GatewayProtocolError):
            await client.fail_map_rows(
                "leads", CONTRACT, [FailRow("a", "x")], run_id="r", write_version=1
            )


@pytest.mark.parametrize(
    ("disposition", "run_id", "expected"),
    [
        ("persisted", "r2", "persisted"),
        ("existing", "r1", "existing"),
        (None, "r1", "persisted"),
        (None, "r2", "existing"),
    ],
)
async def test_complete_work_receipt(
    autojump_clock: Any, disposition: str | None, run_id: str, expected: str
) -> None:
    answer: dict[str, Any] = {
        "receipt": {
            "key": "k",
            "result": {"n": 1},
            "runId": "r1",
            "completedAt": "2030-01-01T00:00:00Z",
        }
    }
    if disposition is not None:
        answer["completionDisposition"] = disposition
    script = Script([ok(answer)])
    async with script.client() as client:
        completion = await client.complete_work_receipt("k", {"n": 2}, run_id, run_attempt=2)
    assert completion.completion_disposition == expected
    assert completion.receipt.result == {"n": 1}
    assert script.seen[0][1]["runAttempt"] == 2


async def test_read_rows_and_row_keys(autojump_clock: Any) -> None:
    request = PageRequest(limit=2, offset=4)
    script = Script([ok(page_json(request)), ok({"keys": ["k4", "k5"]})])
    async with script.client() as client:
        page = await client.read_rows("leads", request)
        keys = await client.read_row_keys("leads", request, run_id="r")
    assert page == Page(rows=({"_key": "k4"}, {"_key": "k5"}), limit=2, offset=4)
    assert keys == ["k4", "k5"]
    assert script.seen[1][1]["input"] == {
        "tableNamespace": "leads",
        "runId": "r",
        "limit": 2,
        "offset": 4,
    }


async def test_create_db_session_payload(autojump_clock: Any) -> None:
    script = Script([ok({"expiresAt": "x"})])
    async with script.client() as client:
        await client.create_db_session(
            table_namespace="leads",
            logical_table="sheet_rows",
            operations=["rows.read"],
            limits={"maxRows": 10},
            contract=CONTRACT,
            ttl_seconds=600,
            encryption={"alg": "RSA-OAEP-256+A256GCM", "publicKeyJwk": {"kty": "RSA"}},
        )
    sent = script.seen[0][1]
    assert sent["target"] == {"tableNamespace": "leads", "logicalTable": "sheet_rows"}
    assert sent["operations"] == ["rows.read"] and sent["limits"] == {"maxRows": 10}
    assert sent["ttlSeconds"] == 600
    assert sent["postgresUrlEncryption"]["alg"] == "RSA-OAEP-256+A256GCM"


async def test_every_typed_request_is_its_wire_class_written(autojump_clock: Any) -> None:
    # Each helper's body reads as its action's request class and writes back unchanged:
    # the client sends exactly what the converter writes, for every action.
    sent: list[dict[str, Any]] = []

    async def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(await request.aread()))
        return httpx.Response(400, json={"error": "refused", "code": "invalid_request"})

    page = PageRequest(limit=2, offset=4)
    contract = SheetContract((ContractColumn("e", "email", "input", "mail"),))
    admission = "0" * 32
    client = GatewayClient(
        BASE,
        TOKEN,
        play_name="p",
        user_email="u@example.org",
        transport=httpx.MockTransport(refuse),
    )
    async with client:
        calls: list[Awaitable[Any]] = [
            client.ensure_sheet("ns", contract),
            client.start_sheet_dataset("ns", contract, [{"_key": "a", "email": "x"}], "r"),
            client.create_db_session(
                table_namespace="ns",
                logical_table="sheet_rows",
                operations=["rows.upsert", "rows.read"],
                limits={"maxRows": 3},
                contract=contract,
                ttl_seconds=60,
            ),
            client.read_rows("ns", page, run_id="r", row_mode="all"),
            client.read_rows_batch("ns", [page, page]),
            client.read_rows_after("ns", {"inputIndex": 1, "createdAt": "t", "key": "k"}, 2, 4),
            client.read_row_keys("ns", page),
            client.complete_map_rows(
                "ns",
                contract,
                [CompleteRow("k", {"a": 1}, {"a": {"m": 1}})],
                run_id="r",
                write_version=3,
            ),
            client.fail_map_rows(
                "ns", contract, [FailRow("k", "boom")], run_id="r", write_version=None
            ),
            client.append_rows("ns", contract, [{"email": "x"}], idempotency_key="i", run_id="r"),
            client.upsert_rows(
                "ns", contract, [{"email": "x"}], idempotency_key="i", key_field="email", run_id="r"
            ),
            client.replace_rows("ns", contract, [], idempotency_key="i", run_id="r"),
            client.complete_work_receipt(
                "k", {"n": 1}, "r", run_attempt=2, holder="h", lease_token="t" * 43
            ),
            client.claim_work_receipt("k", "h"),
            client.release_work_receipt("k", "h", "t" * 43),
            client.resolve_play("play-1"),
            client.register_play(ResolvedPlay("play-1", source_code="x"), name="n"),
            client.summary("ns"),
            client.begin_admission("ns", contract, admission, "r"),
            client.stage_admission_chunk(
                client.admission_chunk_body(
                    "ns", contract, admission, 0, 0, prepare_chunk([{"_key": "a"}], 0)
                )
            ),
            client.commit_admission("ns", contract, admission, "r", chunks=1, rows=1),
            client.abort_admission("ns", admission),
            client.claim_share("ns", 3, "h", "t" * 43, ttl_ms=1_000, max_rows=64),
            client.renew_share("ns", 3, 1, "t" * 43, ttl_ms=1_000),
            client.release_share("ns", 3, 1, "t" * 43, finished=True),
            client.attempt_status("ns", 3),
        ]
        for call in calls:
            with pytest.raises(GatewayError):
                await call
    classes = protocol.REQUESTS
    assert {body["action"] for body in sent} == set(classes)
    for body in sent:
        read = protocol.structure(body, classes[body["action"]])
        assert protocol.unstructure(read) == body, body["action"]
        assert body["playName"] == "p"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda c: c.abort_admission("ns", "not-an-id"),
            "admissionId must be 32 lowercase hex digits",
        ),
        (
            lambda c: c.commit_admission("ns", CONTRACT, "0" * 32, "r", chunks=-1, rows=0),
            "chunks must be between 0 and",
        ),
        (lambda c: c.summary(" "), "table_namespace must not be empty once trimmed"),
        (lambda c: c.claim_work_receipt("k", 7), "holder must be a string, got int"),
        (
            lambda c: c.create_db_session(
                table_namespace="ns", logical_table="sheet_rows", operations=[]
            ),
            "operations must hold 1 to",
        ),
    ],
)
async def test_a_value_its_wire_class_refuses_is_never_sent(
    autojump_clock: Any, call: Callable[[GatewayClient], Awaitable[Any]], message: str
) -> None:
    script = Script()
    async with script.client() as client:
        with pytest.raises(InvalidInputError, match=message):
            await call(client)
    assert script.seen == []


async def test_a_keyset_cursor_is_the_wire_s_row_cursor(autojump_clock: Any) -> None:
    first, second = PageRequest(limit=2, offset=0), PageRequest(limit=2, offset=2)
    cursor = {"inputIndex": 1, "createdAt": "2026-01-01T00:00:00+00:00", "key": "k1"}
    script = Script(
        [
            ok({**page_json(first), "nextAfter": cursor}),
            ok({**page_json(second), "nextAfter": {"i": 1}}),
        ]
    )
    async with script.client() as client:
        page = await client.read_rows_after("leads", None, 2, 0)
        assert page.keyset and page.next_after == cursor
        with pytest.raises(GatewayProtocolError, match=r"nextAfter\.createdAt is required"):
            await client.read_rows_after("leads", page.next_after, 2, 2)
        with pytest.raises(InvalidInputError, match=r"after: createdAt is required"):
            await client.read_rows_after("leads", {"i": 1, "k": "k1"}, 2, 2)
    assert [body["input"].get("after", "absent") for _, body, _ in script.seen] == [None, cursor]


# --- the protection-bypass header (the runtime's vercelProtectionBypassToken) -----------------

BYPASS = "bypass-secret-5f1e2d3c"


async def test_the_bypass_token_goes_with_every_request_and_never_into_an_error(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    echo = {"error": f"rejected {BYPASS} and {TOKEN}", "details": {"header": BYPASS}}
    script = Script(replies=[ok({"ok": True}), status(400, echo)])
    client = script.client(protection_bypass_token=f" {BYPASS} ")
    async with client:
        await client.ensure_sheet("ns", CONTRACT)
        with pytest.raises(GatewayError) as excinfo:
            await client.ensure_sheet("ns", CONTRACT)
    assert [headers["x-vercel-protection-bypass"] for _, _, headers in script.seen] == [BYPASS] * 2
    error = excinfo.value
    shown = f"{error} {error!r} {error.details!r} {client!r}"
    assert BYPASS not in shown and TOKEN not in shown and "[redacted]" in str(error)
    assert BYPASS not in caplog.text


async def test_without_a_bypass_token_no_bypass_header_is_sent(autojump_clock: Any) -> None:
    script = Script(replies=[ok({"ok": True})])
    async with script.client() as client:
        await client.ensure_sheet("ns", CONTRACT)
    assert "x-vercel-protection-bypass" not in script.seen[0][2]


@pytest.mark.parametrize(
    "options",
    [
        {"protection_bypass_token": ""},
        {"protection_bypass_token": "  "},
        {"protection_bypass_token": "a\nb"},
        {"protection_bypass_token": 7},
        {"headers": {"X-Vercel-Protection-Bypass": BYPASS}},
    ],
)
def test_a_bad_bypass_token_is_refused_without_echoing_it(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError) as excinfo:
        Script().client(**options)
    assert BYPASS not in str(excinfo.value) and "a\nb" not in str(excinfo.value)


# --- several gateway URLs ----------------------------------------------------------

OTHER = "http://gateway-b.test"


@attrs.define
class TwoGateways:
    """A transport for two hosts: gateway A plays ``a``, gateway B answers ok."""

    a: Reply
    hosts: list[tuple[float, str]] = attrs.field(factory=list)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append((trio.current_time(), request.url.host))
        if request.url.host == "gateway.test":
            return await self.a(request)
        return httpx.Response(200, json={"ok": True, "from": request.url.host})

    def client(self, *urls: str, **kwargs: Any) -> GatewayClient:
        return GatewayClient(
            list(urls) if urls else BASE,
            TOKEN,
            play_name="enrich-leads",
            transport=httpx.MockTransport(self.handle),
            **kwargs,
        )


async def test_a_second_url_takes_over_at_once_when_the_first_cannot_be_reached(
    autojump_clock: Any,
) -> None:
    gateways = TwoGateways(raises(httpx.ConnectError, "[Errno 111] ECONNREFUSED"))
    async with gateways.client(BASE, OTHER) as client:
        assert client.base_urls == (BASE, OTHER)
        first = await client.post_action("ensure_sheet", {})
        second = await client.post_action("ensure_sheet", {})
    assert first["from"] == second["from"] == "gateway-b.test"
    # A, then B at once; the next call stays on B, which answered.
    assert gateways.hosts == [
        (0.0, "gateway.test"),
        (0.0, "gateway-b.test"),
        (0.0, "gateway-b.test"),
    ]


async def test_a_draining_gateway_hands_the_call_to_the_next_url_at_once(
    autojump_clock: Any,
) -> None:
    draining = status(503, {"error": "draining", "code": "gateway_draining", "retry_after_ms": 250})
    gateways = TwoGateways(draining)
    async with gateways.client(base_urls=[OTHER]) as client:
        assert client.base_urls == (BASE, OTHER)
        answer = await client.post_action("runtime_sheet_read_rows", {})
    assert answer["from"] == "gateway-b.test"
    assert gateways.hosts == [(0.0, "gateway.test"), (0.0, "gateway-b.test")]


async def test_every_url_unreachable_backs_off_after_each_round(autojump_clock: Any) -> None:
    refused = raises(httpx.ConnectError, "[Errno 111] ECONNREFUSED")
    seen: list[tuple[float, str]] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append((trio.current_time(), request.url.host))
        if len(seen) > 6:
            return httpx.Response(200, json={"ok": True})
        return await refused(request)

    client = GatewayClient(
        [BASE, OTHER], TOKEN, play_name="p", transport=httpx.MockTransport(handle)
    )
    async with client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    times = [t for t, _ in seen]
    # Rounds of two at once, a back-off between rounds.
    assert times[0] == times[1] and times[2] == times[3] and times[4] == times[5]
    assert times[1] < times[2] < times[4] < times[6]
    assert [host for _, host in seen[:4]] == ["gateway.test", "gateway-b.test"] * 2


@pytest.mark.parametrize("urls", [[], [""], [BASE, 7]])
def test_bad_gateway_url_lists_are_refused(urls: list[Any]) -> None:
    with pytest.raises(InvalidInputError):
        GatewayClient(urls, TOKEN, play_name="p")


async def test_a_refusal_for_the_tenants_share_is_ridden_without_spending_the_ladder(
    autojump_clock: Any,
) -> None:
    # Many workers of one token meet the token's cap: twenty refusals in a row (four
    # times the ladder's attempts) still end in the answer, each after its named delay
    # and at most as much again.
    capped = {"error": "this token holds its share", "code": "gateway_tenant_cap"}
    script = Script([status(429, {**capped, "retry_after_ms": 250}) for _ in range(20)])
    script.replies.append(ok({"ok": True}))
    async with script.client() as client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    gaps = [b - a for a, b in itertools.pairwise(script.times)]
    assert len(gaps) == 20
    assert all(0.25 <= gap <= 0.5 for gap in gaps)


async def test_refusals_for_the_tenants_share_end_at_the_call_budget(autojump_clock: Any) -> None:
    capped = {"error": "this token holds its share", "code": "gateway_tenant_cap"}
    script = Script(default=status(429, {**capped, "retry_after_ms": 250}))
    async with script.client() as client:
        with pytest.raises(GatewayError) as excinfo:
            await client.post_action("ensure_sheet", {})
    assert excinfo.value.status == 429
    assert script.times[-1] < CALL_BUDGET_MS / 1000 <= script.times[-1] + 0.5


async def test_clients_of_one_process_load_the_tls_trust_store_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each runtime opens a gateway client; loading the CA bundle cost each 22 ms.
    made: list[ssl.SSLContext] = []

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(create(*args, **kwargs))
        return made[-1]

    create = httpx.create_ssl_context
    monkeypatch.setattr(httpx, "create_ssl_context", counted)
    tls_context.cache_clear()
    try:
        for _ in range(3):
            async with GatewayClient("https://gateway.invalid", TOKEN, play_name="p"):
                pass
    finally:
        tls_context.cache_clear()
    assert len(made) == 1
    assert made[0].verify_mode == ssl.CERT_REQUIRED and made[0].check_hostname
