"""Many workers on one attempt, on a real gateway and Postgres: every row mapped once
across the workers, a worker cut off mid-share leaves only its unwritten rows to the
others, a newer admission stops every worker, and the status a coordinator reads."""

from __future__ import annotations

from functools import partial
from typing import Any

import psycopg
import pytest
import trio
import trio.lowlevel
from psycopg import sql

from _runtime_helpers import CONTRACT, ROADS, CountingGateway, new_play, runtime
from sheetplane import (
    Attempt,
    AttemptStatus,
    AttemptSupersededError,
    InvalidInputError,
    MapProgress,
)
from sheetplane._attempts import ShareLease
from sheetplane._types import SheetRef
from sheetplane.budgets import SHARE_LEASE_TTL_MS
from sheetplane.runtime import Strategy
from sheetplane.store import sheet_names

ORG = "acme-runtime"


@pytest.fixture
def gateway(runtime_gateway: CountingGateway) -> CountingGateway:
    return runtime_gateway


#: A short lease, so a takeover happens within the test.
SHORT = ShareLease(ttl_ms=1_500, renewal_ms=300, guard_ms=600, poll_ms=100)


def inputs(n: int) -> list[dict[str, Any]]:
    return [
        {"text": " ".join(["w"] * (i % 5 + 1)), "__deeplineRowKey": f"k{i:05d}"} for i in range(n)
    ]


async def count_words(row: dict[str, Any]) -> dict[str, Any]:
    await trio.lowlevel.checkpoint()
    return {"words": len(row["text"].split())}


async def terminal_writes(database_url: str, play: str, namespace: str) -> tuple[int, int]:
    """(rows written terminal by events, rows enriched) of the sheet, read as the owner."""
    names = sheet_names(SheetRef(ORG, play, namespace))

    def read() -> tuple[int, int]:
        with psycopg.connect(database_url) as conn:
            events = conn.execute(
                sql.SQL(
                    "SELECT coalesce(sum(row_count), 0) FROM {} "
                    "WHERE kind IN ('complete_map_rows', 'fail_map_rows')"
                ).format(names.ident("event_table"))
            ).fetchone()
            enriched = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE _status = 'enriched'").format(
                    names.ident("sheet_table")
                )
            ).fetchone()
            assert events is not None and enriched is not None
            return int(events[0]), int(enriched[0])

    return await trio.to_thread.run_sync(read)


@pytest.mark.parametrize("strategy", ROADS)
async def test_three_workers_map_one_attempt_each_row_once(
    gateway: CountingGateway, database_url: str, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as coordinator:
        admission = await coordinator.writer("ns", CONTRACT).start(inputs(600))
        text = admission.attempt.to_json()
        reports = []
        # Each worker's calls wait until all three have a call in flight, so each one
        # holds a share of its own before a fast worker's shares grow
        # (SHARE_GROW_BELOW_MS) and take the rest: a worker that started late once
        # found no row left (pending 32, 568, 0).
        calling = [trio.Event() for _ in range(3)]

        async def worker(index: int) -> None:
            attempt = Attempt.from_json(text)

            async def fn(row: dict[str, Any]) -> dict[str, Any]:
                calling[index].set()
                for event in calling:
                    await event.wait()
                return await count_words(row)

            async with runtime(gateway, strategy, play=attempt.play_name) as rt:
                reports.append(await rt.map_attempt(attempt, CONTRACT, fn, concurrency=2))

        async with trio.open_nursery() as nursery:
            for index in range(3):
                nursery.start_soon(worker, index)
        assert sum(r.completed for r in reports) == 600
        assert all(r.failed == 0 and r.write_version == admission.write_version for r in reports)
        assert all(r.pending > 0 for r in reports), [r.pending for r in reports]
        status = await coordinator.attempt_status(admission.attempt)
        assert status == AttemptStatus(pending=0, claimed=0, enriched=600, failed=0, workers=0)
    assert await terminal_writes(database_url, play, "ns") == (600, 600)


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_cancelled_worker_gives_its_share_back_and_only_unwritten_rows_run_again(
    gateway: CountingGateway, database_url: str, strategy: Strategy
) -> None:
    play = new_play()
    calls: dict[str, int] = {}
    async with runtime(gateway, strategy, play=play) as rt:
        admission = await rt.writer("ns", CONTRACT).start(inputs(64))
        hung = trio.Event()
        twenty_written = trio.Event()

        def progress(p: MapProgress) -> None:
            if p.settled >= 20:
                twenty_written.set()

        async def hanging(row: dict[str, Any]) -> dict[str, Any]:
            calls[row["_key"]] = calls.get(row["_key"], 0) + 1
            if len(calls) > 20:
                # Its first twenty rows are written; this one never will be.
                await twenty_written.wait()
                hung.set()
                await trio.sleep_forever()
            return await count_words(row)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(
                    rt.map_attempt,
                    admission.attempt,
                    CONTRACT,
                    hanging,
                    concurrency=1,
                    flush_seconds=0,
                    progress=progress,
                )
            )
            await hung.wait()
            nursery.cancel_scope.cancel()
        written = (await rt.attempt_status(admission.attempt)).enriched
        assert written == 20
        async with runtime(gateway, strategy, play=play) as other:
            report = await other.map_attempt(admission.attempt, CONTRACT, count_words)
        # Its shares (the one its calls took rows from, and the next, if it had claimed
        # it ahead) were released on the way out, so they were claimed again at once,
        # not after their leases ended; only the rows the first worker had not written
        # ran. Its first share's sixteen rows were all written: it released that one
        # finished.
        held = rt.attempt_tally.shares - 1
        assert held >= 1
        assert other.attempt_tally.taken_over == held
        assert report.elapsed_seconds < SHARE_LEASE_TTL_MS / 1000
        assert report.completed == 64 - written
    assert await terminal_writes(database_url, play, "ns") == (64, 64)


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_newer_admission_stops_every_worker(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as rt:
        writer = rt.writer("ns", CONTRACT)
        admission = await writer.start(inputs(200))
        # The newer admission comes once both workers run their four calls each. It
        # came at the first call before: under load the other worker could still be
        # starting, and 4 calls were cancelled, one worker's, not 8 (seen once).
        all_started = trio.Event()
        running = cancelled = 0

        async def slow(row: dict[str, Any]) -> dict[str, Any]:
            nonlocal running, cancelled
            running += 1
            if running == 8:
                all_started.set()
            try:
                await trio.sleep(3600)
            except trio.Cancelled:
                cancelled += 1
                raise
            return {}

        errors: list[BaseException] = []

        async def worker() -> None:
            async with runtime(gateway, strategy, play=play) as mine:
                mine.share_lease = SHORT
                try:
                    await mine.map_attempt(admission.attempt, CONTRACT, slow, concurrency=4)
                except AttemptSupersededError as exc:
                    errors.append(exc)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker)
                nursery.start_soon(worker)
                await all_started.wait()
                await rt.writer("ns", CONTRACT).start(inputs(200))
        assert len(errors) == 2
        assert all(e.write_version == admission.write_version for e in errors)
        assert cancelled == 8
        assert (await rt.attempt_status(admission.attempt)).superseded


async def test_an_attempt_of_another_run_is_refused(gateway: CountingGateway) -> None:
    play = new_play()
    async with runtime(gateway, "direct", play=play) as rt:
        admission = await rt.writer("ns", CONTRACT).start(inputs(3))
        other = Attempt(play, "ns", "run-2", admission.write_version)
        with pytest.raises(InvalidInputError, match="run"):
            await rt.map_attempt(other, CONTRACT, count_words)
        missing = Attempt(play, "ns", "run-1", admission.write_version + 5)
        with pytest.raises(InvalidInputError, match="no admission"):
            await rt.map_attempt(missing, CONTRACT, count_words)
