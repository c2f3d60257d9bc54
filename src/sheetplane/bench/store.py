"""``sheetplane bench store``: the store against Postgres' own fast paths.

Two measurements, each against a peer measured in the same run on the same
server (``SHEETPLANE_DATABASE_URL``, else a throwaway embedded server):

* **Admission**: ``SheetStore.start_dataset`` of N rows (default 200,000) into a
  fresh sheet, against ``COPY`` of the same rows (same keys, indexes and jsonb
  column texts) into a fresh sheet table of the same shape: the physical limit
  of getting those rows into that table. Target: >= 0.5x COPY.
* **Full read**: every row through ``read_rows_batch`` (4 pages of 5,000 rows a
  batch, one batch after another, as the page reader issues them), against one
  server-side-cursor ``SELECT`` of the same projection in the same order,
  fetched 5,000 rows at a time and decoded into the same dicts. Target: >= 0.7x.
* **Admission on each road** (``--only roads``; ``staged`` is its old name, kept:
  the direct road no longer stages a first admission), N rows, default 1,000,000:
  ``RowWriter.start`` of N rows made on demand (a sequence, never held whole) on
  each road (``direct``: one transaction straight into the sheet; ``gateway_only``:
  staged), through a
  ``sheetplane serve`` subprocess, against one ``COPY`` of the same rows (same
  keys and jsonb column texts, from the same generator) into a fresh sheet
  table of the same shape, run after each admission; ``--rounds`` rounds (default
  3) of both roads, alternating, medians. Targets: >= 0.8x COPY on ``direct``,
  >= 0.5x on ``gateway_only``; the peak RSS of this process (the runner, generator input)
  and of the gateway process during each admission under 200 MiB (``VmHWM``,
  reset before each admission through ``/proc/PID/clear_refs``). Each round also
  times a one-row admission on each road (runtime, mint, the sheet's creation,
  probe, begin, finish: what does not grow with the rows; the peer's table is
  made untimed) and prints the ratio with its median taken off ours, beside the
  target's ratio.

Each figure is the median of several runs (``--repeats``); rows/s and the
ratio to the peer are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Literal, overload

import attrs
import psycopg
import trio
from psycopg import sql

from .._plain import PlainHelpFormatter
from .._types import SheetRef
from ..budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS, MiB
from ..store import SheetStore, open_store, sheet_names, whole_sheet_read
from ..store.embedded import EmbeddedPostgres, database_url_from_env
from ._common import CONTRACT, make_rows

__all__ = ["main"]

INPUT_COLUMNS = ("id", "name", "domain", "employees")


@attrs.frozen
class Figure:
    """One measured pair: ours against the peer."""

    name: str
    rows: int
    ours_s: list[float]
    peer_s: list[float]

    @property
    def ours_rate(self) -> float:
        return self.rows / statistics.median(self.ours_s)

    @property
    def peer_rate(self) -> float:
        return self.rows / statistics.median(self.peer_s)

    @property
    def ratio(self) -> float:
        return self.ours_rate / self.peer_rate


async def _timed(fn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


def _fresh_sheet(tag: str) -> SheetRef:
    return SheetRef("bench-org", f"bench-{tag}", f"ns-{uuid.uuid4().hex[:12]}")


async def _drop(store: SheetStore, sheet: SheetRef) -> None:
    names = sheet_names(sheet)
    tables = (
        "sheet_table",
        "event_table",
        "summary_table",
        "column_summary_table",
        "counter_table",
        "lock_table",
        "staging_table",
        "stage_chunks_table",
        "admissions_table",
    )

    def run(conn: psycopg.Connection[Any]) -> None:
        for attr in tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(names.ident(attr)))

    await store.pool.run(run)


async def _copy_rows(store: SheetStore, sheet: SheetRef, rows: Sequence[dict[str, Any]]) -> None:
    """COPY the rows as admission stores them: key, pending, run, index, version, jsonb texts."""
    names = sheet_names(sheet)
    columns = ["_key", "_status", "_run_id", "_input_index", "seq", *INPUT_COLUMNS]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        names.ident("sheet_table"), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def run(conn: psycopg.Connection[Any]) -> None:
        with conn.cursor() as cur, cur.copy(statement) as copy:
            for index, row in enumerate(rows):
                copy.write_row(
                    [
                        row["id"],
                        "pending",
                        "bench-run",
                        index,
                        "(1,)",
                        *(dumps(row[name]) for name in INPUT_COLUMNS),
                    ]
                )

    await store.pool.run(run)


async def bench_admission(store: SheetStore, rows: list[dict[str, Any]], repeats: int) -> Figure:
    ours: list[float] = []
    peer: list[float] = []
    for _ in range(repeats):
        sheet = _fresh_sheet("admit")
        await store.ensure_sheet(sheet, CONTRACT)

        async def admit(sheet: SheetRef = sheet) -> None:
            admission = await store.start_dataset(
                sheet, rows, "bench-run", CONTRACT, key_field="id"
            )
            assert admission.inserted == len(rows)

        ours.append(await _timed(admit))
        await _drop(store, sheet)

        sheet = _fresh_sheet("copy")
        await store.ensure_sheet(sheet, CONTRACT)

        async def copy(sheet: SheetRef = sheet) -> None:
            await _copy_rows(store, sheet, rows)

        peer.append(await _timed(copy))
        await _drop(store, sheet)
    return Figure("admission (start_dataset vs COPY)", len(rows), ours, peer)


async def read_all_batched(store: SheetStore, sheet: SheetRef) -> int:
    """Every row through read_rows_batch, 4 pages of 5,000 a batch; returns the row count."""
    from .._types import PageRequest

    total = 0
    offset = 0
    per_batch = READ_PAGE_MAX_ROWS * READ_BATCH_MAX_PAGES
    while True:
        requests = [
            PageRequest(READ_PAGE_MAX_ROWS, offset + n * READ_PAGE_MAX_ROWS)
            for n in range(READ_BATCH_MAX_PAGES)
        ]
        pages = await store.read_rows_batch(sheet, requests)
        got = sum(len(page.rows) for page in pages)
        total += got
        offset += per_batch
        if got < per_batch:
            return total


async def read_all_cursor(store: SheetStore, sheet: SheetRef) -> int:
    """Every row through one server-side cursor, decoded into the same dicts."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> int:
        read = whole_sheet_read(conn, names)
        assert read is not None
        query, keys = read
        total = 0
        with conn.cursor(name="bench_full_read") as cursor:
            cursor.itersize = READ_PAGE_MAX_ROWS
            cursor.execute(query)
            while chunk := cursor.fetchmany(READ_PAGE_MAX_ROWS):
                decoded = [dict(zip(keys, row, strict=True)) for row in chunk]
                total += len(decoded)
        return total

    return await store.pool.run(run)


async def bench_reads(store: SheetStore, rows: list[dict[str, Any]], repeats: int) -> Figure:
    sheet = _fresh_sheet("read")
    await store.start_dataset(sheet, rows, "bench-run", CONTRACT, key_field="id")
    table = sheet_names(sheet).ident("sheet_table")
    await store.pool.run(lambda conn: conn.execute(sql.SQL("ANALYZE {}").format(table)))
    ours: list[float] = []
    peer: list[float] = []

    async def batched() -> None:
        assert await read_all_batched(store, sheet) == len(rows)

    async def cursor() -> None:
        assert await read_all_cursor(store, sheet) == len(rows)

    await batched()  # warm the cache for both
    for _ in range(repeats):
        ours.append(await _timed(batched))
        peer.append(await _timed(cursor))
    await _drop(store, sheet)
    return Figure("full read (read_rows_batch vs server cursor)", len(rows), ours, peer)


def _company_row(i: int) -> dict[str, Any]:
    """Company row ``i`` (its key carried as ``_key``)."""
    key = f"c{i:07d}"
    return {
        "_key": key,
        "id": key,
        "name": f"Company {i}",
        "domain": f"company-{i}.example",
        "employees": (i * 7919) % 10_000,
    }


def _staged_rows(n: int) -> Iterator[dict[str, Any]]:
    """N company rows made one at a time."""
    for i in range(n):
        yield _company_row(i)


class GeneratedRows(Sequence[dict[str, Any]]):
    """N company rows made on demand, as a sequence: re-readable (so the direct road
    may take it in one transaction) and never held whole."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [_company_row(i) for i in range(*index.indices(self._n))]
        if not 0 <= index < self._n:
            raise IndexError(index)
        return _company_row(index)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return _staged_rows(self._n)


def _peak_rss(pid: int | str = "self") -> int:
    """``VmHWM`` of a process, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc status")


def _reset_peak_rss(pid: int | str = "self") -> None:
    """Start ``VmHWM`` again from the current RSS (Linux 4.0+)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")


async def _copy_generated(store: SheetStore, sheet: SheetRef, n: int) -> None:
    """COPY ``n`` generated rows as a staged admission stores them, in one transaction."""
    names = sheet_names(sheet)
    columns = [
        "_key",
        "_status",
        "_run_id",
        "_input_index",
        "seq",
        *INPUT_COLUMNS,
    ]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        names.ident("sheet_table"), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def run(conn: psycopg.Connection[Any]) -> None:
        # One statement of a million rows: the peer is not held to the store's
        # statement timeout (the staged path keeps every statement under it).
        conn.execute("SET LOCAL statement_timeout = 0")
        with conn.cursor() as cur, cur.copy(statement) as copy:
            for index, row in enumerate(_staged_rows(n)):
                copy.write_row(
                    [
                        row["_key"],
                        "pending",
                        "bench-run",
                        index,
                        "(1,1)",
                        *(dumps(row[name]) for name in INPUT_COLUMNS),
                    ]
                )

    await store.pool.run(run)


@attrs.frozen
class StagedFigure:
    """One road's staged admissions against the COPY peer, over several rounds, with the
    highest peak memory of any round."""

    road: str
    rows: int
    ours_s: list[float]
    peer_s: list[float]
    runner_peak_rss: int
    gateway_peak_rss: int
    fixed_s: list[float] = attrs.field(factory=list)
    """A one-row admission's time on the road, each round (runtime, mint, the sheet's
    creation, probe, begin, finish: what does not grow with the rows)."""

    @property
    def ratio(self) -> float:
        return statistics.median(self.peer_s) / statistics.median(self.ours_s)

    @property
    def throughput_ratio(self) -> float:
        """The ratio with the one-row admission's median taken off ours: what the rows
        themselves cost against the peer (the peer's table is made untimed)."""
        rest = statistics.median(self.ours_s) - statistics.median(self.fixed_s)
        return statistics.median(self.peer_s) / rest if rest > 0 else float("inf")


async def _serve(url: str, token: str) -> tuple[trio.Process, str]:
    env = {
        **os.environ,
        "SHEETPLANE_DATABASE_URL": url,
        "SHEETPLANE_GATEWAY_TOKENS": f"{token}=bench-org",
    }
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-c",
            "import sys, sheetplane.cli; sys.exit(sheetplane.cli.main())",
            "serve",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # its request log
        env=env,
    )
    assert process.stdout is not None
    line = b""
    with trio.fail_after(60):
        while not line.endswith(b"\n"):
            chunk = await process.stdout.receive_some(1)
            if not chunk:
                raise RuntimeError("sheetplane serve exited before listening")
            line += chunk
    text = line.decode().strip()
    if not text.startswith("listening on "):
        raise RuntimeError(f"unexpected first line from sheetplane serve: {text!r}")
    return process, text.removeprefix("listening on ")


STAGED_ROADS: tuple[Literal["direct", "gateway_only"], ...] = ("direct", "gateway_only")


async def bench_staged(url: str, rows: int, rounds: int) -> list[StagedFigure]:
    """``rounds`` rounds, each admitting on every road and running the COPY peer after
    each admission, so the roads and the peer alternate under the same load."""

    token = f"bench-{uuid.uuid4().hex[:12]}"
    process, base_url = await _serve(url, token)
    ours: dict[str, list[float]] = {road: [] for road in STAGED_ROADS}
    peer: dict[str, list[float]] = {road: [] for road in STAGED_ROADS}
    runner_peak = dict.fromkeys(STAGED_ROADS, 0)
    gateway_peak = dict.fromkeys(STAGED_ROADS, 0)
    fixed: dict[str, list[float]] = {road: [] for road in STAGED_ROADS}
    try:
        async with open_store(url, max_connections=2) as store:
            for round_no in range(rounds):
                for road in STAGED_ROADS:
                    _reset_peak_rss()
                    _reset_peak_rss(process.pid)
                    ours[road].append(await _timed_admission(store, base_url, token, road, rows))
                    runner_peak[road] = max(runner_peak[road], _peak_rss())
                    gateway_peak[road] = max(gateway_peak[road], _peak_rss(process.pid))
                    fixed[road].append(await _timed_admission(store, base_url, token, road, 1))

                    sheet = _fresh_sheet("staged-copy")
                    await store.ensure_sheet(sheet, CONTRACT)
                    started = time.perf_counter()
                    await _copy_generated(store, sheet, rows)
                    peer[road].append(time.perf_counter() - started)
                    await _drop(store, sheet)
                    print(
                        f"round {round_no + 1} {road}: ours {ours[road][-1]:.2f} s, "
                        f"COPY {peer[road][-1]:.2f} s, one row {fixed[road][-1]:.2f} s",
                        flush=True,
                    )
    finally:
        process.terminate()
        with trio.move_on_after(30):
            await process.wait()
    return [
        StagedFigure(
            road, rows, ours[road], peer[road], runner_peak[road], gateway_peak[road], fixed[road]
        )
        for road in STAGED_ROADS
    ]


async def _timed_admission(
    store: SheetStore, base_url: str, token: str, road: Literal["direct", "gateway_only"], rows: int
) -> float:
    """Seconds to open a runtime on ``road`` and admit ``rows`` generated rows into a new
    play's sheet (made by the admission, as a runner's first admission makes it); the
    sheet is dropped after."""
    from ..runtime import open_runtime

    play = f"bench-staged-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    async with open_runtime(
        base_url=base_url,
        token=token,
        org_id="bench-org",
        play_name=play,
        run_id="bench-run",
        strategy=road,
    ) as rt:
        admission = await rt.writer("leads", CONTRACT).start(GeneratedRows(rows))
    elapsed = time.perf_counter() - started
    assert admission.inserted == rows, admission
    await _drop(store, SheetRef("bench-org", play, "leads"))
    return elapsed


def staged_report(figures: Sequence[StagedFigure]) -> str:
    rounds = max((len(f.ours_s) for f in figures), default=0)
    lines = [
        "admission on each road (RowWriter.start of a lazy sequence) vs COPY of the same rows, "
        f"median of {rounds} alternating rounds",
        f"{'road':<14} {'rows':>9} {'ours rows/s':>12} {'COPY rows/s':>12} {'ratio':>6}"
        f" {'runner peak RSS':>16} {'gateway peak RSS':>17} {'one row':>8} {'ratio less it':>14}",
    ]
    for f in figures:
        ours, peer = statistics.median(f.ours_s), statistics.median(f.peer_s)
        one_row = f"{statistics.median(f.fixed_s):>6.2f} s" if f.fixed_s else f"{'-':>8}"
        rest = f"{f.throughput_ratio:>14.2f}" if f.fixed_s else f"{'-':>14}"
        lines.append(
            f"{f.road:<14} {f.rows:>9} {f.rows / ours:>12,.0f} {f.rows / peer:>12,.0f}"
            f" {f.ratio:>6.2f} {f.runner_peak_rss / MiB:>12.0f} MiB"
            f" {f.gateway_peak_rss / MiB:>13.0f} MiB {one_row} {rest}"
        )
    for f in figures:
        lines.append(
            f"  {f.road}: ours {[round(s, 2) for s in f.ours_s]} s, "
            f"COPY {[round(s, 2) for s in f.peer_s]} s, "
            f"one row {[round(s, 2) for s in f.fixed_s]} s"
        )
    lines.append(
        "  (ratio: the target's figure, ours whole; one row: a one-row admission on the road,"
        " its median taken off ours in 'ratio less it')"
    )
    return "\n".join(lines)


def report(figures: Sequence[Figure], repeats: int) -> str:
    lines = [
        f"store benchmark, median of {repeats} runs",
        f"{'measure':<46} {'rows':>8} {'ours rows/s':>12} {'peer rows/s':>12} {'ratio':>6}",
    ]
    for f in figures:
        lines.append(
            f"{f.name:<46} {f.rows:>8} {f.ours_rate:>12,.0f} {f.peer_rate:>12,.0f} {f.ratio:>6.2f}"
        )
    return "\n".join(lines)


async def run_bench(url: str, rows: int, repeats: int, parts: Sequence[str]) -> list[Figure]:
    data = make_rows(rows)
    figures = []
    async with open_store(url, max_connections=4) as store:
        if "reads" in parts:
            figures.append(await bench_reads(store, data, repeats))
        if "admission" in parts:
            figures.append(await bench_admission(store, data, repeats))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Run the store benchmark and print rows/s and ratios."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench store", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=None, help="default 200,000; roads 1,000,000")
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs of each part; medians (default 5)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="roads: alternating rounds of every road and COPY"
    )
    parser.add_argument(
        "--only",
        choices=("reads", "admission", "roads", "staged"),
        default=None,
        help="run one part only (staged: the old name of roads)",
    )
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    only = "roads" if args.only == "staged" else args.only
    parts = (only,) if only else ("reads", "admission", "roads")
    url = args.database_url or database_url_from_env()
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url
        figures = []
        if "reads" in parts or "admission" in parts:
            figures = trio.run(run_bench, url, args.rows or 200_000, args.repeats, parts)
        staged = (
            trio.run(bench_staged, url, args.rows or 1_000_000, args.rounds)
            if "roads" in parts
            else []
        )
    if staged:
        print(staged_report(staged))
    if figures:
        print(report(figures, args.repeats))
    for f in figures:
        print(
            f"  {f.name}: ours {[round(s, 3) for s in f.ours_s]} s, peer "
            f"{[round(s, 3) for s in f.peer_s]} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
