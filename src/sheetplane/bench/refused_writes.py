"""``sheetplane bench refused_writes``: gateway memory while large writes are refused.

A real ``sheetplane serve`` process on Postgres (``SHEETPLANE_DATABASE_URL``,
else a throwaway embedded server) takes ``--waves`` (default 3) waves of
``--concurrent`` (default 10) simultaneous refused writes, each body about
``--body-mib`` MiB (default 7): half are ``runtime_sheet_complete_map_rows``
of rows already completed at that write version with other outputs (409
``runtime_write_conflict``), half ``stage_sheet_admission_chunk`` whose last
row has an empty key (400, the admission aborted).

Printed: the server's resident memory before the writes, its peak (``VmHWM``)
and what it holds once they are answered and ``--settle`` seconds have passed
(``VmRSS``), with the answers' statuses. A refused write whose body stays
referenced until the cyclic collector runs piles up across the waves; one
that drops its body when answered grows the server by the bodies in flight.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from collections.abc import Sequence

import trio

from .._plain import PlainHelpFormatter
from .._types import CompleteRow, SheetRef
from ..budgets import MiB
from ..protocol import read_contract
from ..store import open_store
from . import _common
from .refused_reads import memory_kib, serve_gateway

__all__ = ["main"]

ORG = "bench-refused-org"
PLAY = "bench-refused-writes"
CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}
ROWS = 7


async def _seed(url: str, namespace: str) -> int:
    """The sheet's rows, completed once at its write version: that version."""
    sheet = SheetRef(ORG, PLAY, namespace)
    contract = read_contract(CONTRACT)
    async with open_store(url, max_connections=1) as store:
        rows = [{"_key": f"k{i}", "email": f"u{i}@example.com"} for i in range(ROWS)]
        admission = await store.start_dataset(sheet, rows, "run-1", contract)
        done = [CompleteRow(f"k{i}", {"score": "a"}) for i in range(ROWS)]
        await store.complete_map_rows(
            sheet, contract, done, run_id="run-1", write_version=admission.write_version
        )
        return admission.write_version


async def _post(base_url: str, token: str, fields: dict[str, object]) -> int:
    return await _common.post_over_socket(base_url, token, {"playName": PLAY, **fields})


async def _wave(
    base_url: str, token: str, namespace: str, version: int, n: int, body_mib: float
) -> Counter[int]:
    statuses: Counter[int] = Counter()
    cell = int(body_mib * MiB) // ROWS
    common = {"tableNamespace": namespace, "sheetContract": CONTRACT}

    async def conflicting(i: int) -> None:
        rows = [{"key": f"k{j}", "data": {"score": f"{i % 10}" * cell}} for j in range(ROWS)]
        fields = {"action": "runtime_sheet_complete_map_rows", "runId": "run-1", **common}
        statuses[
            await _post(base_url, token, {**fields, "writeVersion": version, "rows": rows})
        ] += 1

    async def bad_chunk(i: int) -> None:
        staged = {**common, "tableNamespace": f"{namespace}_s"}
        admission_id = uuid.uuid4().hex
        begin = {"action": "begin_sheet_admission", "admissionId": admission_id, "runId": "r2"}
        if await _post(base_url, token, {**begin, **staged}) != 200:
            raise RuntimeError("begin_sheet_admission was refused")
        rows = [{"_key": f"s{j}", "email": f"{i % 10}" * cell} for j in range(ROWS - 1)]
        chunk = {"action": "stage_sheet_admission_chunk", "admissionId": admission_id}
        fields = {**chunk, "seq": 0, "firstPosition": 0, "rows": [*rows, {"_key": ""}]}
        statuses[await _post(base_url, token, {**fields, **staged})] += 1

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(conflicting if i % 2 == 0 else bad_chunk, i)
    return statuses


def _run(url: str, args: argparse.Namespace) -> None:
    namespace = f"refused_w_{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    version = trio.run(_seed, url, namespace)
    process, base_url = serve_gateway(url, token)
    statuses: Counter[int] = Counter()
    try:
        before = memory_kib(process.pid)
        started = time.perf_counter()
        waves = []
        for _ in range(args.waves):
            statuses += trio.run(
                _wave, base_url, token, namespace, version, args.concurrent, args.body_mib
            )
            waves.append(memory_kib(process.pid)["VmRSS"])
        elapsed = time.perf_counter() - started
        peak = memory_kib(process.pid)
        time.sleep(args.settle)
        after = memory_kib(process.pid)
    finally:
        process.terminate()
        process.wait(30)
    print(f"{args.waves} waves of {args.concurrent} refused writes of ~{args.body_mib} MiB")
    print(f"answered in {elapsed:.1f} s; statuses: {dict(sorted(statuses.items()))}")
    print(f"server RSS before:  {before['VmRSS'] / 1024:8.1f} MiB")
    print("server RSS after each wave: " + ", ".join(f"{kib / 1024:.1f}" for kib in waves))
    print(f"server RSS peak:    {peak['VmHWM'] / 1024:8.1f} MiB (VmHWM)")
    print(f"server RSS {args.settle:.0f} s after: {after['VmRSS'] / 1024:8.1f} MiB")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench refused_writes", formatter_class=PlainHelpFormatter
    )
    parser.add_argument("--waves", type=int, default=3, help="waves of simultaneous writes")
    parser.add_argument("--concurrent", type=int, default=10, help="simultaneous writes a wave")
    parser.add_argument("--body-mib", type=float, default=7.0, help="MiB of rows per body")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before the last sample")
    args = parser.parse_args(argv)
    return _common.on_postgres(lambda url: _run(url, args))
