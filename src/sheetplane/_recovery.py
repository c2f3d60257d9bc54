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
refused for good: a bad password, an expired role) leaves at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from .errors import StoreUnavailableError, TransactionConflictError
from .gateway._retry import CallBudget

__all__ = ["RETRIED_ERRORS", "retry_idempotent"]

T = TypeVar("T")

#: What the direct road retries: the connection was lost or refused, or
#: Postgres kept aborting the transaction on conflicts.
RETRIED_ERRORS = (StoreUnavailableError, TransactionConflictError)


async def retry_idempotent(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run ``attempt()``; on a ``RETRIED_ERRORS`` error, wait the ladder's next
    delay and run it again, while the call's budget allows. Then the last error
    is raised as it is. Only for idempotent operations (module docstring).

    Cancellation: trio sleeps between attempts, so a cancelled call stops at once.
    """
    budget = CallBudget(trio.current_time())
    failures = 0
    while True:
        try:
            return await attempt()
        except RETRIED_ERRORS as exc:
            if isinstance(exc, StoreUnavailableError) and not exc.transient:
                raise
            failures += 1
            wake = budget.next_attempt_at(trio.current_time(), failures, None)
            if wake is None:
                raise
        await trio.sleep_until(wake)
