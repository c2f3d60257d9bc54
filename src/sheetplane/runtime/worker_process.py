"""One runner process of an attempt: what ``sheetplane demo --workers N`` and
``sheetplane bench map --workers N`` start N of, and the tests kill one of.

Run as ``python -m sheetplane.runtime.worker_process`` with a JSON object on
stdin (so the executor token never appears on a command line)::

    {"base_url": ..., "token": ..., "org_id": ..., "strategy": "direct",
     "attempt": "<Attempt.to_json()>", "sleep_ms": 10, "concurrency": 16,
     "receipts": false, "lease": {"ttl_ms": ..., "renewal_ms": ..., "guard_ms": ...,
     "poll_ms": ...} | null, "calls_file": "<path>" | null}

The configuration is the first line of stdin. With ``"barrier": true`` the
process connects, prints ``ready`` and waits for a second line (``go``) before
it maps. It maps the attempt of the demo's play (a ``text`` input column, a ``words``
output column: ``fn`` sleeps ``sleep_ms`` and counts the words) with
``Runtime.map_attempt`` and prints one JSON line: its report and its tally, or
``{"error": <class>, "message": ...}`` (exit 1). With ``calls_file`` every ``fn``
call appends ``<key> <wall-clock start> <wall-clock end>`` to it when it
returns, flushed, so a test can see which calls finished in a process it killed.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Final, TextIO

import trio

from .._attempts import Attempt, ShareLease
from .._types import ContractColumn, SheetContract
from ..errors import SheetplaneError
from ._runtime import open_runtime

__all__ = ["CONTRACT", "main"]

#: The demo's and the benchmark's sheet: ``text`` in, ``words`` out.
CONTRACT: Final = SheetContract(
    (ContractColumn("text", "text", "input"), ContractColumn("words", "words", "output"))
)


async def _work(config: dict[str, Any], calls: TextIO | None) -> dict[str, Any]:
    attempt = Attempt.from_json(config["attempt"])
    sleep = float(config.get("sleep_ms", 0)) / 1000

    async def fn(row: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        if sleep:
            await trio.sleep(sleep)
        if calls is not None:
            calls.write(f"{row['_key']} {started:.6f} {time.time():.6f}\n")
            calls.flush()
        return {"words": len(str(row.get("text", "")).split())}

    async with open_runtime(
        base_url=config["base_url"],
        token=config["token"],
        org_id=config["org_id"],
        play_name=attempt.play_name,
        run_id=attempt.run_id,
        strategy=config.get("strategy", "direct"),
    ) as rt:
        if config.get("lease"):
            rt.share_lease = ShareLease(**config["lease"])
        if config.get("barrier"):
            # A start barrier (the benchmark's): connected, then ready, then wait for go.
            await rt.attempt_status(attempt)
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
        report = await rt.map_attempt(
            attempt,
            CONTRACT,
            fn,
            concurrency=int(config.get("concurrency", 16)),
            receipts=bool(config.get("receipts", False)),
        )
        tally = rt.attempt_tally
        return {
            "pending": report.pending,
            "completed": report.completed,
            "failed": report.failed,
            "reused": report.reused,
            "elapsed_seconds": report.elapsed_seconds,
            "shares": tally.shares,
            "taken_over": tally.taken_over,
            "renewals": tally.renewals,
        }


def main() -> int:
    """Read the configuration from stdin, map, print one JSON line."""
    config = json.loads(sys.stdin.readline())
    path = config.get("calls_file")
    calls = None if path is None else open(path, "a", encoding="utf-8")  # noqa: SIM115
    try:
        result = trio.run(_work, config, calls)
    except SheetplaneError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 1
    finally:
        if calls is not None:
            calls.close()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
