"""Two holders never run a lease's body at once: ``LeaseTimes`` against a model of the
gateway's lease table and a clock.

The machine keeps a plain model of the store's lease rules (take when free,
renew by the holder, take over only once expired, release by the holder)
that processes each request some time after it was sent, and answers it some
time later, or never. Holders run the keeper's decisions exactly as the trio
shell does (``sheetplane._leases``): a body starts when an acquiring answer
arrives before ``stop_at``, a renewal is sent between ``renew_at`` and
``stop_at`` (late sends model a loaded event loop), an acquiring renewal
moves the lease on from when it was sent, a refusal stops the body when it
arrives, and the body stops at ``stop_at`` whatever is in flight. Every
claim is a new holder, as in ``ReceiptRecorder.claim``.

Invariants: a running body's holder is the table's holder with an expiry
strictly later than now, and no two holders' running intervals overlap.
Delays range from nothing to a whole lease, answers may be lost. The machine
runs twice: with a work receipt's lease, and with a share's
(``ShareLeaseMachine``: ``map_attempt``'s workers keep their shares with the
same ``LeaseTimes`` and the ``SHARE_LEASE_*`` budgets).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Literal

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sheetplane._leases import LeaseTimes
from sheetplane.budgets import (
    CALL_BUDGET_MS,
    SHARE_LEASE_GUARD_MS,
    SHARE_LEASE_RENEWAL_MS,
    SHARE_LEASE_TTL_MS,
    WORK_RECEIPT_LEASE_GUARD_MS,
    WORK_RECEIPT_LEASE_RENEWAL_MS,
    WORK_RECEIPT_LEASE_TTL_MS,
)

TTL, RENEWAL, GUARD = (
    WORK_RECEIPT_LEASE_TTL_MS,
    WORK_RECEIPT_LEASE_RENEWAL_MS,
    WORK_RECEIPT_LEASE_GUARD_MS,
)
#: Network and server delays, in milliseconds: none, small, up to a whole call, a whole lease.
DELAYS = st.sampled_from([0, 1, 250, CALL_BUDGET_MS // 2, CALL_BUDGET_MS, TTL])
STEPS = st.sampled_from([1, 250, GUARD // 2, RENEWAL, GUARD, TTL // 2, TTL])
PROCESSES = ("p", "q", "r")


@attrs.define
class Holder:
    """One claim block: idle until its first answer, then running until it stops."""

    name: str
    times: LeaseTimes | None = None
    started: float | None = None
    pending: bool = False


@attrs.frozen(order=True)
class Event:
    at: int
    seq: int
    kind: Literal["process", "answer"]
    request: Literal["claim", "release"] = attrs.field(order=False)
    holder: str = attrs.field(order=False)
    sent_at: int = attrs.field(order=False)
    answer_delay: int | None = attrs.field(order=False)
    """None: the answer is lost."""
    acquired: bool = attrs.field(default=False, order=False)


class LeaseMachine(RuleBasedStateMachine):
    #: The lease's budgets: a work receipt's (``ShareLeaseMachine``: a share's).
    ttl, renewal, guard = TTL, RENEWAL, GUARD

    def times(self, sent_at: int) -> LeaseTimes:
        return LeaseTimes(sent_at, ttl=self.ttl, renewal=self.renewal, guard=self.guard)

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.table_holder: str | None = None
        self.table_expires = 0
        self.events: list[Event] = []
        self.seq = itertools.count()
        self.names = itertools.count()
        self.active: dict[str, Holder] = {}  # process -> its current claim block
        self.runs: list[tuple[str, float, float]] = []

    # --- the model gateway ---------------------------------------------------------------

    def _send(
        self,
        request: Literal["claim", "release"],
        holder: str,
        process_delay: int,
        answer_delay: int | None,
    ) -> None:
        heapq.heappush(
            self.events,
            Event(
                self.now + process_delay,
                next(self.seq),
                "process",
                request,
                holder,
                self.now,
                answer_delay,
            ),
        )

    def _process(self, event: Event) -> None:
        acquired = False
        if event.request == "claim":
            if (
                self.table_holder is None
                or self.table_holder == event.holder
                or self.table_expires <= event.at
            ):
                self.table_holder, self.table_expires = event.holder, event.at + self.ttl
                acquired = True
        elif self.table_holder == event.holder:
            self.table_holder = None
        if event.request == "claim" and event.answer_delay is not None:
            heapq.heappush(
                self.events,
                attrs.evolve(
                    event,
                    at=event.at + event.answer_delay,
                    seq=next(self.seq),
                    kind="answer",
                    acquired=acquired,
                ),
            )

    # --- the holders (the keeper's decisions) ----------------------------------------------

    def _holder(self, name: str) -> Holder | None:
        return next((h for h in self.active.values() if h.name == name), None)

    def _stop(self, holder: Holder, at: float) -> None:
        assert holder.started is not None
        self.runs.append((holder.name, holder.started, at))
        holder.started = None
        holder.times = None

    def _answer(self, event: Event) -> None:
        holder = self._holder(event.holder)
        if holder is None:
            return
        holder.pending = False
        if holder.started is None:  # the first claim's answer
            lease = self.times(event.sent_at)
            if event.acquired and event.at < lease.stop_at:
                holder.times, holder.started = lease, event.at
            return
        assert holder.times is not None
        if event.acquired:
            holder.times.renewed(event.sent_at)
        else:
            self._stop(holder, event.at)

    def _stop_expired(self, until: float) -> None:
        for holder in self.active.values():
            if holder.times is not None and holder.times.stop_at <= until:
                holder.pending = False  # the keeper's call is cut off with the body
                self._stop(holder, holder.times.stop_at)

    # --- rules ------------------------------------------------------------------------------

    @precondition(lambda self: any(p not in self.active for p in PROCESSES))
    @rule(data=st.data(), process_delay=DELAYS, answer_delay=st.none() | DELAYS)
    def claim(self, data: st.DataObject, process_delay: int, answer_delay: int | None) -> None:
        process = data.draw(st.sampled_from([p for p in PROCESSES if p not in self.active]))
        holder = Holder(f"{process}{next(self.names)}", pending=True)
        self.active[process] = holder
        self._send("claim", holder.name, process_delay, answer_delay)

    @precondition(
        lambda self: any(
            h.times is not None and not h.pending and h.times.renew_at <= self.now
            for h in self.active.values()
        )
    )
    @rule(data=st.data(), process_delay=DELAYS, answer_delay=st.none() | DELAYS)
    def renew(self, data: st.DataObject, process_delay: int, answer_delay: int | None) -> None:
        due = [
            h
            for h in self.active.values()
            if h.times is not None and not h.pending and h.times.renew_at <= self.now
        ]
        holder = data.draw(st.sampled_from(due))
        holder.pending = True
        self._send("claim", holder.name, process_delay, answer_delay)

    @precondition(lambda self: bool(self.active))
    @rule(data=st.data(), process_delay=DELAYS)
    def leave(self, data: st.DataObject, process_delay: int) -> None:
        """The block ends (body done, raised or cancelled): stop, and release if running."""
        process = data.draw(st.sampled_from(sorted(self.active)))
        holder = self.active.pop(process)
        if holder.started is not None:
            self._stop(holder, self.now)
            self._send("release", holder.name, process_delay, None)

    @rule(step=STEPS)
    def advance(self, step: int) -> None:
        target = self.now + step
        while self.events and self.events[0].at <= target:
            event = heapq.heappop(self.events)
            self._stop_expired(event.at)
            self.now = event.at
            if event.kind == "process":
                self._process(event)
            else:
                self._answer(event)
        self._stop_expired(target)
        self.now = target

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def a_running_body_holds_the_live_lease(self) -> None:
        for holder in self.active.values():
            if holder.started is not None:
                assert self.table_holder == holder.name
                assert self.table_expires > self.now

    @invariant()
    def no_two_holders_ever_overlap(self) -> None:
        runs = list(self.runs)
        runs += [(h.name, h.started, self.now) for h in self.active.values() if h.started]
        runs.sort(key=lambda run: run[1])
        for (name_a, _start_a, end_a), (name_b, start_b, _end_b) in itertools.pairwise(runs):
            # Touching is not overlapping: a body that stopped (and released) at t and
            # another that started at t, once the release was processed, ran one after
            # the other.
            assert name_a == name_b or end_a <= start_b, (name_a, end_a, name_b, start_b)


LeaseMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_lease_machine = LeaseMachine.TestCase


class ShareLeaseMachine(LeaseMachine):
    """The same rules with a share's lease (``map_attempt``'s keeper uses ``LeaseTimes``
    with ``ShareLease``'s budgets): its renewal may take a whole request timeout."""

    ttl, renewal, guard = SHARE_LEASE_TTL_MS, SHARE_LEASE_RENEWAL_MS, SHARE_LEASE_GUARD_MS


ShareLeaseMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None
)
test_share_lease_machine = ShareLeaseMachine.TestCase
