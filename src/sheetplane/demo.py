"""``sheetplane demo``: the whole data plane, end to end, on a throwaway Postgres.

What it does, in order:

1. With no ``--database-url`` (and no ``SHEETPLANE_DATABASE_URL``) it starts an
   embedded Postgres; it starts the reference gateway in-process on loopback
   with a freshly generated executor token, and opens two runtimes for one
   run: one on the ``direct`` strategy, one ``gateway_only``.
2. **Admission**: attempt 1 admits N rows (default 10,000) with ``start``.
3. **Map**: an enrichment (a word count and a short hash of each row's email)
   is written in batches, alternately through the direct road (a scoped
   Postgres session) and the gateway road, both under attempt 1's write
   version. The last tenth of the batches is left unwritten, as a worker
   that stalled would leave them.
4. **Fencing**: a retry (attempt 2) admits the same input again. Attempt 1's
   remaining writes now come back ``newer_write_version``: each raises
   ``AttemptSupersededError``, which is caught and shown, and attempt 2 maps
   the rows that were still pending.
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
import random
import secrets
import sys
import time
from collections.abc import Callable
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

from .budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS, TRANSPORT_CEILING_BYTES
from .dataset import Dataset
from .errors import AttemptSupersededError, InvalidInputError, SheetplaneError
from .gateway.server import running_gateway
from .runtime import (
    CompleteRow,
    ContractColumn,
    RowWriter,
    Runtime,
    RuntimeStats,
    SheetContract,
    open_runtime,
)
from .sizes import json_byte_length_up_to
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
#: Map batches written concurrently.
MAP_CONCURRENCY: Final = 2 * READ_BATCH_MAX_PAGES
#: Concurrent ``at(i)`` calls per road in the read-back.
RANDOM_READS: Final = 16 * READ_BATCH_MAX_PAGES
#: The admission request may use this share of the transport ceiling (its answer
#: repeats every row with its key, so it needs the rest).
ADMISSION_REQUEST_BYTES: Final = TRANSPORT_CEILING_BYTES // 2

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
    direct_batches: int = 0
    gateway_batches: int = 0
    fenced_attempts: int = 0
    fenced_rows: int = 0
    fenced_reasons: set[str] = attrs.field(factory=set)
    retry_pending: int = 0
    retry_completed: int = 0
    rows_read: dict[str, int] = attrs.field(factory=dict)
    stats: dict[str, RuntimeStats] = attrs.field(factory=dict)
    random_reads: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    timings: dict[str, float] = attrs.field(factory=dict)


class DemoCheckFailed(SheetplaneError):
    """The demo read back something other than what it wrote."""

    code = "demo_check_failed"


async def _batches(dataset: Dataset, size: int) -> list[list[dict[str, Any]]]:
    """The dataset's rows, read by keyset (``async for``), in batches of ``size``."""
    batches: list[list[dict[str, Any]]] = [[]]
    async for row in dataset:
        if len(batches[-1]) == size:
            batches.append([])
        batches[-1].append(row)
    return batches if batches[0] else []


async def _map_batches(
    batches: list[list[dict[str, Any]]],
    writers: tuple[RowWriter, RowWriter],
    report: DemoReport,
    advance: Callable[[int], None],
) -> None:
    """Write each batch's outputs, alternately on the direct and the gateway writer."""
    limiter = trio.CapacityLimiter(MAP_CONCURRENCY)

    async def write(index: int, batch: list[dict[str, Any]]) -> None:
        async with limiter:
            writer = writers[index % 2]
            await writer.complete([CompleteRow(row["_key"], enrich(row)) for row in batch])
            if index % 2 == 0:
                report.direct_batches += 1
            else:
                report.gateway_batches += 1
            advance(len(batch))

    async with trio.open_nursery() as nursery:
        for index, batch in enumerate(batches):
            nursery.start_soon(write, index, batch)


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
    if json_byte_length_up_to(inputs, ADMISSION_REQUEST_BYTES).exceeded:
        raise InvalidInputError(
            f"{rows} rows do not fit one admission request; try fewer with --rows"
        )
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
            progress = Progress(
                TextColumn("{task.description:<24}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            )
            with progress:
                await _run_phases(direct, via_gateway, inputs, report, progress, console)
    report.timings["total"] = time.perf_counter() - started
    return report


def _advancer(progress: Progress, task: TaskID) -> Callable[[int], None]:
    def advance(n: int) -> None:
        progress.advance(task, n)

    return advance


async def _run_phases(
    direct: Runtime,
    via_gateway: Runtime,
    inputs: list[dict[str, Any]],
    report: DemoReport,
    progress: Progress,
    console: Console,
) -> None:
    rows = len(inputs)
    clock = time.perf_counter

    # 1. Admission (always through the gateway).
    task = progress.add_task("admission", total=rows)
    t0 = clock()
    attempt1 = via_gateway.writer(NAMESPACE, CONTRACT)
    admission = await attempt1.start(inputs)
    report.inserted = admission.inserted
    progress.update(task, completed=admission.inserted)
    report.timings["admission"] = clock() - t0
    version1 = admission.write_version

    # 2. Map, alternating roads, leaving the last tenth unwritten.
    size = max(1, min(MAP_BATCH_ROWS, rows // 20))
    report.batch_rows = size
    batches = await _batches(admission.pending(), size)
    unfinished = max(1, len(batches) // 10)
    mapped, left = batches[:-unfinished], batches[-unfinished:]
    task = progress.add_task("map (attempt 1)", total=rows)
    t0 = clock()
    attempt1_direct = direct.writer(NAMESPACE, CONTRACT, write_version=version1)
    await _map_batches(mapped, (attempt1_direct, attempt1), report, _advancer(progress, task))
    report.timings["map"] = clock() - t0

    # 3. A retry admits the input again; attempt 1's remaining writes are fenced.
    t0 = clock()
    attempt2 = via_gateway.writer(NAMESPACE, CONTRACT)
    retry = await attempt2.start(inputs)
    report.retry_pending = retry.pending_count
    report.retry_completed = retry.completed_count
    progress.console.print(
        f"retry admitted as write version {retry.write_version} (attempt 1 had {version1}): "
        f"{retry.pending_count} rows still to map, {retry.completed_count} kept"
    )
    for writer, road, batch in zip(
        (attempt1_direct, attempt1), ("direct", "gateway"), left[:2], strict=False
    ):
        try:
            await writer.complete([CompleteRow(row["_key"], enrich(row)) for row in batch])
        except AttemptSupersededError as exc:
            reasons = {str(r.get("reason")) for r in exc.stale_rows}
            report.fenced_attempts += 1
            report.fenced_rows += len(exc.stale_rows)
            report.fenced_reasons |= reasons
            progress.console.print(
                f"[yellow]attempt 1 fenced on the {road} road:[/] {len(exc.stale_rows)} rows "
                f"{', '.join(sorted(reasons))} -> AttemptSupersededError; the attempt stops"
            )
        else:
            raise DemoCheckFailed(f"attempt 1's stale write on the {road} road was not fenced")
    task = progress.add_task("map (retry)", total=retry.pending_count)
    attempt2_direct = direct.writer(NAMESPACE, CONTRACT, write_version=retry.write_version)
    await _map_batches(
        await _batches(retry.pending(), size),
        (attempt2_direct, attempt2),
        report,
        _advancer(progress, task),
    )
    report.timings["fence + retry"] = clock() - t0

    # 4. Read-back through the lazy dataset on both roads.
    digests = {}
    for road, rt in (("direct", direct), ("gateway", via_gateway)):
        task = progress.add_task(f"read-back ({road})", total=rows)
        t0 = clock()
        digests[road] = await _read_back(rt, road, inputs, report, _advancer(progress, task))
        report.timings[f"read-back ({road})"] = clock() - t0
    if digests["direct"] != digests["gateway"]:
        raise DemoCheckFailed("the two roads read different rows")


def report_table(report: DemoReport) -> Table:
    """The closing table."""
    table = Table(title="sheetplane demo", show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("direct road", justify="right")
    table.add_column("gateway road", justify="right")
    table.add_column("notes")
    direct, gateway = report.stats["direct"], report.stats["gateway"]
    table.add_row("rows admitted", "", f"{report.inserted:,}", "one start(), write version 1")
    table.add_row(
        "map write batches",
        f"{report.direct_batches:,}",
        f"{report.gateway_batches:,}",
        f"up to {report.batch_rows} rows each, fenced by write version",
    )
    table.add_row(
        "fenced writes",
        "",
        "",
        f"{report.fenced_attempts} stale batches, {report.fenced_rows} rows "
        f"({', '.join(sorted(report.fenced_reasons))}): AttemptSupersededError",
    )
    table.add_row(
        "retry",
        "",
        "",
        f"{report.retry_pending:,} rows re-mapped, {report.retry_completed:,} kept as enriched",
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


def _single(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


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
        "--database-url",
        default=None,
        help="Postgres superuser URL (default: $SHEETPLANE_DATABASE_URL, else an embedded one)",
    )
    parser.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo; print its table; 0 on success, 1 with a one-line reason otherwise."""
    console = Console()
    if not console.is_terminal:
        # Piped or captured: wide enough that the closing table keeps one line a row.
        console = Console(width=max(console.width, _PIPED_WIDTH))
    url = args.database_url or database_url_from_env()
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
        exc = _single(raised)
        if not isinstance(exc, Exception):
            raise
        # sheetplane's errors never carry a secret (tokens and URLs are redacted
        # before they reach an exception); anything else may, so only its type
        # is shown, with the URL taken out of its message.
        message = str(exc)
        if url is not None:
            message = message.replace(url, "[database URL]")
        message = " ".join(message.split())  # one line, whatever the driver wrote
        console.print(f"[red]demo failed:[/] {type(exc).__name__}: {message}", markup=True)
        return 1
    report.timings["with Postgres start"] = time.perf_counter() - started
    console.print(report_table(report))
    console.print("[green]demo finished: every row admitted, mapped, fenced and read back[/]")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="sheetplane")
    add_demo_parser(parser.add_subparsers(dest="command", required=True))
    sys.exit(run_demo(parser.parse_args(["demo", *sys.argv[1:]])))
