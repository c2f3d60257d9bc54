"""``sheetplane demo``: the whole data plane, end to end, on a throwaway Postgres.

What it does, in order:

1. With no ``--database-url`` (and no ``SHEETPLANE_DATABASE_URL``) it starts an
   embedded Postgres; it starts the reference gateway in-process on loopback
   with a freshly generated executor token, and opens two runtimes for one
   run: one on the ``direct`` strategy, one ``gateway_only``.
2. **Admission**: attempt 1 admits N rows (default 10,000) with ``start``.
3. **Map**: attempt 1 maps an enrichment (a word count and a short hash of
   each row's email, behind a simulated provider call) with ``Runtime.map`` on
   the direct road. Once most rows have settled, a retry (attempt 2) admits
   the same input again through the gateway.
4. **Fencing**: attempt 1's next write comes back ``newer_write_version``:
   ``map`` cancels every provider call still in flight at once, starts no
   more, and raises ``AttemptSupersededError``, which is caught and shown. A
   rerun with ``map`` on the gateway road maps the rows still pending. Then a
   smaller sheet shows receipts: a map with ``receipts=True`` is stopped
   mid-run as a crashing worker would be, and its rerun with
   ``receipts=True`` takes every finished provider call from its receipt
   instead of calling the provider again.
5. **Read-back**: the sheet is read through the lazy dataset on both roads
   (``async for``, by keyset), each row checked against the enrichment, and
   concurrent ``at(i)`` calls show the page reader coalescing them.
6. A closing table: rows, batches, requests saved by batching, splits,
   fenced writes, timings. Exit status 0, or 1 with a one-line reason.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from ._groups import single_error
from ._map import MapProgress
from ._phases import Summary, summarize, trace_in_memory
from .budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS
from .errors import AttemptSupersededError, SheetplaneError
from .gateway.server import running_gateway
from .runtime import (
    ContractColumn,
    Runtime,
    RuntimeStats,
    SheetContract,
    open_runtime,
)
from .store import open_store
from .store.embedded import EmbeddedPostgres, database_url_from_env

__all__ = ["DEFAULT_ROWS", "add_demo_parser", "run_demo"]

DEFAULT_ROWS: Final = 10_000
ORG: Final = "demo-org"
PLAY: Final = "demo-enrich"
NAMESPACE: Final = "leads"
RUN_ID: Final = "demo-run"
CONTRACT: Final = SheetContract(
    (
        ContractColumn("name", "name", "input"),
        ContractColumn("email", "email", "input"),
        ContractColumn("bio", "bio", "input"),
        ContractColumn("words", "words", "output"),
        ContractColumn("digest", "digest", "output"),
    )
)
#: Rows a map write carries at most (a tenth of a page).
MAP_BATCH_ROWS: Final = READ_PAGE_MAX_ROWS // 10
#: Provider calls in flight at once.
MAP_CONCURRENCY: Final = 64
#: The simulated provider's latency, seconds.
PROVIDER_LATENCY_S: Final = 0.02
#: Attempt 1 is superseded once its provider has been called for this share of its rows.
SUPERSEDE_AT: Final = 0.6
#: Rows of the receipts sheet (each provider call there is two gateway calls).
RECEIPT_ROWS: Final = 200
RECEIPT_NAMESPACE: Final = "provider_calls"
#: Concurrent ``at(i)`` calls per road in the read-back.
RANDOM_READS: Final = 16 * READ_BATCH_MAX_PAGES

#: Console columns when the output is not a terminal.
_PIPED_WIDTH: Final = 120

_BIO = (
    "ships data pipelines with trio and postgres, reads sheets in pages, "
    "writes outputs under fencing, and never waits on a promise that will not settle"
)
_WORDS = _BIO.split()


def make_inputs(n: int) -> list[dict[str, Any]]:
    """``n`` input rows, deterministic: the same ``n`` always gives the same rows."""
    rng = random.Random(n)
    return [
        {
            "name": f"Person {i:06d}",
            "email": f"person{i}@example.com",
            "bio": " ".join(rng.choices(_WORDS, k=3 + i % 17)),
        }
        for i in range(n)
    ]


def enrich(row: dict[str, Any]) -> dict[str, Any]:
    """The map: a word count of the bio and a short hash of the email."""
    return {
        "words": len(str(row["bio"]).split()),
        "digest": hashlib.sha256(str(row["email"]).encode()).hexdigest()[:12],
    }


@attrs.define
class DemoReport:
    """What the demo did, for the closing table."""

    rows: int = 0
    inserted: int = 0
    batch_rows: int = 0
    admitted_version: int = 0
    attempt1_version: int | None = None
    attempt1_settled: int = 0
    fenced_rows: int = 0
    fenced_reasons: set[str] = attrs.field(factory=set)
    cancelled_in_flight: int = 0
    retry_pending: int = 0
    retry_completed: int = 0
    receipt_rows: int = 0
    receipt_first_calls: int = 0
    receipt_written: int = 0
    receipt_window: int = 0
    receipt_rerun_calls: int = 0
    receipt_reused: int = 0
    rows_read: dict[str, int] = attrs.field(factory=dict)
    stats: dict[str, RuntimeStats] = attrs.field(factory=dict)
    random_reads: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    timings: dict[str, float] = attrs.field(factory=dict)


class DemoCheckFailed(SheetplaneError):
    """The demo read back something other than what it wrote."""

    code = "demo_check_failed"


@attrs.define
class Provider:
    """The simulated enrichment provider: counts calls started, in flight and cancelled.

    With ``supersede``, the call numbered ``supersede_after`` starts it (a retry's
    admission) in ``nursery``, and every call from then on returns only once it
    is done: so the attempt's later writes are certain to meet the newer version.
    """

    supersede: Callable[[], Awaitable[object]] | None = None
    supersede_after: int = 0
    nursery: trio.Nursery | None = None
    superseded: trio.Event = attrs.Factory(trio.Event)
    started: int = 0
    in_flight: int = 0
    cancelled: int = 0

    async def _supersede(self) -> None:
        assert self.supersede is not None
        await self.supersede()
        self.superseded.set()

    async def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        self.started += 1
        self.in_flight += 1
        try:
            if self.supersede is not None and self.started >= self.supersede_after:
                if self.started == self.supersede_after:
                    assert self.nursery is not None
                    self.nursery.start_soon(self._supersede)
                await self.superseded.wait()
            await trio.sleep(PROVIDER_LATENCY_S)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        return enrich(row)


def _check_row(row: dict[str, Any], index: int, expected: dict[str, Any]) -> None:
    if row.get("_input_index") != index or row.get("email") != expected["email"]:
        raise DemoCheckFailed(f"row {index} came back out of order: {row.get('_key')!r}")
    outputs = enrich(expected)
    if row.get("_status") != "enriched" or any(row.get(k) != v for k, v in outputs.items()):
        raise DemoCheckFailed(f"row {index} ({row.get('_key')!r}) lacks its outputs")


async def _read_back(
    rt: Runtime,
    road: str,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    advance: Callable[[int], None],
) -> str:
    """Iterate the sheet on ``rt``'s road, check every row; return a digest of the rows."""
    digest = hashlib.sha256()
    dataset = rt.dataset(NAMESPACE)
    count = 0
    async for row in dataset:
        _check_row(row, count, inputs[count])
        digest.update(json.dumps(row, sort_keys=True).encode())
        count += 1
        if count % MAP_BATCH_ROWS == 0:
            advance(MAP_BATCH_ROWS)
    advance(count % MAP_BATCH_ROWS)
    if count != len(inputs) or await dataset.count() != len(inputs):
        raise DemoCheckFailed(f"the {road} road read {count} rows, not {len(inputs)}")
    report.rows_read[road] = count

    before = rt.stats()
    indices = random.Random(road).sample(range(len(inputs)), min(RANDOM_READS, len(inputs)))
    found: dict[int, Any] = {}

    async def at(i: int) -> None:
        found[i] = await dataset.at(i)

    async with trio.open_nursery() as nursery:
        for i in indices:
            nursery.start_soon(at, i)
    for i in indices:
        _check_row(found[i], i, inputs[i])
    after = rt.stats()
    report.random_reads[road] = (
        after.page_reads - before.page_reads,
        after.batch_requests - before.batch_requests,
    )
    report.stats[road] = after
    return digest.hexdigest()


async def demo(database_url: str, rows: int, console: Console) -> DemoReport:
    """Run the demo against ``database_url`` (a superuser URL; a secret, never printed)."""
    report = DemoReport(rows=rows)
    inputs = make_inputs(rows)
    token = secrets.token_urlsafe(24)
    started = time.perf_counter()
    # Reach the database first, so an unreachable one fails with the store's own
    # error rather than as the gateway's failed startup.
    async with open_store(database_url, max_connections=1):
        pass
    async with running_gateway(database_url, tokens={token: ORG}) as gateway:
        console.print(f"reference gateway listening on {gateway.base_url}")
        common: dict[str, Any] = {
            "base_url": gateway.base_url,
            "token": token,
            "org_id": ORG,
            # A play of its own, so runs against one database never share a sheet.
            "play_name": f"{PLAY}-{secrets.token_hex(4)}",
            "run_id": RUN_ID,
        }
        async with (
            open_runtime(strategy="direct", **common) as direct,
            open_runtime(strategy="gateway_only", **common) as via_gateway,
        ):
            progress = (
                Progress(
                    TextColumn("{task.description:<24}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=console,
                )
                if console.is_terminal
                else PipedProgress(console)
            )
            with progress:
                await _run_phases(direct, via_gateway, inputs, report, progress, console)
    report.timings["total"] = time.perf_counter() - started
    return report


class PipedProgress:
    """The demo's progress when its output is not a terminal: one line per phase, printed
    as the phase ends. rich draws its bars only when a piped ``Progress`` stops, after
    every line printed meanwhile, so a log read the phases out of order.

    The same calls as ``rich.progress.Progress`` (those the demo makes); a phase ends
    when it is stopped, when the next one is added, or when the block exits.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._tasks: list[_PipedTask] = []

    def __enter__(self) -> PipedProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end_phases()

    def end_phases(self) -> None:
        """Every phase added so far has ended: print the lines not yet printed."""
        for index in range(len(self._tasks)):
            self.stop_task(TaskID(index))

    def add_task(self, description: str, total: int) -> TaskID:
        self.end_phases()
        self._tasks.append(_PipedTask(description, total, time.perf_counter()))
        return TaskID(len(self._tasks) - 1)

    def update(self, task: TaskID, *, completed: int) -> None:
        self._tasks[task].completed = completed

    def advance(self, task: TaskID, n: int) -> None:
        self._tasks[task].completed += n

    def stop_task(self, task: TaskID) -> None:
        phase = self._tasks[task]
        if not phase.done:
            phase.done = True
            seconds = time.perf_counter() - phase.started
            self.console.print(
                f"{phase.description:<24} {phase.completed:,}/{phase.total:,}  {seconds:.1f} s",
                markup=False,
                highlight=False,
            )


@attrs.define
class _PipedTask:
    description: str
    total: int
    started: float
    completed: int = 0
    done: bool = False


def _say(progress: Progress | PipedProgress, sentence: str) -> None:
    """A phase's one plain sentence, before it starts (its words: docs/runner-guide.md,
    Glossary)."""
    if isinstance(progress, PipedProgress):
        progress.end_phases()
    progress.console.print(f"[bold]{sentence}[/]", soft_wrap=True)


def _advancer(progress: Progress | PipedProgress, task: TaskID) -> Callable[[int], None]:
    def advance(n: int) -> None:
        progress.advance(task, n)

    return advance


async def _admission(
    direct: Runtime,
    via_gateway: Runtime,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    progress: Progress | PipedProgress,
) -> None:
    """Admission: staged in chunks through the gateway, committed whole."""
    rows = len(inputs)
    clock = time.perf_counter
    _say(
        progress,
        f"Admission: the {rows:,} input rows enter the sheet as one attempt, sent through"
        " the gateway in chunks and committed whole.",
    )
    task = progress.add_task("admission", total=rows)
    t0 = clock()
    attempt1 = via_gateway.writer(NAMESPACE, CONTRACT)
    admission = await attempt1.start(inputs)
    report.inserted = admission.inserted
    progress.update(task, completed=admission.inserted)
    report.timings["admission"] = clock() - t0
    report.admitted_version = admission.write_version


async def _superseded_attempt(
    direct: Runtime,
    via_gateway: Runtime,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    progress: Progress | PipedProgress,
) -> None:
    """Attempt 1 maps on the direct road; a retry supersedes it mid-map."""
    rows = len(inputs)
    clock = time.perf_counter
    size = max(1, min(MAP_BATCH_ROWS, rows // 20))
    report.batch_rows = size
    _say(
        progress,
        "Map, attempt 1: an enrichment runs over the rows on the direct road until a retry"
        " of the same input, admitted part way through, supersedes it.",
    )
    task = progress.add_task("map (attempt 1)", total=rows)
    retry: list[int] = []
    t0 = clock()

    async with trio.open_nursery() as nursery:

        async def admit_retry() -> None:
            admission = await via_gateway.writer(NAMESPACE, CONTRACT).start(inputs)
            retry.append(admission.write_version)

        provider = Provider(admit_retry, max(1, math.ceil(SUPERSEDE_AT * rows)), nursery)

        def settled(p: MapProgress) -> None:
            progress.update(task, completed=p.settled)
            report.attempt1_settled = p.settled

        try:
            await direct.map(
                NAMESPACE,
                CONTRACT,
                inputs,
                provider,
                concurrency=MAP_CONCURRENCY,
                batch_rows=size,
                progress=settled,
            )
        except AttemptSupersededError as exc:
            # map admits the rows itself: attempt 1 mapped at its own admission's version.
            report.attempt1_version = exc.write_version
            reasons: set[str] = {row.reason for row in exc.superseded_rows}
            report.fenced_rows = len(exc.superseded_rows)
            report.fenced_reasons = reasons
            report.cancelled_in_flight = provider.cancelled
            if provider.in_flight:
                raise DemoCheckFailed("provider calls outlived the superseded map") from None
            progress.console.print(
                f"[yellow]attempt 1 fenced on the direct road:[/] {len(exc.superseded_rows)} rows "
                f"{', '.join(sorted(reasons))} -> AttemptSupersededError"
            )
            progress.console.print(
                f"map stopped at once: {provider.cancelled} provider calls cancelled "
                "in flight, none left running"
            )
        else:
            raise DemoCheckFailed("attempt 1 was never superseded")
        finally:
            progress.stop_task(task)  # the map has stopped: so does its bar's clock
    report.timings["map (attempt 1)"] = clock() - t0
    progress.console.print(
        f"retry admitted as write version {retry[0]} (attempt 1 mapped at write version "
        f"{report.attempt1_version}) after {report.attempt1_settled:,} of attempt 1's rows "
        "were written"
    )


async def _rerun(
    direct: Runtime,
    via_gateway: Runtime,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    progress: Progress | PipedProgress,
) -> None:
    """A rerun on the gateway road maps what is still pending."""
    rows = len(inputs)
    clock = time.perf_counter
    size = report.batch_rows
    t0 = clock()
    _say(
        progress,
        "Map, the retry: the rows not yet enriched are mapped through the gateway;"
        " enriched rows are kept.",
    )
    task = progress.add_task("map (rerun)", total=rows)
    rerun = await via_gateway.map(
        NAMESPACE,
        CONTRACT,
        inputs,
        Provider(),
        concurrency=MAP_CONCURRENCY,
        batch_rows=size,
        progress=lambda p: progress.update(task, completed=rows - p.total + p.settled),
    )
    progress.update(task, completed=rows)
    report.retry_pending = rerun.pending
    report.retry_completed = rerun.admitted - rerun.pending
    report.timings["map (rerun)"] = clock() - t0


async def _receipts(
    direct: Runtime,
    via_gateway: Runtime,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    progress: Progress | PipedProgress,
) -> None:
    """Receipts: a map stopped mid-run, and its rerun reusing every finished call."""
    clock = time.perf_counter
    t0 = clock()
    calls = inputs[:RECEIPT_ROWS]
    report.receipt_rows = len(calls)
    first = Provider()
    _say(
        progress,
        f"Receipts: a map of {len(calls)} rows is stopped half way, as a crashing worker"
        " would be, and its rerun takes each finished provider call from its receipt.",
    )
    task = progress.add_task("receipts", total=len(calls))
    with trio.CancelScope() as crash:

        def stop_half_way(p: MapProgress) -> None:
            progress.update(task, completed=p.settled)
            if p.settled * 2 >= p.total:
                crash.cancel()  # the worker dies here, as a crashing process would

        await direct.map(
            RECEIPT_NAMESPACE,
            CONTRACT,
            calls,
            first,
            concurrency=8,
            batch_rows=max(1, len(calls) // 10),
            receipts=True,
            progress=stop_half_way,
        )
    progress.stop_task(task)
    again = Provider()
    rerun = await via_gateway.map(
        RECEIPT_NAMESPACE, CONTRACT, calls, again, concurrency=8, receipts=True
    )
    progress.update(task, completed=len(calls))  # the rerun finished the rest
    report.receipt_first_calls = first.started - first.cancelled
    report.receipt_written = rerun.admitted - rerun.pending
    report.receipt_rerun_calls = again.started
    report.receipt_reused = rerun.reused
    # A call that returned while the stop cancelled its receipt's write is finished
    # but unrecorded: the rerun calls it again.
    report.receipt_window = report.receipt_first_calls - report.receipt_written - rerun.reused
    if again.started + rerun.reused != rerun.pending or report.receipt_window < 0:
        raise DemoCheckFailed("the rerun neither reused nor called some rows")
    progress.console.print(
        f"receipts: a map stopped half way finished {report.receipt_first_calls} provider calls: "
        f"{report.receipt_written} rows written, {rerun.reused} recorded but not yet written, "
        f"{report.receipt_window} finished inside the stop before their receipt was recorded"
    )
    progress.console.print(
        f"its rerun reused {rerun.reused} from their receipts and called the provider "
        f"{again.started} times ({report.receipt_window} of them a second time)"
    )
    report.timings["receipts"] = clock() - t0


async def _read_back_both(
    direct: Runtime,
    via_gateway: Runtime,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    progress: Progress | PipedProgress,
) -> None:
    """Read-back through the lazy dataset on both roads."""
    rows = len(inputs)
    clock = time.perf_counter
    digests = {}
    _say(
        progress,
        "Read-back: the sheet is read through the lazy dataset on each road, and every"
        " row is checked against its input.",
    )
    for road, rt in (("direct", direct), ("gateway", via_gateway)):
        task = progress.add_task(f"read-back ({road})", total=rows)
        t0 = clock()
        digests[road] = await _read_back(rt, road, inputs, report, _advancer(progress, task))
        report.timings[f"read-back ({road})"] = clock() - t0
    if digests["direct"] != digests["gateway"]:
        raise DemoCheckFailed("the two roads read different rows")


async def _run_phases(
    direct: Runtime,
    via_gateway: Runtime,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    progress: Progress | PipedProgress,
    console: Console,
) -> None:
    for phase in (_admission, _superseded_attempt, _rerun, _receipts, _read_back_both):
        await phase(direct, via_gateway, inputs, report, progress)


def report_table(report: DemoReport) -> Table:
    """The closing table."""
    table = Table(title="sheetplane demo", show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("direct road", justify="right")
    table.add_column("gateway road", justify="right")
    table.add_column("notes")
    direct, gateway = report.stats["direct"], report.stats["gateway"]
    table.add_row(
        "rows admitted",
        "",
        f"{report.inserted:,}",
        f"one start(), write version {report.admitted_version}",
    )
    table.add_row(
        "map (attempt 1)",
        f"{report.attempt1_settled:,}",
        "",
        f"rows settled in batches of up to {report.batch_rows} at write version "
        f"{report.attempt1_version}, then superseded",
    )
    table.add_row(
        "fenced writes",
        f"{report.fenced_rows:,}",
        "",
        f"{', '.join(sorted(report.fenced_reasons))}: AttemptSupersededError; "
        f"{report.cancelled_in_flight} calls cancelled in flight",
    )
    table.add_row(
        "map (rerun)",
        "",
        f"{report.retry_pending:,}",
        f"rows mapped, {report.retry_completed:,} kept as enriched",
    )
    table.add_row(
        "receipts (rerun)",
        f"{report.receipt_first_calls}",
        f"{report.receipt_rerun_calls}",
        f"provider calls; {report.receipt_reused} reused from receipts, "
        f"{report.receipt_window} finished inside the stop, of {report.receipt_rows} rows",
    )
    table.add_row(
        "rows read back",
        f"{report.rows_read['direct']:,}",
        f"{report.rows_read['gateway']:,}",
        "async for, by keyset; every row checked",
    )
    table.add_row("keyset page reads", f"{direct.keyset_reads:,}", f"{gateway.keyset_reads:,}", "")
    (d_pages, d_batches), (g_pages, g_batches) = (
        report.random_reads["direct"],
        report.random_reads["gateway"],
    )
    table.add_row(
        "at(i): page reads → batches",
        f"{d_pages} → {d_batches}",
        f"{g_pages} → {g_batches}",
        f"requests saved by batching: {d_pages - d_batches} + {g_pages - g_batches}",
    )
    table.add_row("splits (413 / over budget)", f"{direct.splits}", f"{gateway.splits}", "")
    table.add_row(
        "scoped sessions minted", f"{direct.sessions_minted}", f"{gateway.sessions_minted}", ""
    )
    for phase, seconds in report.timings.items():
        rate = ""
        if (phase.startswith("read-back") or phase == "admission") and seconds > 0:
            rate = f"  {report.rows / seconds:,.0f} rows/s"
        table.add_row(f"time: {phase}", "", "", f"{seconds:.2f} s{rate}")
    return table


def phase_table(summary: Summary) -> Table:
    """``--trace``'s table: where the time of the demo's maps went, per phase (their
    spans overlap: busy is wall time with at least one running, summed adds them up)."""
    table = Table(
        title=f"where the time went: {summary.maps} maps, {summary.map_seconds:.2f} s busy "
        "(from OpenTelemetry spans)",
        show_header=True,
        header_style="bold",
    )
    for column in ("phase", "spans", "rows", "busy s", "share", "summed s"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for phase in summary.phases:
        busy = share = ""
        if phase.busy_seconds is not None:
            busy = f"{phase.busy_seconds:.3f}"
            if summary.map_seconds > 0:
                share = f"{phase.busy_seconds / summary.map_seconds:.0%}"
        table.add_row(
            phase.name,
            f"{phase.count:,}",
            "" if phase.rows is None else f"{phase.rows:,}",
            busy,
            share,
            f"{phase.summed_seconds:.3f}",
        )
    return table


def _positive_rows(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--rows must be at least 1, got {value}")
    return value


def add_demo_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``demo`` on the ``sheetplane`` command's subparsers."""
    parser = subparsers.add_parser(
        "demo",
        help="run the data plane end to end on a throwaway embedded Postgres",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rows",
        type=_positive_rows,
        default=DEFAULT_ROWS,
        help=f"rows to admit (default {DEFAULT_ROWS:,})",
    )
    parser.add_argument(
        "--workers",
        type=_positive_rows,
        default=None,
        help="map one attempt with N runner processes instead, and check the sheet "
        "against one worker's (sheetplane.demo_workers)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="print where the time went, per phase, from OpenTelemetry spans "
        "(needs the trace extra: the OpenTelemetry SDK)",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="Postgres superuser URL (default: $SHEETPLANE_DATABASE_URL, else an embedded one)",
    )
    parser.set_defaults(run=run_demo)


def _run_workers_demo(args: argparse.Namespace, url: str | None, console: Console) -> int:
    """``--workers N``: one attempt mapped by N runner processes."""
    from .demo_workers import workers_demo

    if url is not None:
        return trio.run(workers_demo, url, args.rows, args.workers, console)
    console.print("starting a throwaway embedded Postgres ...")
    with EmbeddedPostgres() as server:
        return trio.run(workers_demo, server.url, args.rows, args.workers, console)


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; print its table; 0 on success, 1 with a one-line reason otherwise."""
    console = Console()
    if not console.is_terminal:
        # Piped or captured: wide enough that the closing table keeps one line a row.
        console = Console(width=max(console.width, _PIPED_WIDTH))
    url = args.database_url or database_url_from_env()
    # The SDK is the trace extra (sheetplane.cli checked it before anything started).
    spans = trace_in_memory()[0] if args.trace else None
    if args.workers is not None:
        return _run_workers_demo(args, url, console)
    started = time.perf_counter()
    try:
        if url is not None:
            report = trio.run(demo, url, args.rows, console)
        else:
            console.print("starting a throwaway embedded Postgres ...")
            with EmbeddedPostgres() as server:
                report = trio.run(demo, server.url, args.rows, console)
    except KeyboardInterrupt:
        console.print("[red]demo interrupted[/]")
        return 130
    except BaseException as raised:
        exc = single_error(raised)
        if not isinstance(exc, Exception):
            raise
        # sheetplane's errors never carry a secret (tokens and URLs are redacted
        # before they reach an exception); anything else may, so only its type
        # is shown, with the URL taken out of its message.
        message = str(exc)
        if url is not None:
            message = message.replace(url, "[database URL]")
        message = " ".join(message.split())  # one line, whatever the driver wrote
        # One line on stderr, as for any command's expected failure.
        Console(stderr=True, soft_wrap=True).print(
            f"[red]demo failed:[/] {type(exc).__name__}: {message}", markup=True
        )
        return 1
    report.timings["with Postgres start"] = time.perf_counter() - started
    console.print(report_table(report))
    if spans is not None:
        console.print(phase_table(summarize(spans.get_finished_spans())))
    console.print("[green]demo finished: every row admitted, mapped, fenced and read back[/]")
    console.print("The words used here (road, fenced, keyset page read, minted...) are explained")
    console.print("in docs/runner-guide.md, Glossary.")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="sheetplane")
    add_demo_parser(parser.add_subparsers(dest="command", required=True))
    sys.exit(run_demo(parser.parse_args(["demo", *sys.argv[1:]])))
