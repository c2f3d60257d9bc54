"""``sheetplane bench dataset``: iterating a lazy dataset costs O(rows), on both roads.

Two sheets, of 100,000 and 1,000,000 rows (``--small``, ``--large``), are
seeded with one ``INSERT ... SELECT generate_series`` through the superuser
(admission is not what is measured), on ``SHEETPLANE_DATABASE_URL`` or a
throwaway embedded Postgres, with the reference gateway in-process on
loopback. Then, for each road (``direct``: scoped sessions; ``gateway``:
HTTP), ``async for row in rt.dataset(ns)`` reads every row, ``--repeats``
times (default 3), and the median is kept. Timed runs interleave the sizes
and the roads, so load from elsewhere on the machine falls on all alike.

* **Linearity**: time per row on the large sheet over time per row on the
  small one. Keyset paging makes every page cost the same however deep it is,
  so the target is <= 1.2x; growing offsets would make it about 10x.
* **Peer**: the same rows read with one server-side cursor ``SELECT`` on a
  plain psycopg connection, decoded into dicts (a physical floor for reading
  these rows into Python), measured in the same run. Target: the gateway road
  at >= 0.75x the peer's rows/s.
* **Memory**: the process's peak RSS (``resource.getrusage``) after an
  untimed read of the small sheet on every road, then of the large one, then
  after the timed runs (the gateway runs in this process too, so its side
  counts as well); and a tracemalloc peak over the first 100,000 rows of one
  iteration per road (tracemalloc slows allocation-heavy code about tenfold,
  so that pass is not timed).
"""

from __future__ import annotations

import argparse
import resource
import secrets
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any, Final

import attrs
import psycopg
import trio
from psycopg import sql

from .._plain import PlainHelpFormatter
from .._types import SheetRef
from ..budgets import READ_PAGE_MAX_ROWS, KiB
from ..gateway.server import running_gateway
from ..runtime import ContractColumn, SheetContract, Strategy, open_runtime
from ..store import SheetStore, open_store, sheet_names
from ..store.embedded import EmbeddedPostgres, database_url_from_env

__all__ = ["main"]

ORG: Final = "bench-org"
PLAY: Final = "bench-dataset"
CONTRACT: Final = SheetContract(
    (ContractColumn("text", "text", "input"), ContractColumn("words", "words", "output"))
)
ROADS: Final[tuple[tuple[str, Strategy], ...]] = (("direct", "direct"), ("gateway", "gateway_only"))
#: Rows traced by tracemalloc per road (the first ones of an iteration).
TRACED_ROWS: Final = 100_000
#: The target: time per row at the large size over time per row at the small size.
LINEAR_TARGET: Final = 1.2
#: The target: the gateway road's rows/s over the peer's, at each size.
GATEWAY_TARGET: Final = 0.75


async def seed(store: SheetStore, namespace: str, rows: int) -> None:
    """``rows`` pending rows in one statement; the summary counters follow."""
    sheet = SheetRef(ORG, PLAY, namespace)
    await store.ensure_sheet(sheet, CONTRACT)
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            sql.SQL(
                "INSERT INTO {t} (_key, _status, _run_id, _input_index, seq.write_version, text)"
                " SELECT 'k' || lpad(i::text, 8, '0'), 'pending', 'bench', i, 1,"
                " to_jsonb('row ' || i || ' ' || repeat('word ', i %% 11))"
                " FROM generate_series(0, %(n)s - 1) AS i"
            ).format(t=names.ident("sheet_table")),
            {"n": rows},
        )
        conn.execute(sql.SQL("ANALYZE {}").format(names.ident("sheet_table")))

    await store.pool.run(run)


def peer_read(url: str, namespace: str) -> int:
    """Every row, in read order, through one server-side cursor, decoded into dicts."""
    names = sheet_names(SheetRef(ORG, PLAY, namespace))
    query = sql.SQL(
        "SELECT _key, text, words, _status, _error, _input_index FROM {} "
        "ORDER BY _input_index ASC NULLS LAST, _created_at ASC, _key ASC"
    ).format(names.ident("sheet_table"))
    keys = ("_key", "text", "words", "_status", "_error", "_input_index")
    rows = 0
    with psycopg.connect(url) as conn, conn.cursor(name="bench_peer") as cursor:
        cursor.itersize = READ_PAGE_MAX_ROWS
        cursor.execute(query)
        for record in cursor:
            dict(zip(keys, record, strict=True))
            rows += 1
    return rows


@attrs.frozen
class Measure:
    """One road at one size: seconds of each run."""

    road: str
    rows: int
    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def per_row_us(self) -> float:
        return self.median / self.rows * 1e6


@attrs.define
class Result:
    measures: dict[tuple[str, int], Measure] = attrs.field(factory=dict)
    rss_kib: dict[str, int] = attrs.field(factory=dict)
    traced_peak: dict[str, int] = attrs.field(factory=dict)
    requests: dict[str, int] = attrs.field(factory=dict)
    traced_rows: int = 0


def _peak_rss_kib() -> int:
    # ru_maxrss is in KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


async def run_bench(url: str, small: int, large: int, repeats: int) -> Result:
    result = Result()
    token = secrets.token_urlsafe(24)
    namespaces = {small: f"rows-{small}", large: f"rows-{large}"}
    async with open_store(url, max_connections=2) as store:
        for rows, namespace in namespaces.items():
            await seed(store, namespace, rows)
    async with running_gateway(url, tokens={token: ORG}) as gateway:
        common: dict[str, Any] = {
            "base_url": gateway.base_url,
            "token": token,
            "org_id": ORG,
            "play_name": PLAY,
            "run_id": "bench",
        }
        for label, strategy in ROADS:
            async with open_runtime(strategy=strategy, **common) as rt:
                dataset = rt.dataset(namespaces[small])
                await dataset.peek(1)  # mint sessions, open connections
                traced = 0
                tracemalloc.start()
                async for _row in dataset:
                    traced += 1
                    if traced == TRACED_ROWS:
                        break
                result.traced_peak[label] = tracemalloc.get_traced_memory()[1]
                result.traced_rows = traced
                tracemalloc.stop()
        async with (
            open_runtime(strategy="direct", **common) as direct,
            open_runtime(strategy="gateway_only", **common) as via_gateway,
        ):
            runtimes = {"direct": direct, "gateway": via_gateway}

            async def read(label: str, rows: int) -> float:
                """Read every row of the ``rows`` sheet on ``label``'s road; seconds taken."""
                namespace = namespaces[rows]
                started = time.perf_counter()
                if label == "peer":
                    got = await trio.to_thread.run_sync(peer_read, url, namespace)
                else:
                    rt = runtimes[label]
                    before = rt.stats().keyset_reads
                    got = 0
                    async for _row in rt.dataset(namespace):
                        got += 1
                    result.requests[f"{label} {rows}"] = rt.stats().keyset_reads - before
                elapsed = time.perf_counter() - started
                if got != rows:
                    raise AssertionError(f"{label} read {got} rows, expected {rows}")
                return elapsed

            labels = ("peer", *runtimes)
            # Untimed: one read of each sheet on each road warms Postgres' cache,
            # mints the sessions and opens the connections.
            for rows in (small, large):
                for label in labels:
                    await read(label, rows)
                result.rss_kib[f"after reading {rows:,} rows on each road"] = _peak_rss_kib()
            # Timed runs interleave sizes and roads, so load from elsewhere on the
            # machine falls on all of them alike.
            seconds: dict[tuple[str, int], list[float]] = {}
            for _ in range(repeats):
                for rows in (small, large):
                    for label in labels:
                        seconds.setdefault((label, rows), []).append(await read(label, rows))
            for (label, rows), runs in seconds.items():
                result.measures[(label, rows)] = Measure(label, rows, tuple(runs))
            result.rss_kib[f"after {repeats} more of each"] = _peak_rss_kib()
    return result


def report(result: Result, small: int, large: int, repeats: int) -> str:
    lines = [
        f"dataset benchmark: async for over {small:,} and {large:,} rows, median of {repeats}",
        f"{'road':<8} {'rows':>10} {'reads':>6} {'median s':>9} {'us/row':>7} "
        f"{'rows/s':>10} {'vs peer':>8}",
    ]
    for label in ("peer", *(road for road, _ in ROADS)):
        for rows in (small, large):
            m = result.measures[(label, rows)]
            peer = result.measures[("peer", rows)]
            reads = result.requests.get(f"{label} {rows}", "-")
            lines.append(
                f"{label:<8} {rows:>10,} {reads!s:>6} {m.median:>9.3f} {m.per_row_us:>7.2f} "
                f"{rows / m.median:>10,.0f} {peer.median / m.median:>7.2f}x"
            )
    for label, _ in ROADS:
        ratio = (
            result.measures[(label, large)].per_row_us / result.measures[(label, small)].per_row_us
        )
        verdict = "ok" if ratio <= LINEAR_TARGET else "MISSED"
        lines.append(
            f"{label}: time per row at {large:,} / at {small:,} = {ratio:.2f}x "
            f"(target <= {LINEAR_TARGET}) {verdict}"
        )
    for rows in (small, large):
        ratio = result.measures[("peer", rows)].median / result.measures[("gateway", rows)].median
        verdict = "ok" if ratio >= GATEWAY_TARGET else "MISSED"
        lines.append(
            f"gateway / peer at {rows:,}: {ratio:.2f}x (target >= {GATEWAY_TARGET}) {verdict}"
        )
    for label, peak in result.traced_peak.items():
        lines.append(
            f"{label}: tracemalloc peak over {result.traced_rows:,} rows {peak / KiB:,.0f} KiB"
        )
    for when, kib in result.rss_kib.items():
        lines.append(f"peak RSS {when}: {kib / KiB:,.0f} MiB")
    for (label, rows), m in sorted(result.measures.items()):
        lines.append(f"  runs {label} {rows:,}: {[round(s, 3) for s in m.seconds]} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the dataset benchmark and print its table."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench dataset", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument(
        "--small", type=int, default=100_000, help="rows of the small sheet (default 100,000)"
    )
    parser.add_argument(
        "--large", type=int, default=1_000_000, help="rows of the large sheet (default 1,000,000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed reads of each sheet on each road; medians"
    )
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    if not 0 < args.small < args.large or args.repeats < 1:
        parser.error("need 0 < --small < --large and --repeats >= 1")
    url = args.database_url or database_url_from_env()
    if url is not None:
        result = trio.run(run_bench, url, args.small, args.large, args.repeats)
    else:
        with EmbeddedPostgres() as server:
            result = trio.run(run_bench, server.url, args.small, args.large, args.repeats)
    print(report(result, args.small, args.large, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
