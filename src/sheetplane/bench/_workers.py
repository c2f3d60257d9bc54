"""``sheetplane bench map --workers 2,4,8``: runner processes on one attempt.

On ``SHEETPLANE_DATABASE_URL`` or a throwaway embedded Postgres, with the
reference gateway in-process on loopback, on the direct road, one token:

* **Scaling.** For each N in ``--workers`` and for 1, a fresh play admits
  ``--worker-rows`` rows and N runner processes (``python -m
  sheetplane.runtime.worker_process``) map its attempt with a fn that sleeps
  ``--sleep-ms`` (so the fn, not the machine's two cores, is the limit),
  ``--worker-concurrency`` calls each (median of ``--worker-repeats`` runs).
  The workers start behind a barrier (each connects, says ready, and maps
  once all are ready), and throughput is rows over the span from the first fn
  call's start to the last one's end (read from the calls every process
  records), so process start-up, the admission and the last write are left
  out; the wall time from spawning to the last exit is printed beside it.
  Target: rows/s with N workers >= 0.8 x N x rows/s with one, for every N.
* **Reclaim.** Two processes on a fresh attempt with a lease of ``--lease-ms``;
  one is SIGKILLed once a tenth of the rows are written, and the time from the
  kill until one of its shares is claimed again is read from the shares table
  (polled every 20 ms). It is at most the lease's TTL: the dead worker's last
  renewal landed at most ``renewal_ms`` before the kill.

Other work shares the machine: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Final

import psycopg
import trio
from psycopg import sql

from .._attempts import Attempt
from .._types import SheetRef
from ..gateway.server import running_gateway
from ..runtime import open_runtime
from ..runtime.worker_process import CONTRACT
from ..store import sheet_names

__all__ = ["add_worker_options", "run_workers_bench", "workers_report"]

ORG: Final = "bench-workers-org"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def _attempt(gateway: Any, token: str, play: str, rows: int) -> str:
    async with open_runtime(
        base_url=gateway.base_url, token=token, org_id=ORG, play_name=play, run_id="bench"
    ) as rt:
        admission = await rt.writer("ns", CONTRACT).start(
            {"text": f"row {i} of the bench", "__deeplineRowKey": f"r{i:07d}"} for i in range(rows)
        )
        return admission.attempt.to_json()


async def _spawn(nursery: trio.Nursery, config: dict[str, Any], out: Path) -> trio.Process:
    with out.open("wb") as stdout:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-m", "sheetplane.runtime.worker_process"],
                stdin=json.dumps(config).encode(),
                stdout=stdout,
                check=False,
            )
        )
    return process


async def _line(process: trio.Process) -> str:
    """The next line of ``process``'s stdout (read a byte at a time: short lines)."""
    assert process.stdout is not None
    data = b""
    while not data.endswith(b"\n"):
        chunk = await process.stdout.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _span(calls: Path) -> tuple[float, int]:
    """(first start to last end, calls) of every fn call recorded."""
    starts, ends = [], []
    for line in calls.read_text().splitlines():
        _key, start, end = line.split()
        starts.append(float(start))
        ends.append(float(end))
    return max(ends) - min(starts), len(starts)


async def _scaling_run(
    gateway: Any, token: str, workers: int, args: Any, folder: Path
) -> dict[str, Any]:
    play = f"bench-{secrets.token_hex(6)}"
    attempt = await _attempt(gateway, token, play, args.worker_rows)
    calls = folder / f"calls-{play}.txt"
    config = {
        "base_url": gateway.base_url,
        "token": token,
        "org_id": ORG,
        "strategy": "direct",
        "attempt": attempt,
        "sleep_ms": args.sleep_ms,
        "concurrency": args.worker_concurrency,
        "calls_file": str(calls),
    }
    started = time.monotonic()
    processes = [
        await trio.lowlevel.open_process(
            [sys.executable, "-m", "sheetplane.runtime.worker_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(workers)
    ]
    try:
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send_all((json.dumps({**config, "barrier": True}) + "\n").encode())
        # Every worker connected before any maps: the span measures the mapping alone.
        for process in processes:
            if (await _line(process)).strip() != "ready":
                raise RuntimeError("a worker did not get ready")
        for process in processes:
            assert process.stdin is not None
            await process.stdin.send_all(b"go\n")
            await process.stdin.aclose()
        reports = [await _line(process) for process in processes]
        for process in processes:
            await process.wait()
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
    wall = time.monotonic() - started
    failed = [r for p, r in zip(processes, reports, strict=True) if p.returncode]
    if failed:
        raise RuntimeError(f"a worker failed: {failed[0]}")
    span, done = _span(calls)
    return {"workers": workers, "rows": done, "span": span, "wall": wall, "rate": done / span}


def _claimed_again(database_url: str, play: str) -> bool:
    names = sheet_names(SheetRef(ORG, play, "ns"))
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE share_no > 0 AND claims > 1").format(
                names.ident("shares_table")
            )
        ).fetchone()
    return bool(row and row[0])


async def _reclaim(
    gateway: Any, token: str, database_url: str, args: Any, folder: Path
) -> dict[str, Any]:
    play = f"bench-{secrets.token_hex(6)}"
    attempt = await _attempt(gateway, token, play, args.worker_rows)
    ttl = args.lease_ms
    lease = {"ttl_ms": ttl, "renewal_ms": ttl // 6, "guard_ms": ttl // 3, "poll_ms": 100}
    config = {
        "base_url": gateway.base_url,
        "token": token,
        "org_id": ORG,
        "strategy": "direct",
        "attempt": attempt,
        "sleep_ms": args.sleep_ms,
        "concurrency": args.worker_concurrency,
        "lease": lease,
    }
    async with open_runtime(
        base_url=gateway.base_url, token=token, org_id=ORG, play_name=play, run_id="bench"
    ) as rt:
        handle = Attempt.from_json(attempt)
        async with trio.open_nursery() as nursery:
            processes = [
                await _spawn(nursery, config, folder / f"{play}-{n}.json") for n in range(2)
            ]
            while (await rt.attempt_status(handle)).enriched < args.worker_rows // 10:  # noqa: ASYNC110
                await trio.sleep(0.05)
            processes[0].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            while not await trio.to_thread.run_sync(_claimed_again, database_url, play):  # noqa: ASYNC110
                await trio.sleep(0.02)
            reclaimed = time.monotonic() - killed
    return {"reclaim": reclaimed, "lease": lease}


def _worker_counts(text: str) -> list[int]:
    """``--workers``: worker counts, comma-separated, each >= 2."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of worker counts: {text!r}") from None
    if not counts or any(n < 2 for n in counts):
        raise argparse.ArgumentTypeError("each worker count is at least 2 (1 is the baseline)")
    return counts


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """``bench map``'s options of this benchmark (``--workers`` and its settings)."""
    parser.add_argument(
        "--workers",
        type=_worker_counts,
        default=None,
        help="instead of (a)-(d): runner processes on one attempt, e.g. 2,4,8 "
        "(sheetplane.bench._workers)",
    )
    parser.add_argument(
        "--worker-rows", type=int, default=4_000, help="--workers: the attempt's rows"
    )
    parser.add_argument(
        "--sleep-ms", type=int, default=100, help="--workers: how long fn sleeps (default 100)"
    )
    parser.add_argument(
        "--worker-concurrency", type=int, default=16, help="--workers: fn calls per worker"
    )
    parser.add_argument(
        "--worker-repeats", type=int, default=1, help="--workers: runs of each N; medians"
    )
    parser.add_argument(
        "--lease-ms",
        type=int,
        default=3_000,
        help="--workers: the share lease of the SIGKILL-to-reclaim run (default 3,000)",
    )
    parser.add_argument(
        "--no-reclaim", action="store_true", help="--workers: leave the reclaim run out"
    )


async def run_workers_bench(database_url: str, args: Any) -> dict[str, Any]:
    """Every figure of the workers benchmark."""
    token = secrets.token_urlsafe(24)
    out: dict[str, Any] = {"runs": {}, "load_before": _load()}
    async with running_gateway(database_url, tokens={token: ORG}) as gateway:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            for n in [1, *args.workers]:
                runs = []
                for _ in range(args.worker_repeats):
                    runs.append(await _scaling_run(gateway, token, n, args, folder))
                out["runs"][n] = runs
                print(f"  {n} worker(s): " + ", ".join(f"{r['rate']:.0f} rows/s" for r in runs))
            if not args.no_reclaim:
                out["reclaim"] = await _reclaim(gateway, token, database_url, args, folder)
    out["load_after"] = _load()
    return out


def workers_report(result: dict[str, Any], args: Any) -> str:
    """The figures, one line each, and whether each N met its target."""
    runs = result["runs"]
    base = statistics.median(r["rate"] for r in runs[1])
    lines = [
        f"bench map --workers: {args.worker_rows:,} rows, fn sleeps {args.sleep_ms} ms, "
        f"concurrency {args.worker_concurrency} per worker, direct road, one token; "
        f"median of {args.worker_repeats}; load {result['load_before']} -> {result['load_after']}",
        f"  1 worker: {base:,.0f} rows/s (fn span; wall "
        f"{statistics.median(r['wall'] for r in runs[1]):.1f} s)",
    ]
    for n in args.workers:
        rate = statistics.median(r["rate"] for r in runs[n])
        ratio = rate / base
        verdict = "met" if ratio >= 0.8 * n else "NOT met"
        lines.append(
            f"  {n} workers: {rate:,.0f} rows/s = {ratio:.2f}x one worker "
            f"(target >= {0.8 * n:.1f}x: {verdict}; wall "
            f"{statistics.median(r['wall'] for r in runs[n]):.1f} s)"
        )
    if "reclaim" in result:
        lease = result["reclaim"]["lease"]
        lines.append(
            f"  SIGKILL to reclaim: {result['reclaim']['reclaim']:.2f} s "
            f"(lease ttl {lease['ttl_ms']} ms, renewal {lease['renewal_ms']} ms)"
        )
    return "\n".join(lines)
