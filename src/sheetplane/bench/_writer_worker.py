"""One writer process of ``sheetplane bench writers`` (run by path, not imported).

Reads its settings as JSON from the first line of stdin, opens its road
(``direct``: ``open_runtime`` on the gateway, every write through a scoped
session; ``store``: ``open_store`` on the URL in ``SHEETPLANE_BENCH_URL``),
completes its warm-up chunk (which mints the session and opens the pool), prints
``ready`` and waits for ``go`` on stdin. Then it completes its chunks one call
at a time and prints one JSON line: the latency of every call in seconds.

It uses only the public names both the current and an older checkout of
sheetplane have, so ``--before-src`` can run it on the code before a change.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import trio

from sheetplane._types import CompleteRow, ContractColumn, SheetContract, SheetRef

CONTRACT = SheetContract(
    (
        ContractColumn("company", "company", "input"),
        ContractColumn("score", "score", "output"),
    )
)


async def _run(settings: dict[str, Any], complete: Any) -> list[float]:
    keys: list[str] = settings["keys"]
    chunk = int(settings["chunk"])
    chunks = [keys[i : i + chunk] for i in range(0, len(keys), chunk)]
    await complete([CompleteRow(k, {"score": 1}) for k in chunks[0]])
    print("ready", flush=True)
    line = await trio.to_thread.run_sync(sys.stdin.readline)
    assert line.strip() == "go", line
    latencies = []
    for part in chunks[1:]:
        started = time.perf_counter()
        await complete([CompleteRow(k, {"score": len(k)}) for k in part])
        latencies.append(time.perf_counter() - started)
    return latencies


async def main(settings: dict[str, Any]) -> list[float]:
    version = int(settings["write_version"])
    if settings["road"] == "store":
        from sheetplane.store import open_store

        sheet = SheetRef(settings["org"], settings["play"], settings["ns"])
        async with open_store(os.environ["SHEETPLANE_BENCH_URL"], max_connections=2) as store:

            async def on_store(rows: list[CompleteRow]) -> Any:
                return await store.complete_map_rows(
                    sheet, CONTRACT, rows, run_id=settings["run_id"], write_version=version
                )

            return await _run(settings, on_store)
    from sheetplane.runtime import open_runtime

    async with open_runtime(
        base_url=settings["base_url"],
        token=os.environ["SHEETPLANE_BENCH_TOKEN"],
        org_id=settings["org"],
        play_name=settings["play"],
        run_id=settings["run_id"],
        strategy="direct",
    ) as runtime:
        writer = runtime.writer(settings["ns"], CONTRACT, write_version=version)
        return await _run(settings, writer.complete)


if __name__ == "__main__":
    print(json.dumps(trio.run(main, json.loads(sys.stdin.readline()))), flush=True)
