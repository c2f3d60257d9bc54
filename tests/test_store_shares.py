"""An attempt's shares on a real Postgres: claims divide the pending rows, a lease
that ends is taken over, renewals and releases need the token, a finished share
is done only when its rows are written, and a newer admission supersedes."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

from sheetplane._attempts import AttemptStatus
from sheetplane._types import (
    AdmittedPart,
    CompleteRow,
    ContractColumn,
    PageRequest,
    RowFilter,
    SheetContract,
    SheetRef,
)
from sheetplane.budgets import SHARE_LEASE_MIN_TTL_MS, SHARE_LEASE_TTL_MS
from sheetplane.errors import InvalidInputError
from sheetplane.store import SheetStore, sheet_names

CONTRACT = SheetContract(
    (ContractColumn("company", "company", "input"), ContractColumn("score", "score", "output"))
)
TTL = SHARE_LEASE_TTL_MS


async def admitted(store: SheetStore, rows: int) -> tuple[SheetRef, int]:
    sheet = SheetRef("org-shares", "play-shares", f"ns-{uuid.uuid4().hex[:10]}")
    inline = await store.start_dataset(
        sheet, [{"company": f"c{i}"} for i in range(rows)], "run-1", CONTRACT
    )
    return sheet, inline.write_version


async def expire_leases(store: SheetStore, sheet: SheetRef) -> None:
    """End every lease of the sheet now (the database's clock is not ours to move)."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            sql.SQL("UPDATE {} SET expires_at = clock_timestamp() - interval '1 second'").format(
                names.ident("shares_table")
            )
        )

    await store.pool.run(run)


async def share_keys(
    store: SheetStore, sheet: SheetRef, version: int, first: int, last: int
) -> list[str]:
    """The keys of the share's rows still to map (what its worker reads)."""
    which = RowFilter(admitted=AdmittedPart(version, "unsettled", first, last))
    return await store.read_row_keys(sheet, PageRequest(5000, 0), which=which)


async def claim(store: SheetStore, sheet: SheetRef, version: int, holder: str, rows: int = 40):
    token = f"token-{holder}"
    answer = await store.claim_share(sheet, version, holder, token, ttl_ms=TTL, max_rows=rows)
    return answer, token


async def test_claims_divide_the_pending_rows_in_input_order(store: SheetStore) -> None:
    sheet, version = await admitted(store, 100)
    seen: list[str] = []
    shares = []
    for n in range(3):
        answer, _ = await claim(store, sheet, version, f"w{n}")
        assert answer.outcome == "claimed" and not answer.taken_over
        shares.append(answer.share)
        assert answer.first_index is not None and answer.last_index is not None
        seen += await share_keys(store, sheet, version, answer.first_index, answer.last_index)
    assert shares == [1, 2, 3]
    assert len(seen) == len(set(seen)) == 100
    # Nothing left unclaimed: three shares held, and when the first expires.
    answer, _ = await claim(store, sheet, version, "w9")
    assert answer.outcome == "none" and answer.live == 3
    assert answer.retry_after_ms is not None and 0 < answer.retry_after_ms <= TTL


async def test_racing_claims_never_take_one_share_twice(store: SheetStore) -> None:
    sheet, version = await admitted(store, 300)
    answers = []

    async def worker(n: int) -> None:
        answers.append((await claim(store, sheet, version, f"w{n}", rows=25))[0])

    async with trio.open_nursery() as nursery:
        for n in range(12):
            nursery.start_soon(worker, n)
    ranges = sorted((a.first_index, a.last_index) for a in answers)
    assert len({a.share for a in answers}) == 12
    assert all(prev[1] < nxt[0] for prev, nxt in itertools.pairwise(ranges))


async def test_a_lease_that_ended_is_taken_over_and_only_its_unwritten_rows_are_read(
    store: SheetStore,
) -> None:
    sheet, version = await admitted(store, 10)
    first, token = await claim(store, sheet, version, "dead", rows=10)
    assert first.first_index is not None and first.last_index is not None
    keys = await share_keys(store, sheet, version, first.first_index, first.last_index)
    # The dead worker wrote four rows before it died.
    written = [CompleteRow(key, {"score": 1}) for key in keys[:4]]
    await store.complete_map_rows(sheet, CONTRACT, written, run_id="run-1", write_version=version)
    live, _ = await claim(store, sheet, version, "other")
    assert live.outcome == "none" and live.live == 1
    await expire_leases(store, sheet)
    taken, new_token = await claim(store, sheet, version, "other")
    assert (taken.outcome, taken.share, taken.taken_over) == ("claimed", 1, True)
    assert await share_keys(store, sheet, version, 0, 10**6) == keys[4:]
    # The dead worker's token renews and releases nothing now.
    assert (await store.renew_share(sheet, version, 1, token, ttl_ms=TTL)).outcome == "lost"
    assert (await store.release_share(sheet, version, 1, token, finished=True)).outcome == "lost"
    assert (await store.renew_share(sheet, version, 1, new_token, ttl_ms=TTL)).outcome == (
        "renewed"
    )


async def test_a_share_is_done_only_when_its_rows_are_written(store: SheetStore) -> None:
    sheet, version = await admitted(store, 6)
    answer, token = await claim(store, sheet, version, "w", rows=6)
    assert answer.first_index is not None and answer.last_index is not None
    keys = await share_keys(store, sheet, version, answer.first_index, answer.last_index)
    # Finished with rows unwritten: released, not done; another worker claims it at once.
    released = await store.release_share(sheet, version, 1, token, finished=True)
    assert released.outcome == "released"
    again, token = await claim(store, sheet, version, "w2")
    assert (again.outcome, again.share, again.taken_over) == ("claimed", 1, True)
    status = await store.attempt_status(sheet, version)
    assert status == AttemptStatus(pending=6, claimed=6, enriched=0, failed=0, workers=1)
    await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow(key, {"score": 2}) for key in keys],
        run_id="run-1",
        write_version=version,
    )
    assert (await store.release_share(sheet, version, 1, token, finished=True)).outcome == (
        "released"
    )
    done, _ = await claim(store, sheet, version, "w3")
    assert (done.outcome, done.live) == ("none", 0)
    status = await store.attempt_status(sheet, version)
    assert status == AttemptStatus(pending=0, claimed=0, enriched=6, failed=0, workers=0)
    assert status.done


async def test_a_newer_admission_supersedes_claims_renewals_and_status(
    store: SheetStore,
) -> None:
    sheet, version = await admitted(store, 20)
    answer, token = await claim(store, sheet, version, "old", rows=5)
    assert answer.outcome == "claimed"
    newer = await store.start_dataset(
        sheet, [{"company": f"c{i}"} for i in range(20)], "run-2", CONTRACT
    )
    assert newer.write_version == version + 1
    assert (await claim(store, sheet, version, "old"))[0].outcome == "superseded"
    assert (await store.renew_share(sheet, version, 1, token, ttl_ms=TTL)).outcome == ("superseded")
    assert (await store.attempt_status(sheet, version)).superseded
    # The new attempt's shares start again from its first row.
    fresh, _ = await claim(store, sheet, newer.write_version, "new", rows=5)
    assert (fresh.outcome, fresh.share, fresh.first_index) == ("claimed", 1, 0)


async def test_bad_claims_are_refused_before_anything_is_written(store: SheetStore) -> None:
    sheet, version = await admitted(store, 3)
    with pytest.raises(InvalidInputError, match="no admission at write version"):
        await claim(store, sheet, version + 1, "w")
    with pytest.raises(InvalidInputError, match="ttl_ms"):
        await store.claim_share(
            sheet, version, "w", "t", ttl_ms=SHARE_LEASE_MIN_TTL_MS - 1, max_rows=5
        )
    with pytest.raises(InvalidInputError, match="max_rows"):
        await store.claim_share(sheet, version, "w", "t", ttl_ms=TTL, max_rows=0)
    status = await store.attempt_status(sheet, version)
    assert (status.pending, status.claimed, status.workers) == (3, 0, 0)
    never = SheetRef("org-shares", "play-shares", f"never-{uuid.uuid4().hex[:10]}")
    with pytest.raises(InvalidInputError, match="no admission at write version 1"):
        await claim(store, never, 1, "w")
    with pytest.raises(InvalidInputError, match="no admission"):
        await store.attempt_status(never, 1)
