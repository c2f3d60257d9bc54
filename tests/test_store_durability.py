"""No acknowledged write is lost when Postgres crashes.

A runner process completes rows and records every key the store acknowledged;
the server is crashed mid-run (``pg_ctl -m immediate``: every server process
quits without a checkpoint, like a power cut for Postgres) and started again on
the same data directory; afterwards every acknowledged key is enriched. With
the embedded server's old settings (``synchronous_commit``, ``fsync`` and
``full_page_writes`` off) the last fraction of a second of acknowledged commits
was gone after the restart.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import trio
from psycopg import sql

from sheetplane._types import SheetRef
from sheetplane.store import open_store, sheet_names
from sheetplane.store.embedded import EmbeddedPostgres

RUNNER = Path(__file__).with_name("_writer_process.py")
ROWS = 3_000
CHUNK = 50
#: Acknowledged keys to wait for before the crash: mid-run, with writes in flight.
CRASH_AFTER = 600
DEADLINE_S = 120
#: How often the test looks at the acknowledgement file while it waits for the crash point.
POLL_S = 0.01


@pytest.fixture
def durable_server() -> Iterator[EmbeddedPostgres]:
    """A server of its own, with the embedded default settings (durable)."""
    with EmbeddedPostgres(max_connections=20) as server:
        yield server


def _acknowledged(path: Path) -> set[str]:
    if not path.exists():
        return set()
    lines = path.read_text(encoding="utf-8").splitlines()
    return {line for line in lines if line and not line.startswith("!")}


async def test_acknowledged_terminal_writes_survive_a_crash(
    durable_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    from _writer_process import CONTRACT

    with psycopg.connect(durable_server.url) as conn:
        settings = conn.execute(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'),"
            " current_setting('full_page_writes')"
        ).fetchone()
    assert settings == ("on", "on", "on")

    tag = uuid.uuid4().hex[:12]
    sheet = SheetRef(f"org-{tag}", f"play-{tag}", f"ns-{tag}")
    rows = [{"company": f"c{i:05d}"} for i in range(ROWS)]
    async with open_store(durable_server.url) as store:
        admission = await store.start_dataset(sheet, rows, "run-crash", CONTRACT)
    keys = [row["_key"] for row in admission.pending_rows]
    acks = tmp_path / "acks.txt"
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "road": "store",
                "org": sheet.org_id,
                "play": sheet.play_name,
                "ns": sheet.table_namespace,
                "run_id": "run-crash",
                "write_version": admission.write_version,
                "keys": keys,
                "chunk": CHUNK,
                "concurrency": 2,
                "acks": str(acks),
                "deadline_s": DEADLINE_S,
            }
        )
    )
    env = dict(os.environ, SHEETPLANE_WRITER_URL=durable_server.url)
    runner = await trio.lowlevel.open_process([sys.executable, str(RUNNER), str(config)], env=env)
    try:
        with trio.fail_after(DEADLINE_S):
            while len(_acknowledged(acks)) < CRASH_AFTER:
                assert runner.poll() is None, "the runner ended before the crash"
                await trio.sleep(POLL_S)
            before_crash = _acknowledged(acks)
            await trio.to_thread.run_sync(lambda: durable_server.restart(mode="immediate"))
            code = await runner.wait()
    finally:
        if runner.poll() is None:
            runner.kill()
            await runner.wait()
    assert code == 0, "the runner left keys unacknowledged"
    assert len(before_crash) < ROWS, "the crash came after the last write"
    acknowledged = _acknowledged(acks)
    assert acknowledged == set(keys)

    names = sheet_names(sheet)
    with psycopg.connect(durable_server.url) as conn:
        stored = dict(
            conn.execute(
                sql.SQL("SELECT _key, _status FROM {}").format(names.ident("sheet_table"))
            ).fetchall()
        )
    lost = sorted(key for key in before_crash if stored.get(key) != "enriched")
    assert not lost, f"{len(lost)} acknowledged key(s) were not enriched after the crash"
    assert all(stored[key] == "enriched" for key in keys)
