"""Rows that carry nothing for a contract's input column are said at once, or refused.

Before, rows keyed ``{"name": ...}`` against a contract whose input column is
``company`` were admitted with ``company: None`` and enriched, without a word.
Now the admission logs one warning naming the column and the row count, and
``strict_inputs=True`` (on ``map`` and ``start``) raises ``InvalidInputError``
before anything is committed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from _runtime_helpers import (
    CountingGateway,
    counting_gateway,
    new_play,
    runtime,
    select_rows,
    sheet_of,
)
from sheetplane import ContractColumn, InvalidInputError, SheetContract

CONTRACT = SheetContract(
    (
        ContractColumn("text", "text", "input"),
        ContractColumn("words", "words", "output"),
    )
)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def named_rows(n: int) -> list[dict[str, Any]]:
    """Rows keyed ``name``: the contract's input column is ``text``."""
    return [{"_key": f"k{i}", "name": f"Person {i}"} for i in range(n)]


async def count_words(row: dict[str, Any]) -> dict[str, Any]:
    return {"words": len(str(row.get("text") or "").split())}


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sheetplane.runtime"]


async def test_rows_missing_an_input_column_are_admitted_with_one_warning(
    gateway: CountingGateway, caplog: pytest.LogCaptureFixture
) -> None:
    # The rows are watched before either road sends them: one road shows it.
    async with runtime(gateway, "gateway_only", play=new_play()) as rt:
        with caplog.at_level(logging.WARNING, logger="sheetplane.runtime"):
            report = await rt.map("leads", CONTRACT, named_rows(30), count_words)
    assert report.admitted == 30
    (warning,) = warnings_of(caplog)
    assert "input column 'text'" in warning and "all 30 rows" in warning
    assert "'leads'" in warning and "'name'" in warning and "strict_inputs=True" in warning


async def test_a_matching_input_gives_no_warning(
    gateway: CountingGateway, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [{"_key": "a", "text": None}, {"_key": "b", "text": "two words"}]
    async with runtime(gateway, "direct", play=new_play()) as rt:
        with caplog.at_level(logging.WARNING, logger="sheetplane.runtime"):
            await rt.map("leads", CONTRACT, rows, count_words)
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("shape", ["list", "generator", "async generator"])
async def test_strict_inputs_refuses_the_admission_with_nothing_written(
    gateway: CountingGateway, shape: str
) -> None:
    play = new_play()

    def rows() -> Any:
        if shape == "list":
            return named_rows(30)
        if shape == "generator":
            return iter(named_rows(30))

        async def each() -> AsyncIterator[dict[str, Any]]:
            for row in named_rows(30):
                yield row

        return each()

    async with runtime(gateway, "direct", play=play) as rt:
        before = gateway.requests
        with pytest.raises(InvalidInputError, match=r"input column 'text'.*nothing was admitted"):
            await rt.map("leads", CONTRACT, rows(), count_words, strict_inputs=True)
        if shape == "list":
            assert gateway.requests == before  # refused before any request
        with pytest.raises(InvalidInputError, match="input column 'text'"):
            await rt.writer("leads", CONTRACT).start(rows(), strict_inputs=True)
        # The same rows with the column are admitted: the sheet holds only those.
        rows_with_text = [{**row, "text": row["name"]} for row in named_rows(3)]
        await rt.writer("leads", CONTRACT).start(rows_with_text, strict_inputs=True)
    stored = await select_rows(gateway.state.store, sheet_of(play, "leads"))
    assert [row["_key"] for row in stored] == ["k0", "k1", "k2"]
