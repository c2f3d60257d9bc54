"""A runner process for the store's multi-process tests: it completes keys and
records every key a terminal write acknowledged.

Run as ``python tests/_writer_process.py CONFIG.json``. The configuration (JSON)
names the sheet, the write version, the keys, the chunk size, how many calls
run at once, the acknowledgement file and the road (with ``"admit_rows": N``
the direct runner first admits N rows into a sheet of its own and writes its
pending keys, as a fleet's runners do):

* ``"road": "store"``: ``open_store`` on the URL in ``SHEETPLANE_WRITER_URL``
  (a secret, so it travels in the environment, never on the command line);
* ``"road": "direct"``: ``open_runtime(strategy="direct")`` on the gateway
  ``base_url`` with the token in ``SHEETPLANE_WRITER_TOKEN``: every write goes
  through a scoped session the gateway mints.

After each acknowledged call the process appends the call's committed keys to
the acknowledgement file, one per line, and flushes: a key is in that file only
once the store answered that it is committed. A call that fails is retried
(the same rows, the same version: terminal writes are idempotent replays) until
``deadline_s`` (unless ``"retry": false``: the library's own recovery is
under test, and a failed call stays failed); the process writes each failure
as ``!<error code>`` so the test can count them, and exits 1 if any key is left
unacknowledged.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from sheetplane._types import CompleteRow, ContractColumn, SheetContract, SheetRef
from sheetplane.errors import SheetplaneError
from sheetplane.store import open_store


def _chunks(keys: Sequence[str], size: int) -> list[list[str]]:
    return [list(keys[start : start + size]) for start in range(0, len(keys), size)]


#: The sheet every runner writes (the benchmark's writers use the same shape).
CONTRACT = SheetContract(
    (
        ContractColumn("company", "company", "input"),
        ContractColumn("score", "score", "output"),
    )
)


async def _drive(config: dict[str, Any], complete: Any, out: TextIO) -> int:
    chunks = _chunks(config["keys"], int(config["chunk"]))
    deadline = time.monotonic() + float(config["deadline_s"])
    left = 0
    pending = trio.Semaphore(int(config.get("concurrency", 1)))

    async def one(chunk: list[str]) -> None:
        nonlocal left
        rows = [CompleteRow(key, {"score": len(key)}) for key in chunk]
        while True:
            try:
                result = await complete(rows)
            except SheetplaneError as exc:
                out.write(f"!{exc.code}\n")
                out.flush()
                if not config.get("retry", True) or time.monotonic() >= deadline:
                    left += len(chunk)
                    return
                await trio.lowlevel.checkpoint()
                continue
            out.write("".join(f"{key}\n" for key in result.committed_keys))
            out.flush()
            return

    async def guarded(chunk: list[str]) -> None:
        async with pending:
            await one(chunk)

    async with trio.open_nursery() as nursery:
        for chunk in chunks:
            nursery.start_soon(guarded, chunk)
    return 1 if left else 0


async def main(config: dict[str, Any], out: TextIO) -> int:
    sheet = SheetRef(config["org"], config["play"], config["ns"])
    version = int(config["write_version"])
    if config["road"] == "store":
        url = os.environ["SHEETPLANE_WRITER_URL"]
        async with open_store(url) as store:

            async def on_store(rows: list[CompleteRow]) -> Any:
                return await store.complete_map_rows(
                    sheet, CONTRACT, rows, run_id=config["run_id"], write_version=version
                )

            return await _drive(config, on_store, out)
    from sheetplane.runtime import open_runtime

    async with open_runtime(
        base_url=config["base_url"],
        token=os.environ["SHEETPLANE_WRITER_TOKEN"],
        org_id=config["org"],
        play_name=config["play"],
        run_id=config["run_id"],
        strategy="direct",
    ) as runtime:
        if "admit_rows" in config:
            # The fleet's workload: admit a sheet of its own, then write its rows.
            writer = runtime.writer(config["ns"], CONTRACT)
            rows = [{"company": f"c{i:06d}"} for i in range(int(config["admit_rows"]))]
            admission = await writer.start(rows)
            config = {**config, "keys": [row["_key"] async for row in admission.pending()]}
        else:
            writer = runtime.writer(config["ns"], CONTRACT, write_version=version)
        return await _drive(config, writer.complete, out)


if __name__ == "__main__":
    settings = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    with Path(settings["acks"]).open("a", encoding="utf-8") as acks:
        sys.exit(trio.run(main, settings, acks))
