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
"""

from __future__ import annotations

import math
import re
from typing import Final

import attrs

from ..budgets import (
    CALL_BUDGET_MS,
    MAX_RETRY_AFTER_MS,
    REQUEST_TIMEOUT_MS,
    RETRY_DELAYS_MS,
)
from ..protocol._wire import UNSUPPORTED_ACTION_TEXT

#: Error texts of failures that are worth another attempt: the runtime's own list,
#: alternative for alternative (docs/gateway.md, "Retries").
TRANSIENT_MESSAGE: Final = re.compile(
    r"timeout exceeded when trying to connect|timed out|fetch failed|ECONNRESET|ECONNREFUSED"
    r"|UND_ERR_CONNECT_TIMEOUT|requested endpoint could not be found, or you don't have access"
    r"|Neon API request failed \((?:408|429|502|503|504)\)"
    r"|RUNTIME_SCHEDULER_(?:SATURATED|UNAVAILABLE|SCHEMA_NOT_READY)"
    r"|RUNTIME_RATE_STATE_UNAVAILABLE|Runtime scheduler DB pool is saturated"
    r"|Runtime scheduler DB circuit breaker is open|Runtime rate state .* is unavailable",
    re.IGNORECASE,
)

#: The answer of a gateway that predates an action.
UNSUPPORTED_ACTION_MESSAGE: Final = re.compile(re.escape(UNSUPPORTED_ACTION_TEXT), re.IGNORECASE)

#: HTTP statuses retried on the ladder whatever their body says (429: a cap such
#: as the gateway's live sessions per token, with the body's ``retry_after_ms``).
TRANSIENT_STATUSES: Final = frozenset({429, 502, 503, 504})


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


def retry_after_from_body(value: object) -> int | None:
    """A body's ``retry_after_ms``: a finite, non-negative number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return min(math.ceil(value), MAX_RETRY_AFTER_MS)


def retry_after_from_header(value: str | None) -> int | None:
    """A ``Retry-After`` header in delta-seconds, as milliseconds; ``None`` otherwise.

    The HTTP-date form is ignored: it would need a wall clock agreed with
    the server, and the ladder is a fine answer without one.
    """
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        return None
    # Compare digit counts first so a thousand-digit header is not converted.
    if len(text) > len(str(MAX_RETRY_AFTER_MS)):
        return MAX_RETRY_AFTER_MS
    return min(int(text) * 1000, MAX_RETRY_AFTER_MS)


def is_transient_message(text: str) -> bool:
    """Whether an error text names a transient failure."""
    return TRANSIENT_MESSAGE.search(text) is not None
