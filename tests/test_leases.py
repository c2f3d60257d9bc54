"""The lease keeper on virtual time (``autojump_clock``): renewals at the derived
interval, the body cancelled strictly before the lease's expiry when renewals
fail or hang, refusals, release on every way out, and ``once`` waiting on
another holder (its receipt, its lease's expiry, or the wait budget)."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from _lease_helpers import TTL, LeaseTable, instant
from sheetplane import LeaseHeldError, LeaseLostError, ReceiptCompletedError
from sheetplane._leases import Lease, LeaseTimes, acquire_lease, hold_lease, run_once
from sheetplane._types import ReceiptClaim, ReceiptCompletion
from sheetplane.budgets import (
    WORK_RECEIPT_LEASE_GUARD_MS,
    WORK_RECEIPT_LEASE_RENEWAL_MS,
    WORK_RECEIPT_ONCE_POLL_MS,
    WORK_RECEIPT_ONCE_WAIT_MS,
    WORK_RECEIPT_RELEASE_TIMEOUT_MS,
)
from sheetplane.errors import TransientGatewayError

RENEWAL = WORK_RECEIPT_LEASE_RENEWAL_MS / 1000
GUARD = WORK_RECEIPT_LEASE_GUARD_MS / 1000
POLL = WORK_RECEIPT_ONCE_POLL_MS / 1000
WAIT = WORK_RECEIPT_ONCE_WAIT_MS / 1000
RELEASE_TIMEOUT = WORK_RECEIPT_RELEASE_TIMEOUT_MS / 1000


@asynccontextmanager
async def claim(table: LeaseTable, key: str, holder: str) -> AsyncIterator[Lease]:
    lease = await acquire_lease(table, key, holder)
    async with hold_lease(lease):
        yield lease


def renewals_of(table: LeaseTable, holder: str) -> list[float]:
    return [t for t, _key, h in table.claims if h == holder]


async def test_renewals_are_sent_every_renewal_interval(autojump_clock: Any) -> None:
    table = LeaseTable()
    t0 = trio.current_time()
    async with claim(table, "k", "a") as lease:
        await trio.sleep(3.5 * RENEWAL)
        assert table.holds("k", "a")
        await lease.complete({"done": True})
        completed_at = trio.current_time()
        # A completed lease is not renewed any more, and no longer bounds the body.
        await trio.sleep(3 * RENEWAL)
        body_ended_at = trio.current_time()
    assert body_ended_at == completed_at + 3 * RENEWAL
    expected = [t0]
    for _ in range(3):
        expected.append(LeaseTimes(expected[-1]).renew_at)
    assert renewals_of(table, "a") == expected
    assert lease.renewals == 3
    assert lease.expires_at == instant(expected[-1] + TTL)
    assert table.releases == []  # completed: nothing to release


async def test_a_hanging_renewal_cancels_the_body_strictly_before_expiry(
    autojump_clock: Any,
) -> None:
    async def hang_renewals(table: LeaseTable, key: str, holder: str) -> None:
        if table.holds(key, holder):
            await trio.sleep_forever()

    table = LeaseTable(before_claim=hang_renewals)
    t0 = trio.current_time()
    cancelled_at: list[float] = []
    with pytest.raises(LeaseLostError, match="no renewal landed") as caught:
        async with claim(table, "k", "a"):
            try:
                await trio.sleep_forever()
            finally:
                cancelled_at.append(trio.current_time())
                # Nobody else can hold the lease yet: the gateway still has it as ours.
                assert table.holds("k", "a")
    assert caught.value.key == "k"
    assert cancelled_at == [LeaseTimes(t0).stop_at]
    assert cancelled_at[0] < t0 + TTL == table.rows["k"].expires
    assert cancelled_at[0] == t0 + TTL - GUARD
    assert renewals_of(table, "a") == [t0, t0 + RENEWAL]
    assert table.releases == []  # a lost lease is not ours to release


async def test_a_failed_renewal_cancels_the_body_at_once(autojump_clock: Any) -> None:
    async def fail_renewals(table: LeaseTable, key: str, holder: str) -> None:
        if table.holds(key, holder):
            raise TransientGatewayError(503, None, "claim_work_receipt failed with HTTP 503")

    table = LeaseTable(before_claim=fail_renewals)
    t0 = trio.current_time()
    with pytest.raises(LeaseLostError, match=r"a renewal failed .*TransientGatewayError"):
        async with claim(table, "k", "a"):
            await trio.sleep_forever()
    assert trio.current_time() == LeaseTimes(t0).renew_at


async def test_a_refused_renewal_cancels_the_body(autojump_clock: Any) -> None:
    async def intrude(table: LeaseTable, key: str, holder: str) -> None:
        # A gateway whose clock ran fast handed the lease to someone else.
        if table.holds(key, holder):
            table.rows[key].holder = "intruder"

    table = LeaseTable(before_claim=intrude)
    t0 = trio.current_time()
    with pytest.raises(LeaseLostError, match="refused: 'intruder' holds it"):
        async with claim(table, "k", "a"):
            await trio.sleep_forever()
    assert trio.current_time() == t0 + RENEWAL


async def test_a_completion_fenced_by_another_holder_raises_lease_lost(
    autojump_clock: Any,
) -> None:
    table = LeaseTable()
    with pytest.raises(LeaseLostError, match="took the lease over"):
        async with claim(table, "k", "a") as lease:
            table.rows["k"].holder = "intruder"
            await lease.complete(1)
    assert table.rows["k"].receipt is None


async def test_claiming_a_held_key_raises_lease_held_with_holder_and_expiry(
    autojump_clock: Any,
) -> None:
    table = LeaseTable()
    t0 = trio.current_time()
    async with claim(table, "k", "a"):
        with pytest.raises(LeaseHeldError) as caught:
            await acquire_lease(table, "k", "b")
    assert (caught.value.key, caught.value.holder) == ("k", "a")
    assert caught.value.expires_at == instant(t0 + TTL)


async def test_claiming_a_completed_key_raises_receipt_completed(autojump_clock: Any) -> None:
    table = LeaseTable()
    async with claim(table, "k", "a") as lease:
        await lease.complete({"n": 1})
    with pytest.raises(ReceiptCompletedError) as caught:
        await acquire_lease(table, "k", "b")
    assert caught.value.receipt.result == {"n": 1}


async def test_a_body_error_releases_the_lease_and_comes_out_as_itself(
    autojump_clock: Any,
) -> None:
    table = LeaseTable()
    with pytest.raises(ValueError, match="provider said no"):
        async with claim(table, "k", "a"):
            await trio.sleep(1)
            raise ValueError("provider said no")
    assert [(key, holder) for _t, key, holder in table.releases] == [("k", "a")]
    assert table.rows["k"].holder is None
    async with claim(table, "k", "b"):  # taken at once, no wait for expiry
        pass


async def test_a_cancelled_block_still_releases_its_lease(autojump_clock: Any) -> None:
    table = LeaseTable()
    with trio.move_on_after(5) as scope:
        async with claim(table, "k", "a"):
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert table.rows["k"].holder is None
    assert len(table.releases) == 1


async def test_once_waits_for_the_holders_receipt(autojump_clock: Any) -> None:
    table = LeaseTable()
    calls: list[str] = []

    async def work() -> dict[str, int]:
        calls.append("b")
        return {"by": 2}

    async def holder_a(task_status: trio.TaskStatus[None]) -> None:
        async with claim(table, "k", "a") as lease:
            task_status.started()
            await trio.sleep(5)
            await lease.complete({"by": 1})

    async with trio.open_nursery() as nursery:
        await nursery.start(holder_a)
        t0 = trio.current_time()
        result, reused = await run_once(table, "k", "b", work)
    assert (result, reused, calls) == ({"by": 1}, True, [])
    assert renewals_of(table, "b") == [t0, t0 + POLL, t0 + 2 * POLL, t0 + 3 * POLL]


async def test_once_takes_over_an_expired_lease(autojump_clock: Any) -> None:
    table = LeaseTable()
    await table.claim("k", "crashed", "t-crashed")  # a holder that died without releasing
    expired_at = table.rows["k"].expires
    assert expired_at is not None
    started: list[float] = []

    async def work() -> str:
        started.append(trio.current_time())
        return "fresh"

    assert await run_once(table, "k", "b", work) == ("fresh", False)
    assert len(started) == 1 and started[0] >= expired_at
    assert table.rows["k"].receipt is not None


async def test_once_gives_up_after_its_wait_budget_on_a_live_holder(autojump_clock: Any) -> None:
    table = LeaseTable()

    async def never() -> None:
        raise AssertionError("fn must not run while another holder is alive")

    async with trio.open_nursery() as nursery:

        async def holder_a(task_status: trio.TaskStatus[None]) -> None:
            async with claim(table, "k", "a"):
                task_status.started()
                await trio.sleep_forever()

        await nursery.start(holder_a)
        t0 = trio.current_time()
        with pytest.raises(LeaseHeldError):
            await run_once(table, "k", "b", never)
        assert trio.current_time() == t0 + WAIT
        nursery.cancel_scope.cancel()


async def test_once_waiting_on_another_holder_says_so_once(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    table = LeaseTable()
    await table.claim("k", "crashed", "t-crashed")  # a holder that died without releasing
    expires = table.rows["k"].expires
    assert expires is not None

    async def work() -> str:
        return "fresh"

    with caplog.at_level(logging.WARNING, logger="sheetplane.runtime"):
        assert await run_once(table, "k", "b", work) == ("fresh", False)
    assert len(renewals_of(table, "b")) > 100  # polled all the way to the expiry...
    # ...and said so once, naming the holder, the expiry and the longest wait.
    assert [r.getMessage() for r in caplog.records] == [
        f"a work receipt is leased by 'crashed' until {instant(expires).isoformat()}: once "
        f"waits for its receipt or the lease's expiry, at most {WAIT:.1f} s "
        "(WORK_RECEIPT_ONCE_WAIT_MS)"
    ]


async def test_once_runs_fn_once_and_reuses_its_result(autojump_clock: Any) -> None:
    table = LeaseTable()
    calls = 0

    async def work() -> int:
        nonlocal calls
        calls += 1
        return 42

    assert await run_once(table, "k", "a", work) == (42, False)
    assert await run_once(table, "k", "b", work) == (42, True)
    assert calls == 1


async def test_a_claim_cancelled_before_its_answer_is_released(autojump_clock: Any) -> None:
    async def slow_answer(table: LeaseTable, key: str, holder: str) -> None:
        assert table.holds(key, holder)  # the claim landed...
        await trio.sleep(10)  # ...but its answer comes after the caller gave up

    table = LeaseTable(after_claim=slow_answer)
    with trio.move_on_after(1):
        await acquire_lease(table, "k", "a")
    assert [(key, holder) for _t, key, holder in table.releases] == [("k", "a")]
    assert table.rows["k"].holder is None  # the next holder need not wait for the expiry


@attrs.define
class DetachedGateway:
    """``table`` behind a gateway that finishes a claim whose caller has left (as the
    reference gateway does): each claim is served in ``server``'s nursery and lands
    ``claim_delay(holder)`` seconds after it was sent, whether or not anyone still
    waits for its answer. Completions and releases are served at once."""

    table: LeaseTable
    server: trio.Nursery
    claim_delay: Callable[[LeaseTable, str, str], float]

    async def claim(self, key: str, holder: str, lease_token: str) -> ReceiptClaim:
        answered = trio.Event()
        answers: list[ReceiptClaim] = []
        delay = self.claim_delay(self.table, key, holder)

        async def serve() -> None:
            await trio.sleep(delay)
            answers.append(await self.table.claim(key, holder, lease_token))
            answered.set()

        self.server.start_soon(serve)
        await answered.wait()
        return answers[0]

    async def complete(
        self, key: str, result: Any, holder: str, lease_token: str
    ) -> ReceiptCompletion:
        return await self.table.complete(key, result, holder, lease_token)

    async def release(self, key: str, holder: str, lease_token: str) -> bool:
        return await self.table.release(key, holder, lease_token)


async def test_a_claim_landing_after_its_caller_left_is_still_released(
    autojump_clock: Any,
) -> None:
    # The demo's receipts stall: a map stopped while a claim was in flight sent its
    # release at once; the gateway ran the release first (no lease yet), then the
    # claim, which held the key for a whole TTL against the rerun.
    table = LeaseTable()
    async with trio.open_nursery() as server:
        gateway = DetachedGateway(table, server, lambda _t, _k, _h: 10.0)
        t0 = trio.current_time()
        with trio.move_on_after(1) as stop:
            await acquire_lease(gateway, "k", "a")
        assert stop.cancelled_caught
        returned_at = trio.current_time()
    # Every claim sent has landed: the key is free, and the next holder takes it at once.
    assert table.rows["k"].holder is None
    async with claim(table, "k", "b"):
        pass
    # The cut-short claim was given its answer (10 s, within the release's bound), and
    # only then released.
    assert returned_at == t0 + 10
    assert [t for t, _key, holder in table.releases if holder == "a"] == [t0 + 10]


async def test_a_cut_short_claim_waits_for_its_answer_only_a_release_timeout(
    autojump_clock: Any,
) -> None:
    table = LeaseTable()
    async with trio.open_nursery() as server:
        gateway = DetachedGateway(table, server, lambda _t, _k, _h: math.inf)
        t0 = trio.current_time()
        with trio.move_on_after(1) as stop:
            await acquire_lease(gateway, "k", "a")
        assert stop.cancelled_caught
        assert trio.current_time() == t0 + 1 + RELEASE_TIMEOUT
        assert [(key, holder) for _t, key, holder in table.releases] == [("k", "a")]
        server.cancel_scope.cancel()


async def test_a_renewal_in_flight_when_the_block_ends_is_released_after_it_lands(
    autojump_clock: Any,
) -> None:
    def slow_renewals(table: LeaseTable, key: str, holder: str) -> float:
        return 10.0 if table.holds(key, holder) else 0.0

    table = LeaseTable()
    async with trio.open_nursery() as server:
        gateway = DetachedGateway(table, server, slow_renewals)
        t0 = trio.current_time()
        lease = await acquire_lease(gateway, "k", "a")
        async with hold_lease(lease):
            await trio.sleep(RENEWAL + 1)  # the renewal sent at RENEWAL lands at RENEWAL + 10
        assert trio.current_time() == t0 + RENEWAL + 10
    assert [t for t, _key, _holder in table.releases] == [t0 + RENEWAL + 10]
    assert table.rows["k"].holder is None
