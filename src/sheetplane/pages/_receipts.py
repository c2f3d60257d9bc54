"""Work receipts on either road, behind one interface (``WorkReceipts``).

A play's work receipts record a unit of work once, under a lease its holder
claims, completes and releases. The gateway road is the client itself
(``GatewayClient``: ``complete_work_receipt``, ``claim_work_receipt``,
``release_work_receipt``); the store's road is ``store.StoreReceipts``, through
which the reference gateway answers those actions. Both have these very
signatures (mypy checks them below). No session role is granted the receipts
tables, so a runner's receipts take the gateway on both strategies
(``Runtime.receipts``); ``runtime/_receipts.py`` calls a ``WorkReceipts`` and
never asks which one it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .._types import ReceiptClaim, ReceiptCompletion

if TYPE_CHECKING:
    from ..gateway.client import GatewayClient
    from ..store import StoreReceipts

__all__ = ["WorkReceipts"]


class WorkReceipts(Protocol):
    """The work receipts of one play (the run is named by each completion)."""

    async def claim_work_receipt(
        self, key: str, holder: str, *, lease_token: str | None = None
    ) -> ReceiptClaim:
        """Take, renew (the same ``holder`` and ``lease_token``) or take over (expired)
        the lease on ``key``; acquired, the answer carries the lease's token."""
        ...

    async def complete_work_receipt(
        self,
        key: str,
        result: Any,
        run_id: str,
        *,
        run_attempt: int | None = None,
        holder: str | None = None,
        lease_token: str | None = None,
    ) -> ReceiptCompletion:
        """Record ``key`` once: ``persisted`` if this call wrote it, else ``existing``
        with the first writer's receipt; fenced by ``holder``'s lease when given."""
        ...

    async def release_work_receipt(self, key: str, holder: str, lease_token: str | None) -> bool:
        """Give up ``holder``'s lease on ``key``; True when it held one with ``lease_token``."""
        ...


if TYPE_CHECKING:

    def _both_roads(client: GatewayClient, store: StoreReceipts) -> tuple[WorkReceipts, ...]:
        """mypy's check that the client and the store offer ``WorkReceipts`` alike."""
        return client, store
