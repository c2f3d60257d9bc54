"""``run_map`` (the loop of ``Runtime.map``) on virtual time, with fake writes: batches
by kind of up to ``batch_rows``, the flush timer, failures as FailRows, bounded
read-ahead and retention, progress, supersession cancelling every running ``fn``
at once with none started after, cancellation, and a BaseException passing through."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import sheetplane._map
from _fake_road import FakeRoad
from _fake_road import make_rows as road_rows
from sheetplane import (
    AttemptSupersededError,
    BoundedBatchFunction,
    LaneWedgedError,
    MapProgress,
)
from sheetplane._map import receipt_key, run_map
from sheetplane._types import CompleteRow, FailRow, StaleRow, TerminalWriteResult
from sheetplane.budgets import (
    MAP_MAX_RETAINED_RESULT_BYTES,
    MAP_RETAINED_BATCHES,
    MAP_WRITE_BATCH_MAX_BYTES,
    MAP_WRITE_MAX_IN_FLIGHT,
    MAX_ERROR_TEXT_BYTES,
    MAX_JSON_DEPTH,
    MAX_QUEUE_WAIT_MS,
    MAX_ROW_KEY_BYTES,
)
from sheetplane.dataset import DatasetIterator


def rows(n: int) -> list[dict[str, Any]]:
    return [{"_key": f"k{i:05d}", "n": i} for i in range(n)]


@attrs.define
class Pending:
    """An async iterable of rows that counts how many were taken from it."""

    items: list[dict[str, Any]]
    taken: int = 0

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for item in self.items:
            await trio.lowlevel.checkpoint()
            self.taken += 1
            yield item


@attrs.define
class Writes:
    """Fake terminal writes: record (time, kind, keys), optionally slow or superseded."""

    delay: float = 0.0
    supersede_on: int | None = None
    """The 1-based write call that reports the attempt superseded."""
    log: list[tuple[float, str, tuple[str, ...]]] = attrs.Factory(list)
    calls: int = 0
    errors: dict[str, str] = attrs.Factory(dict)
    """Each failed row's error, by key."""

    async def _write(self, kind: str, keys: tuple[str, ...]) -> TerminalWriteResult:
        self.calls += 1
        if self.delay:
            await trio.sleep(self.delay)
        else:
            await trio.lowlevel.checkpoint()
        if self.calls == self.supersede_on:
            stale = (StaleRow(keys[0], "newer_write_version", None),)
            raise AttemptSupersededError("leads", "run-1", 1, len(keys), stale)
        self.log.append((trio.current_time(), kind, keys))
        return TerminalWriteResult(keys, (), len(keys))

    async def complete(self, batch: Sequence[CompleteRow]) -> TerminalWriteResult:
        return await self._write("complete", tuple(row.key for row in batch))

    async def fail(self, batch: Sequence[FailRow]) -> TerminalWriteResult:
        self.errors.update((row.key, row.error) for row in batch)
        return await self._write("fail", tuple(row.key for row in batch))

    def written(self) -> int:
        return sum(len(keys) for _t, _kind, keys in self.log)


async def instant(row: dict[str, Any]) -> dict[str, Any]:
    await trio.lowlevel.checkpoint()
    return {"double": 2 * row["n"]}


async def mapped(
    items: Pending | list[dict[str, Any]], fn: Any, writes: Writes, **options: Any
) -> tuple[int, int, int]:
    """``run_map`` over ``items`` into ``writes``; options override the defaults here."""
    pending = items if isinstance(items, Pending) else Pending(items)
    settings: dict[str, Any] = {
        "total": len(pending.items),
        "complete": writes.complete,
        "fail": writes.fail,
        "concurrency": 4,
        "batch_rows": 500,
        "flush_seconds": 0.25,
        **options,
    }
    return await run_map(pending, fn, **settings)


async def test_writes_leave_in_full_batches_and_the_tail_once_no_row_can_join_it(
    autojump_clock: Any,
) -> None:
    writes = Writes()
    t0 = trio.current_time()
    counts = await mapped(Pending(rows(1200)), instant, writes, concurrency=16)
    assert counts == (1200, 0, 0)
    assert [(t - t0, kind, len(keys)) for t, kind, keys in writes.log] == [
        (0.0, "complete", 500),
        (0.0, "complete", 500),
        (0.0, "complete", 200),
    ]
    assert sorted(k for _t, _kind, keys in writes.log for k in keys) == [
        r["_key"] for r in rows(1200)
    ]


async def test_a_trickle_is_flushed_every_flush_seconds(autojump_clock: Any) -> None:
    writes = Writes()

    async def slow(row: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(0.1)
        return {}

    t0 = trio.current_time()
    await mapped(Pending(rows(8)), slow, writes, concurrency=1, batch_rows=100)
    # Row i is done at 0.1 * (i + 1); a batch leaves 0.25 s after its first row, the
    # last one as soon as the last row is done (no row can join it after that).
    assert [(round(t - t0, 6), keys) for t, _kind, keys in writes.log] == [
        (0.35, ("k00000", "k00001", "k00002")),
        (0.65, ("k00003", "k00004", "k00005")),
        (0.8, ("k00006", "k00007")),
    ]


async def test_fn_errors_become_fail_rows_in_their_own_lane(autojump_clock: Any) -> None:
    writes = Writes()

    async def picky(row: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if row["n"] % 3 == 0:
            raise ValueError(f"no thanks: {row['n']}")
        return {"ok": True}

    counts = await mapped(Pending(rows(9)), picky, writes, batch_rows=50)
    assert counts == (6, 3, 0)
    by_kind = {kind: sorted(keys) for _t, kind, keys in writes.log}
    assert by_kind == {
        "complete": ["k00001", "k00002", "k00004", "k00005", "k00007", "k00008"],
        "fail": ["k00000", "k00003", "k00006"],
    }


async def test_read_ahead_and_retained_results_stay_bounded(autojump_clock: Any) -> None:
    writes = Writes(delay=10.0)  # writes far slower than fn
    pending = Pending(rows(5_000))
    done = 0
    worst_unwritten = worst_unstarted = 0
    started = 0

    async def counting(row: dict[str, Any]) -> dict[str, Any]:
        nonlocal done, started, worst_unwritten, worst_unstarted
        started += 1
        worst_unstarted = max(worst_unstarted, pending.taken - started)
        await trio.lowlevel.checkpoint()
        done += 1
        worst_unwritten = max(worst_unwritten, done - writes.written())
        return {}

    await mapped(pending, counting, writes, concurrency=8, batch_rows=100)
    assert writes.written() == 5_000
    assert worst_unstarted <= 8  # rows are taken only by a worker about to call fn
    # Computed, not yet written: the retained batches, plus one result per worker in hand.
    assert worst_unwritten <= MAP_RETAINED_BATCHES * 100 + 8


async def test_progress_is_reported_as_batches_settle(autojump_clock: Any) -> None:
    seen: list[MapProgress] = []
    writes = Writes()
    await mapped(Pending(rows(1_050)), instant, writes, progress=seen.append)
    assert [p.settled for p in seen] == [500, 1_000, 1_050]
    assert seen[-1] == MapProgress(settled=1_050, completed=1_050, failed=0, reused=0, total=1_050)


async def test_supersession_cancels_every_running_call_and_starts_none(
    autojump_clock: Any,
) -> None:
    events: list[str] = []

    class Refusing(Writes):
        async def _write(self, kind: str, keys: tuple[str, ...]) -> TerminalWriteResult:
            try:
                return await super()._write(kind, keys)
            except AttemptSupersededError:
                events.append("refused")  # the step the refusal reaches the map in
                raise

    writes = Refusing(delay=0.5, supersede_on=2)
    cancelled: list[float] = []
    finished = 0

    async def slow(row: dict[str, Any]) -> dict[str, Any]:
        nonlocal finished
        events.append("start")
        try:
            await trio.sleep({0: 1.0, 1: 2.0, 2: 1.5}.get(row["n"] // 10, 100.0))
        except trio.Cancelled:
            cancelled.append(trio.current_time())
            raise
        finished += 1
        return {}

    t0 = trio.current_time()
    with pytest.raises(AttemptSupersededError):
        await mapped(Pending(rows(1_000)), slow, writes, concurrency=20, batch_rows=10)
    # Rows 0-9 end at 1.0 (batch 1 written at 1.5) and their workers start rows 20-29,
    # which end at 2.5: the very instant batch 2 (rows 10-19, sent at 2.0) is refused.
    # Whichever runs first in that instant, no call may start after the refusal.
    assert "start" not in events[events.index("refused") :]
    started = events.count("start")
    assert started >= 30
    assert finished >= 20
    assert cancelled == [t0 + 2.5] * (started - finished)  # every running call, at once
    assert writes.written() == 10


async def test_cancelling_map_cancels_its_calls_and_writes(autojump_clock: Any) -> None:
    writes = Writes(delay=5.0)
    running = 0

    async def slow(row: dict[str, Any]) -> dict[str, Any]:
        nonlocal running
        running += 1
        try:
            await trio.sleep(1.0)
        finally:
            running -= 1
        return {}

    with trio.move_on_after(3.5) as scope:
        await mapped(Pending(rows(100)), slow, writes, batch_rows=2)
    assert scope.cancelled_caught
    assert running == 0
    calls_at_cancel = writes.calls
    await trio.sleep(60)  # nothing it started is still running
    assert writes.calls == calls_at_cancel and running == 0


class Crash(BaseException):
    """Not an Exception: stops the map instead of failing a row."""


async def test_a_base_exception_from_fn_propagates_as_itself(autojump_clock: Any) -> None:
    writes = Writes()

    async def crashing(row: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(0.01 * row["n"])
        if row["n"] == 5:
            raise Crash("the process is going down")
        return {}

    with pytest.raises(Crash, match="going down"):
        await mapped(Pending(rows(50)), crashing, writes, concurrency=3, batch_rows=100)


def test_receipt_keys_name_the_row_or_digest_a_long_one() -> None:
    assert receipt_key("leads", "k1") == "map/leads/k1"
    long = receipt_key("leads", "x" * MAX_ROW_KEY_BYTES)
    assert long.startswith("map-sha256/") and len(long) == len("map-sha256/") + 64
    assert long != receipt_key("leads", "y" * MAX_ROW_KEY_BYTES)


async def test_outputs_that_cannot_be_written_fail_their_row_alone(autojump_clock: Any) -> None:
    writes = Writes()
    failures = writes.errors

    async def odd(row: dict[str, Any]) -> Any:
        await trio.lowlevel.checkpoint()
        return (
            [
                {"ok": 1},
                {"bad": object()},
                {"nan": float("nan")},
                "not a mapping",
            ][row["n"] % 4]
            if row["n"] != 4
            else _raise_long()
        )

    counts = await mapped(Pending(rows(8)), odd, writes, concurrency=2, batch_rows=10)
    assert counts == (1, 7, 0)  # row 0 completes; row 4 raised; the rest cannot be written
    assert "not valid JSON" in failures["k00001"] and "not valid JSON" in failures["k00002"]
    assert "must return a mapping" in failures["k00003"]
    assert len(failures["k00004"].encode()) <= MAX_ERROR_TEXT_BYTES
    assert failures["k00004"].endswith("...")


async def test_outputs_the_store_would_refuse_fail_their_row_alone(autojump_clock: Any) -> None:
    # These passed map's measure and reached the store's check of the whole batch,
    # which refused the write: the map stopped on the one bad row.
    writes = Writes()
    failures = writes.errors

    deep: Any = 1
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = [deep]
    bad = [{"ok": 1}, {"text": "a\x00b"}, {"deep": deep}, {1: "an int key"}]

    async def refused(row: dict[str, Any]) -> Any:
        await trio.lowlevel.checkpoint()
        return bad[row["n"]]

    counts = await mapped(Pending(rows(4)), refused, writes, batch_rows=10)
    assert counts == (1, 3, 0)
    assert "NUL" in failures["k00001"]
    assert "MAX_JSON_DEPTH" in failures["k00002"]
    assert "JSON object" in failures["k00003"]


def _raise_long() -> Any:
    raise ValueError("x" * (2 * MAX_ERROR_TEXT_BYTES))


class _Passes(trio.abc.Instrument):
    """Counts the scheduler's passes (each ends in one I/O wait)."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


@attrs.define
class Paged(Pending):
    """Rows read a page at a time, like the keyset iterator: a checkpoint per page only."""

    page: int = 500

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for index, item in enumerate(self.items):
            if index % self.page == 0:
                await trio.sleep(0.001)
            self.taken += 1
            yield item


async def test_workers_take_many_rows_per_scheduler_pass(autojump_clock: Any) -> None:
    # A row checkpoints in fn and once more waiting for room: with 16 workers a pass
    # moves about 16 rows. Workers queued on a fair lock took one row per pass.
    passes = _Passes()
    trio.lowlevel.add_instrument(passes)
    try:
        counts = await mapped(Paged(rows(4_000)), instant, Writes(), concurrency=16)
    finally:
        trio.lowlevel.remove_instrument(passes)
    assert counts == (4_000, 0, 0)
    assert passes.count < 4_000 / 4


async def test_workers_do_not_wait_for_a_page_read_after_the_first(autojump_clock: Any) -> None:
    # Each page read takes 5 s; the workers take a page's 100 rows in 10 s (1 s each,
    # 10 at once). The next page is read while they do: only the first read is waited
    # for. Each read stopped every worker before: 10 reads of 5 s on top of the 100 s.
    road = FakeRoad(road_rows(1_000), delay=5.0)
    writes = Writes()

    async def slow(row: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(1.0)
        return {}

    t0 = trio.current_time()
    counts = await run_map(
        DatasetIterator(road, 100, None),
        slow,
        total=1_000,
        complete=writes.complete,
        fail=writes.fail,
        concurrency=10,
        batch_rows=100,
        flush_seconds=0.25,
    )
    assert counts == (1_000, 0, 0)
    assert writes.written() == 1_000
    assert len(road.after_calls) == 10
    assert trio.current_time() - t0 == pytest.approx(5.0 + 100 * 1.0)


# --- one batching mechanism -----------------------------------------------------------

MAP_SOURCE = Path(sheetplane._map.__file__).read_text(encoding="utf-8")


def test_map_keeps_no_timer_or_size_limit_of_its_own() -> None:
    tree = ast.parse(MAP_SOURCE)
    # No clock, sleep or deadline: the write batches' linger is the batcher's.
    timing = {"current_time", "sleep", "sleep_until", "move_on_after", "move_on_at"}
    timing |= {"fail_after", "fail_at", "deadline", "Semaphore", "CapacityLimiter"}
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    used |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    used |= {
        kw.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords
    }
    assert not used & timing
    # The write settings appear only as the batcher's arguments (run_map hands them on
    # to the class that runs it).
    (run,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MapRun"]
    (construct,) = [
        n
        for n in ast.walk(run)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "BoundedBatchFunction"
    ]
    inside = {id(n) for kw in construct.keywords for n in ast.walk(kw.value)}
    settings = {"batch_rows", "flush_seconds", "MAP_WRITE_BATCH_MAX_BYTES"}
    settings |= {"MAP_MAX_RETAINED_RESULT_BYTES", "MAP_RETAINED_BATCHES"}
    for node in ast.walk(run):
        if isinstance(node, ast.Name) and node.id in settings:
            assert id(node) in inside, f"MapRun uses {node.id} outside the batcher"


async def test_the_write_settings_reach_the_batcher(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[dict[str, Any]] = []

    class Recording(BoundedBatchFunction[Any, Any, Any]):
        def __init__(self, execute: Any, **settings: Any) -> None:
            made.append(settings)
            super().__init__(execute, **settings)

    monkeypatch.setattr(sheetplane._map, "BoundedBatchFunction", Recording)
    writes = Writes()
    await mapped(Pending(rows(30)), instant, writes, batch_rows=7, flush_seconds=0.5)
    ((settings),) = made
    assert {name: settings[name] for name in ("max_batch_items", "flush_seconds")} == {
        "max_batch_items": 7,
        "flush_seconds": 0.5,
    }
    assert settings["max_batch_bytes"] == MAP_WRITE_BATCH_MAX_BYTES
    assert settings["max_retained_items"] == MAP_RETAINED_BATCHES * 7
    assert settings["max_retained_bytes"] == MAP_MAX_RETAINED_RESULT_BYTES
    assert settings["max_in_flight_batches"] == MAP_WRITE_MAX_IN_FLIGHT
    assert [len(keys) for _t, _kind, keys in writes.log] == [7, 7, 7, 7, 2]


async def test_a_write_batch_leaves_before_it_passes_the_byte_limit(autojump_clock: Any) -> None:
    writes = Writes()
    big = MAP_WRITE_BATCH_MAX_BYTES // 3

    async def bulky(row: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return {"blob": "x" * big}

    await mapped(Pending(rows(7)), bulky, writes, concurrency=1)
    # Two rows fit under the byte limit, a third would pass it.
    assert [len(keys) for _t, _kind, keys in writes.log] == [2, 2, 2, 1]


async def test_a_row_that_waits_past_the_queue_wait_deadline_stops_the_map(
    autojump_clock: Any,
) -> None:
    max_wait = MAX_QUEUE_WAIT_MS / 1000
    writes = Writes(delay=10 * max_wait)  # every write slot stays taken past the deadline
    t0 = trio.current_time()
    with pytest.raises(LaneWedgedError):
        await mapped(
            Pending(rows((MAP_WRITE_MAX_IN_FLIGHT + 1) * 10)), instant, writes, batch_rows=10
        )
    # Raised when the first queued row's deadline passed, not when a write ended.
    assert trio.current_time() - t0 == pytest.approx(max_wait)
    assert writes.log == []
