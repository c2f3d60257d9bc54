"""OpenTelemetry spans, read back with the SDK's in-memory exporter: one trace across the
runner and the gateway (the server's spans and log lines carry the runner's trace id),
the gateway's statements as children of its action, and nothing secret in any
attribute. The SDK is set as sheetplane's provider only (``_tracing.use_tracer_provider``),
never as the process's global one."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence

import httpx
import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from _runtime_helpers import CONTRACT, ORG, CountingGateway, counting_gateway, new_play, runtime
from sheetplane import _tracing
from sheetplane.gateway.server._logs import JsonFormatter
from sheetplane.protocol import RUNTIME_PATH


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """sheetplane's spans go to an in-memory exporter for the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracing.use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        _tracing.use_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """Every record of the gateway's loggers, formatted by the gateway's JSON formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("sheetplane.gateway")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def _trace_hex(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def _children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


@pytest.fixture
async def gateway(database_url: str) -> CountingGateway:  # type: ignore[misc]
    async with counting_gateway(database_url) as gw:
        yield gw


async def test_the_gateway_continues_the_runners_trace(
    gateway: CountingGateway, spans: InMemorySpanExporter, json_logs: io.StringIO
) -> None:
    async with runtime(gateway, "gateway_only", play=new_play()) as rt:
        with _tracing.span("runner job") as job:
            await rt.writer("traced", CONTRACT).start([{"_key": "a", "text": "one two"}])
        trace_id = format(job.get_span_context().trace_id, "032x")
    # The server ends a request's span once its answer is sent: after the caller has it.
    await trio.testing.wait_all_tasks_blocked()
    everything = spans.get_finished_spans()
    # The gateway's own background work (its reaper's passes) makes traces of its own.
    finished = [s for s in everything if _trace_hex(s) == trace_id]
    outside = {(s.name, s.parent is None) for s in everything if s not in finished}
    assert all(not name.startswith(("POST", "action")) for name, _root in outside), outside
    attempts = [s for s in finished if s.kind is SpanKind.CLIENT and s.name == "POST"]
    servers = [s for s in finished if s.kind is SpanKind.SERVER]
    assert attempts and len(servers) == len(attempts)
    # Each server span's parent is the attempt that sent it (its traceparent).
    assert {s.parent.span_id for s in servers if s.parent} == {a.context.span_id for a in attempts}
    for server in servers:
        assert server.parent is not None and server.parent.is_remote
        assert server.name == f"POST {RUNTIME_PATH}"
        assert server.attributes is not None
        assert server.attributes["http.response.status_code"] == 200
        (action,) = _children(finished, server)
        assert action.name == f"action {server.attributes['sheetplane.gateway.action']}"
    # The store's statements are children of the gateway's action spans.
    statements = [s for s in finished if s.name.startswith("db ")]
    action_ids = {s.context.span_id for s in finished if s.name.startswith("action ")}
    assert statements
    assert all(s.parent is not None and s.parent.span_id in action_ids for s in statements)
    commit = [s for s in statements if s.attributes and s.attributes["db.operation.name"]]
    assert all(s.attributes and s.attributes["db.system.name"] == "postgresql" for s in commit)
    # Every access line of those requests carries the trace id.
    access = [r for r in _lines(json_logs) if r.get("event") == "request"]
    assert len(access) == len(servers)
    assert {r["trace_id"] for r in access} == {trace_id}


async def test_the_api_alone_still_carries_a_callers_trace_into_the_logs(
    gateway: CountingGateway, json_logs: io.StringIO
) -> None:
    """No SDK in the gateway's process: its spans record nothing, but the caller's
    trace id still reaches its log lines."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with httpx.AsyncClient(base_url=gateway.base_url) as http:
        answer = await http.post(
            RUNTIME_PATH,
            json={"action": "runtime_sheet_summary", "playName": new_play(), "input": {}},
            headers={
                "authorization": f"Bearer {gateway.token}",
                "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
            },
        )
    assert answer.status_code == 400
    await trio.testing.wait_all_tasks_blocked()  # the access line is written after the answer
    (access,) = [r for r in _lines(json_logs) if r.get("event") == "request"]
    assert access["trace_id"] == trace_id
    assert access["org_id"] == ORG
