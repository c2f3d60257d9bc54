"""``Runtime.map``: the runner's main job as one call.

::

    report = await rt.map(namespace, contract, rows, fn, concurrency=16,
                          batch_rows=500, flush_seconds=0.25, receipts=False, progress=None)

``Runtime.map`` admits ``rows`` and hands :func:`run_map` the admission's
pending rows and the writer's two terminal writes. ``run_map`` is the loop,
free of the runtime (the virtual-time tests drive it with fakes):

* ``concurrency`` worker tasks take rows from one iterator of the pending
  dataset and call ``fn`` on each; so at most ``concurrency`` calls run at
  once. One worker steps the iterator at a time (the others wait only while
  it does). Over a ``Dataset`` (read by keyset) one *read-ahead* task reads
  the next page while the workers take rows from the current one, so they
  wait for no page read but the first; at most ``MAP_READ_AHEAD_ROWS`` rows
  (two pages) are held.
* Each outcome is a ``CompleteRow`` (``fn`` returned its outputs) or a
  ``FailRow`` (``fn`` raised an ``Exception``: its message, cut to
  ``MAX_ERROR_TEXT_BYTES``; or returned outputs the store would refuse: not
  a JSON object, a NUL, nesting past ``MAX_JSON_DEPTH``, larger than
  ``MAX_ROW_BYTES``; one bad row fails alone, never its batch). Each output
  is checked once, by the store's own check (``checked_outputs``), whose
  bytes are its estimate in the batcher; the writes skip the writer's argument
  checks (the rows are map's own), and on the direct road the store takes the
  checked outputs (a ``CheckedObject``) without checking them again. A
  ``BaseException`` other than a cancellation propagates and stops the map.
* The writes are batched by one ``BoundedBatchFunction``, with one lane per
  write kind (``complete``, ``fail``), and nothing else: the worker hands the
  outcome to it with ``submit_nowait`` (a row costs an entry in its lane,
  never a task or a wake-up of its own) and takes its next row at once. Its
  settings are the write rules: a batch of up to ``batch_rows`` rows and
  ``MAP_WRITE_BATCH_MAX_BYTES``, leaving ``flush_seconds`` after its first
  row (or at once when the workers are done: the batcher drains),
  ``MAP_WRITE_MAX_IN_FLIGHT`` writes of both kinds at once, results not yet
  written capped at ``MAP_RETAINED_BATCHES * batch_rows`` rows and
  ``MAP_MAX_RETAINED_RESULT_BYTES``, and ``MAX_QUEUE_WAIT_MS`` for a row to
  reach its write. Where the batcher has no room (``trio.WouldBlock``) the
  worker waits until a write settles and offers the row again. Memory
  therefore does not grow with the sheet. One *watcher* task looks at the
  handed rows' ``Pending`` objects in order and stops the map on the first
  that failed (a write error, or a row that waited past its deadline).
* When a write reports the attempt superseded, the workers' cancel scope is
  cancelled in the same step, before any other task runs: every ``fn`` call
  still running is cancelled at once and none starts after (each worker
  checks the flag right before calling ``fn``). ``run_map`` then raises
  ``AttemptSupersededError``. Any other write error stops the map the same
  way and is raised.
* With ``receipts``, each row's ``fn`` runs through ``once`` under the key
  ``map/{namespace}/{row key}`` (a digest when that would be too long): a
  rerun after a supersession or a crash takes every finished call's result
  from its receipt (counted in ``reused``) instead of calling ``fn`` again.

Cancelling ``map`` cancels everything it started: ``fn`` calls, the reads,
and the write batches (a cut write is safe to replay at the same version).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, Literal, Protocol, runtime_checkable

import attrs
import trio

from . import _tracing
from ._groups import raise_single
from ._ints import check_int
from ._rowchecks import checked_outputs
from ._types import CompleteRow, FailRow, SheetContract, TerminalWriteResult
from .batching import Batch, BoundedBatchFunction, Pending
from .budgets import (
    MAP_MAX_BATCH_ROWS,
    MAP_MAX_RETAINED_RESULT_BYTES,
    MAP_RETAINED_BATCHES,
    MAP_WRITE_BATCH_MAX_BYTES,
    MAP_WRITE_MAX_IN_FLIGHT,
    MAX_ERROR_TEXT_BYTES,
    MAX_QUEUE_WAIT_MS,
    MAX_ROW_KEY_BYTES,
)
from .errors import BatcherClosedError, InvalidInputError

__all__ = [
    "UNKNOWN_OUTPUTS",
    "CompleteWrite",
    "FailWrite",
    "MapProgress",
    "MapReport",
    "MapRun",
    "OutputKeys",
    "UnknownOutputs",
    "map_span",
    "receipt_key",
    "run_map",
    "trace_report",
]

Row = dict[str, Any]
MapFn = Callable[[Row], Awaitable[Mapping[str, Any]]]
Once = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[tuple[Any, bool]]]
#: A map's terminal writes: a batch of outputs, or of failures, written fenced.
CompleteWrite = Callable[[Sequence[CompleteRow]], Awaitable[TerminalWriteResult]]
FailWrite = Callable[[Sequence[FailRow]], Awaitable[TerminalWriteResult]]
Kind = Literal["complete", "fail"]
_MS: Final = 1000


@runtime_checkable
class ReadsAhead(Protocol):
    """An iterator of pending rows that reads its next page on request (a ``Dataset``'s
    ``DatasetIterator``: named by shape, so importing ``map`` loads no store)."""

    async def read_ahead(self) -> bool: ...


@attrs.frozen
class MapReport:
    """What one ``map`` did."""

    write_version: int
    """The admission's write version: every write of this map carried it."""
    admitted: int
    """Input rows the admission took (to map, or already enriched and kept)."""
    pending: int
    """Rows this attempt had to map."""
    completed: int
    """Rows written enriched."""
    failed: int
    """Rows written failed (``fn`` raised an ``Exception``)."""
    reused: int
    """Rows whose outputs came from a receipt of an earlier call (``receipts=True``)."""
    elapsed_seconds: float
    """How long the map took, admission included."""


@attrs.frozen
class MapProgress:
    """A snapshot passed to ``progress`` as rows settle (after each write batch)."""

    settled: int
    """Rows written so far (completed plus failed)."""
    completed: int
    """Rows written enriched so far."""
    failed: int
    """Rows written failed so far."""
    reused: int
    """Rows so far whose outputs came from a receipt."""
    total: int
    """Rows to map in all (the admission's pending rows)."""


def map_span(
    name: str, namespace: str, concurrency: int, batch_rows: int
) -> AbstractContextManager[_tracing.Span]:
    """The span of one ``map`` (``sheetplane.map``) or ``map_attempt`` call: its sheet and
    settings now, its counts (``trace_report``) and ``fn``'s time (``run_map``) at the end."""
    return _tracing.span(
        name,
        {
            "sheetplane.table_namespace": namespace,
            "sheetplane.map.concurrency": concurrency,
            "sheetplane.map.batch_rows": batch_rows,
        },
    )


def trace_report(span: _tracing.Span, report: MapReport) -> None:
    """A map's counts on its span."""
    span.set_attributes(
        {
            "sheetplane.write_version": report.write_version,
            "sheetplane.map.admitted": report.admitted,
            "sheetplane.map.pending": report.pending,
            "sheetplane.map.completed": report.completed,
            "sheetplane.map.failed": report.failed,
            "sheetplane.map.reused": report.reused,
        }
    )


def receipt_key(namespace: str, row_key: str) -> str:
    """The receipt key of one row's ``fn`` call: ``map/{namespace}/{row key}``, or its
    SHA-256 digest when that is longer than ``MAX_ROW_KEY_BYTES``."""
    key = f"map/{namespace}/{row_key}"
    if len(key.encode("utf-8", "surrogatepass")) <= MAX_ROW_KEY_BYTES:
        return key
    return "map-sha256/" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def check_map_options(
    fn: object, concurrency: object, batch_rows: object, flush_seconds: object, progress: object
) -> None:
    """Raise ``InvalidInputError`` naming the first bad ``map`` option.

    ``fn`` must be async (an ``async def`` function, a method or a
    ``functools.partial`` of one, or an object whose ``__call__`` is one): a plain
    function or a lambda is refused here, before anything is admitted, rather than
    failing every row with "can't be used in 'await' expression". ``progress`` is
    called synchronously as rows settle, so an ``async def`` one (which would
    never run) is refused too.
    """
    if not callable(fn):
        raise InvalidInputError(f"fn must be an async callable, got {fn!r}")
    if not is_async_callable(fn):
        raise InvalidInputError(
            f"fn must be an async function (async def fn(row) -> outputs), got {_named(fn)};"
            " for blocking code, await trio.to_thread.run_sync(your_function, row) inside it"
        )
    for name, value, top in (
        ("concurrency", concurrency, None),
        ("batch_rows", batch_rows, MAP_MAX_BATCH_ROWS),
    ):
        check_int(name, value, 1, top)
    if (
        isinstance(flush_seconds, bool)
        or not isinstance(flush_seconds, int | float)
        or not math.isfinite(flush_seconds)
        or flush_seconds < 0
    ):
        raise InvalidInputError(f"flush_seconds must be finite and >= 0, got {flush_seconds!r}")
    if progress is not None and not callable(progress):
        raise InvalidInputError(f"progress must be callable or None, got {progress!r}")
    if progress is not None and is_async_callable(progress):
        raise InvalidInputError(
            f"progress must be a plain function (def progress(p: MapProgress) -> None): it is"
            f" called as rows settle, and {_named(progress)} is async, so it would never run"
        )


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` gives a coroutine by its definition: an ``async def``
    function or method, a ``functools.partial`` of one, or an object whose class
    defines an ``async def __call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = inspect.getattr_static(type(fn), "__call__", None)
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


def _named(fn: object) -> str:
    """How a message names a callable (its qualified name, else its type)."""
    name = getattr(fn, "__qualname__", None)
    return f"{name!r}" if isinstance(name, str) else f"a {type(fn).__name__}"


#: A worker's outcome and its estimated bytes (measured once, by the worker): one value
#: of the write batcher.
Outcome = tuple[CompleteRow | FailRow, int]


def _estimate(outcome: Outcome) -> int:
    return outcome[1]


@attrs.define(eq=False)
class _Queued:
    """One write kind's rows handed to the batcher whose write has not started, oldest
    first, for its watcher. The batcher keeps a lane in order, so the rows a batch of
    this kind starts with are the oldest ones here."""

    rows: deque[Pending[Kind, Outcome]] = attrs.Factory(deque)
    idle: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)
    """Where the watcher waits while no row is queued."""
    finished: bool = False
    _watching: trio.CancelScope | None = None

    def add(self, row: Pending[Kind, Outcome]) -> None:
        self.rows.append(row)
        if self.idle:
            self.idle.unpark()

    def started(self, count: int) -> None:
        """A batch of the oldest ``count`` rows started: the watcher looks further on."""
        for _ in range(min(count, len(self.rows))):
            self.rows.popleft()
        if self._watching is not None:
            self._watching.cancel()

    def finish(self) -> None:
        """No row comes after this one: the watcher ends once nothing is queued."""
        self.finished = True
        self.idle.unpark_all()

    async def watch_oldest(self) -> BaseException | None:
        """Wait until the oldest queued row settles (its error, if any) or starts (None)."""
        oldest = self.rows[0]
        try:
            with trio.CancelScope() as self._watching:
                await oldest.wait()
        except Exception as exc:
            if self.rows and self.rows[0] is oldest:
                self.rows.popleft()
            return exc
        finally:
            self._watching = None
        return None


def _fail(key: str, text: str) -> Outcome:
    """A FailRow whose message fits the gateway's error cap (cut at a character)."""
    encoded = text.encode("utf-8", "replace")
    if len(encoded) > MAX_ERROR_TEXT_BYTES:
        text = encoded[: MAX_ERROR_TEXT_BYTES - 3].decode("utf-8", "ignore") + "..."
    return FailRow(key, text), len(key) + len(text.encode("utf-8", "replace"))


def _complete(key: str, outputs: Mapping[str, Any]) -> Outcome:
    """A CompleteRow, or a FailRow when the store would refuse the outputs (not JSON, a
    NUL, too deep, larger than ``MAX_ROW_BYTES``): one bad row fails alone instead of
    failing its whole batch's write. Checked once, by the store's own check, whose
    bytes (or bound on them) are the row's estimate."""
    try:
        data, size = checked_outputs(outputs, _outputs)
    except InvalidInputError as exc:
        return _fail(key, f"fn returned outputs that cannot be written: {exc}")
    return CompleteRow(key, data), len(key) + size


def _outputs() -> str:
    return "its outputs"


def _failure_text(exc: Exception) -> str:
    """A failed row's ``_error``: the exception's type and its message (a ``KeyError``
    reads ``KeyError: 'provider'``, not just ``'provider'``)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: What ``map`` does with outputs that carry a key naming no contract column.
UnknownOutputs = Literal["fail", "raise"]
UNKNOWN_OUTPUTS: Final[tuple[UnknownOutputs, ...]] = ("fail", "raise")


@attrs.frozen
class OutputKeys:
    """The keys ``fn``'s outputs may carry: a column's ``id`` (or its ``sql_name`` or
    ``field``); ``_key``, which every row handed to ``fn`` carries, is let through."""

    names: frozenset[str]
    """Every name of every contract column."""
    outputs: tuple[str, ...]
    """The ids of the contract's output columns, for the message."""

    @classmethod
    def of(cls, contract: SheetContract) -> OutputKeys:
        """The keys ``contract``'s columns may be written under."""
        names = {name for c in contract.columns for name in (c.id, c.sql_name, c.field) if name}
        outputs = tuple(c.id for c in contract.columns if c.source == "output")
        return cls(frozenset(names | {"_key"}), outputs)

    def problem(self, outputs: Mapping[str, Any]) -> str | None:
        """Why ``outputs`` cannot be written as they are (the first unknown key), or None."""
        for key in outputs:
            if key not in self.names:
                return (
                    f"fn returned the output key {key!r}, which names no column of the "
                    f"contract; its outputs are {list(self.outputs)} (keyed by column id)"
                )
        return None


@attrs.define(eq=False)
class _MapState:
    """What the workers, the write tasks and the batch function share."""

    total: int
    progress: Callable[[MapProgress], object] | None
    completed: int = 0
    failed: int = 0
    reused: int = 0
    fn_calls: int = 0
    """``fn`` calls timed (only while the map's span records)."""
    fn_seconds: float = 0.0
    """Their time, summed over the calls (task-seconds, not wall time)."""
    stop: bool = False
    error: BaseException | None = None
    workers: trio.CancelScope | None = None
    everything: trio.CancelScope | None = None

    def halt(self, error: BaseException) -> None:
        """Stop at once: no ``fn`` call starts after this, running ones are cancelled."""
        if self.error is None:
            self.error = error
        self.stop = True
        if self.workers is not None:
            self.workers.cancel()
        if self.everything is not None:
            self.everything.cancel()

    def settled(self, kind: Kind, rows: int) -> None:
        if kind == "complete":
            self.completed += rows
        else:
            self.failed += rows
        if self.progress is not None:
            self.progress(
                MapProgress(
                    settled=self.completed + self.failed,
                    completed=self.completed,
                    failed=self.failed,
                    reused=self.reused,
                    total=self.total,
                )
            )


async def run_map(
    pending: AsyncIterable[Row],
    fn: MapFn,
    *,
    total: int,
    complete: CompleteWrite,
    fail: FailWrite,
    concurrency: int,
    batch_rows: int,
    flush_seconds: float,
    once: Once | None = None,
    namespace: str = "",
    progress: Callable[[MapProgress], object] | None = None,
    output_keys: OutputKeys | None = None,
    unknown_outputs: UnknownOutputs = "fail",
) -> tuple[int, int, int]:
    """Map ``fn`` over ``pending`` and write every outcome; ``(completed, failed, reused)``.

    See the module docstring for the rules. Raises ``AttemptSupersededError``
    when a write finds the attempt superseded (after cancelling every ``fn``
    call), the first other write error, or a ``BaseException`` from ``fn``.
    """
    run = MapRun(
        pending,
        fn,
        total=total,
        complete=complete,
        fail=fail,
        concurrency=concurrency,
        batch_rows=batch_rows,
        flush_seconds=flush_seconds,
        once=once,
        namespace=namespace,
        progress=progress,
        output_keys=output_keys,
        unknown_outputs=unknown_outputs,
    )
    return await run.run()


class MapRun:
    """One ``run_map``: its workers call ``fn`` and hand each outcome to a batcher whose
    batches are the terminal writes; watchers stop the run on a row that waited too long."""

    def __init__(
        self,
        pending: AsyncIterable[Row],
        fn: MapFn,
        *,
        total: int,
        complete: CompleteWrite,
        fail: FailWrite,
        concurrency: int,
        batch_rows: int,
        flush_seconds: float,
        once: Once | None,
        namespace: str,
        progress: Callable[[MapProgress], object] | None,
        output_keys: OutputKeys | None,
        unknown_outputs: UnknownOutputs,
    ) -> None:
        self.fn = fn
        self.complete = complete
        self.fail = fail
        self.concurrency = concurrency
        self.once = once
        self.namespace = namespace
        self.output_keys = output_keys
        self.unknown_outputs = unknown_outputs
        self.state = _MapState(total=total, progress=progress)
        self.queued: dict[Kind, _Queued] = {"complete": _Queued(), "fail": _Queued()}
        #: Workers the batcher had no room for wait here until a write ends.
        self.room = trio.lowlevel.ParkingLot()
        self.batcher: BoundedBatchFunction[Kind, Outcome, None] = BoundedBatchFunction(
            self.execute,
            estimate_bytes=_estimate,
            max_batch_items=batch_rows,
            max_batch_bytes=MAP_WRITE_BATCH_MAX_BYTES,
            max_retained_items=MAP_RETAINED_BATCHES * batch_rows,
            max_retained_bytes=MAP_MAX_RETAINED_RESULT_BYTES,
            max_in_flight_batches=MAP_WRITE_MAX_IN_FLIGHT,
            flush_seconds=flush_seconds,
        )
        self.max_wait = MAX_QUEUE_WAIT_MS / _MS
        self.iterator: AsyncIterator[Row] = aiter(pending)
        self.reading = False
        self.page_read = trio.lowlevel.ParkingLot()
        self.live_workers = concurrency
        self.reading_ahead = trio.CancelScope()
        self.timing = False

    async def execute(self, batch: Batch[Kind, Outcome]) -> list[None]:
        """The batcher's function: one terminal write of a batch of outcomes."""
        state = self.state
        self.queued[batch.key].started(len(batch.values))
        try:
            if batch.key == "complete":
                await self.complete(
                    [row for row, _size in batch.values if type(row) is CompleteRow]
                )
            else:
                await self.fail([row for row, _size in batch.values if type(row) is FailRow])
        except Exception as exc:
            state.halt(exc)  # in this very step: no fn call starts after a supersession
            raise
        finally:
            # The batcher frees this batch's room before anyone woken here runs.
            self.room.unpark_all()
        state.settled(batch.key, len(batch.values))
        return [None] * len(batch.values)

    async def hand_over(self, result: Outcome) -> None:
        kind: Kind = "complete" if type(result[0]) is CompleteRow else "fail"
        while True:
            try:
                entry = self.batcher.submit_nowait(kind, result, max_wait=self.max_wait)
            except trio.WouldBlock:
                # Room frees when a write ends (rows that can wait no more stop the map).
                await self.room.park()
            else:
                self.queued[kind].add(entry)
                lane = entry.lane
                if lane is not None and lane.closed:
                    # Its lane is ready to write: yield so the write starts while an
                    # fn that never checkpoints goes on mapping.
                    await trio.lowlevel.checkpoint()
                return

    async def watcher(self, kind: Kind) -> None:
        """Stops the map on the first queued row of ``kind`` that waited past its
        deadline. Rows whose write started are ``execute``'s to look after."""
        lane = self.queued[kind]
        while True:
            if lane.rows:
                failure = await lane.watch_oldest()
                # A closed batcher is the map already stopping on another error.
                if failure is not None and type(failure) is not BatcherClosedError:
                    self.state.halt(failure)
                    return
            elif lane.finished:
                return
            else:
                await lane.idle.park()

    async def next_row(self) -> Row | None:
        # One worker at a time steps the iterator; the others wait for that step to
        # end and then look again. Not a trio.Lock: its fair hand-off gives the lock
        # to a woken worker that has not run yet, so every worker queued behind it
        # each pass and the workers took one row per scheduler pass between them.
        while self.reading:
            await self.page_read.park()
        if self.state.stop:
            return None
        self.reading = True
        try:
            return await anext(self.iterator, None)
        finally:
            self.reading = False
            if self.page_read:
                self.page_read.unpark_all()

    async def timed(self, row: Row) -> Mapping[str, Any]:
        """``fn``, timed for the map's span (``fn`` itself has no span)."""
        started = time.perf_counter()
        try:
            return await self.fn(row)
        finally:
            self.state.fn_calls += 1
            self.state.fn_seconds += time.perf_counter() - started

    async def call(self, row: Row) -> Outcome:
        """``fn`` on one row, and its outcome: complete with its outputs, or fail."""
        key = row["_key"]
        fn = self.timed if self.timing else self.fn
        try:
            if self.once is None:
                outputs = await fn(row)
            else:
                outputs, reused = await self.once(receipt_key(self.namespace, key), lambda: fn(row))
                if reused:
                    self.state.reused += 1
        except Exception as exc:
            return _fail(key, _failure_text(exc))
        if not isinstance(outputs, Mapping):
            what = type(outputs).__name__
            return _fail(key, f"fn must return a mapping of outputs, got {what}")
        problem = None if self.output_keys is None else self.output_keys.problem(outputs)
        if problem is not None:
            if self.unknown_outputs == "raise":
                raise InvalidInputError(f"row {key!r}: {problem}")
            return _fail(key, problem)
        return _complete(key, outputs)

    async def worker(self) -> None:
        try:
            while True:
                row = await self.next_row()
                if row is None:
                    return
                if self.state.stop:  # checked right before fn: nothing starts once superseded
                    return
                await self.hand_over(await self.call(row))
        finally:
            self.live_workers -= 1
            if not self.live_workers:
                self.reading_ahead.cancel()

    async def read_ahead(self, pages: ReadsAhead) -> None:
        """Reads each next page while the workers take the current one's rows."""
        with self.reading_ahead:
            while await pages.read_ahead():
                pass

    async def run(self) -> tuple[int, int, int]:
        """Run the map to its end: ``(completed, failed, reused)`` (``run_map``)."""
        state = self.state
        # fn is timed only while the map's span records (an SDK is set up).
        self.timing = _tracing.recording()
        try:
            with trio.CancelScope() as everything:
                state.everything = everything
                async with trio.open_nursery() as watching:
                    for kind in self.queued:
                        watching.start_soon(self.watcher, kind)
                    # Exits in order: the workers finish, the batcher drains (a partial
                    # batch leaves at once: no row can join it now), the watcher ends.
                    async with self.batcher, trio.open_nursery() as workers:
                        state.workers = workers.cancel_scope
                        if isinstance(self.iterator, ReadsAhead):
                            workers.start_soon(self.read_ahead, self.iterator)
                        for _ in range(self.concurrency):
                            workers.start_soon(self.worker)
                    for lane in self.queued.values():
                        lane.finish()
        except BaseExceptionGroup as group:
            raise_single(group)
        finally:
            if self.timing:
                _tracing.annotate(
                    {
                        "sheetplane.map.fn_calls": state.fn_calls,
                        "sheetplane.map.fn_seconds": state.fn_seconds,
                    }
                )
        if state.error is not None:
            raise state.error
        return state.completed, state.failed, state.reused
