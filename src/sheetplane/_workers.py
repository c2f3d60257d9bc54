"""``Runtime.map_attempt``: one worker of an attempt that any number of workers map.

::

    report = await rt.map_attempt(attempt, contract, fn, concurrency=16, ...)

:func:`run_attempt` is the worker, free of the runtime (the virtual-time tests
drive it with a model of the store's shares). It is :func:`run_map` (the map
loop: ``concurrency`` fn calls, batched fenced writes, supersession) over an
iterator of rows that claims shares as the map asks for rows:

* The iterator claims a share (``ShareRoad.claim``: up to
  ``SHARE_ROUNDS * concurrency`` rows under a lease, and twice the last claim's
  rows after a whole share went out to the calls in under
  ``SHARE_GROW_BELOW_MS``, up to ``SHARE_MAX_ROWS``: fast calls pay a claim, a
  read and a release for more rows), reads the share's rows
  that are still unsettled (a share taken over from a dead worker holds only the
  rows it had not written) and hands them out one by one. A task claims and
  reads the next share (``SHARE_PREFETCH_SHARES``: one) once the rows left would
  go out in under ``SHARE_PREFETCH_LEAD`` times the last claim and read took, so
  the calls find its rows there when the current ones run out; the share ahead is
  held (renewed, given back on the way out) like any other. A claim cancelled in
  flight waits for its answer (shielded, bounded) so the share it names is given
  back too.
* A share is released *finished* as soon as every row handed out of it has
  been written (the writes report their rows back here), by a task of the
  worker's (shielded, bounded), so the write that settled it frees its slot at
  once; a release that does not land is counted (``unreleased``) and logged, and
  the share's lease ends instead. The store marks it done only when none of its
  rows is left unsettled.
* When there is nothing left to claim but other workers still hold shares,
  the iterator asks again every ``ShareLease.poll_ms`` (or when the first of
  them would expire, if sooner): a worker that dies leaves its shares to the
  workers still running. The worker ends when no share of the attempt is held
  but its own, and its own are written.
* One *keeper* task renews every held share ``renewal_ms`` after its last claim
  or renewal landed, each renewal a task of its own bounded by the share's stop
  time (a slow renewal of one share delays no other's). The map runs
  in a cancel scope whose deadline is the earliest stop time of the shares held
  (``LeaseTimes``: the sent instant plus the TTL, less the guard, strictly
  before the store's expiry); a renewal that lands moves it on. A renewal
  refused (``lost``), or none landing in time, cancels the map at once (every
  fn call, every write not yet sent); the worker gives its other shares back
  and starts again, claiming afresh, if that round wrote anything, and raises
  ``LeaseLostError`` if it did not (it cannot keep a lease at all).
* A claim or renewal that finds a newer admission (``superseded``) cancels the
  map the same way and raises ``AttemptSupersededError``; a write that finds one
  does so inside ``run_map``, which cancels every fn call before it raises.

On leaving by an error or cancellation, the shares still held are released
unfinished (shielded, bounded), so other workers take them at once instead of
after their leases end; on supersession there is nothing left to take.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, Protocol

import attrs
import trio

from ._attempts import Attempt, ShareClaim, ShareLease
from ._groups import raise_single
from ._leases import LeaseTimes
from ._map import (
    CompleteWrite,
    FailWrite,
    MapFn,
    MapProgress,
    Once,
    OutputKeys,
    UnknownOutputs,
    receipt_key,
    run_map,
)
from ._types import CompleteRow, FailRow, TerminalWriteResult, new_lease_token
from .budgets import (
    SHARE_GROW_BELOW_MS,
    SHARE_MAX_ROWS,
    SHARE_PREFETCH_LEAD,
    SHARE_ROUNDS,
    WORK_RECEIPT_RELEASE_TIMEOUT_MS,
)
from .errors import AttemptSupersededError, LeaseLostError, SheetplaneError
from .pages import ShareRoad

__all__ = ["AttemptTally", "ShareOnce", "run_attempt", "share_rows"]

Row = dict[str, Any]
_MS: Final = 1000
log = logging.getLogger("sheetplane.runtime")


class ShareOnce(Protocol):
    """``ReceiptRecorder.once_reused`` under a given holder and lease token."""

    def __call__(
        self, key: str, fn: Callable[[], Awaitable[Any]], *, holder: str, lease_token: str
    ) -> Awaitable[tuple[Any, bool]]: ...


def share_rows(concurrency: int) -> int:
    """Rows a worker claims at a time: ``SHARE_ROUNDS`` rounds of its calls."""
    return max(1, min(SHARE_MAX_ROWS, SHARE_ROUNDS * concurrency))


def superseded(attempt: Attempt) -> AttemptSupersededError:
    """The error of a claim or renewal that found a newer admission (no row written)."""
    return AttemptSupersededError(
        attempt.table_namespace, attempt.run_id, attempt.write_version, 0, ()
    )


@attrs.define(eq=False)
class _Held:
    """One share this worker holds."""

    claim: ShareClaim
    token: str = attrs.field(repr=False)
    times: LeaseTimes
    read_all: bool = False
    """Every row of it has been handed to the map."""
    outstanding: int = 0
    """Rows handed to the map whose write has not landed."""
    renewing: bool = False
    """A renewal of it is in flight."""

    @property
    def number(self) -> int:
        assert self.claim.share is not None
        return self.claim.share


@attrs.define
class AttemptTally:
    """What one worker did, for its report and for tests."""

    rows: int = 0
    """Rows handed to this worker's fn calls."""
    shares: int = 0
    """Shares it claimed."""
    taken_over: int = 0
    """Of those, shares another worker had held before."""
    renewals: int = 0
    """Renewals that landed."""
    completed: int = 0
    """Rows it wrote enriched."""
    failed: int = 0
    """Rows it wrote failed."""
    reused: int = 0
    """Rows whose outputs came from a receipt."""
    lost: int = 0
    """Rounds that lost a share's lease and started again."""
    ahead: int = 0
    """Shares claimed and read while the calls still took rows from the one before."""
    unreleased: int = 0
    """Settled shares whose release did not land (each waits out its lease instead)."""


@attrs.define(eq=False)
class _Ahead:
    """The next share, claimed and read by a task while the current one's rows go out."""

    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    share: tuple[_Held, Sequence[Row]] | None = None
    error: Exception | None = None


@attrs.define(eq=False)
class _Worker:
    attempt: Attempt
    shares: ShareRoad
    rows_of: Callable[[ShareClaim], Awaitable[Sequence[Row]]]
    lease: ShareLease
    max_rows: int
    holder: str
    concurrency: int = 1
    held: dict[int, _Held] = attrs.Factory(dict)
    by_key: dict[str, _Held] = attrs.Factory(dict)
    by_receipt: dict[str, _Held] = attrs.Factory(dict)
    tally: AttemptTally = attrs.Factory(AttemptTally)
    error: BaseException | None = None
    body: trio.CancelScope | None = None
    changed: trio.Event = attrs.Factory(trio.Event)
    tasks: trio.Nursery | None = None
    """Where the claim ahead and the releases of settled shares run (inside ``body``)."""
    ahead: _Ahead | None = None
    releasing: int = 0
    """Settled shares whose release is in flight."""
    released: trio.Event = attrs.Factory(trio.Event)
    fetched_in: float = 0.0
    claim_sent: float = 0.0
    """Seconds the last claim (its last request) and read of a share took."""

    # --- lease keeping ------------------------------------------------------------

    def _times(self, sent: float) -> LeaseTimes:
        lease = self.lease
        return LeaseTimes(sent, lease.ttl_ms / _MS, lease.renewal_ms / _MS, lease.guard_ms / _MS)

    def _deadline(self) -> None:
        """The map's deadline: the earliest stop time of the shares held."""
        if self.body is not None:
            self.body.deadline = min(
                (h.times.stop_at for h in self.held.values()), default=math.inf
            )
        self.changed.set()
        self.changed = trio.Event()

    def receipt_claim(self, held: _Held) -> tuple[str, str]:
        """The holder and lease token under which a share's rows claim their receipts:
        the share's own, the same for whoever holds it, so a worker that takes a dead
        worker's share over takes the leases of its receipts over at once. The token
        is derived, not secret: the share's lease, not the receipt's, keeps two
        workers off one row, and a receipt's completion needs no lease."""
        a = self.attempt
        holder = f"share:{a.table_namespace}@{a.write_version}/{held.number}"
        material = f"sheetplane/share-receipts/{a.to_json()}/{held.number}".encode()
        return holder, hashlib.sha256(material).hexdigest()

    async def once(
        self, key: str, call: Callable[[], Awaitable[Any]], run: ShareOnce
    ) -> tuple[Any, bool]:
        """``once`` of one row's call under its share's receipt claim."""
        held = self.by_receipt.get(key)
        if held is None:  # not a row of a share this worker holds: never handed out
            raise LeaseLostError(key, "the row is in no share this worker holds", "share")
        holder, token = self.receipt_claim(held)
        return await run(key, call, holder=holder, lease_token=token)

    def key(self, held: _Held) -> str:
        """A share's name in errors: ``namespace@version/share``."""
        a = self.attempt
        return f"{a.table_namespace}@{a.write_version}/{held.number}"

    def halt(self, error: BaseException) -> None:
        """Stop the map at once with ``error`` (the first one wins)."""
        if self.error is None:
            self.error = error
        if self.body is not None:
            self.body.cancel()

    async def keep(self, nursery: trio.Nursery) -> None:
        """Renew each held share on its own schedule, each renewal a task of its own
        (a slow renewal of one share delays no other's); halt the map when one cannot be."""
        while True:
            waiting = [h for h in self.held.values() if not h.renewing]
            if not waiting:
                await self.changed.wait()
                continue
            due = min(waiting, key=lambda h: h.times.renew_at)
            with trio.move_on_at(due.times.renew_at):
                await self.changed.wait()
                continue  # the held shares changed: look again
            if self.held.get(due.number) is due:
                due.renewing = True
                nursery.start_soon(self.renew, due)

    async def renew(self, due: _Held) -> None:
        """One renewal of ``due``, bounded by its stop time."""
        a = self.attempt
        sent = trio.current_time()
        renewal = None
        try:
            with trio.move_on_at(due.times.stop_at):
                try:
                    renewal = await self.shares.renew(
                        a.write_version, due.number, due.token, ttl_ms=self.lease.ttl_ms
                    )
                except SheetplaneError as exc:
                    self.halt(LeaseLostError(self.key(due), f"a renewal failed: {exc}", "share"))
                    return
        finally:
            due.renewing = False
        if self.held.get(due.number) is not due:
            return  # released meanwhile
        if renewal is None:
            self.halt(
                LeaseLostError(
                    self.key(due), "no renewal landed before the lease would expire", "share"
                )
            )
        elif renewal.outcome == "superseded":
            self.halt(superseded(a))
        elif renewal.outcome != "renewed":
            self.halt(LeaseLostError(self.key(due), "a renewal was refused", "share"))
        else:
            due.times.renewed(sent)
            self.tally.renewals += 1
            self._deadline()

    # --- claims and releases ------------------------------------------------------

    async def claim(self) -> ShareClaim | None:
        """The next share to map, or None when the attempt has none left for this worker."""
        a = self.attempt
        while True:
            token = new_lease_token()
            sent = trio.current_time()
            # Cancelled while in flight (the claim ahead often is), a claim waits for its
            # answer, shielded and bounded: the share it names is then held and given
            # back on the way out. One cut short by the bound may have landed: its
            # share is claimed again once its lease ends.
            claim: ShareClaim | None = None
            with trio.CancelScope(
                shield=True, relative_deadline=WORK_RECEIPT_RELEASE_TIMEOUT_MS / _MS
            ):
                claim = await self.shares.claim(
                    a.write_version,
                    self.holder,
                    token,
                    ttl_ms=self.lease.ttl_ms,
                    max_rows=self.max_rows,
                )
            if claim is None:
                raise LeaseLostError(
                    f"{a.table_namespace}@{a.write_version}",
                    "a claim got no answer in time",
                    "a share of attempt",
                )
            if claim.outcome == "superseded":
                raise superseded(a)
            if claim.outcome == "claimed":
                self.claim_sent = sent
                held = _Held(claim, token, self._times(sent))
                self.held[held.number] = held
                self.tally.shares += 1
                self.tally.taken_over += claim.taken_over
                self._deadline()
                return claim
            if self.releasing:
                # The store counted this worker's shares whose release is in flight
                # as live: once they land, ask again and count exactly.
                await self.releases_landed()
                continue
            others = claim.live - len(self.held)
            if others <= 0:
                return None
            wait = self.lease.poll_ms
            if claim.retry_after_ms is not None:
                wait = min(wait, claim.retry_after_ms + 1)
            await trio.sleep(wait / _MS)

    async def release(self, held: _Held, *, finished: bool) -> None:
        if self.held.get(held.number) is not held:
            return
        self.drop(held)
        await self.shares.release(
            self.attempt.write_version, held.number, held.token, finished=finished
        )

    def drop(self, held: _Held) -> None:
        """Hold ``held`` no more: no renewal, no part of the map's deadline."""
        del self.held[held.number]
        self._deadline()

    def release_settled(self, held: _Held) -> None:
        """Release ``held`` finished (all its rows written) in a task of the worker's, so
        the write that settled it frees its slot at once."""
        if self.held.get(held.number) is not held:
            return
        self.drop(held)
        self.releasing += 1
        assert self.tasks is not None
        self.tasks.start_soon(self.released_finished, held)

    async def released_finished(self, held: _Held) -> None:
        """One settled share's release, shielded and bounded like ``release_all``. One that
        does not land costs the share's lease: the next claim of it finds its rows
        written and marks it done. It is counted and logged, never raised: the rows
        are written, and the map goes on."""
        failure: str | None = "it did not land in time"
        try:
            with trio.CancelScope(
                shield=True, relative_deadline=WORK_RECEIPT_RELEASE_TIMEOUT_MS / _MS
            ):
                await self.shares.release(
                    self.attempt.write_version, held.number, held.token, finished=True
                )
                failure = None
        except SheetplaneError as exc:
            failure = str(exc)
        finally:
            self.releasing -= 1
            if not self.releasing:
                self.released.set()
                self.released = trio.Event()
        if failure is not None:
            self.tally.unreleased += 1
            log.warning(
                "map_attempt: the release of settled share %s failed (%s); its lease ends instead",
                self.key(held),
                failure,
            )

    async def releases_landed(self) -> None:
        while self.releasing:
            await self.released.wait()

    async def run(self, mapping: Callable[[], Awaitable[object]]) -> None:
        """Run ``mapping`` (the round's ``run_map`` over ``rows``) with the shares kept
        beside it, cancelled at the deadline of the shares held or by ``halt``; raise
        the error that halted it, or ``LeaseLostError`` if a lease ran out first."""
        finished = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.keep, nursery)
                try:
                    with trio.CancelScope() as body:
                        self.body = body
                        self._deadline()
                        async with trio.open_nursery() as tasks:
                            self.tasks = tasks
                            await mapping()
                            if self.ahead is not None:  # the map stopped taking rows
                                self.ahead.scope.cancel()
                        finished = True
                finally:
                    self.body = self.tasks = None
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise_single(group)
        finally:
            if self.held and not isinstance(self.error, AttemptSupersededError):
                await self.release_all()
        if self.error is not None:
            raise self.error
        if not finished:
            a = self.attempt
            raise LeaseLostError(
                f"{a.table_namespace}@{a.write_version}",
                "no renewal landed before a share's lease would expire",
                "a share of attempt",
            )

    async def release_all(self) -> None:
        """Give every held share back unfinished (shielded, bounded)."""
        with (
            trio.CancelScope(shield=True, relative_deadline=WORK_RECEIPT_RELEASE_TIMEOUT_MS / _MS),
            contextlib.suppress(SheetplaneError),
        ):
            for held in list(self.held.values()):
                await self.release(held, finished=False)

    # --- the rows --------------------------------------------------------------------

    def settled(self, rows: Sequence[CompleteRow] | Sequence[FailRow]) -> None:
        """Rows whose write landed: release every share all of whose rows are written."""
        for row in rows:
            held = self.by_key.pop(row.key, None)
            if held is None:
                continue
            held.outstanding -= 1
            self.by_receipt.pop(receipt_key(self.attempt.table_namespace, row.key), None)
            if held.read_all and held.outstanding == 0:
                self.release_settled(held)

    def grow(self, rows: int, seconds: float) -> None:
        """After a full share's rows went out to the calls in ``seconds``: the next claim
        asks for twice the rows when that took less than ``SHARE_GROW_BELOW_MS`` (a
        claim, a read and a release a share cost less a row), up to ``SHARE_MAX_ROWS``."""
        if rows >= self.max_rows and seconds * _MS < SHARE_GROW_BELOW_MS:
            self.max_rows = min(SHARE_MAX_ROWS, 2 * self.max_rows)

    async def fetch(self) -> tuple[_Held, Sequence[Row]] | None:
        """Claim the next share and read its unsettled rows; None when none is left."""
        claim = await self.claim()
        if claim is None:
            return None
        held = self.held[claim.share or 0]
        rows = await self.rows_of(claim)
        self.fetched_in = trio.current_time() - self.claim_sent
        return held, rows

    def fetch_ahead(self) -> None:
        """Start claiming and reading the next share in a task (one at a time)."""
        assert self.ahead is None and self.tasks is not None
        self.ahead = _Ahead()
        self.tasks.start_soon(self.fetched_ahead, self.ahead)

    async def fetched_ahead(self, ahead: _Ahead) -> None:
        with ahead.scope:
            try:
                ahead.share = await self.fetch()
            except Exception as exc:  # raised where the calls take rows, as inline
                ahead.error = exc
        ahead.done.set()

    async def taken_ahead(self) -> tuple[_Held, Sequence[Row]] | None:
        """The share fetched ahead, once it is there (its error, if it had one)."""
        ahead = self.ahead
        assert ahead is not None
        await ahead.done.wait()
        self.ahead = None
        if ahead.error is not None:
            raise ahead.error
        if ahead.share is not None:
            self.tally.ahead += 1
        return ahead.share

    def due_ahead(self, paced: int, left: int, elapsed: float) -> bool:
        """Whether ``left`` rows, at the pace ``paced`` rows went out in ``elapsed`` seconds,
        go out in less than ``SHARE_PREFETCH_LEAD`` times the last claim and read took."""
        return paced > 0 and left * elapsed <= SHARE_PREFETCH_LEAD * self.fetched_in * paced

    async def rows(self) -> AsyncIterator[Row]:
        """Every row this worker maps: share after share, until none is left.

        The next share is claimed and read ahead, in a task, once this one's rows left
        would go out in under ``SHARE_PREFETCH_LEAD`` times the last claim and read
        took. The pace is taken over at least one round of calls after the first
        ``concurrency`` rows (those go out at once, to calls that were waiting), and the
        next share's size from the same pace (``grow``)."""
        share = await self.fetch()
        while share is not None:
            held, rows = share
            handing = paced_from = trio.current_time()
            for handed, row in enumerate(rows):
                if handed == self.concurrency:
                    paced_from = trio.current_time()
                elif self.ahead is None and handed >= 2 * self.concurrency:
                    paced, elapsed = handed - self.concurrency, trio.current_time() - paced_from
                    if self.due_ahead(paced, len(rows) - handed, elapsed):
                        self.grow(len(rows), (elapsed / paced) * len(rows))
                        self.fetch_ahead()
                key = row["_key"]
                self.by_key[key] = held
                self.by_receipt[receipt_key(self.attempt.table_namespace, key)] = held
                held.outstanding += 1
                self.tally.rows += 1
                yield row
            if self.ahead is None:
                self.grow(len(rows), trio.current_time() - handing)
                self.fetch_ahead()
            held.read_all = True
            if held.outstanding == 0:
                self.release_settled(held)
            share = await self.taken_ahead()


async def run_attempt(
    attempt: Attempt,
    shares: ShareRoad,
    rows_of: Callable[[ShareClaim], Awaitable[Sequence[Row]]],
    fn: MapFn,
    *,
    complete: CompleteWrite,
    fail: FailWrite,
    concurrency: int,
    batch_rows: int,
    flush_seconds: float,
    lease: ShareLease,
    total: int,
    once: ShareOnce | None = None,
    progress: Callable[[MapProgress], object] | None = None,
    output_keys: OutputKeys | None = None,
    unknown_outputs: UnknownOutputs = "fail",
    tally: AttemptTally | None = None,
) -> tuple[int, int, int, int]:
    """Map ``fn`` over this worker's shares of ``attempt``; ``(rows, completed, failed,
    reused)``. See the module docstring for the rules.

    A round that loses a share's lease (its calls cancelled before the lease could
    end) gives its other shares back and starts again, claiming afresh, as long as
    it wrote a row: the rows written stay written, the rest are claimed again by
    whoever comes first. A round that loses a lease without writing anything
    raises ``LeaseLostError``: the worker cannot keep a lease at all.

    Raises ``AttemptSupersededError`` once a claim, renewal or write finds a newer
    admission; every fn call still running is cancelled and nothing more is written.
    """
    tally = AttemptTally() if tally is None else tally

    async def one_round() -> None:
        """A round: ``run_map`` over the shares a new worker claims."""
        holder = f"worker-{uuid.uuid4().hex}"
        worker = _Worker(
            attempt,
            shares,
            rows_of,
            lease,
            share_rows(concurrency),
            holder=holder,
            concurrency=concurrency,
            tally=tally,
        )
        completed, failed = _settling(worker, tally, complete, fail)
        row_once = None if once is None else _row_once(worker, once, tally)
        report = None if progress is None else _reporter(progress, tally, total)
        await worker.run(
            lambda: run_map(
                worker.rows(),
                fn,
                total=total,
                complete=completed,
                fail=failed,
                concurrency=concurrency,
                batch_rows=batch_rows,
                flush_seconds=flush_seconds,
                once=row_once,
                namespace=attempt.table_namespace,
                progress=report,
                output_keys=output_keys,
                unknown_outputs=unknown_outputs,
            )
        )

    while True:
        written = tally.completed + tally.failed
        try:
            await one_round()
        except LeaseLostError as exc:
            if tally.completed + tally.failed == written:
                raise
            tally.lost += 1
            log.warning("map_attempt: %s; claiming again", exc)
            continue
        return tally.rows, tally.completed, tally.failed, tally.reused


def _settling(
    worker: _Worker,
    tally: AttemptTally,
    complete: CompleteWrite,
    fail: FailWrite,
) -> tuple[CompleteWrite, FailWrite]:
    """A round's terminal writes: each counts its rows and tells the worker they settled."""

    async def completed(rows: Sequence[CompleteRow]) -> TerminalWriteResult:
        result = await complete(rows)
        tally.completed += len(rows)
        worker.settled(rows)
        return result

    async def failed(rows: Sequence[FailRow]) -> TerminalWriteResult:
        result = await fail(rows)
        tally.failed += len(rows)
        worker.settled(rows)
        return result

    return completed, failed


def _reporter(
    progress: Callable[[MapProgress], object], tally: AttemptTally, total: int
) -> Callable[[MapProgress], None]:
    """A round's progress callback: it reports the whole attempt's tally, not the round's."""

    def reported(_: MapProgress) -> None:
        progress(
            MapProgress(
                settled=tally.completed + tally.failed,
                completed=tally.completed,
                failed=tally.failed,
                reused=tally.reused,
                total=total,
            )
        )

    return reported


def _row_once(worker: _Worker, receipts: ShareOnce, tally: AttemptTally) -> Once:
    """A round's ``once``: the worker's receipt of each row's call, counted in the tally."""

    async def row_once(key: str, call: Callable[[], Awaitable[Any]]) -> tuple[Any, bool]:
        result, reused = await worker.once(key, call, receipts)
        tally.reused += reused
        return result, False  # counted here: a round's count would not outlive it

    return row_once
