"""Races the chaos harness found between writers of one sheet."""

from __future__ import annotations

import uuid

import trio

from sheetplane._types import ContractColumn, SheetContract, SheetRef
from sheetplane.store import SheetStore

CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)


async def test_concurrent_first_admissions_to_a_new_sheet_do_not_deadlock(
    store: SheetStore,
) -> None:
    # Three runners admit to a sheet that does not exist yet, as the gateway does:
    # ensure the layout, then admit. An ensure that waited for another's DDL ran
    # its own no-op DDL anyway and deadlocked with an admission (a 500 on the gateway).
    rows = [{"_key": f"k{i}", "email": f"u{i}@x.org"} for i in range(30)]
    versions: list[int] = []

    async def runner(sheet: SheetRef, run_id: str) -> None:
        await store.ensure_sheet(sheet, CONTRACT)
        admission = await store.start_dataset(sheet, rows, run_id, CONTRACT)
        versions.append(admission.write_version)

    for _ in range(40):
        tag = uuid.uuid4().hex
        sheet = SheetRef(f"org-{tag}", "play", f"ns-{tag}")
        versions.clear()
        async with trio.open_nursery() as nursery:
            for runner_number in range(3):
                nursery.start_soon(runner, sheet, f"run-{runner_number}")
        assert sorted(versions) == [1, 2, 3]
        assert await store.count(sheet) == len(rows)
