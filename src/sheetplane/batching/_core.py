"""The batcher's scheduling core: every decision, no I/O.

``SchedulingCore`` is plain state and plain methods that take ``now`` (float
seconds on whatever clock the caller uses). It owns the lanes, the admission
queue, readiness, the dispatch choice, retention accounting and per-value
deadlines; it never waits, sleeps or wakes anybody. The trio shell
(``_shell.py``) parks callers, runs the batches the core hands out and sleeps
until ``next_wakeup``. The property suite drives this class directly with an
explicit clock.

Where things live:

- A value is an ``Entry``. It is *admitting* (in the FIFO admission queue,
  waiting for room under the retention caps), *queued* (in its lane),
  *running* (in a batch handed to ``execute``) or settled.
- A lane is a deque of queued entries with one ``lane_id``. Its next batch is
  the greedy prefix: the head always, then each following value while the
  batch stays within ``max_batch_items`` and ``max_batch_bytes``. The lane is
  *closed* (ready regardless of time) when that prefix cannot grow any more:
  it holds ``max_batch_items`` values, a following value does not fit, or the
  head alone exceeds ``max_batch_bytes``. Otherwise it is ready once
  ``now >= head.flush_at``.
- A value's linger counts from its ``submit`` (an admission wait counts as
  waiting). Deadlines are compared with the expression that set them:
  ``flush_at`` is stored as ``submitted_at + flush_seconds`` and a lane is
  flush-ready when ``now >= flush_at``; a value expires when
  ``now >= deadline``. Computing
  ``now - submitted_at >= flush_seconds`` instead can stay false at the very
  instant ``next_wakeup`` returned (float rounding), and a timer loop would
  spin forever.

- Retention counts queued and running values over all lanes; a submit that
  would pass a cap waits in the admission queue, which admits strictly first
  come first served. ``max_wait`` covers admission and queue alike; a shell
  calls ``expire(now)`` before ``dispatch(now)``, so a value whose deadline
  has come is never dispatched.

Why heaps: sequence numbers grow with submission time and ``flush_at`` is
``submitted_at + flush_seconds``, so among lane heads the smallest sequence
number also has the earliest flush deadline. One lazy heap of lane heads by
sequence number therefore yields both the oldest head and, if any lane is
flush-ready, the oldest flush-ready one; a second lazy heap holds the closed
lanes. A closed lane is ready whatever the time, so a head that takes over a
lane which stays closed goes on the closed heap only; it joins the heads heap
if its lane opens again (each lane remembers which head it last pushed on
each heap). Stale heap rows are skipped when they surface and the heaps are
rebuilt when stale rows outnumber live ones, so a dispatch costs O(log lanes)
however many lanes there are.
"""

from __future__ import annotations

import contextvars
import heapq
import math
from collections import deque
from collections.abc import Hashable
from typing import Any, Final, Generic, TypeVar

from ..errors import OversizedValueError
from ._stats import BatcherStatistics

K = TypeVar("K")
V = TypeVar("V")

# Entry states.
ADMITTING: Final = 0
"""Waiting in the admission queue for room under the retention caps."""
QUEUED: Final = 1
"""In its lane, waiting for its batch to start."""
RUNNING: Final = 2
"""In a batch handed to ``execute``; the caller waits for the result."""
DONE: Final = 3
"""Settled with the batch's result or error."""
WITHDRAWN: Final = 4
"""The caller left before the batch started; never executed."""
ABANDONED: Final = 5
"""The caller left while its batch ran; the batch goes on for the others."""
EXPIRED: Final = 6
"""``max_wait`` passed before the batch started; never executed."""
CLOSED: Final = 7
"""The batcher was torn down while the value waited."""

_STALE_SLACK: Final = 64
"""Stale heap rows tolerated beyond twice the live ones before a rebuild."""
_COMPACT_EVERY: Final = 16
"""Dispatches between two looks at the stale rows (they are few and cheap to keep)."""
_INF: Final = math.inf
_new_entry: Final = object.__new__
_new_batch: Final = object.__new__
_NO_ENTRIES: Final[list[Any]] = []
"""A finished batch's entries, and ``expire``'s answer when nothing expires (shared,
never changed)."""


class Entry(Generic[K, V]):
    """One submitted value and where it is. ``waiter`` belongs to the shell.

    Only ``SchedulingCore.submit`` makes entries, without an ``__init__`` call
    (a value's intake is its hottest path): it sets ``seq``, ``key``,
    ``value``, ``nbytes``, ``flush_at``, ``deadline``, ``state``, ``lane`` and
    ``waiter``; ``lane_id`` is set while the value waits for admission, and
    ``batch`` and ``index`` once it is dispatched.
    """

    __slots__ = (
        "batch",
        "deadline",
        "flush_at",
        "index",
        "key",
        "lane",
        "lane_id",
        "nbytes",
        "seq",
        "state",
        "value",
        "waiter",
    )

    seq: int
    lane_id: Hashable
    # Typed loosely: both are dropped (set to None) once the value leaves the
    # queue, so a settled entry holds no reference to user data.
    key: Any
    value: Any
    nbytes: int
    deadline: float
    flush_at: float
    state: int
    lane: _Lane | None
    batch: Batch[K, V] | None
    index: int
    """Position in its batch, once dispatched."""
    waiter: Any

    def __lt__(self, other: Entry[Any, Any]) -> bool:
        """Submission order: how lane heads are ranked."""
        return self.seq < other.seq

    def __repr__(self) -> str:
        return f"<Entry seq={self.seq} state={self.state} nbytes={self.nbytes}>"


class Batch(Generic[K, V]):
    """What ``execute`` receives: ``key`` (the first value's key), ``values`` (a tuple,
    in submission order) and ``lane_id``. The underscored fields belong to the batcher."""

    __slots__ = ("_done", "_entries", "_live", "_nbytes", "_scope", "key", "lane_id", "values")

    values: tuple[V, ...]
    _live: int
    _nbytes: int

    def __init__(self, lane_id: Hashable, key: K, entries: list[Entry[K, V]]) -> None:
        # ``dispatch`` sets ``values``, ``_live`` and ``_nbytes`` once it has
        # taken the whole prefix.
        self.key = key
        self.lane_id = lane_id
        self._entries = entries
        self._done = False
        self._scope: Any = None

    def __repr__(self) -> str:
        return f"<Batch lane_id={self.lane_id!r} values={len(self.values)}>"

    def waiting_contexts(self) -> list[contextvars.Context]:
        """The ``contextvars`` contexts of the tasks waiting for this batch's values
        (parked in ``submit`` or ``Pending.wait``), oldest value first: where its
        callers are, for the batch's span to link to (``sheetplane._tracing``). A value
        nobody waits for has none. Meant for ``execute``, while the batch runs."""
        return [entry.waiter.context for entry in self._entries if entry.waiter is not None]


class _Lane:
    """The queued entries of one lane id, oldest first."""

    __slots__ = (
        "closed",
        "closed_pushed",
        "entries",
        "head_seq",
        "heads_pushed",
        "lane_id",
        "nbytes",
    )

    def __init__(self, lane_id: Hashable) -> None:
        self.lane_id = lane_id
        self.entries: deque[Entry[Any, Any]] = deque()
        # The queued bytes while the lane is open (the test of whether the next
        # value closes it); not kept while it is closed, recounted when it opens.
        self.nbytes = 0
        self.head_seq = -1
        self.closed = False
        # The head seq last pushed onto each heap (-1: none live there).
        self.closed_pushed = -1
        self.heads_pushed = -1


def _check_limit(name: str, value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value!r}")
    return value


class SchedulingCore(Generic[K, V]):
    """Lanes, admission, readiness, dispatch choice and retention of one batcher.

    Every method is synchronous and takes the current time where time matters.
    ``now`` must never go backwards between calls. ``entry_type`` lets a shell
    keep its own per-value fields on the entries (a subclass of ``Entry``).
    """

    __slots__ = (
        "_abandoned",
        "_admission",
        "_batches",
        "_closed",
        "_deadlines",
        "_draining",
        "_entry_type",
        "_heads",
        "_lanes",
        "_peak_bytes",
        "_peak_in_flight",
        "_peak_items",
        "_running",
        "_running_items",
        "_seq",
        "_timeline",
        "_values",
        "_wedged",
        "_withdrawn",
        "expired",
        "flush_seconds",
        "in_flight",
        "max_batch_bytes",
        "max_batch_items",
        "max_in_flight_batches",
        "max_retained_bytes",
        "max_retained_items",
        "more_ready",
        "retained_bytes",
        "retained_items",
        "wakeup_hint",
    )

    def __init__(
        self,
        *,
        max_batch_items: int,
        max_batch_bytes: int,
        max_retained_items: int,
        max_retained_bytes: int,
        max_in_flight_batches: int,
        flush_seconds: float,
        entry_type: type[Entry[K, V]] = Entry,
    ) -> None:
        self._entry_type = entry_type
        self.max_batch_items = _check_limit("max_batch_items", max_batch_items)
        self.max_batch_bytes = _check_limit("max_batch_bytes", max_batch_bytes)
        self.max_retained_items = _check_limit("max_retained_items", max_retained_items)
        self.max_retained_bytes = _check_limit("max_retained_bytes", max_retained_bytes)
        self.max_in_flight_batches = _check_limit("max_in_flight_batches", max_in_flight_batches)
        if isinstance(flush_seconds, bool) or not isinstance(flush_seconds, int | float):
            raise TypeError(f"flush_seconds must be a number of seconds, got {flush_seconds!r}")
        if not math.isfinite(flush_seconds) or flush_seconds < 0:
            raise ValueError(
                f"flush_seconds must be finite and not negative, got {flush_seconds!r}"
            )
        self.flush_seconds = float(flush_seconds)

        self._lanes: dict[Hashable, _Lane] = {}
        self._admission: deque[Entry[K, V]] = deque()
        # Lane heads by submission order (entries compare by seq), lazy: a row is
        # live while its entry still heads its lane (and, in _closed, the lane is closed).
        self._heads: list[Entry[K, V]] = []
        self._closed: list[Entry[K, V]] = []
        # Value deadlines, lazy (settled entries are skipped when they surface).
        # Most callers pass the same max_wait, so deadlines mostly arrive in
        # order: those go on a deque (no allocation per value), the rest on a heap.
        self._timeline: deque[Entry[K, V]] = deque()
        self._deadlines: list[tuple[float, int, Entry[K, V]]] = []
        self._running: dict[Batch[K, V], None] = {}
        self._seq = 0
        #: The earliest deadline (flush or value) set since the shell last took
        #: it; a shell sleeping until ``next_wakeup`` moves its timer earlier
        #: when this is sooner, and never needs to move it later.
        self.wakeup_hint = math.inf
        self._draining = False
        #: Whether another batch could start right after the last ``dispatch``.
        self.more_ready = False
        #: The values the last ``next_batch`` expired (shared empty list when none).
        self.expired: list[Entry[K, V]] = _NO_ENTRIES

        self.retained_items = 0
        self.retained_bytes = 0
        # Values in running batches (retention counts them until ``finish``):
        # ``queued`` is the rest of ``retained_items``.
        self._running_items = 0
        self.in_flight = 0
        self._batches = 0
        self._values = 0
        self._peak_items = 0
        self._peak_bytes = 0
        self._peak_in_flight = 0
        self._wedged = 0
        self._withdrawn = 0
        self._abandoned = 0

    # --- intake ----------------------------------------------------------------

    def submit(
        self,
        lane_id: Hashable,
        key: K,
        value: V,
        nbytes: int,
        now: float,
        deadline: float,
        nowait: bool = False,
    ) -> Entry[K, V] | None:
        """Take one value: admit it into its lane now, or queue it for admission.

        With ``nowait``, a value that would have to queue for admission (rule 3:
        no room under a retention cap, or values already waiting for it) is
        refused instead: this returns None and keeps nothing. Otherwise it
        returns the value's entry; only a ``nowait`` call ever returns None.

        Raises ``OversizedValueError`` (and keeps nothing) when ``nbytes`` alone
        exceeds ``max_retained_bytes``; ``TypeError`` if ``lane_id`` is unhashable.
        Both come before the refusal: ``nowait`` raises what the waiting
        call raises at once.
        """
        retained_bytes = self.retained_bytes + nbytes
        if (
            retained_bytes <= self.max_retained_bytes
            and self.retained_items < self.max_retained_items
            and not self._admission
        ):
            admit = True
        elif nbytes > self.max_retained_bytes:
            raise OversizedValueError(
                f"value estimated at {nbytes} bytes exceeds max_retained_bytes="
                f"{self.max_retained_bytes}"
            )
        else:
            admit = False
        lane = self._lanes.get(lane_id)  # an unhashable lane id fails here, changing nothing
        if not admit and nowait:
            return None
        entry = _new_entry(self._entry_type)
        self._seq = entry.seq = self._seq + 1
        entry.key = key
        entry.value = value
        entry.nbytes = nbytes
        entry.flush_at = now + self.flush_seconds
        entry.deadline = deadline
        entry.waiter = None
        if deadline != _INF:
            timeline = self._timeline
            if not timeline or deadline >= timeline[-1].deadline:
                timeline.append(entry)
            else:
                heapq.heappush(self._deadlines, (deadline, entry.seq, entry))
            if deadline < self.wakeup_hint:
                self.wakeup_hint = deadline
        if not admit:
            entry.state = ADMITTING
            entry.lane = None
            entry.lane_id = lane_id
            self._admission.append(entry)
        elif lane is not None and lane.closed:
            # The common case under load, inlined: a closed lane only grows at
            # its tail (and keeps no byte count).
            entry.state = QUEUED
            entry.lane = lane
            lane.entries.append(entry)
            self.retained_items += 1
            self.retained_bytes = retained_bytes
        else:
            self._enqueue(entry, lane_id, lane)
        return entry

    def submit_nowait(
        self, lane_id: Hashable, key: K, value: V, nbytes: int, now: float, deadline: float
    ) -> Entry[K, V] | None:
        """``submit(..., nowait=True)``: the value's entry if it is admitted at once,
        else None (keeping nothing). The entry returned is never ``ADMITTING``; every
        rule after admission is ``submit``'s."""
        return self.submit(lane_id, key, value, nbytes, now, deadline, True)

    def _enqueue(self, entry: Entry[K, V], lane_id: Hashable, lane: _Lane | None) -> None:
        """Put an admitted entry at the tail of the lane of ``lane_id`` (``lane``:
        that lane's current object, None if there is none)."""
        if lane is None:
            lane = self._lanes[lane_id] = _Lane(lane_id)
        entry.state = QUEUED
        entry.lane = lane
        flush_at = entry.flush_at
        nbytes = entry.nbytes
        self.retained_items += 1
        self.retained_bytes += nbytes
        entries = lane.entries
        if not entries:
            entries.append(entry)
            lane.nbytes = nbytes
            lane.head_seq = lane.heads_pushed = entry.seq
            heapq.heappush(self._heads, entry)
            if flush_at < self.wakeup_hint:
                self.wakeup_hint = flush_at
            lane.closed = self.max_batch_items == 1 or nbytes > self.max_batch_bytes
        else:
            entries.append(entry)
            if not lane.closed:
                # An open lane fits whole in one batch, so only the newcomer can close it.
                lane.closed = (
                    len(entries) >= self.max_batch_items
                    or lane.nbytes + nbytes > self.max_batch_bytes
                )
            lane.nbytes += nbytes
        if lane.closed and lane.closed_pushed != lane.head_seq:
            lane.closed_pushed = lane.head_seq
            heapq.heappush(self._closed, entries[0])

    def _admit(self) -> None:
        """Admit waiting entries, first come first served, while room allows."""
        admission = self._admission
        while admission:
            entry = admission[0]
            if (
                self.retained_items >= self.max_retained_items
                or self.retained_bytes + entry.nbytes > self.max_retained_bytes
            ):
                return
            admission.popleft()
            self._enqueue(entry, entry.lane_id, self._lanes.get(entry.lane_id))

    # --- readiness and dispatch ----------------------------------------------

    def _prefix(self, lane: _Lane) -> tuple[int, int, bool]:
        """The lane's next batch: (values, bytes, whether it can grow no more)."""
        entries = iter(lane.entries)
        head = next(entries)
        count, total = 1, head.nbytes
        if total > self.max_batch_bytes:
            return 1, total, True
        for entry in entries:
            if count == self.max_batch_items or total + entry.nbytes > self.max_batch_bytes:
                return count, total, True
            count += 1
            total += entry.nbytes
        return count, total, count == self.max_batch_items

    def _lane_changed(self, lane: _Lane) -> None:
        """Re-derive head and closedness after values left ``lane``."""
        if not lane.entries:
            del self._lanes[lane.lane_id]
            lane.head_seq = -1
            lane.closed = False
            return
        head = lane.entries[0]
        lane.head_seq = head.seq
        _, nbytes, lane.closed = self._prefix(lane)
        if lane.closed:
            if lane.closed_pushed != head.seq:
                lane.closed_pushed = head.seq
                heapq.heappush(self._closed, head)
            return
        lane.nbytes = nbytes  # an open lane's prefix is all of it
        if lane.heads_pushed != head.seq:
            lane.heads_pushed = head.seq
            heapq.heappush(self._heads, head)
            if head.flush_at < self.wakeup_hint:
                self.wakeup_hint = head.flush_at

    def _oldest_head(self) -> _Lane | None:
        heads = self._heads
        while heads:
            head = heads[0]
            lane = head.lane
            if lane is not None and lane.head_seq == head.seq:
                return lane
            heapq.heappop(heads)
        return None

    def _ready_lane(self, now: float) -> _Lane | None:
        """Among ready lanes, the one whose head value is oldest."""
        closed = self._closed
        if closed and not self._heads:
            # Only closed lanes hold values (the case under load): the top row, if live.
            head = closed[0]
            lane = head.lane
            if lane is not None and lane.head_seq == head.seq and lane.closed:
                return lane
        while closed:
            head = closed[0]
            lane = head.lane
            if lane is not None and lane.head_seq == head.seq and lane.closed:
                break
            heapq.heappop(closed)
            if lane is not None and lane.closed_pushed == head.seq:
                lane.closed_pushed = -1
        best = self._oldest_head()
        if best is not None and not (self._draining or now >= best.entries[0].flush_at):
            best = None
        if closed and (best is None or closed[0].seq < best.head_seq):
            best = closed[0].lane
        return best

    def has_ready(self, now: float) -> bool:
        """Whether ``dispatch(now)`` would start a batch (after ``expire(now)``)."""
        return self.in_flight < self.max_in_flight_batches and self._ready_lane(now) is not None

    def dispatch(self, now: float) -> Batch[K, V] | None:
        """Start the next batch, or return None when no lane is ready or the
        in-flight cap is reached. Call ``expire(now)`` first: an entry whose
        deadline has passed must never be dispatched.

        Afterwards ``more_ready`` says whether another batch could start at
        ``now`` (``has_ready(now)``, as far as this batch changed it)."""
        in_flight = self.in_flight
        if in_flight >= self.max_in_flight_batches:
            self.more_ready = False
            return None
        lane = self._ready_lane(now)
        if lane is None:
            self.more_ready = False
            return None
        # The greedy prefix (as in ``_prefix``), taken off the lane as it is
        # measured; each entry is marked running as it joins the batch.
        queue = lane.entries
        first = queue.popleft()
        entries = [first]
        values = [first.value]
        batch: Batch[K, V] = _new_batch(Batch)  # no __init__ call: one per batch
        batch.key = first.key
        batch.lane_id = lane.lane_id
        batch._entries = entries
        batch._done = False
        batch._scope = None
        first.state = RUNNING
        first.batch = batch
        first.index = 0
        first.key = first.value = None
        nbytes = first.nbytes
        max_bytes = self.max_batch_bytes
        max_items = self.max_batch_items
        if nbytes <= max_bytes:
            take = queue.popleft
            for index in range(1, min(len(queue) + 1, max_items)):
                entry = take()
                size = entry.nbytes
                if nbytes + size > max_bytes:
                    queue.appendleft(entry)
                    break
                entries.append(entry)
                values.append(entry.value)
                nbytes += size
                entry.state = RUNNING
                entry.batch = batch
                entry.index = index
                entry.key = entry.value = None
        batch.values = tuple(values)
        batch._nbytes = nbytes
        batch._live = count = len(entries)
        self._running_items += count
        self.in_flight = in_flight = in_flight + 1
        if queue and len(queue) >= max_items:
            # Still a full batch's worth queued: the lane stays closed whatever
            # the sizes (its prefix stops at the item cap or at a value that
            # does not fit), so its new head goes on the closed heap only.
            head = queue[0]
            lane.head_seq = lane.closed_pushed = head.seq
            lane.closed = True
            closed = self._closed
            if closed[0] is first:
                heapq.heapreplace(closed, head)  # the row of the batch's head: now stale
            else:
                heapq.heappush(closed, head)
            self.more_ready = in_flight < self.max_in_flight_batches
        else:
            self._lane_changed(lane)
            self.more_ready = (
                in_flight < self.max_in_flight_batches and self._ready_lane(now) is not None
            )
        self._running[batch] = None
        if in_flight > self._peak_in_flight:
            self._peak_in_flight = in_flight
        self._batches += 1
        self._values += count
        if not self._batches % _COMPACT_EVERY:
            self._compact()
        return batch

    def next_batch(self, now: float) -> Batch[K, V] | None:
        """``expire(now)`` then ``dispatch(now)`` in one call (a batch runner's step).
        The values that expired are in ``expired`` until the next call."""
        timeline, deadlines = self._timeline, self._deadlines
        if (timeline and timeline[0].deadline <= now) or (deadlines and deadlines[0][0] <= now):
            self.expired = self.expire(now)
        else:
            self.expired = _NO_ENTRIES
        return self.dispatch(now)

    def finish(self, batch: Batch[K, V]) -> list[Entry[K, V]]:
        """Release a batch's retention once ``execute`` returned, raised or was
        cancelled, and admit waiting values into the room it frees.

        Returns the batch's entries (the shell settles those still ``RUNNING``)
        and detaches them from the batch: an entry points at its batch, so
        keeping the list would make every finished batch a reference cycle
        that only the garbage collector could free.
        """
        entries = batch._entries
        if batch._done:
            return entries
        batch._done = True
        batch._entries = _NO_ENTRIES
        del self._running[batch]
        self.in_flight -= 1
        items, retained_bytes = self.retained_items, self.retained_bytes
        if items > self._peak_items:
            self._peak_items = items
        if retained_bytes > self._peak_bytes:
            self._peak_bytes = retained_bytes
        count = len(entries)
        self.retained_items = items - count
        self._running_items -= count
        self.retained_bytes = retained_bytes - batch._nbytes
        if self._admission:
            self._admit()
        lane = self._oldest_head() if self._heads else None
        if lane is not None and lane.entries[0].flush_at < self.wakeup_hint:
            # With the in-flight cap reached, flush deadlines were not armed; and a
            # dispatch since the shell's timer was set may have left a younger head
            # (whose deadline the timer was never set to) as the oldest.
            self.wakeup_hint = lane.entries[0].flush_at
        return entries

    # --- leaving early ---------------------------------------------------------

    def _remove_waiting(self, entry: Entry[K, V]) -> None:
        if entry.state == ADMITTING:
            self._admission.remove(entry)
            self._admit()
        else:
            lane = entry.lane
            assert lane is not None
            lane.entries.remove(entry)
            self._note_peaks()
            self.retained_items -= 1
            self.retained_bytes -= entry.nbytes
            entry.lane = None
            self._lane_changed(lane)
            self._admit()
        entry.key = None
        entry.value = None

    def withdraw(self, entry: Entry[K, V]) -> None:
        """Withdraw an admitting or queued value (its caller was cancelled)."""
        if entry.state != ADMITTING and entry.state != QUEUED:
            raise ValueError(f"only a waiting value can be withdrawn: {entry!r}")
        self._remove_waiting(entry)
        entry.state = WITHDRAWN
        self._withdrawn += 1

    def abandon(self, entry: Entry[K, V]) -> bool:
        """Mark a running value's caller as gone. True when that was the batch's
        last caller: the shell then cancels the batch's scope."""
        if entry.state != RUNNING:
            raise ValueError(f"only a running value can be abandoned: {entry!r}")
        entry.state = ABANDONED
        batch = entry.batch
        assert batch is not None
        batch._live -= 1
        if batch._live == 0 and not batch._done:
            self._abandoned += 1
            return True
        return False

    def expire(self, now: float) -> list[Entry[K, V]]:
        """Remove and return every waiting value with ``now >= deadline`` (a list
        the caller must not change)."""
        timeline, deadlines = self._timeline, self._deadlines
        if (not timeline or timeline[0].deadline > now) and (
            not deadlines or deadlines[0][0] > now
        ):
            return _NO_ENTRIES  # the common case: shared, never changed
        expired: list[Entry[K, V]] = []
        while True:
            # The earlier of the two fronts, in (deadline, submission) order.
            first = timeline[0] if timeline and now >= timeline[0].deadline else None
            if deadlines and now >= deadlines[0][0]:
                other = deadlines[0][2]
                if first is None or (other.deadline, other.seq) < (first.deadline, first.seq):
                    first = heapq.heappop(deadlines)[2]
                else:
                    timeline.popleft()
            elif first is not None:
                timeline.popleft()
            else:
                break
            entry = first
            if entry.state == ADMITTING or entry.state == QUEUED:
                self._remove_waiting(entry)
                entry.state = EXPIRED
                self._wedged += 1
                expired.append(entry)
        return expired

    @property
    def queued(self) -> int:
        """Values in their lanes, waiting for their batch to start."""
        return self.retained_items - self._running_items

    def _note_peaks(self) -> None:
        """Record the retention peaks; called before retention falls (it only
        rises on intake, so a peak is always the level just before a fall, or
        the current one, which ``statistics`` adds)."""
        if self.retained_items > self._peak_items:
            self._peak_items = self.retained_items
        if self.retained_bytes > self._peak_bytes:
            self._peak_bytes = self.retained_bytes

    # --- time ------------------------------------------------------------------

    def next_wakeup(self, now: float) -> float:
        """The earliest instant after ``now`` at which time alone changes
        something: a value deadline, or (while the in-flight cap has room) the
        flush deadline of the oldest lane head. ``math.inf`` when none."""
        timeline, deadlines = self._timeline, self._deadlines
        while timeline and timeline[0].state not in (ADMITTING, QUEUED):
            timeline.popleft()
        while deadlines and deadlines[0][2].state not in (ADMITTING, QUEUED):
            heapq.heappop(deadlines)
        wakeup = timeline[0].deadline if timeline else math.inf
        if deadlines and deadlines[0][0] < wakeup:
            wakeup = deadlines[0][0]
        if self.in_flight < self.max_in_flight_batches and not self._draining:
            lane = self._oldest_head()
            if lane is not None:
                flush_at = lane.entries[0].flush_at
                if now < flush_at < wakeup:
                    wakeup = flush_at
        return wakeup

    def take_wakeup_hint(self) -> float:
        """The earliest deadline set since the last call (``math.inf`` if none).

        A shell that sleeps until ``next_wakeup`` moves its timer earlier when
        this is sooner; it never needs to move it later.
        """
        hint = self.wakeup_hint
        self.wakeup_hint = math.inf
        return hint

    # --- closing -----------------------------------------------------------

    def drain(self) -> None:
        """From now on every lane that holds a value is ready."""
        self._draining = True

    @property
    def draining(self) -> bool:
        """Whether ``drain`` was called."""
        return self._draining

    @property
    def idle(self) -> bool:
        """Nothing waiting for admission, queued or in flight."""
        return self.retained_items == 0 and not self._admission

    def close(self) -> list[Entry[K, V]]:
        """Tear down: return every value whose caller still waits (admitting,
        queued, or running and not abandoned), each marked ``CLOSED``.

        Running batches stay counted until ``finish``."""
        closed: list[Entry[K, V]] = list(self._admission)
        self._admission.clear()
        self._note_peaks()
        for lane in self._lanes.values():
            closed.extend(lane.entries)
            self.retained_items -= len(lane.entries)
            self.retained_bytes -= sum(entry.nbytes for entry in lane.entries)
            lane.head_seq = -1
        self._lanes.clear()
        self._heads.clear()
        self._closed.clear()
        self._timeline.clear()
        self._deadlines.clear()
        for entry in closed:
            entry.state = CLOSED
            entry.key = None
            entry.value = None
        for batch in self._running:
            closed.extend(self.close_running(batch))
        return closed

    def close_running(self, batch: Batch[K, V]) -> list[Entry[K, V]]:
        """Mark the still-waiting callers of ``batch`` ``CLOSED`` and return them."""
        closed = [entry for entry in batch._entries if entry.state == RUNNING]
        for entry in closed:
            entry.state = CLOSED
        batch._live -= len(closed)
        return closed

    # --- housekeeping ------------------------------------------------------

    def _compact(self) -> None:
        """Rebuild a heap once its stale rows outnumber the live ones."""
        lanes = len(self._lanes)
        if len(self._heads) > 2 * lanes + _STALE_SLACK:
            self._heads = []
            for lane in self._lanes.values():
                lane.heads_pushed = lane.head_seq
                self._heads.append(lane.entries[0])
            heapq.heapify(self._heads)
        if len(self._closed) > 2 * lanes + _STALE_SLACK:
            self._closed = []
            for lane in self._lanes.values():
                lane.closed_pushed = lane.head_seq if lane.closed else -1
                if lane.closed:
                    self._closed.append(lane.entries[0])
            heapq.heapify(self._closed)
        timeline = self._timeline
        while timeline and timeline[0].state > QUEUED:  # settled, running or gone
            timeline.popleft()  # lanes mostly dispatch in submission order
        waiting = self.queued + len(self._admission)
        if len(timeline) + len(self._deadlines) > 2 * waiting + _STALE_SLACK:
            waiting_states = (ADMITTING, QUEUED)
            self._timeline = deque(e for e in self._timeline if e.state in waiting_states)
            self._deadlines = [row for row in self._deadlines if row[2].state in waiting_states]
            heapq.heapify(self._deadlines)

    def statistics(self) -> BatcherStatistics:
        """A snapshot of counters and current occupancy."""
        return BatcherStatistics(
            batches=self._batches,
            values=self._values,
            peak_retained_items=max(self._peak_items, self.retained_items),
            peak_retained_bytes=max(self._peak_bytes, self.retained_bytes),
            peak_in_flight=self._peak_in_flight,
            retained_items=self.retained_items,
            retained_bytes=self.retained_bytes,
            queued=self.queued,
            waiting_for_admission=len(self._admission),
            in_flight=self.in_flight,
            lanes=len(self._lanes),
            wedged=self._wedged,
            withdrawn=self._withdrawn,
            abandoned_batches=self._abandoned,
        )
