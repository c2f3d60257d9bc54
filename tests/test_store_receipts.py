"""Work receipts on a real Postgres: insert-or-return-the-winner, races, leased
claims with takeover only after expiry, and a stale holder's completion fenced."""

from __future__ import annotations

import datetime as dt
import math
import uuid

import pytest
import trio

from sheetplane._types import ReceiptCompletion
from sheetplane.budgets import WORK_RECEIPT_LEASE_TTL_MS
from sheetplane.errors import InvalidInputError, WorkReceiptFencedError
from sheetplane.store import SheetStore
from sheetplane.store._names import receipt_names
from sheetplane.store._receipts import claim_work_receipt, complete_work_receipt
from sheetplane.store._schema import ensure_receipts

ORG, PLAY = "org-receipts", "play-receipts"
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
TTL = dt.timedelta(milliseconds=WORK_RECEIPT_LEASE_TTL_MS)


def fresh_key() -> str:
    return f"work-{uuid.uuid4().hex}"


async def test_first_completion_persists_and_later_ones_get_the_winner(store: SheetStore) -> None:
    key = fresh_key()
    first = await store.complete_work_receipt(ORG, PLAY, key, {"value": 1}, "run-1", run_attempt=0)
    second = await store.complete_work_receipt(ORG, PLAY, key, {"value": 2}, "run-2")
    assert first.completion_disposition == "persisted"
    assert (first.receipt.key, first.receipt.result, first.receipt.run_id) == (
        key,
        {"value": 1},
        "run-1",
    )
    assert second.completion_disposition == "existing"
    assert second.receipt == first.receipt
    dt.datetime.fromisoformat(first.receipt.completed_at)


async def test_racing_completions_have_exactly_one_winner(store: SheetStore) -> None:
    key = fresh_key()
    results: dict[int, ReceiptCompletion] = {}

    async def complete(n: int) -> None:
        results[n] = await store.complete_work_receipt(ORG, PLAY, key, {"by": n}, f"run-{n}")

    async with trio.open_nursery() as nursery:
        for n in range(6):
            nursery.start_soon(complete, n)
    winners = [n for n, r in results.items() if r.completion_disposition == "persisted"]
    assert len(winners) == 1
    assert all(r.receipt.result == {"by": winners[0]} for r in results.values())


async def test_a_claim_is_taken_over_only_after_expiry(store: SheetStore) -> None:
    names = receipt_names(ORG, PLAY)
    await ensure_receipts(store.pool, names)
    key = fresh_key()
    first = await claim_work_receipt(store.pool, names, key, "attempt-1", now=T0)
    assert first.acquired and first.holder == "attempt-1"
    assert dt.datetime.fromisoformat(first.expires_at or "") == T0 + TTL

    early = await claim_work_receipt(
        store.pool, names, key, "attempt-2", now=T0 + TTL - dt.timedelta(milliseconds=1)
    )
    assert not early.acquired and early.holder == "attempt-1"
    renewed = await claim_work_receipt(
        store.pool, names, key, "attempt-1", lease_token=first.lease_token, now=T0 + TTL / 2
    )
    assert renewed.acquired and renewed.lease_token == first.lease_token
    assert dt.datetime.fromisoformat(renewed.expires_at or "") == T0 + TTL / 2 + TTL

    takeover_at = T0 + TTL / 2 + TTL
    taken = await claim_work_receipt(store.pool, names, key, "attempt-2", now=takeover_at)
    assert taken.acquired and taken.holder == "attempt-2"

    # The first holder is late: its completion is fenced and writes nothing.
    with pytest.raises(WorkReceiptFencedError, match="claimed by another holder"):
        await complete_work_receipt(
            store.pool, names, key, {"late": True}, "run-1", holder="attempt-1", now=takeover_at
        )
    done = await complete_work_receipt(
        store.pool,
        names,
        key,
        {"ok": True},
        "run-2",
        holder="attempt-2",
        lease_token=taken.lease_token,
        now=takeover_at,
    )
    assert done.completion_disposition == "persisted"
    late = await complete_work_receipt(
        store.pool, names, key, {"late": True}, "run-1", holder="attempt-1", now=takeover_at
    )
    assert (late.completion_disposition, late.receipt.result) == ("existing", {"ok": True})
    after = await claim_work_receipt(store.pool, names, key, "attempt-3", now=takeover_at + TTL * 9)
    assert not after.acquired and after.receipt == done.receipt


async def test_an_expired_claim_does_not_block_completion(store: SheetStore) -> None:
    names = receipt_names(ORG, PLAY)
    await ensure_receipts(store.pool, names)
    key = fresh_key()
    await claim_work_receipt(store.pool, names, key, "attempt-1", now=T0)
    done = await complete_work_receipt(store.pool, names, key, 1, "run-2", now=T0 + TTL)
    assert done.completion_disposition == "persisted"


async def test_racing_claims_have_one_holder(store: SheetStore) -> None:
    names = receipt_names(ORG, PLAY)
    await ensure_receipts(store.pool, names)
    key = fresh_key()
    acquired: list[str] = []

    async def claim(holder: str) -> None:
        if (await claim_work_receipt(store.pool, names, key, holder, now=T0)).acquired:
            acquired.append(holder)

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(claim, f"h{n}")
    assert len(acquired) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"result": math.nan}, "finite"),
        ({"result": object()}, "not valid JSON"),
        ({"key": ""}, "receipt key"),
        ({"run_id": ""}, "run_id"),
        ({"run_attempt": -1}, "run_attempt"),
    ],
)
async def test_bad_completions_are_refused(
    store: SheetStore, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"key": fresh_key(), "result": 1, "run_id": "run-1", **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        await store.complete_work_receipt(ORG, PLAY, **args)  # type: ignore[arg-type]
    if args["key"]:
        after = await store.complete_work_receipt(ORG, PLAY, str(args["key"]), 2, "run-2")
        assert after.completion_disposition == "persisted"  # nothing was written before
