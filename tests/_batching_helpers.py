"""Helpers for the BoundedBatchFunction tests: a recording execute and a caller.

Every rule is tested through both entry points (the ``entry_point`` fixture):
``await batcher.submit(key, value)`` and ``batcher.submit_nowait(key, value)``
awaited through its ``Pending``. A caller of the second kind that is cancelled
while it waits leaves by ``pending.cancel()``, so the cancellation rules hold
for both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import trio

from sheetplane import BoundedBatchFunction
from sheetplane.batching import Batch

DEFAULTS: dict[str, Any] = {
    "max_batch_items": 4,
    "max_batch_bytes": 1_000,
    "max_retained_items": 100,
    "max_retained_bytes": 10_000,
    "max_in_flight_batches": 4,
    "flush_seconds": 0.25,
}


ENTRY_POINTS = ("submit", "submit_nowait")

Submit = Callable[..., Awaitable[Any]]


async def _through_pending(
    batcher: BoundedBatchFunction[Any, Any, Any], key: Hashable, value: Any, **kwargs: Any
) -> Any:
    pending = batcher.submit_nowait(key, value, **kwargs)
    try:
        return await pending.wait()
    except trio.Cancelled:
        pending.cancel()  # the caller leaves, as a cancelled submit does
        raise


async def _through_submit(
    batcher: BoundedBatchFunction[Any, Any, Any], key: Hashable, value: Any, **kwargs: Any
) -> Any:
    return await batcher.submit(key, value, **kwargs)


def submitter(entry_point: str) -> Submit:
    """``submit(batcher, key, value, **kwargs)`` through ``entry_point``, returning the
    value's result or raising its error."""
    return _through_submit if entry_point == "submit" else _through_pending


class Recorder:
    """An execute that records each batch (start time, key, values), can be held
    at a gate, and answers ``("r", value)`` per value."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, Any, tuple[Any, ...]]] = []
        self.finished: list[tuple[float, tuple[Any, ...]]] = []
        self.cancelled: list[tuple[float, tuple[Any, ...]]] = []
        self.gates: dict[Any, trio.Event] = {}
        self.hold_all: trio.Event | None = None

    def hold(self, first_value: Any) -> trio.Event:
        """Hold the batch whose first value is ``first_value`` until the event is set."""
        gate = self.gates[first_value] = trio.Event()
        return gate

    async def __call__(self, batch: Batch[Any, Any]) -> list[Any]:
        self.batches.append((trio.current_time(), batch.key, batch.values))
        try:
            gate = self.gates.get(batch.values[0])
            if gate is not None:
                await gate.wait()
            if self.hold_all is not None:
                await self.hold_all.wait()
        except trio.Cancelled:
            self.cancelled.append((trio.current_time(), batch.values))
            raise
        self.finished.append((trio.current_time(), batch.values))
        return [("r", value) for value in batch.values]

    @property
    def executed(self) -> list[tuple[Any, ...]]:
        return [values for _, _, values in self.batches]


def make(execute: Any, **overrides: Any) -> BoundedBatchFunction[Any, Any, Any]:
    return BoundedBatchFunction(execute, **{**DEFAULTS, **overrides})


class Outcomes:
    """What each caller got and when: ``(kind, result or exception, time)``."""

    def __init__(self, entry_point: str = "submit") -> None:
        self.by_value: dict[Any, tuple[str, Any, float]] = {}
        self.submit = submitter(entry_point)

    async def call(
        self,
        batcher: BoundedBatchFunction[Any, Any, Any],
        key: Hashable,
        value: Any,
        **kwargs: Any,
    ) -> None:
        try:
            result = await self.submit(batcher, key, value, **kwargs)
        except trio.Cancelled:
            self.by_value[value] = ("cancelled", None, trio.current_time())
            raise
        except Exception as exc:
            self.by_value[value] = ("error", exc, trio.current_time())
        else:
            self.by_value[value] = ("ok", result, trio.current_time())

    def __getitem__(self, value: Any) -> tuple[str, Any, float]:
        return self.by_value[value]


async def start_in_order(
    nursery: trio.Nursery,
    outcomes: Outcomes,
    batcher: BoundedBatchFunction[Any, Any, Any],
    calls: list[tuple[Hashable, Any]],
    **kwargs: Any,
) -> None:
    """Start one caller per ``(key, value)``, each parked before the next starts."""
    for key, value in calls:
        nursery.start_soon(lambda k=key, v=value: outcomes.call(batcher, k, v, **kwargs))
        await trio.testing.wait_all_tasks_blocked()


async def start_cancellable(
    nursery: trio.Nursery,
    outcomes: Outcomes,
    batcher: BoundedBatchFunction[Any, Any, Any],
    key: Hashable,
    value: Any,
) -> trio.CancelScope:
    """Start one caller inside its own cancel scope and let it park; cancelling the
    returned scope makes that caller leave."""
    scope = trio.CancelScope()

    async def caller() -> None:
        with scope:
            await outcomes.call(batcher, key, value)

    nursery.start_soon(caller)
    await trio.testing.wait_all_tasks_blocked()
    return scope
