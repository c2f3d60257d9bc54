"""The direct road's recovery: idempotent store calls retried on the gateway road's ladder.

A runner on the direct road talks to Postgres itself, so a lost connection
(``57P01`` when a backend is terminated or the server shuts down, a restart,
a reset), a connect refused for lack of connection slots, or a transaction
that kept meeting deadlocks reaches it as ``StoreUnavailableError`` (its
subclass ``ConnectionSlotsExhaustedError``) or ``TransactionConflictError``.
``retry_idempotent`` runs an operation again on those, along the same
ladder and within the same budget as one gateway call (``RETRY_DELAYS_MS``,
``CALL_BUDGET_MS``, ``gateway._retry.CallBudget``), and only for operations
that are safe to run twice:

* terminal writes (``complete`` / ``fail``): a replay by write version. A
  write that committed before its answer was lost is found on the retry
  exactly as it was written and answered ``committed`` (``updated`` does not
  count it twice, and no second event is recorded); one that did not commit
  is written now. The fence decides either way as it did the first time;
* ``append`` / ``upsert`` / ``replace``: they carry an idempotency key, so a
  write that committed answers ``replayed`` on the retry instead of applying
  twice;
* reads and counts: they change nothing.

Nothing else on the direct road is retried here. Every other error (bad
input, a statement timeout, a conflict the caller made, a connect the server
refused for good: a bad password, an expired role) leaves at once. A refused
login of a session the runner minted is the session manager's to recover
(``sessions.SessionManager.store``: it mints anew until ``call_deadline()``,
the deadline this module's call sets for the task running it); one met inside
an attempt reaches this loop as a transient ``StoreUnavailableError`` with
the session already retired, so the next attempt mints anew.

A connect wait that spent the whole connect budget
(``POSTGRES_CONNECT_BUDGET_MS``: refused, reset or timed-out connects, tried
again until the budget is spent) is not retried either: Postgres is down, and
each retry would only wait the same budget again (a stopped server took 94 s
to report, four connect budgets). A call meeting an outage therefore fails
within one connect budget plus the ladder delays before it, and its message
states the whole call's wait. A refusal for lack of slots is back-pressure
and is retried within the call budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TypeVar

import trio

from .errors import ConnectionSlotsExhaustedError, StoreUnavailableError, TransactionConflictError
from .gateway import CallBudget

__all__ = ["RETRIED_ERRORS", "call_deadline", "retry_idempotent"]

T = TypeVar("T")

#: What the direct road retries: the connection was lost or refused, or
#: Postgres kept aborting the transaction on conflicts.
RETRIED_ERRORS = (StoreUnavailableError, TransactionConflictError)


#: The deadline (``trio.current_time()``) of the direct call the current task is
#: running, while it runs inside ``retry_idempotent``.
_CALL_DEADLINE: ContextVar[float | None] = ContextVar("sheetplane_call_deadline", default=None)


def call_deadline(started: float) -> float:
    """The deadline of the direct call this task runs: its ``retry_idempotent``
    budget's, or (outside one) a whole call budget from ``started`` (its
    ``trio.current_time()``). A session manager mints a gone session anew only
    until then."""
    deadline = _CALL_DEADLINE.get()
    return CallBudget(started).deadline if deadline is None else deadline


async def retry_idempotent(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run ``attempt()``; on a ``RETRIED_ERRORS`` error, wait the ladder's next
    delay and run it again, while the call's budget allows. Then the last error
    is raised as it is. Only for idempotent operations (module docstring).

    Cancellation: trio sleeps between attempts, so a cancelled call stops at once.
    """
    budget = CallBudget(trio.current_time())
    # A nested call (an attempt that itself retries) keeps the outer deadline.
    outer = _CALL_DEADLINE.get()
    scope = _CALL_DEADLINE.set(budget.deadline if outer is None else min(outer, budget.deadline))
    try:
        return await _retry(attempt, budget)
    finally:
        _CALL_DEADLINE.reset(scope)


async def _retry(attempt: Callable[[], Awaitable[T]], budget: CallBudget) -> T:
    failures = 0
    while True:
        try:
            return await attempt()
        except RETRIED_ERRORS as exc:
            failures += 1
            final = isinstance(exc, StoreUnavailableError) and (
                not exc.transient or _postgres_down(exc)
            )
            wake = None if final else budget.next_attempt_at(trio.current_time(), failures, None)
            if wake is None:
                waited = round((trio.current_time() - budget.start) * 1000)
                restated = _gave_up(exc, failures, waited)
                if restated is exc:
                    raise
                raise restated from exc
        await trio.sleep_until(wake)


def _postgres_down(exc: StoreUnavailableError) -> bool:
    """Whether ``exc`` ended a connect wait that spent the whole connect budget
    for a reason other than slots: Postgres is down, and another attempt would
    only wait the same budget again (a slot refusal is back-pressure: retried)."""
    return exc.waited_ms is not None and not isinstance(exc, ConnectionSlotsExhaustedError)


def _gave_up(exc: Exception, attempts: int, waited_ms: int) -> Exception:
    """``exc`` restated with what the whole call waited: same type, same flags."""
    if attempts == 1 or not isinstance(exc, StoreUnavailableError):
        return exc
    error = type(exc)(
        f"{exc} (the call gave up after {attempts} attempts in {waited_ms} ms)",
        transient=exc.transient,
        waited_ms=exc.waited_ms,
    )
    return error
