"""Work receipts for a run, on its receipts road: record once, claim a lease, run once."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from .. import _checks as checks
from .. import _tracing
from .._ints import check_int
from .._leases import Lease, acquire_lease, hold_lease, run_once
from .._types import ReceiptClaim, ReceiptCompletion
from ..errors import InvalidInputError
from ..pages import WorkReceipts

__all__ = ["ReceiptRecorder"]


class _RunReceipts:
    """A receipts road as a lease backend (``sheetplane._leases.ReceiptBackend``) for one
    run."""

    def __init__(self, receipts: WorkReceipts, run_id: str) -> None:
        self._receipts = receipts
        self._run_id = run_id

    async def claim(self, key: str, holder: str, lease_token: str) -> ReceiptClaim:
        # The key is not an attribute: a map's receipt keys hold its rows' keys.
        with _tracing.span("sheetplane.receipt.claim") as span:
            claim = await self._receipts.claim_work_receipt(key, holder, lease_token=lease_token)
            span.set_attribute("sheetplane.receipt.acquired", claim.acquired)
            return claim

    async def complete(
        self, key: str, result: Any, holder: str, lease_token: str
    ) -> ReceiptCompletion:
        return await self._receipts.complete_work_receipt(
            key, result, self._run_id, holder=holder, lease_token=lease_token
        )

    async def release(self, key: str, holder: str, lease_token: str) -> bool:
        return await self._receipts.release_work_receipt(key, holder, lease_token)


class ReceiptRecorder:
    """Records work receipts for the run on its receipts road (``pages.WorkReceipts``).
    Get one with ``Runtime.receipts``.

    ``complete`` records a result once. ``claim`` takes the key's lease and
    keeps it alive while its block runs; ``once`` runs a unit of work at most
    once across attempts and processes. Every claim is a new holder
    (``run_id:`` and a random suffix), so two blocks never share a lease,
    even in one process.

    Cancellation: a cancelled ``complete`` may or may not have been recorded;
    calling it again is safe (the first writer's receipt wins). A cancelled
    ``claim`` block or ``once`` releases its lease (shielded, bounded by
    ``WORK_RECEIPT_RELEASE_TIMEOUT_MS``).
    """

    def __init__(self, receipts: WorkReceipts, run_id: str) -> None:
        self._receipts = receipts
        self._run_id = run_id
        self._backend = _RunReceipts(receipts, run_id)

    async def complete(
        self, key: str, result: Any, *, run_attempt: int | None = None
    ) -> ReceiptCompletion:
        """Record ``key`` once: ``persisted`` if this call wrote it, else ``existing``
        with the first writer's receipt."""
        key = checks.text("key", key)
        checks.json_value("result", result)
        if run_attempt is not None:
            check_int("run_attempt", run_attempt, 0)
        return await self._receipts.complete_work_receipt(
            key, result, self._run_id, run_attempt=run_attempt
        )

    def _holder(self) -> str:
        return f"{self._run_id}:{secrets.token_hex(8)}"

    @asynccontextmanager
    async def claim(self, key: str) -> AsyncIterator[Lease]:
        """``async with recorder.claim(key) as lease:`` hold ``key``'s lease while the block runs.

        Raises ``LeaseHeldError`` (``holder``, ``expires_at``) when another
        holder's lease is live, and ``ReceiptCompletedError`` (``receipt``)
        when the work is done; neither runs the block. Inside, a keeper task
        renews the lease every ``WORK_RECEIPT_LEASE_RENEWAL_MS``; if a
        renewal is refused or cannot land in time, the body is cancelled
        before the lease expires and the block raises ``LeaseLostError``.
        ``await lease.complete(result)`` records the receipt, fenced by the
        lease. Leaving without completing releases the lease.
        """
        key = checks.text("key", key)
        lease = await acquire_lease(self._backend, key, self._holder())
        async with hold_lease(lease):
            yield lease

    async def once(self, key: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``fn`` (``async () -> JSON value``) at most once for ``key`` across attempts
        and processes, and return its result, or the result already recorded.

        While another holder holds the key's lease this waits for that
        holder's receipt (or for the lease to expire, then takes it over),
        polling every ``WORK_RECEIPT_ONCE_POLL_MS`` for at most
        ``WORK_RECEIPT_ONCE_WAIT_MS``; past that it raises ``LeaseHeldError``.
        Its first wait logs one warning (logger ``sheetplane.runtime``) naming the
        holder and the lease's expiry.
        ``fn`` raising releases the lease and propagates; a lost lease raises
        ``LeaseLostError``. If cancelled, ``fn`` is cancelled and the lease released.
        """
        result, _reused = await self.once_reused(key, fn)
        return result

    async def once_reused(
        self,
        key: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        holder: str | None = None,
        lease_token: str | None = None,
    ) -> tuple[Any, bool]:
        """As ``once``, and whether the result was a recorded one (``fn`` not called).

        ``holder`` and ``lease_token`` (both or neither; default: a new holder and
        token per call) name the claim: a share of an attempt claims each row's
        receipt under the share's own, so the worker that takes a dead worker's
        share over takes its receipts' leases over at once, instead of waiting
        ``WORK_RECEIPT_LEASE_TTL_MS`` for them to expire."""
        key = checks.text("key", key)
        if not callable(fn):
            raise InvalidInputError(f"fn must be an async callable, got {fn!r}")
        if (holder is None) != (lease_token is None):
            raise InvalidInputError("holder and lease_token go together (both or neither)")
        if holder is None:
            return await run_once(self._backend, key, self._holder(), fn)
        return await run_once(self._backend, key, holder, fn, lease_token=lease_token)
