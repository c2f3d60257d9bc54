"""Bad input the fuzzers found reaching Postgres: each is now refused with
``InvalidInputError`` before anything is written (it used to fail inside the
write as a ``StoreError``, which the gateway answers 500)."""

from __future__ import annotations

from typing import Any

import pytest

from _store_helpers import snapshot
from sheetplane import InvalidInputError
from sheetplane._types import (
    CompleteRow,
    ContractColumn,
    FailRow,
    SheetContract,
    SheetRef,
)
from sheetplane.budgets import MAX_JSON_DEPTH, MAX_ROW_KEY_BYTES
from sheetplane.store import SheetStore

CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
async def admitted(store: SheetStore, sheet: SheetRef) -> int:
    admission = await store.start_dataset(
        sheet,
        [{"_key": "a", "email": "a@x.org"}, {"_key": "b", "email": "b@x.org"}],
        "r1",
        CONTRACT,
    )
    return admission.write_version


@pytest.mark.parametrize(
    "row",
    [
        {"_key": "k", "email": "x\x00y"},
        {"_key": "k\x00", "email": "x"},
        {"_key": "k", "em\x00ail": "x"},
        {"_key": "k", "email": {"nested\x00key": 1}},
        {"_key": "k", "email": ["deep", ["er", "\x00"]]},
    ],
)
async def test_nul_in_an_admitted_row_is_refused_not_a_store_error(
    store: SheetStore, sheet: SheetRef, admitted: int, row: dict[str, Any]
) -> None:
    before = await snapshot(store, sheet)
    with pytest.raises(InvalidInputError, match="NUL"):
        await store.start_dataset(sheet, [row], "r2", CONTRACT)
    assert await snapshot(store, sheet) == before


async def test_nul_in_terminal_writes_receipts_and_idempotency_keys_is_refused(
    store: SheetStore, sheet: SheetRef, admitted: int
) -> None:
    before = await snapshot(store, sheet)
    bad_calls = [
        store.complete_map_rows(
            sheet,
            CONTRACT,
            [CompleteRow("a", {"score": "\x00"})],
            run_id="r1",
            write_version=admitted,
        ),
        store.complete_map_rows(
            sheet,
            CONTRACT,
            [CompleteRow("a", {"score": 1}, {"m": "\x00"})],
            run_id="r1",
            write_version=admitted,
        ),
        store.complete_map_rows(
            sheet,
            CONTRACT,
            [CompleteRow("a", {"score": 1})],
            run_id="r\x001",
            write_version=admitted,
        ),
        store.fail_map_rows(
            sheet, CONTRACT, [FailRow("a", "boom\x00")], run_id="r1", write_version=admitted
        ),
        store.append_rows(sheet, [{"_key": "c", "email": "\x00"}], idempotency_key="i1"),
        store.append_rows(sheet, [{"_key": "c", "email": "c"}], idempotency_key="i\x001"),
        store.complete_work_receipt(sheet.org_id, sheet.play_name, "w\x00", 1, "r1"),
        store.complete_work_receipt(sheet.org_id, sheet.play_name, "w", {"x": "\x00"}, "r1"),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidInputError):
            await call
    assert await snapshot(store, sheet) == before


async def test_an_int_too_long_to_write_is_refused_not_a_store_error(
    store: SheetStore, sheet: SheetRef, admitted: int
) -> None:
    # A flat row passed on its size bound (about 4,800 bytes for this int) and Python
    # refused to write it as text (over 4,300 digits) inside the write.
    before = await snapshot(store, sheet)
    await refused_as_input_and_output(store, sheet, admitted, 10**5_000, "not valid JSON")
    assert await snapshot(store, sheet) == before


async def refused_as_input_and_output(
    store: SheetStore, sheet: SheetRef, admitted: int, value: Any, match: str
) -> None:
    """``value`` is refused in an admitted row and in a written output."""
    with pytest.raises(InvalidInputError, match=match):
        await store.start_dataset(sheet, [{"_key": "c", "email": value}], "r2", CONTRACT)
    with pytest.raises(InvalidInputError, match=match):
        await store.complete_map_rows(
            sheet,
            CONTRACT,
            [CompleteRow("a", {"score": value})],
            run_id="r1",
            write_version=admitted,
        )


@pytest.mark.parametrize("key", ["\ud800", "a\udfffb"])
async def test_lone_surrogate_in_a_written_key_is_refused(
    store: SheetStore, sheet: SheetRef, admitted: int, key: str
) -> None:
    before = await snapshot(store, sheet)
    with pytest.raises(InvalidInputError, match="surrogate"):
        await store.complete_map_rows(
            sheet, CONTRACT, [CompleteRow(key, {"score": 1})], run_id="r1", write_version=admitted
        )
    assert await snapshot(store, sheet) == before


@pytest.mark.parametrize(
    "column",
    [
        ContractColumn("id\x00", "extra", "output"),
        ContractColumn("extra", "extra", "input", "fi\x00eld"),
        ContractColumn("\ud800", "extra", "output"),
        ContractColumn("extra", "\udc00x", "output"),
    ],
)
async def test_nul_or_surrogate_in_a_contract_column_is_refused(
    store: SheetStore, sheet: SheetRef, column: ContractColumn
) -> None:
    with pytest.raises(InvalidInputError, match=r"NUL|surrogate|not a valid column name"):
        await store.ensure_sheet(sheet, SheetContract((*CONTRACT.columns, column)))


@pytest.mark.parametrize(
    "column",
    [
        ContractColumn("extra", "_key\x00", "output"),
        ContractColumn("id\x00", "_skipped", "output"),
        ContractColumn("extra", "_skipped", "input", "fi\udc00eld"),
    ],
)
async def test_nul_in_a_non_physical_contract_column_is_refused_not_skipped(
    store: SheetStore, sheet: SheetRef, column: ContractColumn
) -> None:
    # A column named with ``_`` has no table column, but its names are still text the
    # sheet keeps: a NUL in them was let through as a skipped column.
    assert not column.is_physical
    with pytest.raises(InvalidInputError, match=r"NUL or a lone surrogate"):
        await store.ensure_sheet(sheet, SheetContract((*CONTRACT.columns, column)))


async def test_nesting_past_max_json_depth_is_refused_not_a_recursion_error(
    store: SheetStore, sheet: SheetRef, admitted: int
) -> None:
    before = await snapshot(store, sheet)
    too_deep = nested(MAX_JSON_DEPTH + 1)
    await refused_as_input_and_output(store, sheet, admitted, too_deep, "MAX_JSON_DEPTH")
    with pytest.raises(InvalidInputError, match="MAX_JSON_DEPTH"):
        await store.complete_work_receipt(sheet.org_id, sheet.play_name, "w", too_deep, "r1")
    assert await snapshot(store, sheet) == before
    # Just under the limit is stored and read back whole.
    deep_enough = nested(MAX_JSON_DEPTH - 2)
    await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow("a", {"score": deep_enough})],
        run_id="r1",
        write_version=admitted,
    )
    (row,) = await store.read_rows_by_keys(sheet, ["a"])
    assert row["score"] == deep_enough


async def test_run_attempt_past_the_integer_column_is_refused(
    store: SheetStore, sheet: SheetRef
) -> None:
    with pytest.raises(InvalidInputError, match="run_attempt"):
        await store.complete_work_receipt(
            sheet.org_id, sheet.play_name, "w", 1, "r1", run_attempt=2**31
        )
    done = await store.complete_work_receipt(
        sheet.org_id, sheet.play_name, "w", 1, "r1", run_attempt=2**31 - 1
    )
    assert done.completion_disposition == "persisted"


async def test_write_version_past_bigint_is_refused(
    store: SheetStore, sheet: SheetRef, admitted: int
) -> None:
    # The largest bigint is the bound.
    with pytest.raises(InvalidInputError, match=f"between 0 and {2**63 - 1}, got {2**63}"):
        await store.complete_map_rows(
            sheet, CONTRACT, [CompleteRow("a", {"score": 1})], run_id="r1", write_version=2**63
        )


async def test_a_key_past_the_btree_entry_limit_is_refused_not_a_store_error(
    store: SheetStore, sheet: SheetRef, admitted: int
) -> None:
    before = await snapshot(store, sheet)
    long_key = "é" * (MAX_ROW_KEY_BYTES // 2 + 1)
    with pytest.raises(InvalidInputError, match="MAX_ROW_KEY_BYTES"):
        await store.start_dataset(sheet, [{"_key": long_key, "email": "x"}], "r2", CONTRACT)
    with pytest.raises(InvalidInputError, match="MAX_ROW_KEY_BYTES"):
        await store.start_dataset(
            sheet, [{"id": long_key, "email": "x"}], "r2", CONTRACT, key_field="id"
        )
    with pytest.raises(InvalidInputError, match="MAX_ROW_KEY_BYTES"):
        await store.complete_map_rows(
            sheet,
            CONTRACT,
            [CompleteRow(long_key, {"score": 1})],
            run_id="r1",
            write_version=admitted,
        )
    with pytest.raises(InvalidInputError, match="MAX_ROW_KEY_BYTES"):
        await store.append_rows(sheet, [{"email": "x"}], idempotency_key=long_key)
    with pytest.raises(InvalidInputError, match="MAX_ROW_KEY_BYTES"):
        await store.complete_work_receipt(sheet.org_id, sheet.play_name, long_key, 1, "r1")
    assert await snapshot(store, sheet) == before
    # A key at the limit is stored.
    at_limit = "k" * MAX_ROW_KEY_BYTES
    admission = await store.start_dataset(sheet, [{"_key": at_limit, "email": "x"}], "r3", CONTRACT)
    assert [row["_key"] for row in admission.pending_rows] == [at_limit]


async def test_a_bad_receipt_argument_creates_no_receipts_table(store: SheetStore) -> None:
    # The receipts table used to be created before the arguments were checked.
    from sheetplane.store._names import receipt_names

    org, play = f"org-{id(store)}-receipts", "play-receipts"
    names = receipt_names(org, play)

    async def table_exists() -> bool:
        def run(conn: Any) -> bool:
            row = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL",
                (f'"{names.schema}"."{names.receipts_table}"',),
            ).fetchone()
            return bool(row[0])

        return await store.pool.run(run)

    with pytest.raises(InvalidInputError):
        await store.complete_work_receipt(org, play, "k", {"x": "\x00"}, "r1")
    with pytest.raises(InvalidInputError):
        await store.complete_work_receipt(org, play, "k", 1, "r1", run_attempt=-1)
    with pytest.raises(InvalidInputError):
        await store.claim_work_receipt(org, play, "k", "")
    assert not await table_exists()
    await store.complete_work_receipt(org, play, "k", 1, "r1")
    assert await table_exists()
