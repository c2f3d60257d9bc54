"""Property test (a): the batcher's scheduling core against a plain reference model.

``SchedulingCore`` is driven synchronously under an explicit clock, beside
``sheetplane.testing.models.BatcherModel`` (rules 1 to 3 over plain lanes)
and a few lines of deadline bookkeeping kept here (rule 4). Rules submit
(through ``submit`` and ``submit_nowait``: the latter refuses where the model
says ``submit`` would wait for room, and its values, which nobody awaits in
the core, expire on their deadlines like the others), advance time,
dispatch, finish a batch, cancel a waiting caller and abandon a running
one; invariants check that the caps hold, lanes stay FIFO, every value runs
at most once and only before its deadline, and the retained counts equal the
model's.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from sheetplane import OversizedValueError
from sheetplane.batching import Batch, SchedulingCore
from sheetplane.batching._core import ADMITTING, QUEUED, RUNNING, Entry
from sheetplane.testing.models import BatcherModel

LANES = ("a", "b", "c")
STEPS = (0.0, 0.05, 0.1, 0.2, 0.3, 1.0)  # tenths: sums of them round
MAX_WAITS = (None, 0.0, 0.1, 0.2, 0.3, 0.5, 2.0)


class BatcherCoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.entries: dict[int, Entry[str, int]] = {}
        self.sizes: dict[int, int] = {}
        self.lane_of: dict[int, str] = {}
        self.deadlines: dict[int, float] = {}
        self.running: dict[int, Batch[str, int]] = {}  # first value id -> batch
        self.executed: set[int] = set()
        self.last_run: dict[str, int] = {}
        # The shell's timer: lowered by every wakeup hint, reset by each scheduler step.
        self.timer = math.inf
        # Retention peaks seen after each step: the core's peaks are at least these
        # (one step, an expiry say, can admit a value and drop it again unseen).
        self.peak_items = self.peak_bytes = 0

    @initialize(
        max_batch_items=st.integers(1, 4),
        max_batch_bytes=st.integers(1, 10),
        max_retained_items=st.integers(1, 8),
        max_retained_bytes=st.integers(1, 20),
        max_in_flight_batches=st.integers(1, 3),
        flush_seconds=st.sampled_from([0.0, 0.1, 0.25, 1.0]),
    )
    def build(self, **limits: Any) -> None:
        self.limits = limits
        self.core: SchedulingCore[str, int] = SchedulingCore(**limits)
        self.model = BatcherModel(**limits)

    # --- rules -------------------------------------------------------------------------

    @rule(
        lane=st.sampled_from(LANES),
        size=st.integers(0, 12),
        max_wait=st.sampled_from(MAX_WAITS),
    )
    def submit(self, lane: str, size: int, max_wait: float | None) -> None:
        deadline = math.inf if max_wait is None else self.now + max_wait
        try:
            ident = self.model.submit(lane, size, self.now)
        except ValueError:
            try:
                self.core.submit(lane, lane, -1, size, self.now, deadline)
            except OversizedValueError:
                return
            raise AssertionError("the core kept a value the model calls oversized") from None
        entry = self.core.submit(lane, lane, ident, size, self.now, deadline)
        assert entry.seq == ident  # both number accepted values from 1
        self.entries[ident] = entry
        self.sizes[ident] = size
        self.lane_of[ident] = lane
        if max_wait is not None:
            self.deadlines[ident] = deadline
        self.take_hint()

    @rule(
        lane=st.sampled_from(LANES),
        size=st.integers(0, 12),
        max_wait=st.sampled_from(MAX_WAITS),
    )
    def submit_nowait(self, lane: str, size: int, max_wait: float | None) -> None:
        deadline = math.inf if max_wait is None else self.now + max_wait
        if size > self.limits["max_retained_bytes"]:
            try:
                self.core.submit_nowait(lane, lane, -1, size, self.now, deadline)
            except OversizedValueError:
                return
            raise AssertionError("submit_nowait kept a value the model calls oversized")
        before = self.core.statistics()
        if not self.model.has_room(size):
            assert self.core.submit_nowait(lane, lane, -1, size, self.now, deadline) is None
            assert self.core.statistics() == before  # kept nothing
            return
        ident = self.model.submit(lane, size, self.now)
        entry = self.core.submit_nowait(lane, lane, ident, size, self.now, deadline)
        assert entry is not None and entry.seq == ident
        assert entry.state != ADMITTING  # admitted at once, never queued for room
        self.entries[ident] = entry
        self.sizes[ident] = size
        self.lane_of[ident] = lane
        if max_wait is not None:
            self.deadlines[ident] = deadline
        self.take_hint()

    @rule(step=st.sampled_from(STEPS))
    def advance(self, step: float) -> None:
        self.now += step
        self.dispatch()

    @rule()
    def advance_to_next_wakeup(self) -> None:
        wakeup = self.core.next_wakeup(self.now)
        if wakeup != math.inf:
            self.now = wakeup
        self.dispatch()

    @rule()
    def dispatch(self) -> None:
        """What the shell does at ``now``: expire, then start every batch it may."""
        expected = sorted(
            (deadline, ident)
            for ident, deadline in self.deadlines.items()
            if self.waiting(ident) and self.now >= deadline
        )
        expired = self.core.expire(self.now)
        for _, ident in expected:
            assert self.model.cancel(ident)
            del self.deadlines[ident]
        assert [entry.seq for entry in expired] == [ident for _, ident in expected]
        started: list[tuple[int, tuple[int, ...]]] = []
        while (batch := self.core.dispatch(self.now)) is not None:
            started.append((batch.values[0], batch.values))
            self.running[batch.values[0]] = batch
        assert started == self.model.dispatch(self.now)
        for _, values in started:
            self.check_batch(values)
        self.check_next_wakeup()
        self.core.take_wakeup_hint()
        self.timer = self.core.next_wakeup(self.now)

    @rule()
    def advance_to_timer(self) -> None:
        """Sleep as the shell does: until its timer, which hints only ever lower."""
        if self.timer != math.inf:
            self.now = max(self.now, self.timer)
        self.dispatch()

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        first = data.draw(st.sampled_from(sorted(self.running)))
        self.core.finish(self.running.pop(first))
        self.model.finish(first)
        self.take_hint()

    @precondition(lambda self: any(self.waiting(i) for i in self.entries))
    @rule(data=st.data())
    def cancel_waiting(self, data: st.DataObject) -> None:
        ident = data.draw(st.sampled_from(sorted(i for i in self.entries if self.waiting(i))))
        self.core.withdraw(self.entries[ident])
        assert self.model.cancel(ident)
        self.deadlines.pop(ident, None)
        self.take_hint()

    @precondition(lambda self: any(self.callers(b) for b in self.running.values()))
    @rule(data=st.data())
    def abandon_running(self, data: st.DataObject) -> None:
        batch = data.draw(
            st.sampled_from([b for _, b in sorted(self.running.items()) if self.callers(b)])
        )
        entry = data.draw(st.sampled_from(self.callers(batch)))
        last = self.core.abandon(entry)
        assert last == (not self.callers(batch))

    # --- helpers -------------------------------------------------------------------------

    def take_hint(self) -> None:
        self.timer = min(self.timer, self.core.take_wakeup_hint())

    @staticmethod
    def callers(batch: Batch[str, int]) -> list[Entry[str, int]]:
        return [e for e in batch._entries if e.state == RUNNING]

    def waiting(self, ident: int) -> bool:
        return self.entries[ident].state in (ADMITTING, QUEUED)

    def check_batch(self, values: tuple[int, ...]) -> None:
        limits = self.limits
        assert 1 <= len(values) <= limits["max_batch_items"]
        total = sum(self.sizes[v] for v in values)
        assert total <= limits["max_batch_bytes"] or len(values) == 1
        lanes = {self.lane_of[v] for v in values}
        assert len(lanes) == 1
        (lane,) = lanes
        # FIFO per lane, inside the batch and across batches.
        assert list(values) == sorted(values)
        assert values[0] > self.last_run.get(lane, 0)
        self.last_run[lane] = values[-1]
        for value in values:
            assert value not in self.executed  # at most once
            self.executed.add(value)
            deadline = self.deadlines.pop(value, math.inf)
            assert self.now < deadline  # only before its deadline passed

    def check_next_wakeup(self) -> None:
        """Right after a dispatch at ``now``, time alone changes nothing before the
        earliest waiting deadline or (with in-flight room) the oldest head's flush."""
        wakeup = self.core.next_wakeup(self.now)
        assert wakeup > self.now
        expected = min((d for i, d in self.deadlines.items() if self.waiting(i)), default=math.inf)
        if self.core.in_flight < self.limits["max_in_flight_batches"]:
            flush = self.model.next_flush()
            if flush is not None:
                expected = min(expected, flush)
        assert wakeup == expected

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def the_shells_timer_never_sleeps_past_the_next_wakeup(self) -> None:
        if hasattr(self, "core"):
            assert self.timer <= self.core.next_wakeup(self.now)

    @invariant()
    def retention_equals_the_model_and_stays_within_caps(self) -> None:
        if not hasattr(self, "core"):
            return
        stats = self.core.statistics()
        assert (stats.retained_items, stats.retained_bytes) == (
            self.model.retained_items,
            self.model.retained_bytes,
        )
        assert stats.retained_items <= self.limits["max_retained_items"]
        assert stats.retained_bytes <= self.limits["max_retained_bytes"]
        assert stats.in_flight == len(self.model.in_flight) == len(self.running)
        assert stats.in_flight <= self.limits["max_in_flight_batches"]
        assert stats.waiting_for_admission == len(self.model.admitting)
        assert stats.queued == sum(len(q) for q in self.model.lanes.values())
        assert stats.peak_in_flight <= self.limits["max_in_flight_batches"]
        self.peak_items = max(self.peak_items, self.model.retained_items)
        self.peak_bytes = max(self.peak_bytes, self.model.retained_bytes)
        assert self.peak_items <= stats.peak_retained_items <= self.limits["max_retained_items"]
        assert self.peak_bytes <= stats.peak_retained_bytes <= self.limits["max_retained_bytes"]


BatcherCoreMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None
)
TestBatcherCore = BatcherCoreMachine.TestCase
