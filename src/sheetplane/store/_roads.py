"""The store's side of the play-level families: work receipts and plays.

``StoreReceipts`` and ``StorePlays`` hold one org's (and play's) share of the
store behind the same signatures the gateway client offers for them
(``pages.WorkReceipts``, ``pages.Plays``): the reference gateway answers those
actions through them, so a change to one of these operations is one signature
that the client, the gateway and the store are all checked against (mypy).
No session role is granted the receipts or plays tables, so a runner reaches
them through the gateway on both strategies; these run on the gateway's own
pool.
"""

from __future__ import annotations

from typing import Any

from .._types import ReceiptClaim, ReceiptCompletion, ResolvedPlay, SheetContract, SheetRef
from ._store import SheetStore

__all__ = ["StorePlays", "StoreReceipts"]


class StoreReceipts:
    """The work receipts of ``org_id``'s play ``play_name``, in ``store``."""

    def __init__(self, store: SheetStore, org_id: str, play_name: str) -> None:
        self._store = store
        self._org_id = org_id
        self._play_name = play_name

    async def claim_work_receipt(
        self, key: str, holder: str, *, lease_token: str | None = None
    ) -> ReceiptClaim:
        return await self._store.claim_work_receipt(
            self._org_id, self._play_name, key, holder, lease_token=lease_token
        )

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
        return await self._store.complete_work_receipt(
            self._org_id,
            self._play_name,
            key,
            result,
            run_id,
            run_attempt=run_attempt,
            holder=holder,
            lease_token=lease_token,
        )

    async def release_work_receipt(self, key: str, holder: str, lease_token: str | None) -> bool:
        return await self._store.release_work_receipt(
            self._org_id, self._play_name, key, holder, lease_token
        )


class StorePlays:
    """The play-level operations of ``org_id``'s play ``play_name``, in ``store``: its
    sheets' layout and the org's play registry."""

    def __init__(self, store: SheetStore, org_id: str, play_name: str) -> None:
        self._store = store
        self._org_id = org_id
        self._play_name = play_name

    async def ensure_sheet(self, table_namespace: str, contract: SheetContract) -> None:
        sheet = SheetRef(self._org_id, self._play_name, table_namespace)
        await self._store.ensure_sheet(sheet, contract)

    async def resolve_play(self, play_ref: str) -> ResolvedPlay | None:
        return await self._store.resolve_play(self._org_id, play_ref)

    async def register_play(self, play: ResolvedPlay, *, name: str | None = None) -> None:
        await self._store.register_play(self._org_id, play, name=name)
