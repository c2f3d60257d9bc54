"""A contract that changes under an existing sheet: a column's new ``sql_name`` is refused,
and a new output column is filled for the rows already enriched, as docs/runner-guide.md
("When the contract changes") shows.

Before, a contract keeping a column's id but changing its ``sql_name`` added a
second physical column, and every row read back ``None`` in silence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from _runtime_helpers import CountingGateway, counting_gateway, new_play, runtime
from sheetplane import ContractColumn, GatewayError, SheetContract
from sheetplane.runtime import Strategy

BEFORE = SheetContract(
    (
        ContractColumn("company", "company", "input"),
        ContractColumn("size", "size", "output"),
    )
)
RENAMED = SheetContract(
    (
        ContractColumn("company", "company_name", "input"),
        ContractColumn("size", "size", "output"),
    )
)
WIDER = SheetContract((*BEFORE.columns, ContractColumn("domain", "domain", "output")))
ROWS = [{"_key": f"k{i}", "company": f"Company {i}"} for i in range(6)]


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


async def size(row: dict[str, Any]) -> dict[str, Any]:
    return {"size": len(row["company"])}


async def size_and_domain(row: dict[str, Any]) -> dict[str, Any]:
    return {**(await size(row)), "domain": row["company"].lower().replace(" ", "") + ".test"}


async def test_a_new_sql_name_for_a_stored_column_is_refused(gateway: CountingGateway) -> None:
    # One road: both admit through the gateway's ensure_sheet, where the refusal is.
    async with runtime(gateway, "direct", play=new_play()) as rt:
        await rt.map("leads", BEFORE, ROWS, size)
        # Refused by the store as InvalidInputError; both roads admit through the
        # gateway, which answers it 400 invalid_input.
        with pytest.raises(GatewayError) as excinfo:
            await rt.map("leads", RENAMED, ROWS, size)
        text = str(excinfo.value)
        assert "column 'company' is stored in this sheet as 'company'" in text
        assert "names it 'company_name'" in text and "never renamed" in text
        assert (excinfo.value.status, excinfo.value.gateway_code) == (400, "invalid_input")
        # Nothing changed: the sheet reads back as it was written.
        rows = [row async for row in rt.dataset("leads")]
    assert [(r["company"], r["size"], r["_status"]) for r in rows] == [
        (f"Company {i}", len(f"Company {i}"), "enriched") for i in range(6)
    ]


@pytest.mark.parametrize("strategy", ["direct", "gateway_only"])
async def test_a_new_output_column_is_filled_for_enriched_rows_by_upsert(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    async with runtime(gateway, strategy, play=new_play()) as rt:
        await rt.map("leads", BEFORE, ROWS, size)
        # The wider contract: enriched rows stay enriched (kept, not mapped again) and
        # read back with the new column null; the new rows are mapped.
        report = await rt.map(
            "leads", WIDER, [*ROWS, {"_key": "k6", "company": "New"}], size_and_domain
        )
        assert (report.admitted, report.pending, report.completed) == (7, 1, 1)
        writer = rt.writer("leads", WIDER)
        admission = await writer.start([*ROWS, {"_key": "k6", "company": "New"}])
        missing = [row async for row in admission.completed() if row.get("domain") is None]
        assert sorted(row["_key"] for row in missing) == [f"k{i}" for i in range(6)]
        # The runner guide's recipe: map those rows and upsert their outputs.
        filled = [{"_key": row["_key"], **(await size_and_domain(row))} for row in missing]
        await writer.upsert(filled, idempotency_key="fill-domain-1")
        rows = [row async for row in rt.dataset("leads")]
    assert all(row["domain"] and row["_status"] == "enriched" for row in rows), rows
