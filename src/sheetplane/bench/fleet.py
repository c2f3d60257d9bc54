"""``sheetplane bench fleet``: a fleet of runner processes against one org's budget.

For each Postgres size (``--slots``, default 60 and 200: an embedded server of
that ``max_connections``, one in-process reference gateway on it), each road
(``direct``: every write through a scoped session; ``gateway``: every write
through the gateway) and each layout (``own``: every runner admits a sheet of
its own, then writes it; ``one``: the benchmark admits one sheet and the
runners write their shares of it), ``--runners`` runner processes
(``bench/_fleet_worker.py``, default 25) each run ``--writers`` concurrent
writers (default 8) that complete their keys ``--chunk`` rows a call, each
call once. All runners of a run belong to one org. It prints, per run:

* failed calls (target 0: the library's own recovery, no retry in the runner);
* rows/s of the whole fleet, from the release of the ready runners to the
  last runner's end;
* p50 and p99 latency of one call;
* the peak of the org's session backends (sampled every ``POLL_S`` from
  ``pg_stat_activity``), against the org's connection budget
  (``org_connection_budget``): on the direct road it must never pass it.

Setup (process start, admission of own sheets) is not timed: runners report
``ready`` first and are released together.
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
from typing import Any

import attrs
import psycopg
import trio

from .._plain import PlainHelpFormatter
from ..budgets import org_connection_budget
from ..store.embedded import EmbeddedPostgres
from ._writer_worker import CONTRACT

__all__ = ["main"]

WORKER = Path(__file__).with_name("_fleet_worker.py")
#: How often the org's backends are sampled, in seconds.
POLL_S = 0.1
#: Postgres's default ``superuser_reserved_connections``.
RESERVED = 3


@attrs.define
class Run:
    slots: int
    road: str
    sheets: str
    budget: int
    failures: list[str] = attrs.field(factory=list)
    latencies: list[float] = attrs.field(factory=list)
    rows: int = 0
    seconds: float = 0.0
    peak: int = 0

    def line(self) -> str:
        lat = sorted(self.latencies) or [0.0]
        p50 = statistics.median(lat)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        rate = self.rows / self.seconds if self.seconds else 0.0
        codes = sorted(set(self.failures))
        return (
            f"slots={self.slots:<4} road={self.road:<8} sheets={self.sheets:<4} "
            f"failed={len(self.failures):<5} rows/s={rate:8.0f} p50={p50 * 1000:7.1f} ms "
            f"p99={p99 * 1000:8.1f} ms peak backends={self.peak}/{self.budget}"
            + (f" codes={codes}" if codes else "")
        )


def _org_backends(url: str, org: str) -> int:
    from ..gateway.server import org_session_backends

    with psycopg.connect(url, autocommit=True) as conn:
        return org_session_backends(conn, org)


async def _settings(
    base_url: str, token: str, org: str, run: Run, args: Any
) -> list[dict[str, Any]]:
    """Each runner process's settings: its own sheet to admit (``own``), or its share of
    one sheet's pending keys admitted here (``shared``)."""
    from ..gateway.client import GatewayClient

    play = "bench-fleet"
    settings: list[dict[str, Any]] = []
    common = {
        "base_url": base_url,
        "org": org,
        "play": play,
        "run_id": "run-fleet",
        "road": "direct" if run.road == "direct" else "gateway_only",
        "sheets": run.sheets,
        "chunk": args.chunk,
        "writers": args.writers,
    }
    if run.sheets == "own":
        for _ in range(args.runners):
            ns = f"ns_{uuid.uuid4().hex[:10]}"
            settings.append({**common, "ns": ns, "admit_rows": args.rows})
    else:
        ns = f"ns_{uuid.uuid4().hex[:10]}"
        rows = [{"company": f"c{i:07d}"} for i in range(args.rows * args.runners)]
        async with GatewayClient(base_url, token, play_name=play, org_id=org) as client:
            admission = await client.start_sheet_dataset(ns, CONTRACT, rows, "run-fleet")
        keys = [row["_key"] for row in admission.pending_rows]
        for i in range(args.runners):
            settings.append(
                {
                    **common,
                    "ns": ns,
                    "keys": keys[i :: args.runners],
                    "write_version": admission.write_version,
                }
            )
    return settings


async def _one_run(
    server: EmbeddedPostgres, base_url: str, token: str, org: str, run: Run, args: Any
) -> None:
    settings = await _settings(base_url, token, org, run, args)
    env = {**os.environ, "SHEETPLANE_BENCH_TOKEN": token}
    processes = [
        await trio.lowlevel.open_process(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        for _ in settings
    ]
    outputs: list[bytes] = [b""] * len(processes)
    done = trio.Event()

    async def sample() -> None:
        while not done.is_set():
            held = await trio.to_thread.run_sync(_org_backends, server.url, org)
            run.peak = max(run.peak, held)
            with trio.move_on_after(POLL_S):
                await done.wait()

    async def read_until(index: int, marker: bytes) -> None:
        process = processes[index]
        assert process.stdout is not None
        while marker not in outputs[index]:
            chunk = await process.stdout.receive_some()
            if not chunk:
                return
            outputs[index] += chunk

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        for process, setting in zip(processes, settings, strict=True):
            assert process.stdin is not None
            await process.stdin.send_all(json.dumps(setting).encode() + b"\n")
        async with trio.open_nursery() as ready:
            for index in range(len(processes)):
                ready.start_soon(read_until, index, b"ready\n")
        started = time.perf_counter()
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send_all(b"go\n")
        async with trio.open_nursery() as finished:
            for index in range(len(processes)):
                finished.start_soon(read_until, index, b"}\n")
        for process in processes:
            await process.wait()
        run.seconds = time.perf_counter() - started
        done.set()
    for index, output in enumerate(outputs):
        lines = [line for line in output.decode().splitlines() if line.startswith("{")]
        if not lines:
            run.failures.append(f"runner{index}:exit{processes[index].returncode}")
            continue
        result = json.loads(lines[-1])
        run.latencies += result["latencies"]
        run.failures += result["failures"]
        run.rows += len(result["latencies"]) * args.chunk


async def run_bench(args: argparse.Namespace) -> list[Run]:
    from ..gateway.server import running_gateway

    runs: list[Run] = []
    for slots in args.slots:
        budget = org_connection_budget(slots, RESERVED)
        with EmbeddedPostgres(max_connections=slots, durable=False) as server:
            for road in args.roads:
                for sheets in args.sheets:
                    token, org = f"tok-{secrets.token_hex(12)}", f"fleet-{uuid.uuid4().hex[:8]}"
                    async with running_gateway(server.url, tokens={token: org}) as gateway:
                        run = Run(slots, road, sheets, budget)
                        await _one_run(server, gateway.base_url, token, org, run, args)
                    print(run.line(), flush=True)
                    runs.append(run)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fleet benchmark and print one line per run."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench fleet", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument("--runners", type=int, default=25, help="runner processes per run")
    parser.add_argument("--writers", type=int, default=8, help="concurrent writers per runner")
    parser.add_argument("--rows", type=int, default=800, help="rows per runner")
    parser.add_argument("--chunk", type=int, default=25, help="rows per complete() call")
    parser.add_argument(
        "--slots",
        type=int,
        nargs="+",
        default=[60, 200],
        help="max_connections of each Postgres run (default 60 200)",
    )
    parser.add_argument(
        "--roads",
        nargs="+",
        choices=("direct", "gateway"),
        default=["direct", "gateway"],
        help="roads the runners write on (default both)",
    )
    parser.add_argument(
        "--sheets",
        nargs="+",
        choices=("own", "one"),
        default=["own", "one"],
        help="own: a sheet per runner; one: one sheet for all (default both)",
    )
    args = parser.parse_args(argv)
    print(
        f"runners={args.runners} writers={args.writers} rows/runner={args.rows} "
        f"chunk={args.chunk} load={os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs = trio.run(run_bench, args)
    print(f"load after: {os.getloadavg()[0]:.1f}", flush=True)
    return 1 if any(run.failures for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
