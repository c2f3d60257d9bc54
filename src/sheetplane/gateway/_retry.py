"""The retry decisions of one gateway call, free of I/O.

``post_action`` asks two questions after a failed attempt: may it try again,
and when. The answers depend only on how many attempts failed, what the
server said about waiting, the current time and the call's deadline, so they
live here as plain functions and are tested synchronously.

The rules:

* A call makes at most ``MAX_ATTEMPTS`` attempts. After the ``n``-th failure
  it waits ``RETRY_DELAYS_MS[n - 1]``, unless the answer named a delay
  (``retry_after_ms`` in the body, else a ``Retry-After`` header in seconds):
  then it waits that long, clamped to ``MAX_RETRY_AFTER_MS``. A back-pressure
  answer that names no delay waits ``DEFAULT_RETRY_AFTER_MS``.
* The whole call runs under ``CALL_BUDGET_MS`` from its start. A wait that
  would end at or past the deadline is not taken: the call fails at once
  with the last attempt's error, so no request is ever sent after the budget.
* Each attempt runs until ``min(start + REQUEST_TIMEOUT_MS, deadline)``.
* An attempt the gateway refused for its tenant's share (429
  ``gateway_tenant_cap``: answered before its body was read, nothing done)
  does not spend the ladder either: the call waits the delay the answer named,
  stretched by a random part of it again (``refused_delay_ms``), and tries
  again, for as long as the deadline allows. Many workers of one token that
  meet the token's cap together so take turns within their calls' budgets
  instead of failing after five refusals.
* An attempt that reached no gateway (refused, reset, DNS) or met one that
  is draining does not spend the ladder: the call moves to its next URL at
  once while one of them is untried since the last full round, and after a
  full round waits ``reconnect_delay_ms`` (capped, jittered back-off), for as
  long as the deadline allows.
"""

from __future__ import annotations

import random

import attrs

from ..budgets import (
    CALL_BUDGET_MS,
    GATEWAY_RECONNECT_BASE_MS,
    GATEWAY_RECONNECT_CAP_MS,
    GATEWAY_TENANT_RETRY_AFTER_MS,
    MAX_RETRY_AFTER_MS,
    REQUEST_TIMEOUT_MS,
    RETRY_DELAYS_MS,
)


@attrs.frozen
class CallBudget:
    """The deadline arithmetic of one call, in seconds of ``trio.current_time()``."""

    start: float
    """When the call started."""
    delays_ms: tuple[int, ...] = RETRY_DELAYS_MS
    """The call's ladder: the delay after each failed attempt."""
    budget_ms: int = CALL_BUDGET_MS
    """The whole call's budget (its attempts at their timeout plus the ladder)."""
    attempt_ms: int = REQUEST_TIMEOUT_MS
    """One attempt's timeout (a staged commit takes ``ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS``)."""

    @property
    def deadline(self) -> float:
        """No request is sent at or after this time, and the call has ended by it."""
        return self.start + self.budget_ms / 1000

    def attempt_deadline(self, now: float) -> float:
        """When an attempt started at ``now`` must have finished."""
        return min(now + self.attempt_ms / 1000, self.deadline)

    def next_attempt_at(
        self, now: float, failures: int, retry_after_ms: int | None
    ) -> float | None:
        """When to start the next attempt after ``failures`` failed ones, or ``None`` to stop.

        ``retry_after_ms`` is the delay the last answer named (already
        parsed), if any.
        """
        delay_ms = retry_delay_ms(failures, retry_after_ms, self.delays_ms)
        if delay_ms is None:
            return None
        wake = now + delay_ms / 1000
        if wake >= self.deadline:
            return None
        return wake

    def reconnect_at(self, now: float, rounds: int, draw: float) -> float | None:
        """When to start again after ``rounds`` full rounds of URLs reached no
        gateway, or ``None`` when that would be at or past the deadline.
        ``draw`` is a uniform draw in [0, 1) (the jitter)."""
        wake = now + reconnect_delay_ms(rounds, draw) / 1000
        return wake if wake < self.deadline else None

    def refused_at(self, now: float, retry_after_ms: int | None, draw: float) -> float | None:
        """When to try again after the gateway refused the attempt for its tenant's
        share (429 ``gateway_tenant_cap``), or ``None`` at or past the deadline."""
        wake = now + refused_delay_ms(retry_after_ms, draw) / 1000
        return wake if wake < self.deadline else None


def refused_delay_ms(retry_after_ms: int | None, draw: float) -> float:
    """The wait after a refusal for the tenant's share: the delay it named (else
    ``GATEWAY_TENANT_RETRY_AFTER_MS``), clamped to ``MAX_RETRY_AFTER_MS``, stretched
    by up to as much again (``draw`` in [0, 1)), so the workers of one token that
    were refused together do not come back together."""
    named = GATEWAY_TENANT_RETRY_AFTER_MS if retry_after_ms is None else retry_after_ms
    base = float(max(0, min(named, MAX_RETRY_AFTER_MS)))
    return base + base * min(max(draw, 0.0), 1.0)


def reconnect_delay_ms(rounds: int, draw: float) -> float:
    """The back-off after ``rounds`` (>= 1) rounds that reached no gateway:
    ``GATEWAY_RECONNECT_BASE_MS`` doubled per round, capped at
    ``GATEWAY_RECONNECT_CAP_MS``, then drawn between half of it and all of it."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    doubled: int = GATEWAY_RECONNECT_BASE_MS << min(rounds - 1, 16)
    ceiling = float(min(GATEWAY_RECONNECT_CAP_MS, doubled))
    return ceiling / 2 + ceiling / 2 * min(max(draw, 0.0), 1.0)


def jitter() -> float:
    """A uniform draw in [0, 1) for ``reconnect_at``."""
    return random.random()


def retry_delay_ms(
    failures: int, retry_after_ms: int | None, delays_ms: tuple[int, ...] = RETRY_DELAYS_MS
) -> int | None:
    """The wait after the ``failures``-th failed attempt on the ladder ``delays_ms``,
    or ``None`` when the ladder ran out."""
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    if failures > len(delays_ms):
        return None
    if retry_after_ms is not None:
        return max(0, min(retry_after_ms, MAX_RETRY_AFTER_MS))
    return delays_ms[failures - 1]
