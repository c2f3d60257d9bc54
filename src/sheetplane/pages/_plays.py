"""The play-level operations on either road, behind one interface (``Plays``).

What a runtime does per play rather than per row: ensure one of its sheets
under a contract, and resolve (or register) a play in the org's registry. The
gateway road is the client itself (``GatewayClient``: ``ensure_sheet``,
``resolve_play``, ``register_play``); the store's road is ``store.StorePlays``,
through which the reference gateway answers those actions. Both have these
very signatures (mypy checks them below). Creating tables and reading the
registry are the gateway's: no session role is granted either, so a runner
takes the gateway for them on both strategies (``Runtime.plays``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._types import ResolvedPlay, SheetContract

if TYPE_CHECKING:
    from ..gateway.client import GatewayClient
    from ..store import StorePlays

__all__ = ["Plays"]


class Plays(Protocol):
    """The play-level operations of one play of one org."""

    async def ensure_sheet(self, table_namespace: str, contract: SheetContract) -> None:
        """Create the sheet's tables and any new contract columns (idempotent)."""
        ...

    async def resolve_play(self, play_ref: str) -> ResolvedPlay | None:
        """The org's play whose id, else whose name, is ``play_ref``; None if neither."""
        ...

    async def register_play(self, play: ResolvedPlay, *, name: str | None = None) -> None:
        """Register (or replace) ``play`` in the org, also under ``name``."""
        ...


if TYPE_CHECKING:

    def _both_roads(client: GatewayClient, store: StorePlays) -> tuple[Plays, ...]:
        """mypy's check that the client and the store offer ``Plays`` alike."""
        return client, store
