"""``sheetplane bench counters``: what the counting triggers cost a staged commit.

Stages N rows (default 1,000,000, the company rows of ``bench/_common.py``)
into a fresh sheet through the store, then times ``commit_admission`` alone:
once with the sheet's counting triggers (``store._counters``) as they are, once
with them disabled (``ALTER TABLE ... DISABLE TRIGGER USER``, the counters then
left wrong: a measurement only), alternating, ``--repeats`` times each, on
``SHEETPLANE_DATABASE_URL`` or a throwaway durable embedded server. Prints each
commit's time, the medians and their ratio (with / without).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import trio
from psycopg import sql

from .._plain import PlainHelpFormatter
from .._types import SheetRef
from ..budgets import ADMISSION_CHUNK_ROWS
from ..protocol import prepare_chunk
from ..store import SheetStore, open_store, sheet_names
from ..store.embedded import EmbeddedPostgres, database_url_from_env
from ._common import CONTRACT, make_rows

__all__ = ["main"]


def _disable_triggers(url: str, table: sql.Identifier) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(table))


async def _commit_seconds(store: SheetStore, url: str, rows: int, *, triggers: bool) -> float:
    """Stage ``rows`` rows into a fresh sheet and time their commit."""
    sheet = SheetRef(f"bench-{uuid.uuid4().hex[:8]}", "bench-counters", "ns")
    await store.ensure_sheet(sheet, CONTRACT)
    if not triggers:
        table = sheet_names(sheet).ident("sheet_table")
        await trio.to_thread.run_sync(_disable_triggers, url, table)
    admission = uuid.uuid4().hex
    await store.begin_admission(sheet, CONTRACT, admission, "run-bench")
    chunks = 0
    for first in range(0, rows, ADMISSION_CHUNK_ROWS):
        size = min(ADMISSION_CHUNK_ROWS, rows - first)
        batch: list[Any] = [{**row, "_key": row["id"]} for row in make_rows(size, first)]
        prepared = await trio.to_thread.run_sync(prepare_chunk, batch, first)
        await store.stage_chunk(sheet, admission, chunks, first, prepared)
        chunks += 1
    started = time.perf_counter()
    counts = await store.commit_admission(
        sheet, CONTRACT, admission, "run-bench", chunks=chunks, rows=rows
    )
    elapsed = time.perf_counter() - started
    if counts.inserted != rows:
        raise RuntimeError(f"the commit inserted {counts.inserted} rows, not {rows}")
    return elapsed


async def run_bench(url: str, rows: int, repeats: int) -> str:
    with_triggers: list[float] = []
    without: list[float] = []
    lines = [f"staged commit of {rows:,} rows, counting triggers on and off, alternating"]
    async with open_store(url, max_connections=2) as store:
        for _ in range(repeats):
            for triggers, times in ((True, with_triggers), (False, without)):
                seconds = await _commit_seconds(store, url, rows, triggers=triggers)
                times.append(seconds)
                label = "on " if triggers else "off"
                rate = rows / seconds
                lines.append(f"  triggers {label} {seconds:8.2f} s  {rate:>10,.0f} rows/s")
    on, off = statistics.median(with_triggers), statistics.median(without)
    lines.append(f"median: triggers on {on:.2f} s, off {off:.2f} s, on / off {on / off:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the counters benchmark and print the commit times and their ratio."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench counters", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="rows staged (default 1,000,000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="commits timed with and without the triggers each"
    )
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    url = args.database_url or database_url_from_env()
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url
        print(trio.run(run_bench, url, args.rows, args.repeats))
    return 0
