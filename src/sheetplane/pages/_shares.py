"""An attempt's shares on either road: one ``ShareRoad`` family, two implementations.

``map_attempt``'s workers claim, renew and release shares of one sheet's attempt
and ask where it stands through a ``ShareRoad``; the worker never asks which
road it is on. The rules are the store's (``store/_shares.py``):

* ``DirectShareRoad`` calls the sheet's share functions on a scoped session
  minted for ``rows.claim``, whose role may only ``EXECUTE`` them: it can claim
  only shares of the sheet's current attempt, and renew or release only a
  share whose token it holds.
* ``GatewayShareRoad`` sends the gateway's ``claim_sheet_share``,
  ``renew_sheet_share``, ``release_sheet_share`` and ``sheet_attempt_status``.

A claim retried after a lost connection (direct road) or a lost answer
(gateway road) may have landed the first time: a share taken under a token
whose answer never arrived stays unworked only until its lease ends, and is
then claimed again. Renewals, releases and status reads are safe to repeat.
"""

from __future__ import annotations

from typing import Final, Protocol, runtime_checkable

from .. import protocol as m
from .._attempts import AttemptStatus, ShareClaim, ShareRenewal
from .._recovery import retry_idempotent
from .._types import SheetRef
from ..gateway.client import GatewayClient
from ..sessions import AccessShape, SessionManager

__all__ = ["DirectShareRoad", "GatewayShareRoad", "ShareRoad"]


@runtime_checkable
class ShareRoad(Protocol):
    """The shares of one sheet's attempts (each call names the attempt's version)."""

    @property
    def actions(self) -> tuple[str, ...]:
        """The gateway actions this road sends (a map probes them before it admits)."""
        ...

    async def claim(
        self, write_version: int, holder: str, token: str, *, ttl_ms: int, max_rows: int
    ) -> ShareClaim:
        """Claim a share of up to ``max_rows`` rows under a lease of ``ttl_ms``."""
        ...

    async def renew(
        self, write_version: int, share: int, token: str, *, ttl_ms: int
    ) -> ShareRenewal:
        """Push a held share's lease ``ttl_ms`` on from now."""
        ...

    async def release(
        self, write_version: int, share: int, token: str, *, finished: bool
    ) -> ShareRenewal:
        """Give a held share up, ``finished`` (its rows written) or not."""
        ...

    async def status(self, write_version: int) -> AttemptStatus:
        """Where the attempt stands."""
        ...


class DirectShareRoad:
    """An attempt's shares through scoped sessions for ``rows.claim``."""

    actions: Final[tuple[str, ...]] = ()

    def __init__(
        self, sessions: SessionManager, sheet: SheetRef, *, user_email: str | None = None
    ) -> None:
        self._sessions = sessions
        self._sheet = sheet
        self._shape = AccessShape(
            table_namespace=sheet.table_namespace,
            operations=("rows.claim",),
            user_email=user_email,
        )

    def __repr__(self) -> str:
        return f"<DirectShareRoad {self._sheet.table_namespace!r}>"

    async def claim(
        self, write_version: int, holder: str, token: str, *, ttl_ms: int, max_rows: int
    ) -> ShareClaim:
        """The sheet's claim function, retried after a lost connection or a session the
        gateway reclaimed (see the module docstring for a claim that landed unanswered)."""

        async def attempt() -> ShareClaim:
            async with self._sessions.store(self._shape) as store:
                return await store.claim_share(
                    self._sheet, write_version, holder, token, ttl_ms=ttl_ms, max_rows=max_rows
                )

        return await retry_idempotent(attempt)

    async def renew(
        self, write_version: int, share: int, token: str, *, ttl_ms: int
    ) -> ShareRenewal:
        """The sheet's renew function, retried after a lost connection."""

        async def attempt() -> ShareRenewal:
            async with self._sessions.store(self._shape) as store:
                return await store.renew_share(
                    self._sheet, write_version, share, token, ttl_ms=ttl_ms
                )

        return await retry_idempotent(attempt)

    async def release(
        self, write_version: int, share: int, token: str, *, finished: bool
    ) -> ShareRenewal:
        """The sheet's release function, retried after a lost connection."""

        async def attempt() -> ShareRenewal:
            async with self._sessions.store(self._shape) as store:
                return await store.release_share(
                    self._sheet, write_version, share, token, finished=finished
                )

        return await retry_idempotent(attempt)

    async def status(self, write_version: int) -> AttemptStatus:
        """The sheet's status function, retried after a lost connection."""

        async def attempt() -> AttemptStatus:
            async with self._sessions.store(self._shape) as store:
                return await store.attempt_status(self._sheet, write_version)

        return await retry_idempotent(attempt)


class GatewayShareRoad:
    """An attempt's shares through the gateway's share actions."""

    actions: Final = (m.action_of(m.ClaimShareRequest),)

    def __init__(self, client: GatewayClient, table_namespace: str) -> None:
        self._client = client
        self._namespace = table_namespace

    def __repr__(self) -> str:
        return f"<GatewayShareRoad {self._namespace!r}>"

    async def claim(
        self, write_version: int, holder: str, token: str, *, ttl_ms: int, max_rows: int
    ) -> ShareClaim:
        """``claim_sheet_share``."""
        return await self._client.claim_share(
            self._namespace, write_version, holder, token, ttl_ms=ttl_ms, max_rows=max_rows
        )

    async def renew(
        self, write_version: int, share: int, token: str, *, ttl_ms: int
    ) -> ShareRenewal:
        """``renew_sheet_share``."""
        return await self._client.renew_share(
            self._namespace, write_version, share, token, ttl_ms=ttl_ms
        )

    async def release(
        self, write_version: int, share: int, token: str, *, finished: bool
    ) -> ShareRenewal:
        """``release_sheet_share``."""
        return await self._client.release_share(
            self._namespace, write_version, share, token, finished=finished
        )

    async def status(self, write_version: int) -> AttemptStatus:
        """``sheet_attempt_status``."""
        return await self._client.attempt_status(self._namespace, write_version)
