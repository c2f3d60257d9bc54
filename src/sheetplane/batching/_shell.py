"""``BoundedBatchFunction``: the trio shell around the scheduling core.

The shell only waits, wakes and cancels; every decision is the core's.

- Callers park with ``trio.lowlevel.wait_task_rescheduled`` and are woken with
  ``reschedule``: one park and one wake per value, no ``Event`` per value.
- Batches run in the batcher's nursery on *batch runner* tasks. A runner takes
  a batch from the core, awaits ``execute`` inside a cancel scope that belongs
  to that batch for as long as it runs, settles the callers, and takes the
  next ready batch in the same step. Before a runner starts a batch it makes
  sure another runner is summoned if more batches are ready, so a slow
  ``execute`` never holds up the others (up to ``max_in_flight_batches``).
  A runner that has woken ``_WAKE_ROUND`` callers (or settled
  ``_SETTLE_ROUND`` values) yields once before its next batch, so the
  callers it woke run in rounds rather than all at once.
  When every caller of a batch has gone, that batch's scope is cancelled;
  the runner then retires with it, so a cancelled scope never touches
  another batch. (Spawning a task and entering a cancel scope per batch
  measured about 10 us per batch on the 2-core development machine: for
  batches of four, most of the ~3 us per value that aiodataloader needs in
  all. The runner gives each batch the same isolation without that cost; see
  docs/benchmarks.md.)
- One scheduler task sleeps until the core's ``next_wakeup`` (a flush or
  value deadline) or until poked by a cancelled caller; it expires wedged
  values, cancels abandoned batches and summons runners.

Exceptions: every ``Exception`` a batch raises is caught and handed to its
callers, so the internal nursery fails only on a ``BaseException`` such as
``KeyboardInterrupt``; that error leaves ``__aexit__`` unwrapped, not inside
an ``ExceptionGroup``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Hashable, Sequence
from types import TracebackType
from typing import Any, Final, Generic, TypeVar

import outcome
import trio

from .. import _tracing
from .._groups import single_error
from .._ints import is_int
from ..errors import (
    BatchContractError,
    BatcherClosedError,
    InvalidInputError,
    LaneWedgedError,
    OversizedValueError,
    ValueCancelledError,
)
from ._core import ADMITTING, DONE, QUEUED, RUNNING, Batch, Entry, SchedulingCore
from ._stats import BatcherStatistics

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")

_NEW: Final = 0
_OPEN: Final = 1
_DRAINING: Final = 2
_CLOSED: Final = 3

_SUCCEEDED: Final = trio.lowlevel.Abort.SUCCEEDED
_reschedule: Final = trio.lowlevel.reschedule
_current_task: Final = trio.lowlevel.current_task
_park: Final = trio.lowlevel.wait_task_rescheduled
_current_time: Final = trio.current_time
_yield_shielded: Final = trio.lowlevel.cancel_shielded_checkpoint
_WAKE_ROUND: Final = 64
"""Callers a runner wakes before it yields once, when more batches are ready.
Values nobody waits for (``submit_nowait``) wake nobody and do not count.

Without it a runner drains a deep lane in one step and wakes every caller of
it in one wave: thousands of parked tasks, each touched twice (woken, then
run) long after it parked, so most of trio's park and wake works out of
cache. A round of 64 keeps each task's wake-up close to its run; the yield
costs one scheduler pass per 64 values. See docs/benchmarks.md."""
_SETTLE_ROUND: Final = 1024
"""Values a runner settles before it yields once, when more batches are ready, even
if it woke nobody (values from ``submit_nowait`` that nobody awaits): a runner whose
``execute`` never checkpoints still lets other tasks run between rounds."""
_INF: Final = math.inf
_TEXT: Final = (str, bytes, bytearray)
"""Sequences that are not a sequence of results."""


class _SharedFailure:
    """One exception settled on every caller of a batch.

    Every caller raises the same exception object, with the traceback
    ``execute`` produced reset before each raise so tracebacks do not pile up
    across callers.
    """

    __slots__ = ("error", "traceback")

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.traceback = error.__traceback__


class Pending(Entry[K, V]):
    """One submitted value as its submitter sees it; ``submit_nowait`` returns it.

    ``done`` turns True once the value is settled, and ``outcome`` is then an
    ``outcome.Outcome``: ``Value`` of its result, or ``Error`` of what
    ``await batcher.submit`` would have raised (``execute``'s exception,
    ``BatchContractError``, ``LaneWedgedError`` when ``max_wait`` passed
    first, ``BatcherClosedError`` when the batcher was torn down,
    ``ValueCancelledError`` after ``cancel()``). A value settles whether or
    not anybody waits for it: a deadline hit by a value nobody awaits settles
    it with ``LaneWedgedError`` at that moment, and it is never executed.

    The same object is the entry the scheduling core keeps (no allocation per
    value beyond it), the abort function of a caller parked in ``submit``, and
    the outcome that wakes it: ``results`` is the finished batch's whole result
    sequence (or a ``_SharedFailure``), shared by every value of the batch;
    each value reads its own slot (``index``).
    """

    __slots__ = ("batcher", "results")

    batcher: BoundedBatchFunction[K, V, Any]
    results: Any

    def __call__(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        """``submit``'s abort function: its caller was cancelled."""
        return self.batcher._abort(self)

    def unwrap(self) -> Any:
        """What ``wait_task_rescheduled`` returns to the woken caller."""
        return self.results

    def __repr__(self) -> str:
        return f"<Pending seq={self.seq} done={self.results is not None}>"

    @property
    def done(self) -> bool:
        """Whether the value is settled (``outcome`` is set)."""
        return self.results is not None

    @property
    def outcome(self) -> outcome.Outcome[Any] | None:
        """The value's ``outcome.Outcome`` once ``done``, else None."""
        results = self.results
        if results is None:
            return None
        if type(results) is _SharedFailure:
            return outcome.Error(results.error)
        return outcome.Value(results[self.index])

    def result(self) -> Any:
        """The settled value's result, or raise its error (what ``wait`` would),
        without waiting; ``trio.WouldBlock`` while it is not ``done``.

        Unlike ``outcome`` this builds nothing: it reads the batch's shared result
        sequence at the value's slot (the cheap way to read many settled values).
        """
        results = self.results
        if results is None:
            raise trio.WouldBlock
        if type(results) is _SharedFailure:
            raise results.error.with_traceback(results.traceback)
        return results[self.index]

    async def wait(self) -> Any:
        """Wait until the value is settled; return its result or raise its error.

        One task at a time may wait (another raises ``trio.BusyResourceError``).
        If cancelled, this stops waiting and nothing else changes: the value
        stays submitted (``cancel()`` withdraws it).
        """
        if self.results is None:
            if self.waiter is not None:
                raise trio.BusyResourceError("another task already waits for this value")
            task = self.waiter = _current_task()

            def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
                if self.waiter is task:
                    self.waiter = None
                return _SUCCEEDED

            await _park(abort)
            self.waiter = None
        else:
            await trio.lowlevel.checkpoint()
        results = self.results
        if type(results) is _SharedFailure:
            raise results.error.with_traceback(results.traceback)
        return results[self.index]

    def cancel(self) -> None:
        """Withdraw the value while it is queued: it is never executed. While its
        batch runs, stop waiting for it: the batch goes on for its other values,
        and when no value of the batch is still waited for, the batch's cancel
        scope is cancelled. Either way the value settles at once with
        ``ValueCancelledError``. Once the value is settled this does nothing.
        """
        if self.results is not None:
            return
        batcher = self.batcher
        batcher._abort(self)
        batcher._settle(
            self, _SharedFailure(ValueCancelledError("the value was cancelled by pending.cancel()"))
        )


def _checked_max_wait(max_wait: object) -> float:
    if isinstance(max_wait, bool) or not isinstance(max_wait, int | float):
        raise InvalidInputError(f"max_wait must be seconds or None, got {max_wait!r}")
    if not 0 <= max_wait < math.inf:
        raise InvalidInputError(f"max_wait must be finite and not negative, got {max_wait!r}")
    return float(max_wait)


class BoundedBatchFunction(Generic[K, V, R]):
    """Batch concurrent ``submit`` calls into bounded ``execute`` calls.

    ``execute(batch)`` receives a ``Batch`` (``batch.key``: the first value's
    key; ``batch.values``: a tuple in submission order) and returns one result
    per value, positionally. Values whose ``key_id(key)`` differ never share a
    batch. Every bound is enforced at once: batch items and estimated bytes,
    retained items and bytes over all lanes (queued plus in flight), concurrent
    ``execute`` calls, the linger of a non-full lane (``flush_seconds``) and
    each value's ``max_wait``.

    Use it as ``async with batcher:``; the block owns the nursery every batch
    runs in. Leaving the block normally drains: no new ``submit`` is accepted,
    every queued value dispatches at once (without waiting for its lane's
    flush timer) and running batches finish. Leaving it by an exception
    (including cancellation) cancels running batches, and every caller still
    waiting gets ``BatcherClosedError``. A batcher is used for one block only.

    Raises ``ValueError`` for a limit below 1 or a negative or non-finite
    ``flush_seconds``, and ``TypeError`` when ``execute``, ``key_id`` or
    ``estimate_bytes`` is not callable.
    """

    def __init__(
        self,
        execute: Callable[[Batch[K, V]], Awaitable[Sequence[R]]],
        *,
        key_id: Callable[[K], Hashable] | None = None,
        estimate_bytes: Callable[[V], int] | None = None,
        max_batch_items: int,
        max_batch_bytes: int,
        max_retained_items: int,
        max_retained_bytes: int,
        max_in_flight_batches: int,
        flush_seconds: float,
    ) -> None:
        if not callable(execute):
            raise TypeError(f"execute must be an async callable, got {execute!r}")
        if key_id is not None and not callable(key_id):
            raise TypeError(f"key_id must be callable or None, got {key_id!r}")
        if estimate_bytes is not None and not callable(estimate_bytes):
            raise TypeError(f"estimate_bytes must be callable or None, got {estimate_bytes!r}")
        self._core: SchedulingCore[K, V] = SchedulingCore(
            max_batch_items=max_batch_items,
            max_batch_bytes=max_batch_bytes,
            max_retained_items=max_retained_items,
            max_retained_bytes=max_retained_bytes,
            max_in_flight_batches=max_in_flight_batches,
            flush_seconds=flush_seconds,
            entry_type=Pending,
        )
        self._execute = execute
        self._key_id = key_id
        self._estimate_bytes = estimate_bytes
        # Neither hook: a value's lane id is its key and its size 1 byte.
        self._plain = key_id is None and estimate_bytes is None
        # ``_plain`` and the block open: ``submit`` takes its short path.
        self._fast = False
        self._max_retained_bytes = max_retained_bytes
        self._state = _NEW
        self._nursery_manager: Any = None
        self._nursery: trio.Nursery | None = None
        self._owner_context = _tracing.current_context()
        # Batch runners: parked idle ones, how many are summoned but have not run yet.
        self._idle: list[trio.lowlevel.Task] = []
        self._summoned = 0
        # The scheduler: its timer scope while parked, and pokes from abort functions.
        self._scheduler_task: trio.lowlevel.Task | None = None
        self._timer: trio.CancelScope | None = None
        self._timer_at = -math.inf
        self._poked = False
        self._to_cancel: list[Batch[K, V]] = []
        # The runner scopes the scheduler has cancelled (a runner retires with its
        # scope): a set lookup per batch instead of trio's ``cancel_called``
        # property, which reads the clock each time.
        self._cancelled_scopes: set[trio.CancelScope] = set()
        self._drained: trio.Event | None = None
        self._now: Callable[[], float] = _current_time

    def __repr__(self) -> str:
        stats = self._core.statistics()
        return (
            f"<BoundedBatchFunction queued={stats.queued} in_flight={stats.in_flight} "
            f"waiting_for_admission={stats.waiting_for_admission}>"
        )

    def stats(self) -> BatcherStatistics:
        """A snapshot of the batcher's counters and current occupancy."""
        return self._core.statistics()

    # --- the block -------------------------------------------------------------

    async def __aenter__(self) -> BoundedBatchFunction[K, V, R]:
        if self._state != _NEW:
            raise RuntimeError("a BoundedBatchFunction can be entered only once")
        # The run's clock, read directly: trio.current_time() goes through two more calls.
        self._now = trio.lowlevel.current_clock().current_time
        # Batches run in the context of the block that owns the batcher (its spans'
        # parent), never in that of whichever caller started a runner.
        self._owner_context = _tracing.current_context()
        manager = trio.open_nursery()
        self._nursery = await manager.__aenter__()
        self._nursery_manager = manager
        self._state = _OPEN
        self._fast = self._plain
        self._nursery.start_soon(self._schedule)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """Drain (normal exit) or tear down (exit by an exception); never swallows it."""
        if exc is None:
            self._state = _DRAINING
            self._fast = False
            self._core.drain()
            try:
                if not self._core.idle:
                    self._drained = trio.Event()
                    self._summon_if_ready(_current_time())
                    self._poke()
                    await self._drained.wait()
            except BaseException:
                await self._tear_down()
                raise
            self._state = _CLOSED
            self._fast = False
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            await self._exit_nursery()
        else:
            await self._tear_down()
        return False

    async def _tear_down(self) -> None:
        """Leave by an exception: cancel everything; waiting callers get BatcherClosedError."""
        self._state = _CLOSED
        self._fast = False
        for entry in self._core.close():
            self._settle_closed(entry)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        await self._exit_nursery()

    async def _exit_nursery(self) -> None:
        try:
            # The body's own exception is not passed in: it propagates from the
            # `async with` unchanged instead of inside a group made here.
            await self._nursery_manager.__aexit__(None, None, None)
        except BaseExceptionGroup as group:
            raise single_error(group) from None

    # --- submit ----------------------------------------------------------------

    async def submit(self, key: K, value: V, max_wait: float | None = None) -> R:
        """Queue ``value`` in the lane of ``key`` and return its result.

        ``max_wait`` (seconds, or None for no limit) counts from this call
        until the value's batch starts executing, admission wait included.
        When it passes first, this raises ``LaneWedgedError`` at that moment
        and the value is never handed to ``execute``. A ``max_wait`` of 0
        therefore always raises.

        Raises ``OversizedValueError`` at once when the value's estimate alone
        exceeds ``max_retained_bytes``; ``InvalidInputError`` when
        ``estimate_bytes`` returns something other than a non-negative int, or
        ``max_wait`` is negative or not finite; ``BatcherClosedError`` outside
        the ``async with`` block (or once it is being left). If ``execute``
        raises, this raises the same exception object (every caller of the
        batch gets that object); if ``execute`` returns something other than
        one result per value, ``BatchContractError``.

        Cancellation: if cancelled while waiting for admission or while queued,
        the value is withdrawn and never executed. If cancelled while its batch
        runs, this stops waiting and the batch goes on for its other callers;
        when every caller of a batch has gone, the batch's cancel scope is
        cancelled.
        """
        if self._fast:
            # The common case (no hooks, the block open) without the checks only
            # the hooks need; the rest is ``_take``'s.
            core = self._core
            now = self._now()
            if max_wait is None:
                deadline = _INF
            elif type(max_wait) is float and 0.0 <= max_wait < _INF:
                deadline = now + max_wait
            else:
                deadline = now + _checked_max_wait(max_wait)
            entry: Pending[K, V] = core.submit(  # type: ignore[assignment]
                key, key, value, 1, now, deadline
            )
            entry.batcher = self
            entry.results = None
            entry.waiter = _current_task()
            if core.wakeup_hint < self._timer_at:
                self._sync_timer()
            if self._summoned == 0 and core.in_flight < core.max_in_flight_batches:
                lane = entry.lane
                if lane is not None and (lane.closed or now >= entry.flush_at):
                    self._summon()
        else:
            entry = self._take(key, value, max_wait, False)
            entry.waiter = _current_task()
        results = await _park(entry)
        if type(results) is _SharedFailure:
            raise results.error.with_traceback(results.traceback)
        return results[entry.index]  # type: ignore[no-any-return]

    def submit_nowait(self, key: K, value: V, max_wait: float | None = None) -> Pending[K, V]:
        """Queue ``value`` as ``submit`` does, without waiting; return its ``Pending``.

        Every rule of ``submit`` holds for it (lanes, caps, the flush linger,
        ``max_wait`` counted from this call, cancellation of a batch nobody
        waits for any more, the result check). Where ``submit`` would wait for
        room under the retention caps (or behind callers already waiting for
        it), this raises ``trio.WouldBlock`` and keeps nothing, as trio's
        ``send_nowait`` does; it raises at once what ``submit`` raises at once
        (``BatcherClosedError``, ``OversizedValueError``, ``InvalidInputError``).

        ``await pending.wait()`` returns the result or raises the error
        ``submit`` would have; ``pending.done`` and ``pending.outcome`` read it
        without waiting; ``pending.cancel()`` withdraws the value while queued
        (never executed) and stops waiting for it while its batch runs.
        """
        if not self._fast:
            return self._take(key, value, max_wait, True)
        # As in ``submit``: the common case without ``_take``'s checks for the hooks.
        core = self._core
        now = self._now()
        if max_wait is None:
            deadline = _INF
        elif type(max_wait) is float and 0.0 <= max_wait < _INF:
            deadline = now + max_wait
        else:
            deadline = now + _checked_max_wait(max_wait)
        entry: Pending[K, V] | None = core.submit(  # type: ignore[assignment]
            key, key, value, 1, now, deadline, True
        )
        if entry is None:
            raise trio.WouldBlock
        entry.batcher = self
        entry.results = None
        if core.wakeup_hint < self._timer_at:
            self._sync_timer()
        if self._summoned == 0 and core.in_flight < core.max_in_flight_batches:
            lane = entry.lane
            if lane is not None and (lane.closed or now >= entry.flush_at):
                self._summon()
        return entry

    def _take(self, key: K, value: V, max_wait: float | None, nowait: bool) -> Pending[K, V]:
        """Both entry points up to the park: checks, the core's intake, the timer and
        a runner for a lane that became ready. ``trio.WouldBlock``: ``nowait`` and no
        room."""
        if self._state != _OPEN:
            raise BatcherClosedError(
                "submit outside the batcher's `async with` block"
                if self._state != _DRAINING
                else "submit while the batcher drains on leaving its `async with` block"
            )
        if self._plain:
            lane_id: Hashable = key
            nbytes = 1
        else:
            lane_id = key if self._key_id is None else self._key_id(key)
            if self._estimate_bytes is None:
                nbytes = 1
            else:
                nbytes = self._estimate_bytes(value)
                if type(nbytes) is not int:
                    if not is_int(nbytes):
                        raise InvalidInputError(
                            f"estimate_bytes must return an int, got {type(nbytes).__name__}"
                        )
                    nbytes = int(nbytes)
                if nbytes < 0:
                    raise InvalidInputError(f"estimate_bytes returned a negative size: {nbytes}")
                if nbytes > self._max_retained_bytes:
                    raise OversizedValueError(
                        f"value estimated at {nbytes} bytes exceeds max_retained_bytes="
                        f"{self._max_retained_bytes}"
                    )
        core = self._core
        now = self._now()
        if max_wait is None:
            deadline = _INF
        elif type(max_wait) is float and 0.0 <= max_wait < _INF:
            deadline = now + max_wait
        else:
            deadline = now + _checked_max_wait(max_wait)
        entry: Pending[K, V] | None = core.submit(  # type: ignore[assignment]
            lane_id, key, value, nbytes, now, deadline, nowait
        )
        if entry is None:
            raise trio.WouldBlock
        entry.batcher = self
        entry.results = None
        if core.wakeup_hint < self._timer_at:
            self._sync_timer()
        if self._summoned == 0 and core.in_flight < core.max_in_flight_batches:
            # Only this value's lane can have become ready, by closing (or by a
            # zero linger); the scheduler's timer covers every other way.
            lane = entry.lane
            if lane is not None and (lane.closed or now >= entry.flush_at):
                self._summon()
        return entry

    def _abort(self, entry: Entry[K, V]) -> trio.lowlevel.Abort:
        """A value's submitter left (a parked ``submit`` was cancelled, or
        ``pending.cancel()``): withdraw the value or leave its batch.

        Runs inside trio's cancellation delivery, so it only updates the core
        and pokes the scheduler, which cancels scopes and summons runners.
        """
        state = entry.state
        if state in (ADMITTING, QUEUED):
            self._core.withdraw(entry)
            self._poke()
        elif state == RUNNING and self._core.abandon(entry):
            assert entry.batch is not None
            self._to_cancel.append(entry.batch)
            self._poke()
        return _SUCCEEDED

    # --- settling values ---------------------------------------------------

    @staticmethod
    def _settle(entry: Pending[K, V], results: Any) -> None:
        """Settle one value with ``results`` and wake whoever waits for it."""
        entry.results = results
        if entry.waiter is not None:
            _reschedule(entry.waiter, entry)  # type: ignore[arg-type]

    def _settle_closed(self, entry: Entry[K, V]) -> None:
        self._settle(
            entry,  # type: ignore[arg-type]
            _SharedFailure(BatcherClosedError("the batcher was torn down while this value waited")),
        )

    def _settle_wedged(self, expired: list[Entry[K, V]]) -> None:
        core = self._core
        for entry in expired:
            self._settle(
                entry,  # type: ignore[arg-type]
                _SharedFailure(
                    LaneWedgedError(
                        f"max_wait passed before the value's batch started "
                        f"({core.queued} values queued, {core.in_flight} batches in flight, "
                        f"{core.max_in_flight_batches} allowed)"
                    )
                ),
            )

    def _settle_batch(self, entries: list[Entry[K, V]], results: Any) -> int:
        """Settle each live value of a finished batch and wake its waiter; each entry
        is its caller's outcome. Returns how many tasks it woke.

        Entries let go of their batch here, so the batch is freed by the runner
        that finished it rather than by the last caller to wake.
        """
        reschedule, running, done = _reschedule, RUNNING, DONE
        woken = 0
        for entry in entries:
            entry.batch = None
            if entry.state == running:
                entry.state = done
                entry.results = results  # type: ignore[attr-defined]
                waiter = entry.waiter
                if waiter is not None:
                    reschedule(waiter, entry)  # type: ignore[arg-type]
                    woken += 1
        return woken

    # --- batch runners -----------------------------------------------------

    def _summon(self) -> None:
        """Wake an idle batch runner, or start one."""
        self._summoned += 1
        if self._idle:
            _reschedule(self._idle.pop())
        else:
            assert self._nursery is not None
            self._nursery.start_soon(self._run_batches)

    def _summon_if_ready(self, now: float) -> None:
        if self._summoned == 0 and self._core.has_ready(now):
            self._summon()

    async def _run_batches(self) -> None:
        """A batch runner: take ready batches and run them until none is left, then idle.

        Its cancel scope belongs to the batch it runs. When that batch's every
        caller has gone the scope is cancelled, and the runner retires with it.
        """
        _tracing.adopt(self._owner_context)
        core = self._core
        task = _current_task()
        idle = self._idle

        def abort_idle(raise_cancel: Any) -> trio.lowlevel.Abort:
            idle.remove(task)
            return _SUCCEEDED

        execute = self._execute
        cancelled_scopes = self._cancelled_scopes
        with trio.CancelScope() as scope:
            while True:
                self._summoned -= 1
                woken = settled = 0
                while True:
                    if (woken >= _WAKE_ROUND or settled >= _SETTLE_ROUND) and core.has_ready(
                        self._now()
                    ):
                        # Let the callers woken so far run before waking more (see
                        # _WAKE_ROUND); meanwhile this runner counts as summoned.
                        woken = settled = 0
                        self._summoned += 1
                        await _yield_shielded()
                        self._summoned -= 1
                    batch = core.next_batch(self._now())  # expire, then dispatch
                    if core.expired:
                        self._settle_wedged(core.expired)
                    if batch is None:
                        break
                    if core.wakeup_hint < self._timer_at:
                        self._sync_timer()
                    if self._summoned == 0 and core.more_ready:
                        self._summon()  # someone else takes the rest if this one blocks
                    batch._scope = scope
                    try:
                        results: Any = await execute(batch)
                    except Exception as error:
                        results = _SharedFailure(error)
                    except BaseException:
                        self._close_cancelled(batch, scope)
                        raise
                    else:
                        if (
                            type(results) is not list
                            and type(results) is not tuple
                            and (not isinstance(results, Sequence) or isinstance(results, _TEXT))
                        ) or len(results) != len(batch.values):
                            results = _SharedFailure(self._contract_error(results, batch))
                    entries = core.finish(batch)
                    if core.wakeup_hint < self._timer_at:
                        self._sync_timer()
                    woken += self._settle_batch(entries, results)
                    settled += len(entries)
                    if self._drained is not None:
                        self._check_drained()
                    if cancelled_scopes and scope in cancelled_scopes:
                        break
                if (cancelled_scopes and scope in cancelled_scopes) or self._state == _CLOSED:
                    break
                self._check_drained()
                idle.append(task)
                await _park(abort_idle)
        cancelled_scopes.discard(scope)
        # Retired with an abandoned batch: make sure the ready work has a runner.
        if self._state != _CLOSED:
            self._summon_if_ready(_current_time())

    def _close_cancelled(self, batch: Batch[K, V], scope: trio.CancelScope) -> None:
        """``execute`` was cancelled (every caller left, or the batcher is being torn
        down) or interrupted: nobody gets a result from the batch."""
        core = self._core
        closed = core.close_running(batch)
        core.finish(batch)
        for entry in closed:
            self._settle_closed(entry)
        self._check_drained()
        self._cancelled_scopes.discard(scope)

    @staticmethod
    def _contract_error(results: Any, batch: Batch[K, V]) -> BatchContractError:
        count = len(batch.values)
        if isinstance(results, Sequence) and not isinstance(results, _TEXT):
            return BatchContractError(
                f"execute returned {len(results)} results for a batch of {count} values"
            )
        return BatchContractError(
            f"execute must return a sequence of {count} results, got {type(results).__name__}"
        )

    def _check_drained(self) -> None:
        if self._drained is not None and self._core.idle:
            self._drained.set()

    # --- the scheduler -----------------------------------------------------

    def _arm(self, when: float) -> None:
        """Move the scheduler's timer earlier."""
        self._timer_at = when
        if self._timer is not None:
            self._timer.deadline = when

    def _sync_timer(self) -> None:
        hint = self._core.take_wakeup_hint()
        if hint < self._timer_at:
            self._arm(hint)

    def _poke(self) -> None:
        """Have the scheduler look again (safe inside an abort function)."""
        self._poked = True
        task = self._scheduler_task
        if task is not None and self._timer is not None:
            self._timer = None
            _reschedule(task)

    async def _schedule(self) -> None:
        core = self._core
        task = _current_task()

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            self._timer = None
            return _SUCCEEDED

        while True:
            self._poked = False
            now = _current_time()
            if self._to_cancel:
                for batch in self._to_cancel:
                    if not batch._done:
                        batch._scope.cancel()
                        self._cancelled_scopes.add(batch._scope)
                self._to_cancel.clear()
            expired = core.expire(now)
            if expired:
                self._settle_wedged(expired)
            self._summon_if_ready(now)
            self._check_drained()
            if self._poked:
                continue
            core.take_wakeup_hint()
            wakeup = core.next_wakeup(now)
            with trio.CancelScope(deadline=wakeup) as timer:
                self._timer_at = wakeup
                self._timer = timer
                self._scheduler_task = task
                await _park(abort)
            self._timer = None
            self._timer_at = -math.inf
