"""``sheetplane bench refused_reads``: gateway memory while batch reads are refused 413.

One sheet of ``--rows`` rows (default 40) of about ``--row-mib`` MiB each
(default 3) is admitted on Postgres (``SHEETPLANE_DATABASE_URL``, else a
throwaway embedded server). A real ``sheetplane serve`` process then takes
``--concurrent`` (default 20) simultaneous ``runtime_sheet_read_rows_batch``
requests, each asking for every row in one page: each is past
``READ_BATCH_MAX_RESPONSE_BYTES`` and answered 413.

Printed: the server's resident memory before the reads, its peak (``VmHWM``)
and what it holds once they are answered and a few seconds have passed
(``VmRSS``), with the answers' statuses. A read that fetched its page whole
before measuring it holds the page; one that fetches a bounded slice at a
time holds about the budget, and the pool bounds how many run at once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx
import trio

from .._types import SheetRef
from ..budgets import READ_BATCH_MAX_RESPONSE_BYTES, MiB
from ..gateway.server import RUNTIME_PATH
from ..protocol._domain import read_contract
from ..store import open_store
from ..store.embedded import EmbeddedPostgres, database_url_from_env

__all__ = ["main"]

ORG = "bench-refused-org"
PLAY = "bench-refused"
CONTRACT = {"columns": [{"id": "blob", "sqlName": "blob", "source": "input"}]}


def _memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process, in KiB (Linux)."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


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


async def _read_all(base_url: str, token: str, namespace: str, rows: int, n: int) -> Counter[int]:
    statuses: Counter[int] = Counter()
    body = {
        "action": "runtime_sheet_read_rows_batch",
        "playName": PLAY,
        "input": {"tableNamespace": namespace, "pages": [{"limit": rows, "offset": 0}]},
    }

    async def one(http: httpx.AsyncClient) -> None:
        response = await http.post(RUNTIME_PATH, json=body)
        statuses[response.status_code] += 1

    headers = {"authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=n)
    async with (
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120, limits=limits) as http,
        trio.open_nursery() as nursery,
    ):
        for _ in range(n):
            nursery.start_soon(one, http)
    return statuses


def _serve(url: str, token: str) -> tuple[subprocess.Popen[str], str]:
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


def _run(url: str, args: argparse.Namespace) -> None:
    namespace = f"refused_{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    trio.run(_seed, url, namespace, args.rows, args.row_mib)
    process, base_url = _serve(url, token)
    try:
        before = _memory_kib(process.pid)
        started = time.perf_counter()
        statuses = trio.run(_read_all, base_url, token, namespace, args.rows, args.concurrent)
        elapsed = time.perf_counter() - started
        peak = _memory_kib(process.pid)
        time.sleep(args.settle)
        after = _memory_kib(process.pid)
    finally:
        process.terminate()
        process.wait(30)
    budget = READ_BATCH_MAX_RESPONSE_BYTES // MiB
    print(f"sheet: {args.rows} rows of ~{args.row_mib} MiB; budget {budget} MiB")
    print(f"{args.concurrent} concurrent reads of one {args.rows}-row page in {elapsed:.1f} s")
    print(f"statuses: {dict(sorted(statuses.items()))}")
    print(f"server RSS before:  {before['VmRSS'] / 1024:8.1f} MiB")
    print(f"server RSS peak:    {peak['VmHWM'] / 1024:8.1f} MiB (VmHWM)")
    print(f"server RSS {args.settle:.0f} s after: {after['VmRSS'] / 1024:8.1f} MiB")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    parser = argparse.ArgumentParser(prog="sheetplane bench refused_reads")
    parser.add_argument("--rows", type=int, default=40, help="rows in the sheet")
    parser.add_argument("--row-mib", type=float, default=3.0, help="MiB of data per row")
    parser.add_argument("--concurrent", type=int, default=20, help="simultaneous reads")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before the last sample")
    args = parser.parse_args(argv)
    url = database_url_from_env()
    if url is not None:
        _run(url, args)
        return 0
    with EmbeddedPostgres() as server:
        _run(server.url, args)
    return 0
