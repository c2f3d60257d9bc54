"""``sheetplane serve`` as a real subprocess: start it, read its first line, stop it.

Its stderr (the JSON log lines) goes to a file the test can read while the
process runs and after it exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import psycopg
import trio
from psycopg import sql

from sheetplane._types import SheetRef
from sheetplane.gateway.server import RUNTIME_PATH
from sheetplane.store import sheet_names

#: ``sheetplane ...`` through the console script's entry point, with this interpreter.
SHEETPLANE = [sys.executable, "-c", "import sys; from sheetplane.cli import main; sys.exit(main())"]
#: Long enough for an embedded Postgres to start and the store to open on a loaded machine.
FIRST_LINE_TIMEOUT_S = 60


@attrs.define(eq=False)
class Served:
    """One running ``sheetplane serve`` process."""

    process: trio.Process
    line: str
    """Its first stdout line."""
    stderr_path: Path
    stopped: bool = False

    @property
    def base_url(self) -> str:
        return self.line.removeprefix("listening on ")

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        """Every stderr line that is a JSON object (the structured log)."""
        records = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        return records

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = FIRST_LINE_TIMEOUT_S) -> int:
        """Send ``sig`` and wait (at most ``timeout_s``) for the exit status."""
        self.process.send_signal(sig)
        with trio.fail_after(timeout_s):
            await self.process.wait()
        self.stopped = True
        assert self.process.returncode is not None
        return self.process.returncode


@asynccontextmanager
async def serving(
    *args: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    expect_status: int | None = 0,
) -> AsyncIterator[Served]:
    """Run ``sheetplane serve ARGS`` until the block ends; then SIGTERM it and,
    unless the test stopped it itself, expect ``expect_status``."""
    stderr_path = tmp_path / f"serve-{os.urandom(4).hex()}.stderr"
    with stderr_path.open("wb") as stderr:
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [*SHEETPLANE, "serve", *args],
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    env={**os.environ, **(env or {})},
                    check=False,
                )
            )
            assert process.stdout is not None
            buffer = b""
            with trio.fail_after(FIRST_LINE_TIMEOUT_S):
                while b"\n" not in buffer:
                    chunk = await process.stdout.receive_some()
                    assert chunk, f"serve exited before its first line: {stderr_path.read_text()}"
                    buffer += chunk
            served = Served(process, buffer.split(b"\n", 1)[0].decode(), stderr_path)
            try:
                yield served
            finally:
                if not served.stopped:
                    status = await served.stop()
                    if expect_status is not None:
                        assert status == expect_status, served.stderr()[-4000:]


async def post_action(
    base_url: str, token: str, action: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    """One raw POST of ``action`` (no retries)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        return await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": "p", **body},
            headers={"authorization": f"Bearer {token}", **headers},
        )


class SummaryLock:
    """An ACCESS EXCLUSIVE lock on a sheet's summary table, held by an outside
    session: every gateway request that reads the summary waits on it, holding
    its pooled connection."""

    def __init__(self, database_url: str, sheet: SheetRef) -> None:
        self._url = database_url
        self._names = sheet_names(sheet)
        self._conn: psycopg.Connection[Any] | None = None

    def _take(self) -> None:
        self._conn = psycopg.connect(self._url)
        self._conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(self._names.schema, self._names.summary_table)
            )
        )

    def _waiters(self) -> int:
        with psycopg.connect(self._url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
        return int(row[0]) if row else 0

    async def take(self) -> None:
        await trio.to_thread.run_sync(self._take)

    async def wait_for_waiters(self, count: int, *, exactly: bool = False) -> None:
        """Poll Postgres until ``count`` backends wait on a lock (at least, or ``exactly``)."""
        with trio.fail_after(FIRST_LINE_TIMEOUT_S):
            while True:
                waiting = await trio.to_thread.run_sync(self._waiters)
                if waiting == count or (waiting > count and not exactly):
                    return
                await trio.sleep(0.05)

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await trio.to_thread.run_sync(conn.close)


async def wait_for_log(
    served: Served, event: str, timeout_s: float = FIRST_LINE_TIMEOUT_S
) -> dict[str, Any]:
    """Poll the process's stderr until a JSON record with ``event`` appears."""
    with trio.fail_after(timeout_s):
        while True:
            for record in served.log_records():
                if record.get("event") == event:
                    return record
            await trio.sleep(0.05)


def secret_file_options(
    tmp_path: Path, database_url: str, tokens: dict[str, str], metrics_token: str | None = None
) -> list[str]:
    """``serve`` options that read every secret from a file (none on the command line)."""
    folder = tmp_path / f"secrets-{os.urandom(4).hex()}"
    folder.mkdir()
    (folder / "url").write_text(database_url)
    (folder / "tokens").write_text("".join(f"{t}={o}\n" for t, o in tokens.items()))
    options = [
        "--database-url-file",
        str(folder / "url"),
        "--tokens-file",
        str(folder / "tokens"),
    ]
    if metrics_token is not None:
        (folder / "metrics-token").write_text(metrics_token)
        options += ["--metrics-token-file", str(folder / "metrics-token")]
    return options
