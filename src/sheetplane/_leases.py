"""Leases on work receipts, kept alive by trio while the work runs.

::

    async with hold_lease(backend, key, holder) as lease:   # LeaseHeldError / ReceiptCompletedError
        ...                                                 # cancelled if the lease is lost
        await lease.complete(result)                        # fenced by the lease's token

A lease is taken with one claim, carrying a secret token made here (the
gateway keeps its digest): renewals, the completion and the release present
it, since a holder's name is only a name. A retried claim carries the same
token, so it renews rather than finding itself the holder. Inside the block a keeper task, in the
block's own nursery, renews it every ``WORK_RECEIPT_LEASE_RENEWAL_MS``. The
decisions are plain arithmetic in :class:`LeaseTimes`, over the local instants
the successful claims were *sent*: the gateway started the lease no earlier
than that, so ``sent + TTL`` is a lower bound of the gateway's expiry that
needs no agreement between clocks. The body runs in a cancel scope whose
deadline is ``sent + TTL - WORK_RECEIPT_LEASE_GUARD_MS``, strictly before that
bound; each successful renewal pushes it on. A renewal that is refused (the
lease expired and another holder took it) or fails cancels the body at once;
one that cannot land before the deadline is cut off by it, and the body with
it. Either way the block raises ``LeaseLostError``, and no other holder can
have taken the lease while the body ran.

Leaving the block without a completion (the body raised, was cancelled, or
simply returned) releases the lease, as does a claim cut short before its
answer arrived (it may have landed), shielded and bounded by
``WORK_RECEIPT_RELEASE_TIMEOUT_MS``, so the next holder need not wait for it
to expire; a release that does not land only costs that wait. The gateway
goes on with a request whose caller has left, so a claim (or a renewal) cut
short is first given the same bound to answer: a release sent beside it could
run before the claim's transaction commits, find no lease, and leave the claim
to hold the key for a whole TTL.

:func:`run_once` is ``once``: the receipt's result if the work is done, else
claim, run, complete; while another holder holds the lease it polls every
``WORK_RECEIPT_ONCE_POLL_MS`` for that holder's receipt or the lease's
expiry, for at most ``WORK_RECEIPT_ONCE_WAIT_MS``, and says so once (a
warning naming the holder and the expiry) instead of waiting in silence.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, Protocol

import attrs
import trio

from ._groups import raise_single
from ._types import ReceiptClaim, ReceiptCompletion, new_lease_token
from .budgets import (
    WORK_RECEIPT_LEASE_GUARD_MS,
    WORK_RECEIPT_LEASE_RENEWAL_MS,
    WORK_RECEIPT_LEASE_TTL_MS,
    WORK_RECEIPT_ONCE_POLL_MS,
    WORK_RECEIPT_ONCE_WAIT_MS,
    WORK_RECEIPT_RELEASE_TIMEOUT_MS,
)
from .errors import (
    LeaseHeldError,
    LeaseLostError,
    ReceiptCompletedError,
    SheetplaneError,
    WorkReceiptFencedError,
)

__all__ = ["Lease", "LeaseTimes", "ReceiptBackend", "acquire_lease", "hold_lease", "run_once"]

_MS: Final = 1000

log = logging.getLogger("sheetplane.runtime")


class ReceiptBackend(Protocol):
    """Where receipts and their leases live (the gateway, or a model in tests)."""

    async def claim(self, key: str, holder: str, lease_token: str) -> ReceiptClaim:
        """Take, renew (the same token) or take over the lease on ``key`` for ``holder``."""
        ...

    async def complete(
        self, key: str, result: Any, holder: str, lease_token: str
    ) -> ReceiptCompletion:
        """Record ``result``, fenced by ``holder``'s lease and its token
        (``WorkReceiptFencedError``)."""
        ...

    async def release(self, key: str, holder: str, lease_token: str) -> bool:
        """Give up ``holder``'s lease on ``key`` (its token)."""
        ...


@attrs.define
class LeaseTimes:
    """When a held lease is renewed and when its body must stop, in seconds of the
    local clock (``trio.current_time()``). No I/O: the shell only waits for these."""

    sent_at: float
    """When the last claim that acquired or renewed the lease was sent."""
    ttl: float = WORK_RECEIPT_LEASE_TTL_MS / _MS
    """The lease's length."""
    renewal: float = WORK_RECEIPT_LEASE_RENEWAL_MS / _MS
    """How long after a successful claim the next renewal is sent."""
    guard: float = WORK_RECEIPT_LEASE_GUARD_MS / _MS
    """How long before the expiry bound the body is stopped."""

    @property
    def expires_at(self) -> float:
        """A lower bound of the gateway's expiry: it started the lease after we sent the claim."""
        return self.sent_at + self.ttl

    @property
    def stop_at(self) -> float:
        """The body's deadline unless a renewal lands: strictly before ``expires_at``."""
        return self.sent_at + self.ttl - self.guard

    @property
    def renew_at(self) -> float:
        """When the next renewal is sent."""
        return self.sent_at + self.renewal

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` was acquired: the lease runs from then."""
        self.sent_at = max(self.sent_at, sent_at)


def _instant(text: str | None) -> dt.datetime | None:
    return None if text is None else dt.datetime.fromisoformat(text)


@attrs.define(eq=False)
class Lease:
    """A held lease on one work receipt, live inside its claim's block."""

    key: str
    """The work receipt's key."""
    holder: str
    """Who holds the lease: unique to this claim."""
    expires_at: dt.datetime | None
    """When the lease expires on the gateway's clock, as of the last renewal."""
    _token: str = attrs.field(repr=False, alias="token", kw_only=True)
    """The lease's secret: renewals, the completion and the release need it."""
    _backend: ReceiptBackend = attrs.field(repr=False, alias="backend", kw_only=True)
    _times: LeaseTimes = attrs.field(repr=False, alias="times", kw_only=True)
    renewals: int = attrs.field(default=0, init=False)
    """Renewals that landed so far."""
    _body: trio.CancelScope | None = attrs.field(default=None, repr=False, init=False)
    _lost: str | None = attrs.field(default=None, repr=False, init=False)
    _completion: ReceiptCompletion | None = attrs.field(default=None, repr=False, init=False)

    @property
    def lost(self) -> bool:
        """Whether the lease was lost (the body is being, or was, cancelled)."""
        return self._lost is not None

    async def complete(self, result: Any) -> ReceiptCompletion:
        """Record ``result`` as the receipt, fenced by this lease's holder.

        Raises ``LeaseLostError`` when the lease was lost, or when the
        gateway finds another holder's live lease on the key (nothing is
        written then). If cancelled, the receipt may or may not be recorded;
        a later claim of the key then finds it completed, or not.
        """
        if self._lost is not None:
            raise LeaseLostError(self.key, self._lost)
        try:
            completion = await self._backend.complete(self.key, result, self.holder, self._token)
        except WorkReceiptFencedError as exc:
            self._lose("another holder took the lease over before the completion landed")
            raise LeaseLostError(self.key, "another holder took the lease over") from exc
        self._completion = completion
        if self._body is not None:
            # The work is recorded: the rest of the block no longer needs the lease.
            self._body.deadline = math.inf
        return completion

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
        if self._body is not None:
            self._body.cancel()


async def _keep(lease: Lease) -> None:
    """Renew ``lease`` on schedule until the block ends; on failure cancel its body."""
    times = lease._times
    while True:
        await trio.sleep_until(times.renew_at)
        if lease._completion is not None:
            return
        sent = trio.current_time()
        try:
            claim = await _claim_settled(
                lease._backend, lease.key, lease.holder, lease._token, deadline=times.stop_at
            )
        except SheetplaneError as exc:
            lease._lose(f"a renewal failed ({type(exc).__name__}: {exc})")
            return
        if lease._completion is not None:
            return
        if claim is None:
            lease._lose("no renewal landed before the lease would expire")
            return
        if not claim.acquired:
            by = "the work was completed" if claim.receipt else f"{claim.holder!r} holds it"
            lease._lose(f"a renewal was refused: {by}")
            return
        times.renewed(sent)
        lease.expires_at = _instant(claim.expires_at)
        lease.renewals += 1
        assert lease._body is not None
        lease._body.deadline = times.stop_at


async def acquire_lease(
    backend: ReceiptBackend, key: str, holder: str, *, lease_token: str | None = None
) -> Lease:
    """Claim ``key`` for ``holder``: a ``Lease`` not yet kept (enter it with ``hold_lease``).

    ``lease_token`` (default: a fresh one) lets a holder that knows an earlier
    claim's token take that lease over at once, live or not (a worker taking
    over a dead worker's share of an attempt, ``sheetplane._workers``).

    Raises ``ReceiptCompletedError`` when the work is done and
    ``LeaseHeldError`` while another holder's lease is live.
    """
    sent = trio.current_time()
    token = new_lease_token() if lease_token is None else lease_token
    try:
        claim = await _claim_settled(backend, key, holder, token)
        assert claim is not None  # no deadline of its own
    except BaseException:
        # Cut short (cancelled, or a lost answer): the claim may have landed, and
        # nobody would release it before it expires. The holder and the token are
        # this call's own, so giving it up is safe whether or not it landed.
        await _release_for(backend, key, holder, token)
        raise
    if claim.receipt is not None:
        raise ReceiptCompletedError(claim.receipt)
    if not claim.acquired:
        raise LeaseHeldError(key, claim.holder, _instant(claim.expires_at))
    return Lease(
        key,
        holder,
        _instant(claim.expires_at),
        token=token,
        backend=backend,
        times=LeaseTimes(sent),
    )


@asynccontextmanager
async def hold_lease(lease: Lease) -> AsyncIterator[Lease]:
    """Keep ``lease`` (from ``acquire_lease``) alive while the block runs.

    The body is cancelled before the lease's expiry if it cannot be renewed,
    and the block then raises ``LeaseLostError``. Leaving without a
    completion releases the lease (shielded, bounded). An error of the body
    comes out as itself, not inside an exception group.
    """
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep, lease)
            body = trio.CancelScope(deadline=lease._times.stop_at)
            try:
                with body:
                    lease._body = body
                    yield lease
            finally:
                # The body's scope is left before the keeper's is cancelled, so a
                # cancellation of the body's own is caught by it, not by the nursery.
                lease._body = None
                nursery.cancel_scope.cancel()
                if body.cancel_called and lease._completion is None:
                    lease._lose("no renewal landed before the lease would expire")
    except BaseExceptionGroup as group:
        raise_single(group)
    finally:
        if lease._completion is None and lease._lost is None:
            await _release(lease)
    if lease._lost is not None:
        raise LeaseLostError(lease.key, lease._lost)


async def _claim_settled(
    backend: ReceiptBackend, key: str, holder: str, token: str, *, deadline: float = math.inf
) -> ReceiptClaim | None:
    """``backend.claim``, or None once ``deadline`` passes first.

    Cancelled while the claim is in flight, it waits for the claim's answer
    before the cancellation goes on (shielded, for at most
    ``WORK_RECEIPT_RELEASE_TIMEOUT_MS`` and never past ``deadline``): the
    gateway finishes a request whose caller has left, so the release that
    follows must be sent after the claim has landed, not beside it.
    """
    call = trio.CancelScope(shield=True, deadline=deadline)
    answered = trio.Event()
    answers: list[ReceiptClaim] = []
    errors: list[Exception] = []

    async def run() -> None:
        with call:
            try:
                answers.append(await backend.claim(key, holder, token))
            except Exception as exc:
                errors.append(exc)
        answered.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            try:
                await answered.wait()
            except trio.Cancelled:
                bound = trio.current_time() + WORK_RECEIPT_RELEASE_TIMEOUT_MS / _MS
                call.deadline = min(call.deadline, bound)
                raise
    except BaseExceptionGroup as group:
        raise_single(group)
    if errors:
        raise errors[0]
    return answers[0] if answers else None


async def _release(lease: Lease) -> None:
    await _release_for(lease._backend, lease.key, lease.holder, lease._token)


async def _release_for(backend: ReceiptBackend, key: str, holder: str, token: str) -> None:
    # Shielded: a cancelled block still gives its lease back; bounded: a release
    # that does not land costs only the wait for the lease to expire.
    with (
        trio.CancelScope(shield=True, relative_deadline=WORK_RECEIPT_RELEASE_TIMEOUT_MS / _MS),
        contextlib.suppress(SheetplaneError),
    ):
        await backend.release(key, holder, token)


async def run_once(
    backend: ReceiptBackend,
    key: str,
    holder: str,
    fn: Callable[[], Awaitable[Any]],
    *,
    lease_token: str | None = None,
) -> tuple[Any, bool]:
    """``once``: ``(result, reused)``. ``reused`` is True when ``fn`` was not called
    because the work was already done (by anyone, in any attempt or process).

    Raises ``LeaseHeldError`` when another holder still holds the lease after
    ``WORK_RECEIPT_ONCE_WAIT_MS`` (it is alive and renewing), ``LeaseLostError``
    when this call's lease was lost while ``fn`` ran (``fn`` was cancelled),
    and whatever ``fn`` raises (the lease is released). If cancelled, ``fn``
    is cancelled and the lease released. The first wait on another holder logs
    one warning (logger ``sheetplane.runtime``) naming that holder, its lease's
    expiry and the longest wait left; the key is not in it (a map's receipt
    keys hold its rows' keys).
    """
    deadline = trio.current_time() + WORK_RECEIPT_ONCE_WAIT_MS / _MS
    waited = False
    while True:
        try:
            lease = await acquire_lease(backend, key, holder, lease_token=lease_token)
        except ReceiptCompletedError as done:
            return done.receipt.result, True
        except LeaseHeldError as held:
            now = trio.current_time()
            if now >= deadline:
                raise
            if not waited:
                waited = True
                log.warning(
                    "a work receipt is leased by %r until %s: once waits for its receipt "
                    "or the lease's expiry, at most %.1f s (WORK_RECEIPT_ONCE_WAIT_MS)",
                    held.holder,
                    held.expires_at.isoformat() if held.expires_at else "an unknown time",
                    deadline - now,
                )
            await trio.sleep_until(min(now + WORK_RECEIPT_ONCE_POLL_MS / _MS, deadline))
            continue
        async with hold_lease(lease):
            result = await fn()
            completion = await lease.complete(result)
        return completion.receipt.result, False
