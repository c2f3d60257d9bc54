"""The summary counters are a function of the rows: after a random mix of writes on
both roads (admissions with and without a new column, terminal writes, append, upsert,
replace, and the reaper's compaction), every status counter and non-null count equals
a recount of the rows with ``count(*) FILTER`` and ``count(col)``."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

from _runtime_helpers import (
    CONTRACT,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    runtime,
    sheet_of,
)
from sheetplane.budgets import COUNTER_LOG_COMPACT_ROWS
from sheetplane.runtime import CompleteRow, ContractColumn, FailRow, SheetContract
from sheetplane.store import SheetStore, open_store, sheet_names
from sheetplane.store._counters import STATUS_COUNTER, column_counts, status_counts
from sheetplane.store._schema import SYSTEM_COLUMNS

#: The contract a later admission brings: one column more (``ensure_sheet`` adds it).
WIDER = SheetContract((*CONTRACT.columns, ContractColumn("extra", "extra", "input")))
SEEDS = (1, 2)
ROUNDS = 4


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def counters_and_recount(conn: psycopg.Connection[Any], names: Any) -> tuple[Any, Any]:
    """``(counters as read, the same recounted from the rows)``, in one snapshot."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    columns = [
        name
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attnum > 0 AND NOT attisdropped",
            (names.ident("sheet_table").as_string(conn),),
        )
        if name not in SYSTEM_COLUMNS
    ]
    statuses = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE _status = {})").format(sql.Literal(status))
        for status in STATUS_COUNTER
    )
    non_null = sql.SQL("").join(
        sql.SQL(", count({})").format(sql.Identifier(name)) for name in columns
    )
    row = conn.execute(
        sql.SQL("SELECT count(*), {}{} FROM {}").format(
            statuses, non_null, names.ident("sheet_table")
        )
    ).fetchone()
    assert row is not None
    recount = {"total": row[0], "queued": 0, "running": 0, "completed": 0, "failed": 0}
    for status, count in zip(STATUS_COUNTER, row[1 : 1 + len(STATUS_COUNTER)], strict=True):
        recount[STATUS_COUNTER[status]] += count
    recount_columns = dict(zip(columns, row[1 + len(STATUS_COUNTER) :], strict=True))
    stored_columns = column_counts(conn, names)
    stored = (status_counts(conn, names), {c: stored_columns.get(c, 0) for c in columns})
    return stored, (recount, recount_columns)


def inputs(rng: random.Random, wide: bool) -> list[dict[str, Any]]:
    rows = []
    for i in rng.sample(range(30), rng.randint(3, 12)):
        row: dict[str, Any] = {"_key": f"r{i:02d}"}
        if rng.random() < 0.8:
            row["text"] = f"text {i}"
        if wide and rng.random() < 0.5:
            row["extra"] = i
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed", SEEDS)
async def test_counters_equal_a_recount_of_the_rows_after_random_writes_on_both_roads(
    gateway: CountingGateway, store: SheetStore, seed: int
) -> None:
    rng = random.Random(seed)
    play = new_play()
    names = sheet_names(sheet_of(play, "leads"))
    checked = 0

    async def check() -> None:
        nonlocal checked
        stored, recount = await store.pool.run(lambda conn: counters_and_recount(conn, names))
        assert stored == recount
        checked += 1

    async with (
        runtime(gateway, "direct", play=play) as direct,
        runtime(gateway, "gateway_only", play=play) as via_gateway,
    ):
        roads = dict(zip(ROADS, (direct, via_gateway), strict=True))
        wide = False
        for round_ in range(ROUNDS):
            road = roads[rng.choice(ROADS)]
            # From the middle round on at the latest, a start adds a column.
            wide = wide or round_ == ROUNDS // 2 or rng.random() < 0.4
            writer = road.writer("leads", WIDER if wide else CONTRACT)
            admission = await writer.start(inputs(rng, wide))
            await check()
            pending = await admission.pending().materialize()
            rng.shuffle(pending)
            done = pending[: rng.randint(0, len(pending))]
            if done:
                await writer.complete(
                    [CompleteRow(row["_key"], {"words": rng.choice([None, 1, 2])}) for row in done]
                )
                await check()
            failed = pending[len(done) : len(done) + rng.randint(0, 3)]
            if failed:
                await writer.fail([FailRow(row["_key"], "no words") for row in failed])
                await check()
            scoped = roads[rng.choice(ROADS)].writer("leads", WIDER if wide else CONTRACT)
            key = f"{seed}-{rng.random()}"
            rows = [
                {"_key": f"r{i:02d}", "text": f"new {i}", "words": rng.choice([None, 3])}
                for i in rng.sample(range(40), rng.randint(1, 6))
            ]
            write = getattr(scoped, rng.choice(["append", "upsert", "replace"]))
            await write(rows, idempotency_key=key)
            await check()
    assert checked >= 2 * ROUNDS
    counted = await store.pool.run(lambda conn: counters_and_recount(conn, names))
    assert "extra" in counted[1][1]  # the column a start added is counted too


def log_rows(conn: psycopg.Connection[Any], names: Any) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.ident("counter_table")))
    found = row.fetchone()
    assert found is not None
    return int(found[0])


async def test_the_reapers_pass_compacts_a_long_counter_log_unless_a_writer_holds_the_sheet(
    store: SheetStore, sheet: Any, database_url: str
) -> None:
    names = sheet_names(sheet)
    await store.ensure_sheet(sheet, CONTRACT)
    await store.start_dataset(
        sheet, [{"_key": f"k{i}", "text": "t"} for i in range(4)], "r", CONTRACT
    )

    def churn(conn: psycopg.Connection[Any]) -> None:
        # Each statement appends its own deltas: one status move back and forth.
        for n in range(COUNTER_LOG_COMPACT_ROWS // 2 + 1):
            status = "running" if n % 2 == 0 else "pending"
            conn.execute(
                sql.SQL("UPDATE {} SET _status = %s WHERE _key = 'k0'").format(
                    names.ident("sheet_table")
                ),
                (status,),
            )

    await store.pool.run(churn)
    before = await store.pool.run(lambda conn: counters_and_recount(conn, names))
    assert before[0] == before[1]
    assert await store.pool.run(lambda conn: log_rows(conn, names)) > COUNTER_LOG_COMPACT_ROWS
    # A writer holds the sheet: the pass does not wait for it and compacts nothing.
    with psycopg.connect(database_url) as writer:
        writer.execute(sql.SQL("LOCK TABLE {} IN ROW SHARE MODE").format(names.ident("lock_table")))
        with trio.fail_after(30):
            await store.sweep_admissions()
        assert await store.pool.run(lambda conn: log_rows(conn, names)) > COUNTER_LOG_COMPACT_ROWS
    await store.sweep_admissions()
    # One row per nonzero counter: total, queued (4 pending rows) and the text column.
    assert await store.pool.run(lambda conn: log_rows(conn, names)) <= 5 + len(CONTRACT.columns)
    after = await store.pool.run(lambda conn: counters_and_recount(conn, names))
    assert after == before


async def test_a_sheet_of_the_sharded_layout_keeps_its_counts_and_gains_the_triggers(
    store: SheetStore, sheet: Any, database_url: str
) -> None:
    names = sheet_names(sheet)
    await store.start_dataset(
        sheet, [{"_key": f"k{i}", "text": "t"} for i in range(3)], "r", CONTRACT
    )

    def make_old(conn: psycopg.Connection[Any]) -> None:
        # The layout before: no triggers, no lock table, counters in keyed shard rows
        # (and part of them still in the summary row's and column summary's base).
        for trigger in ("insert", "update", "delete", "truncate"):
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(f"sheetplane_count_{trigger}"), names.ident("sheet_table")
                )
            )
        conn.execute(sql.SQL("DROP TABLE {}").format(names.ident("lock_table")))
        conn.execute(sql.SQL("DROP TABLE {}").format(names.ident("counter_table")))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (kind text NOT NULL, name text NOT NULL, shard integer NOT NULL,"
                " value bigint NOT NULL DEFAULT 0, PRIMARY KEY (kind, name, shard))"
            ).format(names.ident("counter_table"))
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} VALUES ('status', 'total', 3, 2), ('status', 'queued', 7, 2),"
                " ('column', 'text', 1, 1), ('column', 'text', 9, 1)"
            ).format(names.ident("counter_table"))
        )
        conn.execute(
            sql.SQL("UPDATE {} SET total = 1, queued = 1").format(names.ident("summary_table"))
        )
        conn.execute(
            sql.SQL("INSERT INTO {} (column_name, non_null) VALUES ('text', 1)").format(
                names.ident("column_summary_table")
            )
        )

    await store.pool.run(make_old)
    before = await store.pool.run(lambda conn: counters_and_recount(conn, names))
    assert before[0] == before[1]
    # A fresh store (no remembered layout) ensures the sheet: the layout is upgraded.
    async with open_store(database_url, max_connections=2) as fresh:
        await fresh.ensure_sheet(sheet, CONTRACT)
        await fresh.append_rows(sheet, [{"text": "x"}, {"words": 1}], idempotency_key="k")
        rows = await fresh.read_rows_after(sheet, None, 10)
    after = await store.pool.run(lambda conn: counters_and_recount(conn, names))
    assert after[0] == after[1]
    assert after[0][0]["total"] == 5 and len(rows[0]) == 5
    # An owner's TRUNCATE (no write path runs one) cancels every counter, the base too.
    await store.pool.run(
        lambda conn: conn.execute(sql.SQL("TRUNCATE {}").format(names.ident("sheet_table")))
    )
    emptied = await store.pool.run(lambda conn: counters_and_recount(conn, names))
    assert emptied[0] == emptied[1] and emptied[0][0]["total"] == 0


def test_bench_counters_commits_with_and_without_triggers_and_reports_the_ratio(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sheetplane.bench import counters

    assert counters.main(["--rows", "2000", "--repeats", "1", "--database-url", database_url]) == 0
    out = capsys.readouterr().out
    runs = [line.split()[1] for line in out.splitlines() if line.startswith("  triggers ")]
    assert runs == ["on", "off"]
    assert "on / off" in out.splitlines()[-1]
