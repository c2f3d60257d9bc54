"""A lease table in memory with the store's claim/complete/release rules, on trio's clock.

It stands in for the gateway in the virtual-time tests of the lease keeper:
the server's clock is ``trio.current_time()`` (a ``MockClock`` there), and a
hook runs before each claim so a test can delay, fail or refuse renewals.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from sheetplane._types import Receipt, ReceiptClaim, ReceiptCompletion
from sheetplane.budgets import WORK_RECEIPT_LEASE_TTL_MS
from sheetplane.errors import WorkReceiptFencedError

EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
TTL = WORK_RECEIPT_LEASE_TTL_MS / 1000


def instant(seconds: float) -> dt.datetime:
    """The wall-clock form of a trio time on the table's clock."""
    return EPOCH + dt.timedelta(seconds=seconds)


@attrs.define
class Row:
    holder: str | None = None
    expires: float | None = None
    receipt: Receipt | None = None
    token: str | None = None


ClaimHook = Callable[["LeaseTable", str, str], Awaitable[None]]


@attrs.define
class LeaseTable:
    """Receipts and leases as the store keeps them, expiring on trio's clock."""

    rows: dict[str, Row] = attrs.Factory(dict)
    claims: list[tuple[float, str, str]] = attrs.Factory(list)
    """Every claim received: (time sent, key, holder)."""
    completions: list[tuple[float, str, str]] = attrs.Factory(list)
    releases: list[tuple[float, str, str]] = attrs.Factory(list)
    before_claim: ClaimHook | None = None
    after_claim: ClaimHook | None = None
    """Runs once a claim took effect, before it is answered (a slow answer)."""

    def holds(self, key: str, holder: str) -> bool:
        row = self.rows.get(key)
        now = trio.current_time()
        return bool(row and row.holder == holder and row.expires is not None and row.expires > now)

    async def claim(self, key: str, holder: str, lease_token: str) -> ReceiptClaim:
        self.claims.append((trio.current_time(), key, holder))
        if self.before_claim is not None:
            await self.before_claim(self, key, holder)
        await trio.lowlevel.checkpoint()
        now = trio.current_time()
        row = self.rows.setdefault(key, Row())
        if row.receipt is not None:
            return ReceiptClaim(False, None, None, row.receipt)
        if (
            row.holder is None
            or (row.holder == holder and row.token == lease_token)
            or (row.expires is not None and row.expires <= now)
        ):
            row.holder, row.expires, row.token = holder, now + TTL, lease_token
            answer = ReceiptClaim(True, holder, instant(row.expires).isoformat(), None, lease_token)
            if self.after_claim is not None:
                await self.after_claim(self, key, holder)
            return answer
        assert row.expires is not None
        return ReceiptClaim(False, row.holder, instant(row.expires).isoformat(), None)

    async def complete(
        self, key: str, result: Any, holder: str, lease_token: str
    ) -> ReceiptCompletion:
        self.completions.append((trio.current_time(), key, holder))
        await trio.lowlevel.checkpoint()
        now = trio.current_time()
        row = self.rows.setdefault(key, Row())
        if row.receipt is not None:
            return ReceiptCompletion(row.receipt, "existing")
        live_other = (
            row.holder is not None
            and (row.holder, row.token) != (holder, lease_token)
            and row.expires is not None
            and row.expires > now
        )
        if live_other:
            raise WorkReceiptFencedError(f"work receipt {key!r} is claimed by another holder")
        row.receipt = Receipt(key, result, holder, instant(now).isoformat())
        row.holder = row.expires = row.token = None
        return ReceiptCompletion(row.receipt, "persisted")

    async def release(self, key: str, holder: str, lease_token: str) -> bool:
        self.releases.append((trio.current_time(), key, holder))
        await trio.lowlevel.checkpoint()
        row = self.rows.get(key)
        if (
            row is None
            or row.receipt is not None
            or (row.holder, row.token) != (holder, lease_token)
        ):
            return False
        row.holder = row.expires = row.token = None
        return True
