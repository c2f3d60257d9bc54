"""``Runtime.map`` against real Postgres and the reference gateway: a big map on both
roads equals its input, a superseding admission mid-map leaves no ``fn`` call
started after the supersession and none running, and ``receipts=True`` after a
crash calls ``fn`` only for the rows without a receipt."""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from _runtime_helpers import (
    CONTRACT,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    runtime,
    select_rows,
    sheet_of,
)
from sheetplane import AttemptSupersededError, InvalidInputError, MapProgress
from sheetplane.runtime import RowWriter, Strategy, TerminalWriteResult

#: The big map's rows on each road: 50,000 in CI (100,000 took 32 s on direct and 38 s
#: on the gateway road on the shared two-core machine, past the ~30 s a test may
#: take); ``SHEETPLANE_MAP_TEST_ROWS=100000`` runs the full size.
BIG = int(os.environ.get("SHEETPLANE_MAP_TEST_ROWS", "50000"))


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def inputs(n: int) -> list[dict[str, Any]]:
    return [{"_key": f"k{i:06d}", "text": "word " * (i % 7) + f"row{i}"} for i in range(n)]


async def count_words(row: dict[str, Any]) -> dict[str, Any]:
    await trio.lowlevel.checkpoint()
    if row["_key"].endswith("999"):
        raise ValueError(f"cannot count {row['_key']}")
    return {"words": len(row["text"].split())}


@pytest.mark.heavy(12)
@pytest.mark.parametrize("strategy", ROADS)
async def test_a_big_map_equals_its_input(gateway: CountingGateway, strategy: Strategy) -> None:
    play, rows = new_play(), inputs(BIG)
    seen: list[MapProgress] = []
    started = time.monotonic()
    async with runtime(gateway, strategy, play=play) as rt:
        report = await rt.map("big", CONTRACT, rows, count_words, progress=seen.append)
    elapsed = time.monotonic() - started
    failing = BIG // 1000
    assert (report.admitted, report.pending, report.reused) == (BIG, BIG, 0)
    assert (report.completed, report.failed) == (BIG - failing, failing)
    assert seen[-1].settled == BIG and seen[-1].total == BIG
    stored = await select_rows(gateway.state.store, sheet_of(play, "big"))
    assert [row["_key"] for row in stored] == [row["_key"] for row in rows]
    for row, source in zip(stored, rows, strict=True):
        if source["_key"].endswith("999"):
            assert (row["_status"], row["_error"]) == (
                "failed",
                f"ValueError: cannot count {source['_key']}",
            )
        else:
            assert row["_status"] == "enriched"
            assert row["words"] == len(source["text"].split())
    print(f"map of {BIG} rows on {strategy}: {elapsed:.1f} s")


async def test_a_superseding_admission_mid_map_stops_every_call(
    gateway: CountingGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    play, rows = new_play(), inputs(2_000)
    clock = itertools.count()
    starts: list[int] = []
    refused: list[int] = []
    running = 0
    superseding = trio.Event()

    fence = RowWriter._fence

    def recording_fence(
        self: RowWriter, result: TerminalWriteResult, *args: int
    ) -> TerminalWriteResult:
        try:
            return fence(self, result, *args)
        except AttemptSupersededError:
            refused.append(next(clock))  # the step the map learns of the supersession
            raise

    monkeypatch.setattr(RowWriter, "_fence", recording_fence)

    async with (
        runtime(gateway, "direct", play=play, run_id="run-1") as first,
        runtime(gateway, "direct", play=play, run_id="run-2") as second,
        trio.open_nursery() as nursery,
    ):

        async def supersede() -> None:
            await second.writer("ns", CONTRACT).start(rows)
            superseding.set()

        async def slow(row: dict[str, Any]) -> dict[str, Any]:
            nonlocal running
            starts.append(next(clock))
            running += 1
            try:
                if row["_key"] == "k000150":
                    nursery.start_soon(supersede)
                if row["_key"] >= "k000150":
                    await superseding.wait()  # the newer admission lands mid-map
                await trio.sleep(0.002)
                return {"words": 1}
            finally:
                running -= 1

        with pytest.raises(AttemptSupersededError):
            await first.map("ns", CONTRACT, rows, slow, concurrency=8, batch_rows=50)
        assert running == 0  # nothing left running when map raises
        with trio.fail_after(60):  # the newer admission committed; its answer may lag
            await superseding.wait()
    assert refused, "the map never saw the supersession"
    assert [s for s in starts if s > refused[0]] == []  # no call started after it
    assert len(starts) < len(rows)


class Crash(BaseException):
    """The process dying mid-run (not an Exception: it stops the map)."""


@pytest.mark.parametrize("strategy", ROADS)
async def test_receipts_after_a_crash_call_fn_only_for_rows_without_one(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play, rows = new_play(), inputs(40)
    first_calls: list[str] = []

    async def crashing(row: dict[str, Any]) -> dict[str, Any]:
        if int(row["_key"][1:]) >= 25:
            raise Crash("killed mid-run")
        first_calls.append(row["_key"])
        return {"words": len(row["text"].split())}

    async with runtime(gateway, strategy, play=play, run_id="run-1") as rt:
        with pytest.raises(Crash):
            await rt.map("ns", CONTRACT, rows, crashing, concurrency=1, receipts=True)
    assert first_calls == [row["_key"] for row in rows[:25]]

    again: list[str] = []

    async def counting(row: dict[str, Any]) -> dict[str, Any]:
        again.append(row["_key"])
        return {"words": len(row["text"].split())}

    async with runtime(gateway, strategy, play=play, run_id="run-2") as rt:
        report = await rt.map("ns", CONTRACT, rows, counting, concurrency=4, receipts=True)
    assert sorted(again) == [row["_key"] for row in rows[25:]]  # only rows without a receipt
    assert report.reused == report.pending - 15
    assert report.completed == report.pending and report.failed == 0
    stored = await select_rows(gateway.state.store, sheet_of(play, "ns"))
    assert all(row["_status"] == "enriched" for row in stored)
    assert [row["words"] for row in stored] == [len(r["text"].split()) for r in rows]


async def test_bad_options_are_refused_before_admitting(gateway: CountingGateway) -> None:
    play = new_play()
    async with runtime(gateway, "direct", play=play) as rt:
        before = gateway.requests
        for options in (
            {"concurrency": 0},
            {"batch_rows": 0},
            {"batch_rows": 10**6},
            {"flush_seconds": -1},
            {"flush_seconds": float("nan")},
            {"receipts": "yes"},
            {"progress": 3},
        ):
            with pytest.raises(InvalidInputError):
                await rt.map("ns", CONTRACT, inputs(2), count_words, **options)
        with pytest.raises(InvalidInputError, match="fn must be"):
            await rt.map("ns", CONTRACT, inputs(2), "not callable")  # type: ignore[arg-type]
        assert gateway.requests == before


def plain_count(row: dict[str, Any]) -> dict[str, Any]:
    return {"words": len(row["text"].split())}


async def async_progress(progress: MapProgress) -> None:
    raise AssertionError("never awaited")


async def test_a_sync_fn_or_an_async_progress_is_refused_before_admitting(
    gateway: CountingGateway,
) -> None:
    # Before, a plain def or a lambda was accepted, every row then failed with
    # "object dict can't be used in 'await' expression" and map returned normally;
    # an async progress was never awaited.
    play = new_play()
    async with runtime(gateway, "direct", play=play) as rt:
        before = gateway.requests
        for fn in (plain_count, lambda row: {"words": 1}):
            with pytest.raises(
                InvalidInputError, match=r"fn must be an async function \(async def"
            ):
                await rt.map("ns", CONTRACT, inputs(3), fn)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="progress must be a plain function"):
            await rt.map("ns", CONTRACT, inputs(3), count_words, progress=async_progress)
        assert gateway.requests == before

        class Provider:
            async def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
                return await count_words(row)

        # Async callables of every shape are taken.
        for fn in (count_words, Provider(), functools.partial(count_words)):
            report = await rt.map("ns", CONTRACT, inputs(3), fn)
            assert report.admitted == 3


async def test_map_writes_of_every_batch_size_share_one_session(gateway: CountingGateway) -> None:
    play = new_play()
    async with runtime(gateway, "direct", play=play) as rt:
        # flush_seconds=0: every batch leaves with whatever is queued, of many sizes.
        report = await rt.map(
            "ns", CONTRACT, inputs(1_000), count_words, batch_rows=37, flush_seconds=0
        )
        assert report.completed + report.failed == 1_000
        # At most one session stages the admission, one claims the shares, one reads
        # the pending rows, and one writes every batch, whatever their sizes (one per
        # size was 11 here).
        assert rt.stats().sessions_minted <= 4
