"""Three runner processes on one attempt of a few thousand rows, one SIGKILLed mid-run:
every row ends enriched, each row is written terminal once, the dead worker's share
is taken over after its lease, and with receipts no call whose receipt was recorded
is made again."""

from __future__ import annotations

import json
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

from _runtime_helpers import CountingGateway, new_play, runtime
from sheetplane._types import SheetRef
from sheetplane.runtime.worker_process import CONTRACT
from sheetplane.store import sheet_names
from sheetplane.store._names import receipt_names

ORG = "acme-runtime"
ROWS = 2_000
#: A short lease (the budgets allow down to SHARE_LEASE_MIN_TTL_MS), so the dead
#: worker's share is taken over within the test; a renewal may still take 2 s on a
#: loaded machine before its worker gives the share up.
LEASE = {"ttl_ms": 4_000, "renewal_ms": 500, "guard_ms": 1_500, "poll_ms": 200}


@pytest.fixture
def gateway(runtime_gateway: CountingGateway) -> CountingGateway:
    return runtime_gateway


def _read(database_url: str, play: str) -> dict[str, Any]:
    names = sheet_names(SheetRef(ORG, play, "ns"))
    receipts = receipt_names(ORG, play)
    with psycopg.connect(database_url) as conn:
        written = conn.execute(
            sql.SQL(
                "SELECT coalesce(sum(row_count), 0) FROM {} "
                "WHERE kind IN ('complete_map_rows', 'fail_map_rows')"
            ).format(names.ident("event_table"))
        ).fetchone()
        statuses = dict(
            conn.execute(
                sql.SQL("SELECT _status, count(*) FROM {} GROUP BY _status").format(
                    names.ident("sheet_table")
                )
            ).fetchall()
        )
        recorded = dict(
            conn.execute(
                sql.SQL(
                    "SELECT key, extract(epoch FROM completed_at) FROM {} "
                    "WHERE completed_at IS NOT NULL"
                ).format(receipts.ident("receipts_table"))
            ).fetchall()
        )
    assert written is not None
    return {"written": int(written[0]), "statuses": statuses, "recorded": recorded}


@pytest.mark.heavy(12)
async def test_three_processes_one_killed_every_row_once(
    gateway: CountingGateway, database_url: str, tmp_path: Path
) -> None:
    play = new_play()
    async with runtime(gateway, "direct", play=play) as rt:
        admission = await rt.writer("ns", CONTRACT).start(
            [{"text": "a b c", "__deeplineRowKey": f"k{i:05d}"} for i in range(ROWS)]
        )
        # Each process's own calls file: the test sees when the one it kills is mapping.
        calls = [tmp_path / f"calls{n}.txt" for n in range(3)]
        config = {
            "base_url": gateway.base_url,
            "token": gateway.token,
            "org_id": ORG,
            "strategy": "direct",
            "attempt": admission.attempt.to_json(),
            "sleep_ms": 2,
            "concurrency": 16,
            "receipts": True,
            "lease": LEASE,
        }
        outputs = [tmp_path / f"worker{n}.json" for n in range(3)]
        processes: list[trio.Process] = []
        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                for out, calls_file in zip(outputs, calls, strict=True):
                    mine = {**config, "calls_file": str(calls_file)}
                    with out.open("wb") as stdout:
                        process = await nursery.start(
                            partial(
                                trio.run_process,
                                [sys.executable, "-m", "sheetplane.runtime.worker_process"],
                                stdin=json.dumps(mine).encode(),
                                stdout=stdout,
                                check=False,
                            )
                        )
                        processes.append(process)
                # Kill the first once the attempt is well under way (a fifth written)
                # while it holds a share: it has finished calls of its own and all three
                # hold a lease. On the whole attempt's progress alone it could be killed
                # before it had claimed anything (its start is seconds late under load),
                # leaving no share to take over. Read where each is written (polled).
                while True:
                    status = await rt.attempt_status(admission.attempt)
                    mapping = calls[0].exists() and calls[0].stat().st_size > 0
                    if status.enriched >= ROWS // 5 and status.workers == 3 and mapping:
                        break
                    await trio.sleep(0.05)
                processes[0].send_signal(signal.SIGKILL)
        assert processes[0].returncode == -signal.SIGKILL
        assert [p.returncode for p in processes[1:]] == [0, 0], [
            out.read_text() for out in outputs[1:]
        ]
        reports = [json.loads(out.read_text()) for out in outputs[1:]]
        status = await rt.attempt_status(admission.attempt)
    assert (status.pending, status.enriched, status.failed, status.workers) == (0, ROWS, 0, 0)
    found = await trio.to_thread.run_sync(_read, database_url, play)
    # Every row enriched, and written terminal exactly once across the three processes.
    assert found["statuses"] == {"enriched": ROWS}
    assert found["written"] == ROWS
    # The dead worker held a share when it died: a survivor took it over.
    assert sum(r["taken_over"] for r in reports) >= 1
    # With receipts, no call began for a row after its receipt was recorded: a call
    # the dead worker had finished (and recorded) was reused, not made again. Only
    # a call cut between its end and its receipt (at most one per slot of the dead
    # worker) may have run twice.
    finished: dict[str, list[float]] = {}
    lines = [line for path in calls if path.exists() for line in path.read_text().splitlines()]
    for line in lines:
        key, start, _end = line.split()
        finished.setdefault(key, []).append(float(start))
    recorded = found["recorded"]
    assert all(
        start <= float(recorded[f"map/ns/{key}"])
        for key, starts in finished.items()
        for start in starts
    )
    twice = [key for key, starts in finished.items() if len(starts) > 1]
    assert len(twice) <= int(config["concurrency"])
    assert sum(r["reused"] for r in reports) + len(finished) >= ROWS
