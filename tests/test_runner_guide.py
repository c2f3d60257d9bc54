"""docs/runner-guide.md's example, extracted from the markdown and run as written against a
real Postgres and the reference gateway: both strategies, a rerun, and a superseded attempt."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

import sheetplane.runtime
from sheetplane.gateway.server import RunningGateway, running_gateway

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "runner-guide.md"
TOKEN = f"tok-guide-{secrets.token_hex(6)}"
ORG = "guide-org"


def example_namespace() -> dict[str, Any]:
    """The guide's first ``python`` block, executed as a module that is not ``__main__``."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert blocks, "docs/runner-guide.md has no python block"
    namespace: dict[str, Any] = {"__name__": "runner_guide_example"}
    exec(compile(blocks[0], str(GUIDE), "exec"), namespace)
    return namespace


def leads(n: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        email = "broken-address" if i % 10 == 9 else f"lead{i}@Domain{i % 3}.example"
        rows.append({"email": email, "company": f"Company {i}"})
    return rows


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}) as gw:
        yield gw


def arguments(gw: RunningGateway, play: str, **more: Any) -> dict[str, Any]:
    return {
        "base_url": gw.base_url,
        "token": TOKEN,
        "org_id": ORG,
        "play_name": play,
        "run_id": "run-1",
        **more,
    }


@pytest.mark.parametrize("strategy", ["direct", "gateway_only"])
async def test_the_guide_example_runs_as_written(gateway: RunningGateway, strategy: str) -> None:
    example = example_namespace()
    play = f"guide-{uuid.uuid4().hex[:8]}"
    run = example["run_enrichment"]

    first = await run(**arguments(gateway, play, rows=leads(250), strategy=strategy))
    assert first == {
        "superseded": False,
        "admitted": 250,
        "mapped": 250,
        "failed": 25,
        "statuses": {"enriched": 225, "failed": 25},
        "top_domain": "domain0.example",
        "first_key": first["first_key"],
        "receipt": "persisted",
    }
    assert first["first_key"]

    again = await run(**arguments(gateway, play, rows=leads(250), strategy=strategy))
    # Enriched rows are kept, not mapped again; the failed ones are retried (and fail again).
    assert again["admitted"] == 250
    assert again["mapped"] == 25 and again["failed"] == 25
    assert again["statuses"] == {"enriched": 225, "failed": 25}
    assert again["receipt"] == "existing"


async def test_the_guide_example_stops_when_a_retry_supersedes_it(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = example_namespace()
    play = f"guide-{uuid.uuid4().hex[:8]}"
    rows = leads(300)
    # map writes its batches through the writer's mapped-batch entry (its rows were
    # checked as fn returned them); the hook sits there.
    original = sheetplane.runtime.RowWriter.complete_mapped
    retried: list[int] = []

    async def complete_after_a_retry(self: Any, batch: Any) -> Any:
        # Deterministically, a retry of the same input is admitted (by another
        # runtime) just before this attempt's first write.
        if not retried:
            async with sheetplane.open_runtime(**arguments(gateway, play)) as other:
                admission = await other.writer("leads", example["CONTRACT"]).start(rows)
                retried.append(admission.write_version)
        return await original(self, batch)

    monkeypatch.setattr(sheetplane.runtime.RowWriter, "complete_mapped", complete_after_a_retry)
    result = await example["run_enrichment"](**arguments(gateway, play, rows=rows))
    assert retried
    assert result["superseded"] is True and result["stale_rows"] > 0


def test_the_guides_plugin_tests_pass_as_their_own_pytest_run(
    database_url: str, tmp_path: Path
) -> None:
    """The guide's "Testing a runner" block, beside its example as runner.py, run by pytest
    with the installed plugin and nothing else."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    (plugin_tests,) = [block for block in blocks if "sheetplane_gateway" in block]
    (tmp_path / "runner.py").write_text(blocks[0], encoding="utf-8")
    (tmp_path / "test_runner.py").write_text(plugin_tests, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntrio_mode = true\naddopts = -p no:cacheprovider\n", encoding="utf-8"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly"],
        cwd=tmp_path,
        env={**os.environ, "SHEETPLANE_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


@pytest.mark.heavy(15)
def test_the_guides_plain_script_runs_with_nothing_started_by_hand(tmp_path: Path) -> None:
    """The guide's local.py beside its example as runner.py: ``python local.py`` starts an
    embedded Postgres and an in-process gateway itself, and runs the example on them."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    (local,) = [block for block in blocks if "EmbeddedPostgres()" in block]
    (tmp_path / "runner.py").write_text(blocks[0], encoding="utf-8")
    (tmp_path / "local.py").write_text(local, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "local.py"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "SHEETPLANE_DATABASE_URL"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "'statuses': {'enriched': 2, 'failed': 1}" in done.stdout
    assert "'top_domain': 'example.com'" in done.stdout


async def test_the_guides_many_runners_example_runs_as_written(gateway: RunningGateway) -> None:
    """The "Many runners" block: a coordinator admits and hands the attempt's JSON out;
    three workers map it together; the coordinator's status ends with every row done."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    (source,) = [block for block in blocks if "map_attempt" in block]
    example: dict[str, Any] = {"__name__": "runner_guide_many"}
    exec(compile(source, str(GUIDE), "exec"), example)
    play = f"guide-{uuid.uuid4().hex[:8]}"
    rows = [{"email": f"lead{i}@Domain{i % 3}.example"} for i in range(400)]
    reports: list[Any] = []
    connection = {"base_url": gateway.base_url, "token": TOKEN, "org_id": ORG}
    async with trio.open_nursery() as nursery:

        async def worker(text: str) -> None:
            reports.append(await example["work"](text, **connection))

        status = await example["coordinate"](
            rows,
            lambda text: nursery.start_soon(worker, text),
            workers=3,
            play_name=play,
            run_id="run-1",
            **connection,
        )
    assert (status.pending, status.enriched, status.failed) == (0, 400, 0)
    assert len(reports) == 3 and sum(r.completed for r in reports) == 400
