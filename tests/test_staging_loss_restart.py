"""A runner whose admission's staging rows are lost mid-admission (a database
restart empties the unlogged staging table) finds it at the next chunk; a
sequence input is admitted again from its start, once, by itself, and a one-shot
iterator gets ``AdmissionStateError`` with nothing committed (docs/store.md,
Staged admission)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any, overload

import psycopg
import pytest
from psycopg import sql

from _runtime_helpers import CONTRACT, ORG, ROADS, counting_gateway, runtime
from sheetplane._types import SheetRef
from sheetplane.budgets import ADMISSION_CHUNK_ROWS
from sheetplane.errors import STAGING_LOST_TEXT, AdmissionStateError
from sheetplane.runtime import Strategy
from sheetplane.store import sheet_names

#: Three chunks: the loss comes while the third is cut, when the runner holds
#: only the second (being sent) and the third, so the first is staged.
ROWS = 2 * ADMISSION_CHUNK_ROWS + 500
LOSE_AT = 2 * ADMISSION_CHUNK_ROWS + 1


def _truncate(database_url: str, sheet: SheetRef) -> None:
    staging = sheet_names(sheet).ident("staging_table")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}").format(staging))


class LosingRows(Sequence[dict[str, Any]]):
    """The input rows; reading row ``LOSE_AT`` the first time empties
    the sheet's staging table, as a database restart would mid-admission."""

    def __init__(self, database_url: str, sheet: SheetRef) -> None:
        self.database_url, self.sheet, self.lost = database_url, sheet, 0

    def __len__(self) -> int:
        return ROWS

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(ROWS))]
        if not 0 <= index < ROWS:
            raise IndexError(index)
        if index == LOSE_AT and not self.lost:
            self.lost += 1
            _truncate(self.database_url, self.sheet)
        return {"text": f"row {index}"}


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_sequence_whose_staging_rows_are_lost_is_admitted_again_once(
    database_url: str, strategy: Strategy
) -> None:
    play, ns = f"play-{uuid.uuid4().hex[:8]}", f"ns_{uuid.uuid4().hex[:10]}"
    async with (
        counting_gateway(database_url) as gateway,
        runtime(gateway, strategy, play=play) as rt,
    ):
        # A sheet that holds a row: the direct road stages a sequence too (a first
        # admission of one goes in one transaction, with nothing staged to lose).
        await rt.writer(ns, CONTRACT).start([{"text": "already here"}])
        rows = LosingRows(database_url, SheetRef(ORG, play, ns))
        admission = await rt.writer(ns, CONTRACT).start(rows)
        assert rows.lost == 1
        assert (admission.inserted, admission.pending_count) == (ROWS, ROWS)
        assert await rt.dataset(ns).count() == ROWS + 1


async def test_a_one_shot_iterator_whose_staging_rows_are_lost_raises_and_commits_nothing(
    database_url: str,
) -> None:
    play, ns = f"play-{uuid.uuid4().hex[:8]}", f"ns_{uuid.uuid4().hex[:10]}"
    sheet = SheetRef(ORG, play, ns)

    def rows() -> Iterator[dict[str, Any]]:
        for index in range(ROWS):
            if index == LOSE_AT:
                _truncate(database_url, sheet)
            yield {"text": f"row {index}"}

    async with (
        counting_gateway(database_url) as gateway,
        runtime(gateway, "direct", play=play) as rt,
    ):
        with pytest.raises(AdmissionStateError, match=STAGING_LOST_TEXT):
            await rt.writer(ns, CONTRACT).start(rows())
        assert await rt.dataset(ns).count() == 0
