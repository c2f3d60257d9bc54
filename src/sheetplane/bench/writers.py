"""``sheetplane bench writers``: terminal writes of k writer processes, one sheet
against separate sheets.

Each configuration (chunk size, k writers, one sheet or k separate sheets)
admits ``--rows`` rows per writer, starts k writer processes
(``bench/_writer_worker.py``) that warm up (mint their session, open their
pool, complete one chunk), then releases them together and times them until
the last one has completed all its rows, one ``complete()`` call of one chunk
at a time each. Configurations run interleaved (every configuration once,
then again, ``--repeats`` times), and each figure is a median:

* rows/s of all writers together, one sheet and separate sheets, and their
  ratio at each k (target >= 0.9 at k = 8: writers of one sheet must not
  queue on each other);
* p50 and p99 latency of one call at the largest k over a single writer's
  (target p99 <= 3x).

The road is ``direct`` (``open_runtime(strategy="direct")`` through a
gateway in this process; every write on a scoped session), or ``store``
(``open_store`` on the superuser URL). ``--before-src PATH`` adds a series run
with ``PYTHONPATH=PATH`` (an older checkout's ``src``) on the store road, and
runs the current code on the store road too, interleaved with it, so the
before and after figures come from one run on one server. The sheets are
admitted by this code, so the older checkout must write the same sheet
layout: across a layout change (the counter log replacing the sharded
counters), run the benchmark once with each checkout instead.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from .._plain import PlainHelpFormatter
from .._types import SheetRef
from ..store import SheetStore, open_store
from ..store.embedded import EmbeddedPostgres, database_url_from_env
from ._writer_worker import CONTRACT

__all__ = ["main"]

WORKER = Path(__file__).with_name("_writer_worker.py")


@attrs.frozen
class Config:
    """One configuration of the benchmark."""

    series: str
    """``after`` (this code) or ``before`` (``--before-src``)."""
    chunk: int
    writers: int
    layout: str
    """``one`` sheet or ``separate`` sheets."""


@attrs.define
class Result:
    rates: list[float] = attrs.Factory(list)
    latencies: list[list[float]] = attrs.Factory(list)


@attrs.frozen
class Setup:
    """One run's server, gateway and tenant: each run acts for an org of its own,
    so the gateway's live-session caps per token and org never bind."""

    url: str
    base_url: str
    token: str
    org: str
    play: str
    rows: int
    before_src: str | None
    road: str


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _admit(store: SheetStore, setup: Setup, ns: str, rows: int) -> tuple[list[str], int]:
    sheet = SheetRef(setup.org, setup.play, ns)
    data = [{"company": f"{ns}-{i:07d}"} for i in range(rows)]
    admission = await store.start_dataset(sheet, data, "run-bench", CONTRACT)
    return [row["_key"] for row in admission.pending_rows], admission.write_version


async def run_config(store: SheetStore, setup: Setup, config: Config) -> tuple[float, list[float]]:
    """One run of ``config``: (rows/s of all writers, every call's latency)."""
    per_writer = setup.rows + config.chunk  # one warm-up chunk each
    jobs: list[tuple[str, list[str], int]] = []
    if config.layout == "one":
        ns = f"ns_{uuid.uuid4().hex[:10]}"
        keys, version = await _admit(store, setup, ns, per_writer * config.writers)
        jobs = [(ns, keys[i :: config.writers], version) for i in range(config.writers)]
    else:
        for _ in range(config.writers):
            ns = f"ns_{uuid.uuid4().hex[:10]}"
            keys, version = await _admit(store, setup, ns, per_writer)
            jobs.append((ns, keys, version))
    env = dict(os.environ, SHEETPLANE_BENCH_URL=setup.url, SHEETPLANE_BENCH_TOKEN=setup.token)
    road = setup.road
    if config.series == "before":
        assert setup.before_src is not None
        env["PYTHONPATH"] = setup.before_src
        road = "store"
    processes = []
    for ns, keys, version in jobs:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        settings = {
            "road": road,
            "base_url": setup.base_url,
            "org": setup.org,
            "play": setup.play,
            "ns": ns,
            "run_id": "run-bench",
            "write_version": version,
            "keys": keys,
            "chunk": config.chunk,
        }
        assert process.stdin is not None
        await process.stdin.send_all((json.dumps(settings) + "\n").encode())
        processes.append(process)
    readers = [_Lines(process) for process in processes]
    for reader in readers:
        assert await reader.line() == "ready"
    started = time.perf_counter()
    for process in processes:
        assert process.stdin is not None
        await process.stdin.send_all(b"go\n")
    latencies: list[float] = []
    for reader in readers:
        latencies += json.loads(await reader.line())
    elapsed = time.perf_counter() - started
    for process in processes:
        assert await process.wait() == 0
    return setup.rows * config.writers / elapsed, latencies


class _Lines:
    """Lines of a child's stdout."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdout is not None
        self._stream = process.stdout
        self._buffer = b""

    async def line(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise RuntimeError("a writer process exited early")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


def report(results: dict[Config, Result], configs: Sequence[Config], repeats: int) -> str:
    lines = [f"writers benchmark, median of {repeats} interleaved runs (rows/s of all writers)"]
    series = sorted({c.series for c in configs}, reverse=True)
    chunks = sorted({c.chunk for c in configs})
    ks = sorted({c.writers for c in configs})
    for name in series:
        for chunk in chunks:
            lines.append(f"{name}, chunks of {chunk}:")
            lines.append(f"  {'k':>3} {'one sheet':>11} {'separate':>11} {'ratio':>6}")
            for k in ks:
                one = statistics.median(results[Config(name, chunk, k, "one")].rates)
                sep = statistics.median(results[Config(name, chunk, k, "separate")].rates)
                lines.append(f"  {k:>3} {one:>11,.0f} {sep:>11,.0f} {one / sep:>6.2f}")
            single = [x for r in results[Config(name, chunk, 1, "one")].latencies for x in r]
            top = [x for r in results[Config(name, chunk, ks[-1], "one")].latencies for x in r]
            p50, p99 = _quantile(single, 0.5), _quantile(single, 0.99)
            q50, q99 = _quantile(top, 0.5), _quantile(top, 0.99)
            lines.append(
                f"  one call, one sheet: k=1 p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms;"
                f" k={ks[-1]} p50 {q50 * 1000:.1f} ms p99 {q99 * 1000:.1f} ms"
                f" ({q50 / p50:.2f}x, {q99 / p99:.2f}x)"
            )
    return "\n".join(lines)


async def run_bench(url: str, args: argparse.Namespace) -> str:
    from ..gateway.server import running_gateway

    series = ["after", "before"] if args.before_src else ["after"]
    road = "store" if args.before_src else args.road
    configs = [
        Config(name, chunk, k, layout)
        for name in series
        for chunk in args.chunks
        for k in args.writers
        for layout in ("one", "separate")
    ]
    results = {config: Result() for config in configs}
    tenants = {
        f"tok-{secrets.token_hex(12)}": f"bench-{uuid.uuid4().hex[:8]}"
        for _ in range(len(configs) * args.repeats)
    }
    async with (
        running_gateway(url, tokens=tenants) as gateway,
        open_store(url, max_connections=2) as store,
    ):
        runs = iter(tenants.items())
        for _ in range(args.repeats):
            for config in configs:
                token, org = next(runs)
                setup = Setup(
                    url,
                    gateway.base_url,
                    token,
                    org,
                    "bench-writers",
                    args.rows,
                    args.before_src,
                    road,
                )
                rate, latencies = await run_config(store, setup, config)
                results[config].rates.append(rate)
                results[config].latencies.append(latencies)
    return f"road: {road}\n" + report(results, configs, args.repeats)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the writers benchmark and print rows/s, ratios and latencies."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench writers", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000, help="rows per writer and run")
    parser.add_argument(
        "--chunks",
        type=int,
        nargs="+",
        default=[100, 500],
        help="rows a complete() call (default 100 500)",
    )
    parser.add_argument(
        "--writers",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="writer processes k; must include 1 (default 1 2 4 8)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each configuration; medians (default 3)"
    )
    parser.add_argument(
        "--road",
        choices=("direct", "store"),
        default="direct",
        help="direct: scoped sessions through a gateway; store: the superuser URL",
    )
    parser.add_argument(
        "--before-src",
        default=None,
        help="an older checkout's src directory: measure it too (store road for both)",
    )
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    if 1 not in args.writers:
        parser.error("--writers must include 1 (the single writer's latency is the reference)")
    url = args.database_url or database_url_from_env()
    if url is not None:
        print(trio.run(run_bench, url, args))
    else:
        with EmbeddedPostgres() as server:
            print(trio.run(run_bench, server.url, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
