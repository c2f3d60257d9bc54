"""``sheetplane bench refused_reads``: gateway memory while batch reads are refused 413.

One sheet of ``--rows`` rows (default 40) of about ``--row-mib`` MiB each
(default 3) is admitted on Postgres (``SHEETPLANE_DATABASE_URL``, else a
throwaway embedded server). A real ``sheetplane serve`` process then takes
``--concurrent`` (default 20) simultaneous ``runtime_sheet_read_rows_batch``
requests, each asking for every row in one page: each is past
``READ_BATCH_MAX_RESPONSE_BYTES`` and answered 413.

Printed, for each of ``--runs`` bursts (default 3), each on a fresh server
process: the server's resident memory before the reads, its peak (``VmHWM``),
the growth between them (the target: under 200 MiB in every run) and what it
holds once they are answered and a few seconds have passed (``VmRSS``), with
the answers' statuses. A read that fetched its page whole
before measuring it holds the page; one that fetches a bounded slice at a
time holds about the budget, and the pool bounds how many run at once.

Then, on the same server, the median of ``--ok-reads`` (default 15) batch reads
that are answered 200, one at a time: a page of the large rows that fits the
budget (``--ok-rows``, default 3), and a batch of four 500-row pages of a
company sheet of 2,000 small rows. A change that bounds the refused reads'
memory should leave these no slower: compare the figures of two runs, one on
each version of the code (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx
import trio

from .._plain import PlainHelpFormatter
from .._types import SheetRef
from ..budgets import READ_BATCH_MAX_RESPONSE_BYTES, MiB
from ..gateway.server import RUNTIME_PATH
from ..protocol import read_contract
from ..store import open_store
from . import _common

__all__ = ["main", "memory_kib", "serve_gateway"]

ORG = "bench-refused-org"
PLAY = "bench-refused"
CONTRACT = {"columns": [{"id": "blob", "sqlName": "blob", "source": "input"}]}


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process, in KiB (Linux)."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


#: The company sheet of the successful small-row reads: its rows and its pages.
SMALL_ROWS = 2_000
SMALL_PAGES = [{"limit": 500, "offset": offset} for offset in range(0, SMALL_ROWS, 500)]


async def _seed(url: str, namespace: str, rows: int, row_mib: float) -> None:
    sheet = SheetRef(ORG, PLAY, namespace)
    contract = read_contract(CONTRACT)
    half = int(row_mib * MiB) // 2
    async with open_store(url, max_connections=1) as store:
        await store.ensure_sheet(sheet, contract)
        for start in range(0, rows, 4):  # a few rows per admission keeps the input small
            chunk = [
                {"_key": f"r{i}", "blob": os.urandom(half).hex()}
                for i in range(start, min(rows, start + 4))
            ]
            await store.start_dataset(sheet, chunk, f"run-{start}", contract)
        small = SheetRef(ORG, PLAY, f"{namespace}_small")
        rows_small = _common.make_rows(SMALL_ROWS)
        await store.start_dataset(small, rows_small, "run-small", _common.CONTRACT, key_field="id")


def _read_body(namespace: str, pages: list[dict[str, int]]) -> dict[str, object]:
    return {
        "action": "runtime_sheet_read_rows_batch",
        "playName": PLAY,
        "input": {"tableNamespace": namespace, "pages": pages},
    }


def _client(base_url: str, token: str, n: int) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=n)
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120, limits=limits)


async def _read_all(base_url: str, token: str, namespace: str, rows: int, n: int) -> Counter[int]:
    statuses: Counter[int] = Counter()
    body = _read_body(namespace, [{"limit": rows, "offset": 0}])

    async def one(http: httpx.AsyncClient) -> None:
        response = await http.post(RUNTIME_PATH, json=body)
        statuses[response.status_code] += 1

    async with _client(base_url, token, n) as http, trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one, http)
    return statuses


async def _ok_reads(
    base_url: str, token: str, namespace: str, ok_rows: int, n: int
) -> dict[str, float]:
    """Median seconds of ``n`` successful batch reads of each kind, one at a time."""
    bodies = {
        f"{ok_rows} large rows, one page": _read_body(namespace, [{"limit": ok_rows, "offset": 0}]),
        f"{SMALL_ROWS:,} small rows, four pages": _read_body(f"{namespace}_small", SMALL_PAGES),
    }
    medians: dict[str, float] = {}
    async with _client(base_url, token, 1) as http:
        for name, body in bodies.items():
            times = []
            for _ in range(n):
                started = time.perf_counter()
                response = await http.post(RUNTIME_PATH, json=body)
                times.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise RuntimeError(f"{name}: answered {response.status_code}")
            medians[name] = statistics.median(times)
    return medians


def serve_gateway(url: str, token: str) -> tuple[subprocess.Popen[str], str]:
    env = {
        **os.environ,
        "SHEETPLANE_DATABASE_URL": url,
        "SHEETPLANE_GATEWAY_TOKENS": f"{token}={ORG}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "sheetplane.cli", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError("sheetplane serve did not start")
    return process, line.removeprefix("listening on ")


#: The target: the gateway's resident memory grows by less than this during the burst.
GROWTH_TARGET_MIB = 200


def _burst(
    url: str, token: str, namespace: str, args: argparse.Namespace, last: bool
) -> dict[str, object]:
    """One run on a fresh ``sheetplane serve`` process: the refused burst, its memory,
    and (``last``) the successful reads after it."""
    process, base_url = serve_gateway(url, token)
    medians: dict[str, float] = {}
    try:
        before = memory_kib(process.pid)
        started = time.perf_counter()
        statuses = trio.run(_read_all, base_url, token, namespace, args.rows, args.concurrent)
        elapsed = time.perf_counter() - started
        peak = memory_kib(process.pid)
        time.sleep(args.settle)
        after = memory_kib(process.pid)
        if last:
            medians = trio.run(_ok_reads, base_url, token, namespace, args.ok_rows, args.ok_reads)
    finally:
        process.terminate()
        process.wait(30)
    return {
        "before": before["VmRSS"] / 1024,
        "peak": peak["VmHWM"] / 1024,
        "after": after["VmRSS"] / 1024,
        "statuses": dict(sorted(statuses.items())),
        "elapsed": elapsed,
        "medians": medians,
    }


def _run(url: str, args: argparse.Namespace) -> None:
    namespace = f"refused_{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    trio.run(_seed, url, namespace, args.rows, args.row_mib)
    runs = [_burst(url, token, namespace, args, i == args.runs - 1) for i in range(args.runs)]
    budget = READ_BATCH_MAX_RESPONSE_BYTES // MiB
    print(f"sheet: {args.rows} rows of ~{args.row_mib} MiB; budget {budget} MiB")
    print(
        f"{args.concurrent} concurrent reads of one {args.rows}-row page, "
        "on a fresh server each run"
    )
    growths = []
    for index, run in enumerate(runs, 1):
        growth = float(run["peak"]) - float(run["before"])  # type: ignore[arg-type]
        growths.append(growth)
        print(
            f"run {index}: statuses {run['statuses']} in {run['elapsed']:.1f} s; server RSS "
            f"before {run['before']:.1f} MiB, peak {run['peak']:.1f} MiB (VmHWM), "
            f"growth {growth:.1f} MiB, {args.settle:.0f} s after {run['after']:.1f} MiB"
        )
    met = "met" if max(growths) < GROWTH_TARGET_MIB else "MISSED"
    print(
        f"largest growth {max(growths):.1f} MiB over {len(runs)} runs "
        f"(target < {GROWTH_TARGET_MIB} MiB in every run: {met})"
    )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"successful batch reads after the last run, median of {args.ok_reads}:")
    for name, seconds in runs[-1]["medians"].items():  # type: ignore[attr-defined]
        print(f"  {name}: {seconds * 1000:8.1f} ms")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench refused_reads", formatter_class=PlainHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=40, help="rows in the sheet")
    parser.add_argument("--row-mib", type=float, default=3.0, help="MiB of data per row")
    parser.add_argument("--concurrent", type=int, default=20, help="simultaneous reads")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before the last sample")
    parser.add_argument("--ok-rows", type=int, default=3, help="large rows of a successful read")
    parser.add_argument("--ok-reads", type=int, default=15, help="successful reads of each kind")
    parser.add_argument("--runs", type=int, default=3, help="bursts, each on a fresh server")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return _common.on_postgres(lambda url: _run(url, args))
