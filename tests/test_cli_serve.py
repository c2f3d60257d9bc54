"""``sheetplane serve`` as a subprocess: first line, one request, a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio

from sheetplane.gateway.server import RUNTIME_PATH

#: ``sheetplane ...`` through the console script's entry point, with this interpreter.
SHEETPLANE = [sys.executable, "-c", "import sys; from sheetplane.cli import main; sys.exit(main())"]
TOKEN = "tok-cli-3e4f5a6b"
ENV_TOKEN = "tok-cli-env-7c8d9e0f"
#: Long enough for an embedded Postgres to start and the store to open.
FIRST_LINE_TIMEOUT_S = 60


@asynccontextmanager
async def serving(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[tuple[str, str]]:
    """Run ``sheetplane serve ARGS``; yield (first stdout line, base URL); SIGTERM on exit."""
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [*SHEETPLANE, "serve", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                check=False,
            )
        )
        assert process.stdout is not None
        buffer = b""
        with trio.fail_after(FIRST_LINE_TIMEOUT_S):
            while b"\n" not in buffer:
                chunk = await process.stdout.receive_some()
                assert chunk, "serve exited before printing its first line"
                buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode()
        try:
            yield line, line.removeprefix("listening on ")
        finally:
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(FIRST_LINE_TIMEOUT_S):
                await process.wait()
            assert process.returncode == 0


async def summary(base_url: str, token: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        return await http.post(
            RUNTIME_PATH,
            json={"action": "runtime_sheet_summary", "playName": "p", "tableNamespace": "n"},
            headers={"authorization": f"Bearer {token}"},
        )


async def test_serve_prints_its_address_answers_and_stops(database_url: str) -> None:
    async with serving(
        "--database-url",
        database_url,
        "--token",
        f"{TOKEN}=acme",
        env={"SHEETPLANE_GATEWAY_TOKENS": f"{ENV_TOKEN}=globex"},
    ) as (line, base_url):
        assert line.startswith("listening on http://127.0.0.1:")
        assert int(base_url.rsplit(":", 1)[1]) > 0
        for token in (TOKEN, ENV_TOKEN):
            response = await summary(base_url, token)
            assert response.status_code == 200
            assert response.json()["total"] == 0
        assert (await summary(base_url, "tok-unknown")).status_code == 401


async def test_serve_honours_test_faults_only_with_the_flag(database_url: str) -> None:
    for flag, expected in ((), 200), (("--allow-test-faults",), 503):
        async with serving("--database-url", database_url, "--token", f"{TOKEN}=acme", *flag) as (
            _,
            base_url,
        ):
            async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
                response = await http.post(
                    RUNTIME_PATH,
                    json={
                        "action": "runtime_sheet_summary",
                        "playName": "p",
                        "tableNamespace": "n",
                    },
                    headers={
                        "authorization": f"Bearer {TOKEN}",
                        "x-sheetplane-test-fault": "runtime_sheet_summary=503",
                    },
                )
            assert response.status_code == expected


async def test_serve_without_a_url_starts_an_embedded_postgres(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SHEETPLANE_DATABASE_URL", raising=False)
    async with serving("--token", f"{TOKEN}=acme") as (line, base_url):
        assert line.startswith("listening on http://")
        response = await summary(base_url, TOKEN)
        assert response.status_code == 200


async def test_serve_refuses_a_malformed_token_without_echoing_it() -> None:
    result = await trio.run_process(
        [*SHEETPLANE, "serve", "--token", "secret-without-org"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 2
    assert b"TOKEN=ORG" in result.stderr
    assert b"secret-without-org" not in result.stderr + result.stdout
