"""An example suite that checks a runner against the reference data plane.

It uses only the public ``sheetplane.testing`` plugin: the fixtures
``sheetplane_database_url`` and ``sheetplane_gateway``, the Hypothesis
strategies and the plain models. Copy it into your own suite and replace
``my_runner`` with yours.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sheetplane import (
    AttemptSupersededError,
    CompleteRow,
    ContractColumn,
    SheetContract,
    SheetRef,
)
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.faults import FaultSpec
from sheetplane.store import open_store, raise_if_superseded
from sheetplane.testing.models import ModelWrite, SheetModel, json_equal
from sheetplane.testing.plugin import GatewayHandle
from sheetplane.testing.strategies import json_values, row_keys

CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)


async def my_runner(client: GatewayClient, namespace: str, rows: list[dict[str, Any]]) -> int:
    """The runner under test: admit rows, score each, write the scores back fenced."""
    admission = await client.start_sheet_dataset(namespace, CONTRACT, rows, "run-1")
    writes = [
        CompleteRow(row["_key"], {"score": len(row["email"])}) for row in admission.pending_rows
    ]
    result = await client.complete_map_rows(
        namespace, CONTRACT, writes, run_id="run-1", write_version=admission.write_version
    )
    raise_if_superseded(
        result, table_namespace=namespace, run_id="run-1", write_version=admission.write_version
    )
    return len(result.committed_keys)


async def test_runner_finishes_through_transient_faults(sheetplane_gateway: GatewayHandle) -> None:
    faults = [
        FaultSpec("start_sheet_dataset", "503"),
        FaultSpec("runtime_sheet_complete_map_rows", "reset"),
        FaultSpec("runtime_sheet_summary", "backpressure"),
    ]
    rows = [{"_key": f"k{i}", "email": f"user{i}@example.com"} for i in range(20)]
    async with sheetplane_gateway.client(faults=faults) as client:
        assert await my_runner(client, "leads", rows) == 20
        summary = await client.summary("leads")
    assert (summary.total, summary.completed) == (20, 20)
    assert sheetplane_gateway.running.state.faults.pending("runtime_sheet_summary") == 0


async def test_a_readmitted_sheet_stops_the_older_runner(sheetplane_gateway: GatewayHandle) -> None:
    rows = [{"_key": "a", "email": "a@example.com"}, {"_key": "b", "email": "b@example.com"}]
    async with sheetplane_gateway.client() as client:
        first = await client.start_sheet_dataset("leads", CONTRACT, rows, "run-1")
        await client.start_sheet_dataset("leads", CONTRACT, rows, "run-2")
        result = await client.complete_map_rows(
            "leads",
            CONTRACT,
            [CompleteRow("a", {"score": 1})],
            run_id="run-1",
            write_version=first.write_version,
        )
    with pytest.raises(AttemptSupersededError, match="RUNTIME_SHEET_ATTEMPT_SUPERSEDED"):
        raise_if_superseded(
            result, table_namespace="leads", run_id="run-1", write_version=first.write_version
        )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    emails=st.lists(st.tuples(row_keys(), json_values(max_leaves=4)), max_size=6),
    scores=st.lists(json_values(max_leaves=3), min_size=6, max_size=6),
)
def test_hostile_rows_round_trip_as_the_model_says(
    sheetplane_database_url: str, emails: list[tuple[str, Any]], scores: list[Any]
) -> None:
    """Hostile keys and values, admitted and completed on a real Postgres, end as the
    plain model says."""
    model = SheetModel(columns=("email", "score"), input_columns=("email",))
    rows = [{"_key": key, "email": email} for key, email in emails]
    sheet = SheetRef("org-example", "play-example", f"ns-{uuid.uuid4().hex}")

    async def main() -> None:
        async with open_store(sheetplane_database_url) as store:
            admission = await store.start_dataset(sheet, rows, "run-1", CONTRACT)
            expected = model.admit([(row["_key"], row) for row in rows], "run-1")
            assert [row["_key"] for row in admission.pending_rows] == list(expected.pending_keys)
            pairs = list(zip(expected.pending_keys, scores, strict=False))
            result = await store.complete_map_rows(
                sheet,
                CONTRACT,
                [CompleteRow(key, {"score": score}) for key, score in pairs],
                run_id="run-1",
                write_version=admission.write_version,
            )
            modelled = model.terminal_write(
                [ModelWrite(key, "enriched", {"score": score}) for key, score in pairs],
                expected.version,
                "run-1",
            )
            assert result.committed_keys == modelled.committed
            stored = await store.read_rows_by_keys(sheet, model.read_order())
            assert [row["_key"] for row in stored] == model.read_order()
            for row in stored:
                kept = model.rows[row["_key"]]
                assert row["_status"] == kept.status
                assert json_equal(row["email"], kept.values.get("email"))
                assert json_equal(row["score"], kept.values.get("score"))
            summary = await store.summary(sheet)
            assert attrs.asdict(summary) == model.summary()

    trio.run(main)
