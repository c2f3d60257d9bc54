"""``sheetplane.testing``: the plugin's fixtures, its strategies and models, and the
example suite that uses only the public plugin (run here as its own pytest process)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sheetplane._types import CompleteRow, ContractColumn, SheetContract
from sheetplane.gateway.faults import FaultSpec
from sheetplane.gateway.server import RUNTIME_PATH
from sheetplane.protocol import contract_json, read_contract
from sheetplane.store._fencing import StoredRow, decide_terminal_write
from sheetplane.store._schema import _physical_columns
from sheetplane.testing.models import ModelRow, ModelWrite, json_equal, model_decision
from sheetplane.testing.plugin import GatewayHandle
from sheetplane.testing.strategies import bad_json_bodies, rows, sheet_contracts

EXAMPLE_SUITE = Path(__file__).resolve().parent.parent / "examples" / "plugin_suite"


def test_example_suite_passes_as_its_own_pytest_run(database_url: str) -> None:
    env = {**os.environ, "SHEETPLANE_DATABASE_URL": database_url}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly"],
        cwd=EXAMPLE_SUITE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout
    assert database_url not in result.stdout + result.stderr


_FAILING_TEST = """
def test_fails(sheetplane_database_url):
    url = sheetplane_database_url
    assert url.startswith("mysql://")
"""


def test_a_failing_test_report_shows_no_part_of_the_database_url(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "test_fails.py").write_text(_FAILING_TEST)
    env = {**os.environ, "SHEETPLANE_DATABASE_URL": str(database_url)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=long", "-l"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert "1 failed" in output, output[-4000:]
    assert "<database URL, redacted>" in output
    # Checked without naming the secret in this test's own failure report.
    password = urlsplit(str(database_url)).password or ""
    assert password
    leaks = [
        line.replace(password, "<password>") for line in output.splitlines() if password in line
    ]
    assert not leaks


async def test_gateway_fixture_serves_its_token_and_arms_faults(
    sheetplane_gateway: GatewayHandle,
) -> None:
    body = {"action": "runtime_sheet_summary", "playName": "p", "tableNamespace": "ns"}
    async with httpx.AsyncClient(base_url=sheetplane_gateway.base_url) as http:
        unauthorised = await http.post(RUNTIME_PATH, json=body)
        headers = {"authorization": f"Bearer {sheetplane_gateway.token}"}
        headers.update(sheetplane_gateway.fault_header([FaultSpec("runtime_sheet_summary", "502")]))
        faulted = await http.post(RUNTIME_PATH, json=body, headers=headers)
    assert unauthorised.status_code == 401
    assert faulted.status_code == 502
    assert sheetplane_gateway.token not in repr(sheetplane_gateway)
    async with sheetplane_gateway.client(faults=[FaultSpec("ensure_sheet", "503", 2)]) as client:
        await client.ensure_sheet("ns", SheetContract())
    assert sheetplane_gateway.running.state.faults.pending("ensure_sheet") == 0


def test_fixture_strategy_defaults_to_the_direct_road(sheetplane_strategy: str) -> None:
    assert sheetplane_strategy == "direct"


@settings(max_examples=150, deadline=None)
@given(contract=sheet_contracts(max_columns=6), data=st.data())
def test_contracts_and_rows_are_ones_the_store_accepts(
    contract: SheetContract, data: st.DataObject
) -> None:
    assert read_contract(contract_json(contract)) == contract
    assert len(_physical_columns(contract)) == len(contract.columns)
    for row in data.draw(rows(contract, max_size=3)):
        assert "\x00" not in repr(row)
        assert isinstance(row["_key"], str) and row["_key"]


@settings(max_examples=100, deadline=None)
@given(body=bad_json_bodies())
def test_bad_bodies_are_never_a_complete_request(body: bytes) -> None:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return
    if isinstance(parsed, dict) and isinstance(parsed.get("action"), str):
        assert "playName" not in parsed


STATUSES = ("pending", "running", "enriched", "failed", "stale")


@pytest.mark.parametrize(
    ("status", "stamp", "writer", "same"),
    list(itertools.product(STATUSES, (1, 2, 3), (None, 1, 2, 3), (False, True))),
)
def test_model_decision_agrees_with_the_store_core(
    status: str, stamp: int, writer: int | None, same: bool
) -> None:
    write = ModelWrite("k", "enriched", {"score": 1})
    values = {"score": 1} if same else {"score": 2}
    row = ModelRow(status, stamp, "run", 0, values)  # type: ignore[arg-type]
    disposition, reason = model_decision(row, writer, write)
    stored = StoredRow(status, stamp, same and status == "enriched")  # type: ignore[arg-type]
    core = decide_terminal_write(stored, writer)
    assert (disposition, reason) == (core.disposition, core.reason)
    assert model_decision(None, writer, write) == ("stale", "newer_write_version")


def test_json_equal_follows_jsonb_numbers() -> None:
    assert json_equal(1e308, 10**308)
    assert json_equal({"a": [-0.0]}, {"a": [0]})
    assert not json_equal(True, 1)
    assert not json_equal({"a": 1}, {"a": 1, "b": None})
    assert not json_equal("1", 1)


@pytest.mark.parametrize("sheetplane_strategy", ["direct", "gateway_only"])
async def test_runtime_fixture_writes_and_reads_on_either_road(
    sheetplane_runtime: Any, sheetplane_strategy: str
) -> None:
    contract = SheetContract(
        (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
    )
    assert sheetplane_runtime.context.strategy == sheetplane_strategy
    writer = sheetplane_runtime.writer("leads", contract)
    admission = await writer.start([{"_key": f"k{i}", "email": f"u{i}@x.org"} for i in range(5)])
    await writer.complete(
        [CompleteRow(row["_key"], {"score": 1}) async for row in admission.pending()]
    )
    rows = await sheetplane_runtime.dataset("leads").materialize()
    assert [(row["_key"], row["score"], row["_status"]) for row in rows] == [
        (f"k{i}", 1, "enriched") for i in range(5)
    ]
