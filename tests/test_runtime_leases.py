"""Leases and ``once`` through the runtime, on both strategies, against real Postgres and
the reference gateway: a held key refused to a second runtime with its holder and
expiry, completion then ``ReceiptCompletedError``, release on error, renewals moving
the gateway's expiry, a stale holder's completion fenced (409), and ``once``
running its work once across runtimes, concurrently too."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.lowlevel
from psycopg import sql

from _runtime_helpers import ORG, ROADS, CountingGateway, counting_gateway, new_play, runtime
from sheetplane import LeaseHeldError, LeaseLostError, ReceiptCompletedError
from sheetplane._leases import ReceiptBackend, acquire_lease, hold_lease
from sheetplane._types import ReceiptClaim, ReceiptCompletion
from sheetplane.budgets import WORK_RECEIPT_LEASE_TTL_MS
from sheetplane.errors import WorkReceiptFencedError
from sheetplane.gateway.client import GatewayClient
from sheetplane.runtime import Strategy


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def fresh_key() -> str:
    return f"work-{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_held_key_is_refused_then_completed_once(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play, key = new_play(), fresh_key()
    async with (
        runtime(gateway, strategy, play=play, run_id="run-1") as first,
        runtime(gateway, strategy, play=play, run_id="run-2") as second,
    ):
        async with first.receipts().claim(key) as lease:
            assert lease.key == key and lease.holder.startswith("run-1:")
            ttl = dt.timedelta(milliseconds=WORK_RECEIPT_LEASE_TTL_MS)
            assert lease.expires_at is not None
            assert dt.datetime.now(dt.UTC) < lease.expires_at <= dt.datetime.now(dt.UTC) + ttl
            with pytest.raises(LeaseHeldError) as held:
                async with second.receipts().claim(key):
                    raise AssertionError("a held key must not run a second body")
            assert (held.value.holder, held.value.expires_at) == (lease.holder, lease.expires_at)
            completion = await lease.complete({"sent": 1})
        assert completion.completion_disposition == "persisted"
        with pytest.raises(ReceiptCompletedError) as done:
            async with second.receipts().claim(key):
                raise AssertionError("a completed key must not run a body")
    assert done.value.receipt.result == {"sent": 1}
    assert done.value.receipt.run_id == "run-1"


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_body_error_releases_the_lease_for_the_next_holder(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play, key = new_play(), fresh_key()
    async with (
        runtime(gateway, strategy, play=play, run_id="run-1") as first,
        runtime(gateway, strategy, play=play, run_id="run-2") as second,
    ):
        with pytest.raises(ValueError, match="provider refused"):
            async with first.receipts().claim(key):
                raise ValueError("provider refused")
        async with second.receipts().claim(key) as lease:  # no wait for the expiry
            await lease.complete("second")
        assert await first.receipts().once(key, _never) == "second"


async def _never() -> None:
    raise AssertionError("the work is done: once must not call fn")


@pytest.mark.parametrize("strategy", ROADS)
async def test_once_runs_the_work_once_across_concurrent_runtimes(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play, key = new_play(), fresh_key()
    calls: list[str] = []
    results: dict[str, object] = {}

    async def work_of(run_id: str) -> dict[str, str]:
        calls.append(run_id)
        await trio.lowlevel.checkpoint()
        return {"by": run_id}

    async def run(run_id: str) -> None:
        async with runtime(gateway, strategy, play=play, run_id=run_id) as rt:
            results[run_id] = await rt.receipts().once(key, lambda: work_of(run_id))

    async with trio.open_nursery() as nursery:
        for run_id in ("run-1", "run-2", "run-3"):
            nursery.start_soon(run, run_id)
    assert len(calls) == 1
    assert results == {run_id: {"by": calls[0]} for run_id in ("run-1", "run-2", "run-3")}


class RenewalsSeen:
    """The runtime's receipt backend, setting ``renewed`` once two renewals landed."""

    def __init__(self, backend: ReceiptBackend) -> None:
        self._backend = backend
        self.claims = 0
        self.renewed = trio.Event()

    async def claim(self, key: str, holder: str, lease_token: str) -> ReceiptClaim:
        claim = await self._backend.claim(key, holder, lease_token)
        self.claims += 1
        if self.claims == 3:
            self.renewed.set()
        return claim

    async def complete(
        self, key: str, result: Any, holder: str, lease_token: str
    ) -> ReceiptCompletion:
        return await self._backend.complete(key, result, holder, lease_token)

    async def release(self, key: str, holder: str, lease_token: str) -> bool:
        return await self._backend.release(key, holder, lease_token)


async def test_renewals_move_the_gateways_expiry(gateway: CountingGateway) -> None:
    play, key = new_play(), fresh_key()
    async with runtime(gateway, "gateway_only", play=play) as rt:
        backend = RenewalsSeen(rt.receipts()._backend)
        lease = await acquire_lease(backend, key, "renewing-holder")
        first_expiry = lease.expires_at
        assert first_expiry is not None
        lease._times.renewal = 0.05  # renew every 50 ms instead of every 77 s
        with trio.fail_after(10):
            async with hold_lease(lease):
                await backend.renewed.wait()
                await lease.complete("renewed")
        assert lease.renewals == 2
        assert lease.expires_at is not None and lease.expires_at > first_expiry


async def test_a_stale_holders_completion_is_fenced(gateway: CountingGateway) -> None:
    key = fresh_key()
    async with GatewayClient(gateway.base_url, gateway.token, play_name=new_play()) as client:
        claim = await client.claim_work_receipt(key, "holder-a")
        assert claim.acquired and claim.holder == "holder-a" and claim.receipt is None
        refused = await client.claim_work_receipt(key, "holder-b")
        assert (refused.acquired, refused.holder) == (False, "holder-a")
        assert refused.expires_at == claim.expires_at
        with pytest.raises(WorkReceiptFencedError, match="claimed by another holder"):
            await client.complete_work_receipt(key, "late", "run-b", holder="holder-b")
        done = await client.complete_work_receipt(
            key, "mine", "run-a", holder="holder-a", lease_token=claim.lease_token
        )
        assert done.completion_disposition == "persisted"
        after = await client.claim_work_receipt(key, "holder-b")
        assert not after.acquired and after.receipt is not None and after.receipt.result == "mine"
        assert claim.lease_token is not None
        # Completed: nothing held.
        assert not await client.release_work_receipt(key, "holder-a", claim.lease_token)


async def test_a_lease_taken_over_fails_the_late_completion_as_lost(
    gateway: CountingGateway,
) -> None:
    play, key = new_play(), fresh_key()
    async with runtime(gateway, "gateway_only", play=play) as rt:
        with pytest.raises(LeaseLostError, match="took the lease over"):
            async with rt.receipts().claim(key) as lease:
                # Another holder takes the lease over (as if ours had expired).
                store = gateway.state.store
                names = await store._receipt_names(ORG, play)
                usurp = sql.SQL("UPDATE {} SET claim_holder = 'usurper' WHERE key = %s")
                statement = usurp.format(names.ident("receipts_table"))
                await store.pool.run(lambda conn: conn.execute(statement, (key,)))
                await lease.complete("too late")
