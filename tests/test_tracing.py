"""OpenTelemetry spans, read back with the SDK's in-memory exporter: one trace across the
runner and the gateway (the server's spans and log lines carry the runner's trace id),
the gateway's statements as children of its action, and nothing secret in any
attribute. The SDK is set as sheetplane's provider only (``_tracing.use_tracer_provider``),
never as the process's global one."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from _runtime_helpers import (
    CONTRACT,
    ORG,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    runtime,
)
from sheetplane import _tracing
from sheetplane.dataset import Row
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


# --- the runner's spans ---------------------------------------------------------------------


def _named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _attr(span: ReadableSpan, name: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(name)


def _ancestors(spans: Sequence[ReadableSpan], span: ReadableSpan) -> list[str]:
    by_id = {s.context.span_id: s for s in spans}
    names = []
    parent = span.parent
    while parent is not None and parent.span_id in by_id:
        above = by_id[parent.span_id]
        names.append(above.name)
        parent = above.parent
    return names


MAPPED = 45
#: A value only the rows carry: no span may hold it.
ROW_SECRET = "row-data-7f3a9c"


async def words(row: dict[str, object]) -> dict[str, object]:
    await trio.lowlevel.checkpoint()
    if row["_key"] == "k007":
        raise ValueError(f"cannot count {row['text']}")  # a message quoting the row
    return {"words": len(str(row["text"]).split())}


@pytest.mark.parametrize("strategy", ["direct", "gateway_only"])
async def test_the_span_tree_of_a_small_map(
    gateway: CountingGateway, spans: InMemorySpanExporter, strategy: str
) -> None:
    rows = [{"_key": f"k{i:03d}", "text": f"{ROW_SECRET} w{i}"} for i in range(MAPPED)]
    async with runtime(gateway, strategy, play=new_play()) as rt:  # type: ignore[arg-type]
        report = await rt.map("traced", CONTRACT, rows, words, concurrency=16, batch_rows=10)
    await trio.testing.wait_all_tasks_blocked()
    everything = spans.get_finished_spans()
    (top,) = _named(everything, "sheetplane.map")
    assert top.parent is None
    trace = [s for s in everything if s.context.trace_id == top.context.trace_id]
    road = "direct" if strategy == "direct" else "gateway"
    assert _attr(top, "sheetplane.map.pending") == MAPPED == report.pending
    assert _attr(top, "sheetplane.map.completed") == MAPPED - 1
    assert _attr(top, "sheetplane.map.failed") == 1
    assert _attr(top, "sheetplane.map.fn_calls") == MAPPED
    assert isinstance(_attr(top, "sheetplane.map.fn_seconds"), float)
    assert _attr(top, "sheetplane.map.concurrency") == 16
    # Admission: one span under the map, its chunk under it.
    (admission,) = _named(trace, "sheetplane.admission")
    assert admission.parent is not None and admission.parent.span_id == top.context.span_id
    assert _attr(admission, "sheetplane.road") == road
    assert _attr(admission, "sheetplane.admission.inserted") == MAPPED
    if strategy == "direct":
        # A new sheet on the direct road is admitted in one transaction: no chunks.
        assert _attr(admission, "sheetplane.admission.way") == "one_transaction"
        assert _named(trace, "sheetplane.admission.chunk") == []
    else:
        assert _attr(admission, "sheetplane.admission.way") == "staged"
        (chunk,) = _named(trace, "sheetplane.admission.chunk")
        assert _ancestors(trace, chunk)[:2] == ["sheetplane.admission", "sheetplane.map"]
        assert _attr(chunk, "sheetplane.admission.chunk.rows") == MAPPED
    # Reads: the pending rows, page by page, under the map (the workers' or read-ahead's).
    reads = _named(trace, "sheetplane.read")
    assert sum(_attr(s, "sheetplane.read.rows") for s in reads) == MAPPED  # type: ignore[misc]
    assert all(_ancestors(trace, s)[0] == "sheetplane.map" for s in reads)
    # Writes: the batcher's batches, each parented by the map, never by a worker.
    writes = _named(trace, "sheetplane.write")
    assert all(s.parent is not None and s.parent.span_id == top.context.span_id for s in writes)
    kinds = {(_attr(s, "sheetplane.write.kind"), _attr(s, "sheetplane.road")) for s in writes}
    assert kinds == {("complete", road), ("fail", road)}
    assert sum(_attr(s, "sheetplane.write.rows") for s in writes) == MAPPED  # type: ignore[misc]
    assert all(_attr(s, "sheetplane.write.rows") <= 10 for s in writes)  # type: ignore[operator]
    if strategy == "direct":
        mints = _named(trace, "sheetplane.session.mint")
        assert mints, "the direct road minted its sessions"
        # The gateway's side of each mint: its queue for room in the org's budget.
        queued = _named(trace, "sheetplane.session.mint_queue")
        assert len(queued) == len(mints)
        assert all("action create_db_session" in _ancestors(trace, q) for q in queued)
        assert all("sheetplane.session.mint" in _ancestors(trace, q) for q in queued)
        statements = [s for s in trace if s.name.startswith("db ")]
        runner_side = [s for s in statements if "action " not in " ".join(_ancestors(trace, s))]
        assert any(_attr(s, "sheetplane.read.bytes") for s in runner_side)
    else:
        posts = [s for s in trace if s.name == "POST"]
        servers = [s for s in trace if s.kind is SpanKind.SERVER]
        assert posts and len(servers) == len(posts)
        for write in writes:
            (call,) = _children(trace, write)
            assert call.name.startswith("gateway runtime_sheet_")
    # No row's data in any span's name, attribute or event.
    assert ROW_SECRET not in json.dumps([_exported(s) for s in everything])


def _json_size(row: object) -> int:
    """A row's bytes as a read span counts them: its compact JSON object."""
    return len(json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode())


def _read_bytes(spans: Sequence[ReadableSpan]) -> list[int]:
    counted = [_attr(s, _tracing.READ_BYTES) for s in spans]
    assert all(isinstance(n, int) for n in counted), counted
    return counted  # type: ignore[return-value]


async def _read_three_ways(rt: Any, rows: int) -> tuple[list[Row], list[Row]]:
    """The sheet by keyset pages of 5 (``materialize``), and through the page reader: each
    row by ``at``, all at once, then ``peek(7)``."""
    dataset = rt.dataset("bytes", "all", page_rows=5)
    keyset = await dataset.materialize()
    found: list[Row] = []

    async def at(i: int) -> None:
        row = await dataset.at(i)
        assert row is not None
        found.append(row)

    async with trio.open_nursery() as nursery:
        for i in range(rows):
            nursery.start_soon(at, i)
    return keyset, found + await dataset.peek(7)


async def test_page_reads_carry_their_row_bytes(
    gateway: CountingGateway, spans: InMemorySpanExporter
) -> None:
    """Each page read's span counts the bytes of the rows it read (each row's compact JSON):
    the keyset pages of ``materialize`` and the page reader's batches of ``at`` and ``peek``,
    the same figures on both roads, and the same as the statements that read them."""
    play = new_play()
    rows = [{"_key": f"k{i:02d}", "text": f"wörd {i} " * (i % 5 + 1)} for i in range(23)]
    async with runtime(gateway, "direct", play=play) as rt:
        await rt.writer("bytes", CONTRACT).start(rows)
    pages: dict[str, list[tuple[object, ...]]] = {}
    for strategy in ROADS:
        spans.clear()
        async with runtime(gateway, strategy, play=play) as rt:
            keyset, found = await _read_three_ways(rt, len(rows))
        await trio.testing.wait_all_tasks_blocked()
        finished = spans.get_finished_spans()
        reads = sorted(_named(finished, "sheetplane.read"), key=lambda s: s.start_time or 0)
        batches = _named(finished, "sheetplane.read_batch")
        assert len(keyset) == len(found) - 7 == len(rows)
        keyset_bytes = sum(map(_json_size, keyset))
        batch_bytes = sum(map(_json_size, found))
        assert keyset_bytes > 0 and batch_bytes > keyset_bytes
        assert sum(_read_bytes(reads)) == keyset_bytes
        assert sum(_read_bytes(batches)) == batch_bytes
        assert all(n > 0 for n in _read_bytes(batches))
        # Each keyset page: its own rows' bytes (the last, empty page none).
        read_rows = [_attr(s, "sheetplane.read.rows") for s in reads]
        assert [n > 0 for n in _read_bytes(reads)] == [bool(n) for n in read_rows]
        # The statements that read the rows (the runner's on the direct road, the
        # gateway's on the gateway road) counted the same bytes.
        statements = [s for s in finished if s.name.startswith("db ")]
        counted = [s for s in statements if _attr(s, _tracing.READ_BYTES) is not None]
        assert sum(_read_bytes(counted)) == keyset_bytes + batch_bytes
        pages[strategy] = [
            (
                _attr(s, "sheetplane.read.limit"),
                _attr(s, "sheetplane.read.rows"),
                _attr(s, _tracing.READ_BYTES),
            )
            for s in reads
        ]
    assert pages["direct"] == pages["gateway_only"]


def _exported(span: ReadableSpan) -> dict[str, object]:
    """Everything of a span an exporter sends that code sets: name, attributes, events,
    links' attributes, status text."""
    return {
        "name": span.name,
        "attributes": dict(span.attributes or {}),
        "events": [[e.name, dict(e.attributes or {})] for e in span.events],
        "links": [dict(link.attributes or {}) for link in span.links],
        "status": span.status.description,
    }


# --- trio context ---------------------------------------------------------------------------

WORKERS = 16


async def test_sixteen_workers_and_a_nursery_run_flush_keep_their_parents(
    spans: InMemorySpanExporter,
) -> None:
    """Each of 16 concurrent workers opens its span, submits to one batcher and then does
    work of its own; the batches run in the batcher's nursery. Each worker's work is a
    child of that worker's span, and every batch's flush a child of the block that owns
    the batcher, never of the worker whose submission happened to start its runner."""
    from sheetplane import BoundedBatchFunction
    from sheetplane.batching import Batch

    async def flush(batch: Batch[str, int]) -> list[int]:
        links = _tracing.links_to(batch.waiting_contexts())
        with _tracing.span("flush", {"values": len(batch.values)}, links=links):
            await trio.lowlevel.checkpoint()
            with _tracing.span("flush write"):
                await trio.lowlevel.checkpoint()
        return list(batch.values)

    batcher: BoundedBatchFunction[str, int, int] = BoundedBatchFunction(
        flush,
        max_batch_items=3,
        max_batch_bytes=100,
        max_retained_items=64,
        max_retained_bytes=64,
        max_in_flight_batches=2,
        flush_seconds=0.001,
    )

    worker_spans: set[int] = set()

    async def worker(i: int) -> None:
        with _tracing.span(f"worker {i}") as mine:
            worker_spans.add(mine.get_span_context().span_id)
            for value in range(3):
                await trio.lowlevel.checkpoint()
                assert await batcher.submit("lane", i * 10 + value) == i * 10 + value
                with _tracing.span(f"work {i}"):
                    await trio.lowlevel.checkpoint()

    with _tracing.span("owner"):
        async with batcher, trio.open_nursery() as nursery:
            for i in range(WORKERS):
                nursery.start_soon(worker, i)
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}
    (owner,) = _named(finished, "owner")
    for i in range(WORKERS):
        (mine,) = _named(finished, f"worker {i}")
        works = _named(finished, f"work {i}")
        assert len(works) == 3
        assert all(w.parent and w.parent.span_id == mine.context.span_id for w in works)
    flushes = _named(finished, "flush")
    assert sum(_attr(s, "values") for s in flushes) == WORKERS * 3  # type: ignore[misc]
    assert len(flushes) > 2, "several batches, run by the batcher's runners"
    for flushed in flushes:
        assert flushed.parent is not None
        assert by_id[flushed.parent.span_id] is owner
        # Linked to the span of each worker that waited for one of its values, once each.
        linked = [link.context.span_id for link in flushed.links]
        assert len(linked) == len(set(linked)) >= 1
        assert all(by_id[span_id].name.startswith("worker ") for span_id in linked)
    # Between them the links reach every worker.
    assert {link.context.span_id for s in flushes for link in s.links} == worker_spans
    for write in _named(finished, "flush write"):
        assert write.parent is not None and by_id[write.parent.span_id].name == "flush"


# --- nothing secret -------------------------------------------------------------------------


async def test_no_span_carries_a_token_a_url_a_password_or_row_data(
    gateway: CountingGateway, spans: InMemorySpanExporter, database_url: str
) -> None:
    """Both roads, with receipts, random reads and a refused call: every
    exported name, attribute, event and status of every span (the runner's and the
    gateway's) is searched for the secrets and for the rows' data."""
    from sheetplane import GatewayAuthError, open_runtime

    bypass = "bypass-5e9d0c2b"
    rows = [{"_key": f"k{i:03d}", "text": f"{ROW_SECRET} w{i}"} for i in range(12)]
    play = new_play()
    for strategy in ("direct", "gateway_only"):
        async with open_runtime(
            base_url=gateway.base_url,
            token=gateway.token,
            org_id=ORG,
            play_name=play,
            run_id=f"run-{strategy}",
            strategy=strategy,  # type: ignore[arg-type]
            protection_bypass_token=bypass,
        ) as rt:
            await rt.map(f"secret_{strategy}", CONTRACT, rows, words, receipts=True)
            dataset = rt.dataset(f"secret_{strategy}")
            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(dataset.at, i)
    async with open_runtime(
        base_url=gateway.base_url,
        token="not-the-token-0c4d",
        org_id=ORG,
        play_name=play,
        run_id="run-x",
        strategy="gateway_only",
        prewarm=False,
    ) as refused:
        with pytest.raises(GatewayAuthError):
            await refused.dataset("secret_direct").count()
    await trio.testing.wait_all_tasks_blocked()
    exported = json.dumps([_exported(s) for s in spans.get_finished_spans()])
    password = httpx.URL(database_url).password
    secrets = [gateway.token, "not-the-token-0c4d", bypass, database_url, ROW_SECRET]
    secrets += [password] if password else []
    for secret in secrets:
        assert secret not in exported
    for marker in ("postgresql://", "postgres://", "Bearer"):
        assert marker not in exported
    assert "sheetplane.receipt.claim" in exported
    assert "sheetplane.read_batch" in exported
    assert "GatewayAuthError" in exported


async def test_a_retried_call_shows_each_attempt(
    database_url: str, spans: InMemorySpanExporter
) -> None:
    """A call answered back-pressure once: its span holds two attempts, the first with the
    status, the gateway's code and the delay asked for, the second its resend count."""
    from sheetplane.gateway.faults import FAULT_HEADER

    async with counting_gateway(database_url, allow_test_faults=True) as faulty:
        headers = {FAULT_HEADER: "runtime_sheet_summary=backpressure"}
        async with runtime(faulty, "gateway_only", play=new_play(), headers=headers) as rt:
            await rt.writer("retried", CONTRACT).start([{"_key": "a", "text": "x"}])
            assert await rt.dataset("retried").count() == 1
        await trio.testing.wait_all_tasks_blocked()
    finished = spans.get_finished_spans()
    (call,) = _named(finished, "gateway runtime_sheet_summary")
    assert _attr(call, "sheetplane.gateway.attempts") == 2
    (retry,) = call.events
    assert retry.name == "retry"
    assert retry.attributes and retry.attributes["sheetplane.retry.delay_ms"] >= 0  # type: ignore[operator]
    first, second = sorted(_children(finished, call), key=lambda s: s.start_time or 0)
    assert _attr(first, "http.response.status_code") == 503
    assert _attr(first, "sheetplane.gateway.code") == "runtime_postgres_admission_backpressure"
    assert isinstance(_attr(first, "sheetplane.retry_after_ms"), int)
    assert _attr(first, "error.type") == "sheetplane.errors.BackpressureError"
    assert _attr(first, "http.request.resend_count") is None
    assert _attr(second, "http.response.status_code") == 200
    assert _attr(second, "http.request.resend_count") == 1
    assert _attr(second, "error.type") is None


# --- seeing it --------------------------------------------------------------------------------


def test_the_phase_summary_adds_up_busy_and_summed_time() -> None:
    """Spans made with explicit times: busy time is the union of a phase's intervals,
    summed time their total, fn's time the maps' attribute, retries the waits."""
    from sheetplane._phases import in_memory_tracing, summarize

    with in_memory_tracing() as exporter:
        tracer = _tracing._STATE.tracer
        s = 1_000_000_000

        def made(name: str, start: float, end: float, **attributes: object) -> None:
            span = tracer.start_span(name, start_time=int(start * s), attributes=attributes)  # type: ignore[arg-type]
            if name.startswith("gateway"):
                span.add_event("retry", {"sheetplane.retry.delay_ms": 250})
            span.end(end_time=int(end * s))

        made(
            "sheetplane.map",
            0,
            10,
            **{"sheetplane.map.fn_calls": 40, "sheetplane.map.fn_seconds": 32.5},
        )
        made("sheetplane.admission", 0, 2, **{"sheetplane.admission.pending": 40})
        made("sheetplane.read", 2, 4, **{"sheetplane.read.rows": 25})
        made("sheetplane.read", 3, 5, **{"sheetplane.read.rows": 15})
        made("sheetplane.write", 4, 5, **{"sheetplane.write.rows": 30})
        made("sheetplane.write", 8, 9, **{"sheetplane.write.rows": 10})
        made("gateway runtime_sheet_summary", 5, 6)
        made("POST", 5.5, 6, **{"http.request.resend_count": 1})
        summary = summarize(exporter.get_finished_spans())
    phases = {p.name: p for p in summary.phases}
    assert [p.name for p in summary.phases][:5] == [
        "admission",
        "page reads",
        "fn",
        "terminal writes",
        "retries",
    ]
    assert (summary.maps, summary.map_seconds) == (1, 10.0)
    assert (phases["admission"].count, phases["admission"].rows) == (1, 40)
    reads = phases["page reads"]
    assert (reads.count, reads.rows, reads.busy_seconds, reads.summed_seconds) == (2, 40, 3.0, 4.0)
    writes = phases["terminal writes"]
    assert (writes.rows, writes.busy_seconds, writes.summed_seconds) == (40, 2.0, 2.0)
    assert (phases["fn"].count, phases["fn"].summed_seconds) == (40, 32.5)
    assert (phases["retries"].count, phases["retries"].summed_seconds) == (1, 0.25)


def test_demo_trace_without_the_sdk_says_what_to_install() -> None:
    blocker = (
        "import sys\n"
        "class _Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('opentelemetry.sdk'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Blocker())\n"
    )
    code = blocker + "from sheetplane.cli import main\nsys.exit(main())\n"
    done = subprocess.run(
        [sys.executable, "-c", code, "demo", "--trace", "--database-url", "postgresql://x@h/db"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "sheetplane demo: opentelemetry.sdk.trace is not installed; pip install 'sheetplane[trace]'"
    ]


def test_the_tracing_bench_compares_the_three_modes(database_url: str) -> None:
    """``sheetplane bench tracing`` at a toy size: each mode maps every row on each road,
    and the report gives the API-alone ratio and a map's spans."""
    from sheetplane.bench import tracing as bench

    out = trio.run(
        bench._runs,
        database_url,
        bench.argparse.Namespace(rows=30, repeats=1, roads=list(bench.ROADS)),
    )
    for road in bench.ROADS:
        assert {mode: len(runs) for mode, runs in out[road].items()} == {
            "off": 1,
            "api": 1,
            "sdk": 1,
        }
        assert out["spans"][road] > 10
    text = bench.report(
        out, 1500.0, bench.argparse.Namespace(rows=30, repeats=1, roads=bench.ROADS)
    )
    assert "x off" in text and "(target <= 1.02)" in text and "spans a map" in text
    assert bench._verdict(1.01, [10.0, 10.1, 10.05]) == "ok"
    assert bench._verdict(1.05, [10.0, 10.1, 10.05]) == "MISSED"
    assert bench._verdict(1.05, [8.0, 12.0, 10.0]).startswith("unresolved: the off runs spread 40%")
