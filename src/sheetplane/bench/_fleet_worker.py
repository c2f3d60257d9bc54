"""One runner process of ``sheetplane bench fleet`` (run by path, not imported).

Reads its settings as JSON from the first line of stdin and the executor token
from ``SHEETPLANE_BENCH_TOKEN``. On its road (``direct`` or ``gateway_only``)
it admits a sheet of its own (``own``: ``admit_rows`` rows) or takes its share
of the keys of one sheet the benchmark admitted (``keys`` at ``write_version``),
prints ``ready`` and waits for ``go``. Then ``writers`` tasks complete its keys
``chunk`` at a time, each call once (a failed call is counted, not retried:
the library's own recovery is what is measured), and it prints one JSON line:
every call's latency in seconds, the failed calls and their error codes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import trio

from sheetplane._types import CompleteRow
from sheetplane.bench._writer_worker import CONTRACT
from sheetplane.errors import SheetplaneError


async def main(settings: dict[str, Any]) -> dict[str, Any]:
    from sheetplane.runtime import open_runtime

    failures: list[str] = []
    latencies: list[float] = []
    async with open_runtime(
        base_url=settings["base_url"],
        token=os.environ["SHEETPLANE_BENCH_TOKEN"],
        org_id=settings["org"],
        play_name=settings["play"],
        run_id=settings["run_id"],
        strategy=settings["road"],
    ) as runtime:
        if settings["sheets"] == "own":
            writer = runtime.writer(settings["ns"], CONTRACT)
            rows = [{"company": f"c{i:06d}"} for i in range(int(settings["admit_rows"]))]
            try:
                admission = await writer.start(rows)
                keys = [row["_key"] async for row in admission.pending()]
            except SheetplaneError as exc:
                failures.append(f"start:{exc.code}")
                keys = []
        else:
            writer = runtime.writer(
                settings["ns"], CONTRACT, write_version=int(settings["write_version"])
            )
            keys = list(settings["keys"])
        print("ready", flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        assert line.strip() == "go", line
        chunk = int(settings["chunk"])
        parts = [keys[i : i + chunk] for i in range(0, len(keys), chunk)]

        async def write(mine: list[list[str]]) -> None:
            for part in mine:
                started = time.perf_counter()
                try:
                    await writer.complete([CompleteRow(k, {"score": len(k)}) for k in part])
                except SheetplaneError as exc:
                    failures.append(exc.code)
                    continue
                latencies.append(time.perf_counter() - started)

        writers = int(settings["writers"])
        async with trio.open_nursery() as nursery:
            for i in range(writers):
                nursery.start_soon(write, parts[i::writers])
    return {"latencies": latencies, "failures": failures, "rows": len(keys)}


if __name__ == "__main__":
    print(json.dumps(trio.run(main, json.loads(sys.stdin.readline()))), flush=True)
