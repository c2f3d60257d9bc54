"""A fair queue per org for mints that wait for room in the org's connection budget.

The budget is kept by construction (``_roles.create_session_role``): the
connection limits of an org's live roles never add up to more than the
budget. A mint that does not fit waits here instead of being refused at
once: one queue per org, first come first served (``trio.Lock`` hands over
in arrival order), whose head tries again every ``DB_SESSION_MINT_POLL_MS``
and may reclaim the org's roles that any gateway minted at least
``DB_SESSION_RECLAIM_AFTER_MS`` ago and that hold no connection (a runner's
idle pool closes after ``DB_SESSION_POOL_IDLE_MS``; its runner mints anew on
next use; ``_roles.create_session_role`` reads them from the session ledger,
so a restarted gateway reclaims its predecessor's idle roles too). A mint
still waiting after ``DB_SESSION_MINT_QUEUE_MS`` (from
when it joined the queue) is refused 429 with ``retry_after_ms``; the client
retries it within its call budget. The queue is one process's: several
gateway processes each queue their own callers, and the budget itself holds
across all of them (the check runs under the org's grant lock).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TypeVar

import attrs
import trio

from ...budgets import (
    DB_SESSION_MINT_POLL_MS,
    DB_SESSION_MINT_QUEUE_MS,
)
from ._roles import SessionCapReachedError

__all__ = ["MintQueues"]

T = TypeVar("T")
_MS: Final = 1000


@attrs.define(eq=False)
class _OrgQueue:
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    waiting: int = 0


@attrs.define(eq=False)
class MintQueues:
    """The mint queues of one gateway process, one per org."""

    orgs: dict[str, _OrgQueue] = attrs.field(factory=dict)
    waits: int = 0
    """Mints that did not fit at once and waited (for tests and metrics)."""

    def _queue(self, org_id: str) -> _OrgQueue:
        queue = self.orgs.get(org_id)
        if queue is None:
            queue = self.orgs[org_id] = _OrgQueue()
        return queue

    async def mint(
        self,
        org_id: str,
        attempt: Callable[[], Awaitable[T]],
    ) -> T:
        """``attempt()`` until it fits the org's connection budget.

        ``attempt`` raises ``SessionCapReachedError``; a refusal for connections
        waits in the org's queue (at most ``DB_SESSION_MINT_QUEUE_MS`` in all),
        any other refusal is raised at once, and so is the last one.
        """
        queue = self._queue(org_id)
        deadline = trio.current_time() + DB_SESSION_MINT_QUEUE_MS / _MS
        refused: SessionCapReachedError | None = None
        queue.waiting += 1
        try:
            async with self._turn(queue, deadline) as turn:
                if not turn:
                    raise SessionCapReachedError(
                        "org", queue.waiting, "mints waiting for room in its DB connection budget"
                    )
                first = True
                while True:
                    try:
                        return await attempt()
                    except SessionCapReachedError as exc:
                        if not exc.connections:
                            raise
                        refused = exc
                    if first:
                        self.waits += 1
                        first = False
                    wake = trio.current_time() + DB_SESSION_MINT_POLL_MS / _MS
                    if wake >= deadline:
                        raise refused
                    await trio.sleep_until(wake)
        finally:
            queue.waiting -= 1

    @asynccontextmanager
    async def _turn(self, queue: _OrgQueue, deadline: float) -> AsyncIterator[bool]:
        """Hold the head of the org's queue (False when the deadline came first)."""
        acquired = False
        with trio.move_on_at(deadline):
            await queue.lock.acquire()
            acquired = True
        if not acquired:
            yield False
            return
        try:
            yield True
        finally:
            queue.lock.release()
