"""``sheetplane bench map``: ``Runtime.map`` against the loop runners wrote by hand.

On ``SHEETPLANE_DATABASE_URL`` or a throwaway embedded Postgres, with the
reference gateway in-process on loopback, on the direct road:

* **(a) Throughput** (``--rows``, default 100,000; ``fn`` returns at once):
  ``rt.map(...)`` with its defaults against the hand-written loop the runner
  guide showed before ``map`` existed (admit, read ``admission.pending()`` by
  keyset into batches of 100, four batches written at once with
  ``complete``/``fail``), both timed from admission to the last write, each
  on a fresh play, runs interleaved, median of ``--repeats``. Target: map's
  rows/s >= 1.0x the loop's.
* **(b) Concurrency** (``--sleep-rows``, default 20,000): ``fn`` sleeps 10 ms,
  ``concurrency=64``. Wall time of the ``map`` call over the ideal
  ``rows x 10 ms / 64``; also the span from the first ``fn`` call to the
  last one's end, which leaves out the admission before it and the last
  write after it. Target: <= 1.25. Beside each map call, the same run
  measures the machine's own floor for it: ``SLEEP_CONCURRENCY`` bare trio
  tasks taking the same sleeps (no database, no map), over the same ideal.
* **(c) Memory** (``--memory-rows``, default 100,000 and 1,000,000): a child
  process per size seeds that many pending rows straight through the
  superuser (one ``INSERT ... SELECT``), opens a runtime, and maps them with
  ``run_map`` (the loop of ``Runtime.map``) over the admission's pending
  rows; it samples its resident set (``VmRSS``) every 100 ms while it maps
  and prints the peak (the in-process gateway included). The admission
  itself is left out: ``RowWriter.start`` still holds its whole input in
  memory until staged admission lands, so only the map loop can be flat
  today. Target: the large size's peak within 10% of the small one's.
* **(d) Floor** (``--floor-rows``, default 1,000,000; ``fn`` returns at once),
  on both roads (``direct`` and ``gateway_only``): ``rt.map(...)`` with its
  defaults against its floor, made of the same admission (``writer.start``
  on the same road) plus the same terminal writes (a ``CompleteRow`` per row
  with ``fn``'s outputs) issued directly by the store (``SheetStore``), in
  ``batch_rows`` chunks, ``MAP_WRITE_MAX_IN_FLIGHT`` chunks at once: map
  without its reads, its workers and its batcher. Runs interleaved,
  ``--floor-repeats`` of each (default 1: a million rows takes minutes);
  ``--floor-roads`` measures one road alone.
  Target: map <= 1.25x its floor on both roads. On the gateway road too the
  floor's writes are the store's, not the HTTP client's: the floor is the
  writes "issued directly by the store", so what map pays there beyond it is
  the gateway's whole write path (the client's encoding, HTTP, the gateway's
  decoding and checks) and its page reads over HTTP.

Other work shares the machine: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

import psycopg
import trio
from psycopg import sql

from .._map import run_map
from .._plain import PlainHelpFormatter
from .._types import AdmittedPart, CompleteRow, FailRow, SheetRef
from ..budgets import MAP_WRITE_MAX_IN_FLIGHT, KiB
from ..gateway.server import running_gateway
from ..runtime import ContractColumn, Runtime, SheetContract, open_runtime
from ..store import SheetStore, next_write_version, open_store, sheet_names
from ..store.embedded import DATABASE_URL_ENV, EmbeddedPostgres, database_url_from_env
from ._workers import add_worker_options, run_workers_bench, workers_report

__all__ = ["main"]

ORG: Final = "bench-org"
CONTRACT: Final = SheetContract(
    (ContractColumn("text", "text", "input"), ContractColumn("words", "words", "output"))
)
#: The hand-written loop's constants, as the runner guide had them.
LOOP_BATCH_ROWS: Final = 100
LOOP_CONCURRENT_BATCHES: Final = 4
SLEEP_S: Final = 0.010
SLEEP_CONCURRENCY: Final = 64
THROUGHPUT_TARGET: Final = 1.0
SLEEP_TARGET: Final = 1.25
MEMORY_TARGET: Final = 1.1
FLOOR_TARGET: Final = 1.25
#: map's default batch_rows: the floor writes in chunks of the same size.
MAP_BATCH_ROWS: Final = 500
ROADS: Final = ("direct", "gateway_only")
#: Rows the memory child seeds per statement.
SEED_CHUNK_ROWS: Final = 100_000
#: How often the memory child samples its resident set while it maps.
RSS_SAMPLE_S: Final = 0.1


def make_rows(n: int) -> list[dict[str, Any]]:
    return [{"_key": f"k{i:08d}", "text": "word " * (i % 11) + f"row {i}"} for i in range(n)]


def enrich(row: dict[str, Any]) -> dict[str, Any]:
    return {"words": len(str(row["text"]).split())}


async def instant(row: dict[str, Any]) -> dict[str, Any]:
    return enrich(row)


async def hand_loop(rt: Runtime, namespace: str, rows: list[dict[str, Any]]) -> int:
    """The runner guide's loop before ``map``: batches of 100, four written at once."""
    writer = rt.writer(namespace, CONTRACT)
    admission = await writer.start(rows)
    slots = trio.Semaphore(LOOP_CONCURRENT_BATCHES)

    async def map_batch(batch: list[dict[str, Any]]) -> None:
        try:
            done, failed = [], []
            for row in batch:
                try:
                    done.append(CompleteRow(row["_key"], enrich(row)))
                except ValueError as exc:
                    failed.append(FailRow(row["_key"], str(exc)))
            await writer.complete(done)
            await writer.fail(failed)
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        batch: list[dict[str, Any]] = []
        async for row in admission.pending():
            batch.append(row)
            if len(batch) == LOOP_BATCH_ROWS:
                await slots.acquire()
                nursery.start_soon(map_batch, batch)
                batch = []
        if batch:
            await slots.acquire()
            nursery.start_soon(map_batch, batch)
    return admission.pending_count


class _Span:
    """An ``fn`` that sleeps ``SLEEP_S``, noting when the first call began and the last ended."""

    def __init__(self) -> None:
        self.first = 0.0
        self.last = 0.0

    async def sleeping(self, row: dict[str, Any]) -> dict[str, Any]:
        if not self.first:
            self.first = time.perf_counter()
        await trio.sleep(SLEEP_S)
        self.last = time.perf_counter()
        return enrich(row)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def _throughput_and_sleep(url: str, args: argparse.Namespace) -> dict[str, Any]:
    token = secrets.token_urlsafe(24)
    out: dict[str, Any] = {
        "loop": [],
        "map": [],
        "sleep_wall": [],
        "sleep_span": [],
        "sleep_bare": [],
    }
    rows = make_rows(args.rows)
    async with running_gateway(url, tokens={token: ORG}) as gateway:

        def runtime(play: str) -> Any:
            return open_runtime(
                base_url=gateway.base_url,
                token=token,
                org_id=ORG,
                play_name=play,
                run_id="bench",
                strategy="direct",
            )

        for repeat in range(args.repeats):
            for label in ("loop", "map") if repeat % 2 == 0 else ("map", "loop"):
                play = f"bench-map-{secrets.token_hex(4)}"
                async with runtime(play) as rt:
                    started = time.perf_counter()
                    if label == "loop":
                        done = await hand_loop(rt, "ns", rows)
                    else:
                        done = (await rt.map("ns", CONTRACT, rows, instant)).completed
                    elapsed = time.perf_counter() - started
                if done != len(rows):
                    raise AssertionError(f"{label} mapped {done} rows, not {len(rows)}")
                out[label].append(elapsed)
        sleepy = make_rows(args.sleep_rows)
        for _ in range(args.repeats):
            span = _Span()
            async with runtime(f"bench-sleep-{secrets.token_hex(4)}") as rt:
                started = time.perf_counter()
                report = await rt.map(
                    "ns", CONTRACT, sleepy, span.sleeping, concurrency=SLEEP_CONCURRENCY
                )
                out["sleep_wall"].append(time.perf_counter() - started)
                out["sleep_span"].append(span.last - span.first)
            if report.completed != len(sleepy):
                raise AssertionError("the sleeping map lost rows")
            out["sleep_bare"].append(await bare_sleeps(len(sleepy)))
    return out


async def bare_sleeps(sleeps: int) -> float:
    """Seconds ``SLEEP_CONCURRENCY`` bare trio tasks take to sleep ``SLEEP_S`` ``sleeps``
    times between them: what this machine's scheduler allows (b) at best."""
    left = sleeps

    async def sleeper() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await trio.sleep(SLEEP_S)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(SLEEP_CONCURRENCY):
            nursery.start_soon(sleeper)
    return time.perf_counter() - started


async def _memory_child(url: str, rows: int) -> dict[str, float]:
    """Seed ``rows`` pending rows, map them with run_map; the peak RSS before and after."""
    token = secrets.token_urlsafe(24)
    play, namespace = f"bench-mem-{secrets.token_hex(4)}", "ns"
    sheet = SheetRef(ORG, play, namespace)
    async with open_store(url, max_connections=1) as store:
        await store.ensure_sheet(sheet, CONTRACT)
        names = sheet_names(sheet)

        def seed(conn: psycopg.Connection[Any], start: int, stop: int) -> None:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {t} (_key, _status, _run_id, _input_index, seq.write_version,"
                    " seq.admitted_version, text) SELECT 'k' || lpad(i::text, 8, '0'), 'pending',"
                    " 'bench', i, 1, 1, to_jsonb('row ' || i || ' ' || repeat('word ', i %% 11))"
                    " FROM generate_series(%(start)s, %(stop)s - 1) AS i"
                ).format(t=names.ident("sheet_table")),
                {"start": start, "stop": stop},
            )

        # The rows are stamped with the sheet's first write version, taken as an
        # admission takes it: the gateway's event guard refuses a terminal write at a
        # version past the sheet's admissions.
        version = await store.pool.run(functools.partial(next_write_version, names=names))
        if version != 1:
            raise AssertionError(f"a new sheet's first write version is {version}, not 1")
        # One statement per SEED_CHUNK_ROWS rows: a million in one statement passed the
        # statement timeout on a loaded machine.
        for start in range(0, rows, SEED_CHUNK_ROWS):
            stop = min(rows, start + SEED_CHUNK_ROWS)
            await store.pool.run(functools.partial(seed, start=start, stop=stop))
    async with (
        running_gateway(url, tokens={token: ORG}) as gateway,
        open_runtime(
            base_url=gateway.base_url,
            token=token,
            org_id=ORG,
            play_name=play,
            run_id="bench",
            strategy="direct",
        ) as rt,
    ):
        writer = rt.writer(namespace, CONTRACT, write_version=1)
        pending = rt.admitted_dataset(namespace, AdmittedPart(1, "pending"))
        await pending.peek(1)  # mint the session, open the pool
        before = _current_rss_kib()
        peak = before
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:

            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, _current_rss_kib())
                    await trio.sleep(RSS_SAMPLE_S)

            nursery.start_soon(sample)
            completed, _failed, _reused = await run_map(
                pending,
                instant,
                total=rows,
                complete=writer.complete,
                fail=writer.fail,
                concurrency=16,
                batch_rows=500,
                flush_seconds=0.25,
            )
            peak = max(peak, _current_rss_kib())
            nursery.cancel_scope.cancel()
        seconds = time.perf_counter() - started
    if completed != rows:
        raise AssertionError(f"mapped {completed} of {rows} rows")
    return {
        "rows": rows,
        "before_kib": before,
        "peak_kib": peak,
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "seconds": round(seconds, 1),
    }


def _current_rss_kib() -> int:
    """The process's resident set now (``VmRSS``), KiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


async def floor_writes(
    store: SheetStore, sheet: SheetRef, rows: list[dict[str, Any]], write_version: int
) -> int:
    """The floor's terminal writes: every row's CompleteRow, ``MAP_BATCH_ROWS`` a write,
    issued by ``store`` directly, ``MAP_WRITE_MAX_IN_FLIGHT`` writes at once."""
    written = 0
    slots = trio.Semaphore(MAP_WRITE_MAX_IN_FLIGHT)

    async def write(chunk: list[CompleteRow]) -> None:
        nonlocal written
        try:
            result = await store.complete_map_rows(
                sheet, CONTRACT, chunk, run_id="bench", write_version=write_version
            )
            written += len(result.committed_keys)
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        for start in range(0, len(rows), MAP_BATCH_ROWS):
            part = rows[start : start + MAP_BATCH_ROWS]
            chunk = [CompleteRow(row["_key"], enrich(row)) for row in part]
            await slots.acquire()
            nursery.start_soon(write, chunk)
    return written


async def _floor(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """(d): per road, map's seconds and its floor's, interleaved."""
    token = secrets.token_urlsafe(24)
    rows = make_rows(args.floor_rows)
    out: dict[str, Any] = {road: {"map": [], "floor": []} for road in args.floor_roads}
    async with (
        running_gateway(url, tokens={token: ORG}) as gateway,
        open_store(url, max_connections=MAP_WRITE_MAX_IN_FLIGHT) as store,
    ):
        for repeat in range(args.floor_repeats):
            for road in args.floor_roads:
                for label in ("floor", "map") if repeat % 2 == 0 else ("map", "floor"):
                    play = f"bench-floor-{secrets.token_hex(4)}"
                    async with open_runtime(
                        base_url=gateway.base_url,
                        token=token,
                        org_id=ORG,
                        play_name=play,
                        run_id="bench",
                        strategy=road,
                    ) as rt:
                        started = time.perf_counter()
                        if label == "map":
                            done = (await rt.map("ns", CONTRACT, rows, instant)).completed
                        else:
                            admission = await rt.writer("ns", CONTRACT).start(rows)
                            done = await floor_writes(
                                store, SheetRef(ORG, play, "ns"), rows, admission.write_version
                            )
                        elapsed = time.perf_counter() - started
                    if done != len(rows):
                        raise AssertionError(f"{road} {label} wrote {done} rows, not {len(rows)}")
                    out[road][label].append(elapsed)
                    print(f"(d) {road} {label}: {elapsed:.1f} s, load {_load()}", file=sys.stderr)
    return out


def _memory(url: str, sizes: Sequence[int]) -> list[dict[str, float]]:
    results = []
    for rows in sizes:
        done = subprocess.run(
            [sys.executable, "-m", "sheetplane.bench.map", "--memory-child", str(rows)],
            env={**os.environ, DATABASE_URL_ENV: url},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the memory child for {rows:,} rows failed:\n{done.stderr}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def report(
    timing: dict[str, Any] | None,
    memory: list[dict[str, float]],
    floor: dict[str, Any] | None,
    args: argparse.Namespace,
) -> str:
    lines = [f"map benchmark, direct road, median of {args.repeats}; load average {_load()}"]
    if timing is not None:
        lines += _timing_lines(timing, args)
    if memory:
        lines += _memory_lines(memory)
    if floor is not None:
        lines += _floor_lines(floor, args)
    lines.append(f"load average at the end {_load()}")
    return "\n".join(lines)


def _timing_lines(timing: dict[str, Any], args: argparse.Namespace) -> list[str]:
    loop, mapped = statistics.median(timing["loop"]), statistics.median(timing["map"])
    ratio = loop / mapped
    ideal = args.sleep_rows * SLEEP_S / SLEEP_CONCURRENCY
    wall, span = statistics.median(timing["sleep_wall"]), statistics.median(timing["sleep_span"])
    bare = statistics.median(timing["sleep_bare"])
    verdict = _verdict
    return [
        f"(a) {args.rows:,} rows, fn returns at once (admission to last write):",
        f"    hand-written loop {loop:7.2f} s  {args.rows / loop:>9,.0f} rows/s  "
        f"runs {[round(s, 2) for s in timing['loop']]}",
        f"    rt.map            {mapped:7.2f} s  {args.rows / mapped:>9,.0f} rows/s  "
        f"runs {[round(s, 2) for s in timing['map']]}",
        f"    map / loop = {ratio:.2f}x (target >= {THROUGHPUT_TARGET}) "
        f"{verdict(ratio >= THROUGHPUT_TARGET)}",
        f"(b) {args.sleep_rows:,} rows, fn sleeps {SLEEP_S * 1000:.0f} ms, "
        f"concurrency {SLEEP_CONCURRENCY}: ideal {ideal:.3f} s",
        f"    map call {wall:.3f} s = {wall / ideal:.3f}x ideal (target <= {SLEEP_TARGET}) "
        f"{verdict(wall / ideal <= SLEEP_TARGET)}",
        f"    runs {[round(s, 3) for s in timing['sleep_wall']]}",
        f"    first fn call to last: {span:.3f} s = {span / ideal:.3f}x ideal",
        f"    {SLEEP_CONCURRENCY} bare trio tasks, the same sleeps: {bare:.3f} s = "
        f"{bare / ideal:.3f}x ideal (runs {[round(s, 3) for s in timing['sleep_bare']]}); "
        f"map call / bare = {wall / bare:.2f}x",
    ]


def _memory_lines(memory: list[dict[str, float]]) -> list[str]:
    small, large = memory[0], memory[-1]
    grow = large["peak_kib"] / small["peak_kib"]
    lines = ["(c) RSS of a child mapping N seeded rows (admission left out), sampled:"]
    for m in memory:
        lines.append(
            f"    {m['rows']:>10,} rows: peak while mapping {m['peak_kib'] / KiB:,.0f} MiB "
            f"(before the map {m['before_kib'] / KiB:,.0f} MiB; the process's ru_maxrss "
            f"{m['maxrss_kib'] / KiB:,.0f} MiB), {m['seconds']} s"
        )
    lines.append(
        f"    {large['rows']:,} / {small['rows']:,}: {grow:.2f}x "
        f"(target <= {MEMORY_TARGET}) {_verdict(grow <= MEMORY_TARGET)}"
    )
    return lines


def _floor_lines(floor: dict[str, Any], args: argparse.Namespace) -> list[str]:
    lines = [
        f"(d) {args.floor_rows:,} rows, fn returns at once, against the floor (the same "
        f"admission, the same writes by the store in chunks of {MAP_BATCH_ROWS}), "
        f"median of {args.floor_repeats}:"
    ]
    for road in args.floor_roads:
        mapped, bare = (statistics.median(floor[road][label]) for label in ("map", "floor"))
        ratio = mapped / bare
        lines += [
            f"    {road:>12}: floor {bare:7.1f} s ({args.floor_rows / bare:>7,.0f} rows/s), "
            f"rt.map {mapped:7.1f} s ({args.floor_rows / mapped:>7,.0f} rows/s)",
            f"    {'':>12}  map / floor = {ratio:.2f}x (target <= {FLOOR_TARGET}) "
            f"{_verdict(ratio <= FLOOR_TARGET)}",
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the map benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench map", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=100_000, help="(a) throughput rows (default 100,000)"
    )
    parser.add_argument(
        "--sleep-rows", type=int, default=20_000, help="(b) concurrency rows (default 20,000)"
    )
    parser.add_argument(
        "--memory-rows",
        type=int,
        nargs="*",
        default=[100_000, 1_000_000],
        help="(c) memory: rows of each size (default 100,000 1,000,000)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="(a) and (b): runs of each side; medians"
    )
    parser.add_argument(
        "--floor-rows", type=int, default=1_000_000, help="(d) floor rows (default 1,000,000)"
    )
    parser.add_argument(
        "--floor-repeats", type=int, default=1, help="(d): runs of map and of its floor (default 1)"
    )
    parser.add_argument(
        "--floor-roads",
        nargs="+",
        choices=ROADS,
        default=list(ROADS),
        help="(d): the roads measured (default both), e.g. one at a time at 1,000,000 rows",
    )
    parser.add_argument(
        "--skip",
        choices=("timing", "memory", "floor"),
        action="append",
        default=[],
        help="leave a part out: timing (a and b), memory (c), floor (d); repeatable",
    )
    add_worker_options(parser)
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    url = args.database_url or database_url_from_env()
    if args.memory_child is not None:
        if url is None:
            parser.error("--memory-child needs a database")
        print(json.dumps(trio.run(_memory_child, url, args.memory_child)))
        return 0
    if args.workers is not None:
        with contextlib.ExitStack() as stack:
            if url is None:
                url = stack.enter_context(EmbeddedPostgres()).url
            result = trio.run(run_workers_bench, url, args)
        print(workers_report(result, args))
        return 0
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url
        # Each part prints as soon as it is measured: a later part failing keeps the others.
        timing = None if "timing" in args.skip else trio.run(_throughput_and_sleep, url, args)
        if timing is not None:
            print("\n".join(_timing_lines(timing, args)), flush=True)
        floor = None if "floor" in args.skip else trio.run(_floor, url, args)
        if floor is not None:
            print("\n".join(_floor_lines(floor, args)), flush=True)
        memory = [] if "memory" in args.skip else _memory(url, args.memory_rows)
    print(report(timing, memory, floor, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
