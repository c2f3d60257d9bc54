"""``sheetplane demo --workers N``: one attempt mapped by N runner processes.

The reference gateway runs in-process on loopback over the demo's Postgres. A
coordinator admits the rows and hands the attempt (``Attempt.to_json()``) to
N runner processes (``python -m sheetplane.runtime.worker_process``), which
map it together with ``Runtime.map_attempt``; it watches ``attempt_status``
until they are done. The same rows are then mapped by one worker on a play of
their own, and the two sheets are read back: the demo checks they hold the
same outputs, row for row, and prints what each worker did.
"""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Final

import trio
from rich.console import Console
from rich.table import Table

from .gateway.server import running_gateway
from .runtime import Runtime, open_runtime
from .runtime.worker_process import CONTRACT

__all__ = ["workers_demo"]

ORG: Final = "demo-workers-org"


def _inputs(rows: int) -> list[dict[str, Any]]:
    return [
        {"text": " ".join(["word"] * (i % 7 + 1)), "__deeplineRowKey": f"row-{i:07d}"}
        for i in range(rows)
    ]


async def _outputs(rt: Runtime) -> dict[str, Any]:
    return {row["_key"]: row.get("words") async for row in rt.dataset("ns", "all")}


async def _run_workers(
    gateway: Any, token: str, play: str, rows: int, workers: int, console: Console
) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    async with open_runtime(
        base_url=gateway.base_url, token=token, org_id=ORG, play_name=play, run_id="demo"
    ) as rt:
        admission = await rt.writer("ns", CONTRACT).start(_inputs(rows))
        config = {
            "base_url": gateway.base_url,
            "token": token,
            "org_id": ORG,
            "strategy": "direct",
            "attempt": admission.attempt.to_json(),
            "concurrency": 16,
        }
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            outs = [Path(tmp) / f"worker-{n}.json" for n in range(workers)]
            processes = []
            async with trio.open_nursery() as nursery:
                for out in outs:
                    with out.open("wb") as stdout:
                        processes.append(
                            await nursery.start(
                                partial(
                                    trio.run_process,
                                    [sys.executable, "-m", "sheetplane.runtime.worker_process"],
                                    stdin=json.dumps(config).encode(),
                                    stdout=stdout,
                                    check=False,
                                )
                            )
                        )
                console.print(f"{workers} runner processes are mapping attempt {config['attempt']}")
            elapsed = time.perf_counter() - started
            reports = [json.loads(out.read_text() or "{}") for out in outs]
        for process, report in zip(processes, reports, strict=True):
            if process.returncode:
                raise RuntimeError(f"a runner process failed: {report}")
        status = await rt.attempt_status(admission.attempt)
        if status.pending:
            raise RuntimeError(f"the attempt is not done: {status}")
        return reports, elapsed, await _outputs(rt)


async def workers_demo(database_url: str, rows: int, workers: int, console: Console) -> int:
    """Map one attempt with ``workers`` processes and with one; 0 when the sheets agree."""
    token = secrets.token_urlsafe(24)
    async with running_gateway(database_url, tokens={token: ORG}) as gateway:
        many = f"demo-{secrets.token_hex(4)}"
        reports, elapsed, outputs = await _run_workers(gateway, token, many, rows, workers, console)
        one = f"demo-{secrets.token_hex(4)}"
        async with open_runtime(
            base_url=gateway.base_url, token=token, org_id=ORG, play_name=one, run_id="demo"
        ) as rt:

            async def count(row: dict[str, Any]) -> dict[str, Any]:
                return {"words": len(str(row.get("text", "")).split())}

            started = time.perf_counter()
            await rt.map("ns", CONTRACT, _inputs(rows), count)
            alone = time.perf_counter() - started
            single = await _outputs(rt)
    table = Table(title=f"{rows:,} rows, one attempt, {workers} runner processes")
    for column in ("worker", "rows mapped", "shares", "taken over", "renewals"):
        table.add_column(column, justify="right")
    for n, report in enumerate(reports, 1):
        table.add_row(
            str(n),
            f"{report['completed']:,}",
            str(report["shares"]),
            str(report["taken_over"]),
            str(report["renewals"]),
        )
    console.print(table)
    same = outputs == single and len(outputs) == rows
    console.print(
        f"{workers} workers: {elapsed:.2f} s (process start-up included); one worker in "
        f"this process: {alone:.2f} s (admission included)"
    )
    console.print(
        "the sheets agree row for row with one worker's"
        if same
        else "[red]the sheets differ from one worker's[/]"
    )
    return 0 if same else 1
