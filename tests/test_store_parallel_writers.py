"""Terminal writes of disjoint rows of one sheet run side by side.

Eight writer processes complete disjoint rows of one sheet while the test
samples ``pg_stat_activity`` and ``pg_locks``: how many of the writers'
backends wait for a heavyweight lock at each instant. When every terminal
write took the sheet's exclusive writer lock (the summary row ``FOR UPDATE``)
and updated the one summary row, nearly every sample found most of the eight
waiting; now terminal writes take the writer lock shared, lock only their own
rows, and their counting triggers append to a log without a key, so a sample
rarely finds one waiting.
The assertion is on those samples, not on time. The counters must still equal
a recount of the rows.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import uuid
from pathlib import Path

import psycopg
import trio
from psycopg.conninfo import make_conninfo

from _store_helpers import counters_match_rows
from sheetplane._types import SheetRef
from sheetplane.store import SheetStore

RUNNER = Path(__file__).with_name("_writer_process.py")
WRITERS = 8
ROWS_PER_WRITER = 6_000
CHUNK = 300
DEADLINE_S = 240
#: Time between two samples of the writers' backends.
SAMPLE_S = 0.01


Sample = tuple[int, int, int, str]


def _sample(url: str, application: str, stop: threading.Event) -> list[Sample]:
    """``(writers' backends running a statement, those waiting for a lock, the
    writers' lock requests not granted, the lock waits' events)`` per sample, until ``stop`` is set.

    A wait to extend a relation (``wait_event = 'extend'``, a new page for the
    rows the counting triggers append) is not a lock one writer holds against
    another's rows, so neither count includes it: on two cores shared with other
    tests, eight appending writers meet at the table's end now and then."""
    samples: list[Sample] = []
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.wait(SAMPLE_S):
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE a.wait_event_type = 'Lock'"
                "  AND a.wait_event <> 'extend'),"
                " (SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS w"
                "  ON w.pid = l.pid WHERE NOT l.granted AND l.locktype <> 'extend'"
                "  AND w.application_name = %s),"
                " coalesce(string_agg(a.wait_event, ',') FILTER"
                "  (WHERE a.wait_event_type = 'Lock'), '')"
                " FROM pg_stat_activity AS a WHERE a.application_name = %s"
                " AND a.state = 'active'",
                (application, application),
            ).fetchone()
            assert row is not None
            samples.append((int(row[0]), int(row[1]), int(row[2]), str(row[3])))
    return samples


#: Samples taken while at least two writers ran a statement that the assertions need;
#: a round whose writers finish sooner (a fast machine, or CPU shared with other tests)
#: is followed by another on a new sheet, up to ``ROUNDS``, its samples added.
BUSY_SAMPLES = 20
ROUNDS = 3


async def test_eight_writers_of_one_sheet_do_not_queue_on_a_lock(
    store: SheetStore, database_url: str, tmp_path: Path
) -> None:
    busy: list[Sample] = []
    for round_ in range(ROUNDS):
        busy += await _eight_writers(store, database_url, tmp_path / f"round-{round_}")
        if len(busy) >= BUSY_SAMPLES:
            break
    assert len(busy) >= BUSY_SAMPLES, f"the sampler saw writers at work only {len(busy)} times"
    waiting = [count for _, count, _, _ in busy]
    not_granted = [count for _, _, count, _ in busy]
    events = sorted({event for *_, events in busy for event in events.split(",") if event})
    assert statistics.median(waiting) == 0, (statistics.mean(waiting), max(waiting), events)
    assert sum(count >= 2 for count in waiting) <= len(waiting) // 10, (waiting, events)
    assert statistics.median(not_granted) == 0, events


async def _eight_writers(store: SheetStore, database_url: str, tmp_path: Path) -> list[Sample]:
    """One round: eight writer processes complete disjoint rows of a new sheet, every
    row once and the counters equal to a recount; answers the samples taken while at
    least two of them ran a statement."""
    from _writer_process import CONTRACT

    await trio.Path(tmp_path).mkdir()
    tag = uuid.uuid4().hex[:12]
    sheet = SheetRef(f"org-{tag}", f"play-{tag}", f"ns-{tag}")
    rows = [{"company": f"c{i:06d}"} for i in range(WRITERS * ROWS_PER_WRITER)]
    admission = await store.start_dataset(sheet, rows, "run-parallel", CONTRACT)
    keys = [row["_key"] for row in admission.pending_rows]
    application = f"sp-writers-{tag}"
    env = dict(
        os.environ, SHEETPLANE_WRITER_URL=make_conninfo(database_url, application_name=application)
    )
    processes = []
    for index in range(WRITERS):
        config = tmp_path / f"writer-{index}.json"
        config.write_text(
            json.dumps(
                {
                    "road": "store",
                    "org": sheet.org_id,
                    "play": sheet.play_name,
                    "ns": sheet.table_namespace,
                    "run_id": "run-parallel",
                    "write_version": admission.write_version,
                    "keys": keys[index::WRITERS],
                    "chunk": CHUNK,
                    "acks": str(tmp_path / f"acks-{index}.txt"),
                    "deadline_s": DEADLINE_S,
                }
            )
        )
        processes.append(
            await trio.lowlevel.open_process([sys.executable, str(RUNNER), str(config)], env=env)
        )
    stop = threading.Event()
    samples: list[Sample] = []

    async def sample() -> None:
        samples.extend(await trio.to_thread.run_sync(_sample, database_url, application, stop))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            with trio.fail_after(DEADLINE_S):
                codes = [await process.wait() for process in processes]
            stop.set()
    finally:
        stop.set()
        for process in processes:
            if process.poll() is None:
                process.kill()
                await process.wait()
    assert codes == [0] * WRITERS
    acknowledged = set()
    for index in range(WRITERS):
        lines = (tmp_path / f"acks-{index}.txt").read_text().splitlines()
        assert not [line for line in lines if line.startswith("!")], "a write failed"
        acknowledged.update(lines)
    assert acknowledged == set(keys)
    summary = await store.summary(sheet)
    assert summary.completed == len(keys)
    stored, recount = await counters_match_rows(store, sheet)
    assert stored == recount
    # Only samples taken while at least two writers were running a statement.
    return [sample for sample in samples if sample[0] >= 2]
