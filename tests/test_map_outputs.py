"""What a new user's map may get wrong, refused where it happens: an output key
naming no column, a failure's exception type, and a malformed contract."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import trio

from sheetplane import CompleteRow, ContractColumn, FailRow, InvalidInputError, SheetContract
from sheetplane._map import OutputKeys, run_map
from sheetplane._types import TerminalWriteResult

CONTRACT = SheetContract(
    (
        ContractColumn("email", "email", "input"),
        ContractColumn("domain", "domain_name", "output"),
    )
)


class _Rows:
    def __init__(self, n: int) -> None:
        self.items = [{"_key": f"k{i}", "email": f"u{i}@example.com"} for i in range(n)]

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for row in self.items:
            await trio.lowlevel.checkpoint()
            yield row


class _Written:
    def __init__(self) -> None:
        self.completed: list[CompleteRow] = []
        self.failed: list[FailRow] = []

    async def complete(self, rows: Sequence[CompleteRow]) -> TerminalWriteResult:
        self.completed += rows
        return TerminalWriteResult(tuple(r.key for r in rows), (), len(rows))

    async def fail(self, rows: Sequence[FailRow]) -> TerminalWriteResult:
        self.failed += rows
        return TerminalWriteResult(tuple(r.key for r in rows), (), len(rows))


async def _map(fn: Any, written: _Written, **options: Any) -> tuple[int, int, int]:
    rows = _Rows(4)
    return await run_map(
        rows,
        fn,
        total=len(rows.items),
        complete=written.complete,
        fail=written.fail,
        concurrency=2,
        batch_rows=10,
        flush_seconds=0.0,
        output_keys=OutputKeys.of(CONTRACT),
        **options,
    )


async def test_a_misspelled_output_key_fails_its_row_naming_the_key_and_the_outputs() -> None:
    written = _Written()

    async def typo(row: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return {"domian": row["email"].split("@")[1]}

    assert await _map(typo, written) == (0, 4, 0)
    error = written.failed[0].error
    assert "'domian'" in error and "['domain']" in error and "column id" in error


async def test_outputs_keyed_by_id_or_sql_name_and_the_rows_key_are_written() -> None:
    written = _Written()

    async def good(row: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if row["_key"] == "k0":
            return {"domain_name": "example.com", "_key": row["_key"]}
        return {"domain": "example.com"}

    assert await _map(good, written) == (4, 0, 0)


async def test_unknown_outputs_raise_makes_the_map_raise_at_the_first() -> None:
    written = _Written()

    async def typo(row: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return {"domian": "example.com"}

    with pytest.raises(InvalidInputError, match="domian"):
        await _map(typo, written, unknown_outputs="raise")
    assert written.completed == []


async def test_a_failed_rows_error_keeps_the_exceptions_type() -> None:
    written = _Written()

    async def says_no(row: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        raise KeyError("provider said no")

    await _map(says_no, written)
    assert {row.error for row in written.failed} == {"KeyError: 'provider said no'"}


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: SheetContract([ContractColumn("a", "a", "input")]), "tuple of ContractColumn"),
        (
            lambda: SheetContract(
                (ContractColumn("a", "a", "input"), ContractColumn("a", "b", "output"))
            ),
            "two columns with the id 'a'",
        ),
        (lambda: ContractColumn("_status", "status", "output"), "system column"),
        (lambda: ContractColumn("status", "_status", "output"), "system column"),
        (lambda: ContractColumn("x", "x", "outptu"), "source must be one of"),
        (lambda: SheetContract(("a",)), r"columns\[0\] must be a ContractColumn"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_contract_raises_when_built(build: Any, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        build()
