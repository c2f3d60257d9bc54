"""Staged admission end to end, on both roads, against real Postgres and the reference
gateway: a large generator input admitted, mapped and read back; runners cancelled or
abandoned between chunks leave the sheet as it was; lost answers on a chunk and on the
commit are applied once; bad input deep in the input is refused by position; racing
admissions of one sheet each commit whole. The sheet is checked with the superuser."""

from __future__ import annotations

import tracemalloc
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import psycopg
import pytest
import trio
from psycopg import sql

from _runtime_helpers import (
    CONTRACT,
    ORG,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    reap_session_roles,
    runtime,
    sheet_of,
)
from sheetplane import InvalidInputError
from sheetplane._types import SheetRef
from sheetplane.budgets import ADMISSION_CHUNK_ROWS, MAX_JSON_DEPTH, MAX_ROW_BYTES, MiB
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.faults import FAULT_HEADER
from sheetplane.identity import row_key
from sheetplane.protocol import prepare_chunk
from sheetplane.runtime import CompleteRow, Strategy
from sheetplane.store import SheetStore, sheet_names
from sheetplane.store._counters import STATUS_COUNTERS, status_counts

#: Every DUP_EVERY-th input row repeats the key of the row DUP_EVERY // 2 before it.
DUP_EVERY = 1000
#: The CI test's shorter input, and the small budgets it admits it under (its longer
#: input is four times as long).
SMALL_ROWS = 4_000
SMALL_CHUNK_ROWS = 1_000
SMALL_RANGE_ROWS = 5_000
#: Input rows with --campaign, admitted under the real budgets.
CAMPAIGN_ROWS = (300_000, 1_000_000)


@pytest.fixture(scope="module", autouse=True)
def _drop_session_roles(database_url: str) -> Iterator[None]:
    """The direct road mints sessions here; drop their roles when the module ends."""
    yield
    reap_session_roles(database_url)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url, allow_test_faults=True) as gw:
        yield gw


def generated(n: int) -> Iterator[dict[str, Any]]:
    """``n`` input rows, made one at a time, with a duplicate key now and then."""
    for i in range(n):
        key = i - DUP_EVERY // 2 if i % DUP_EVERY == DUP_EVERY - 1 else i
        yield {"_key": f"k{key:07d}", "text": f"row {i} of the input"}


def kept_keys(n: int) -> Iterator[str]:
    """The keys of ``generated(n)`` that admission keeps, in input order."""
    for i in range(n):
        if i % DUP_EVERY != DUP_EVERY - 1:
            yield f"k{i:07d}"


def sheet_state(store: SheetStore, sheet: SheetRef) -> Any:
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        def one(query: sql.Composable) -> Any:
            return conn.execute(query).fetchall()

        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL",
            (names.ident("sheet_table").as_string(conn),),
        ).fetchone()
        if not exists or not exists[0]:
            return {"exists": False}
        return {
            "exists": True,
            "rows": one(
                sql.SQL("SELECT count(*), max((seq).write_version) FROM {}").format(
                    names.ident("sheet_table")
                )
            )[0],
            # The counters as a read sums them (base plus log), then the version.
            "summary": [
                (
                    *(status_counts(conn, names)[name] for name in STATUS_COUNTERS),
                    one(
                        sql.SQL("SELECT write_version FROM {}").format(names.ident("summary_table"))
                    )[0][0],
                )
            ],
            "events": one(
                sql.SQL("SELECT kind, write_version, row_count FROM {} ORDER BY id").format(
                    names.ident("event_table")
                )
            ),
            "staged": one(
                sql.SQL("SELECT coalesce(sum(_row_count), 0) FROM {}").format(
                    names.ident("staging_table")
                )
            )[0][0],
            "chunks": one(
                sql.SQL("SELECT count(*) FROM {}").format(names.ident("stage_chunks_table"))
            )[0][0],
            "admissions": one(
                sql.SQL("SELECT state FROM {} ORDER BY created_at").format(
                    names.ident("admissions_table")
                )
            ),
        }

    return store.pool.run(run)


async def admit_map_and_read_back(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy, rows: int
) -> int:
    """Admit ``generated(rows)`` into a fresh sheet, check the sheet, map every pending
    row (read lazily, in input order) and read the sheet back; answers the peak
    memory traced (``tracemalloc``) while the input was admitted: the runner's side
    and, in this process, the gateway's."""
    play = new_play()
    sheet = sheet_of(play, "leads")
    kept = rows - rows // DUP_EVERY
    async with runtime(gateway, strategy, play=play) as rt:
        writer = rt.writer("leads", CONTRACT)
        tracemalloc.start()
        try:
            admission = await writer.start(generated(rows))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert admission.write_version == 1
        assert (admission.inserted, admission.pending_count) == (kept, kept)
        assert (admission.skipped, admission.completed_count) == (rows - kept, 0)
        assert await sheet_state(store, sheet) == {
            "exists": True,
            "rows": (kept, 1),
            "summary": [(kept, kept, 0, 0, 0, 1)],
            "events": [("admission", 1, kept)],
            "staged": 0,
            "chunks": 0,
            "admissions": [("committed",)],
        }

        # Map every pending row, reading them lazily in input order.
        expected = kept_keys(rows)
        batch: list[CompleteRow] = []
        async for row in admission.pending():
            assert row["_key"] == next(expected)
            batch.append(CompleteRow(row["_key"], {"words": len(row["text"].split())}))
            if len(batch) == 5_000:
                await writer.complete(batch)
                batch = []
        await writer.complete(batch)
        assert next(expected, None) is None

        read = 0
        expected = kept_keys(rows)
        async for row in rt.dataset("leads"):
            assert (row["_key"], row["_status"], row["_input_index"]) == (
                next(expected),
                "enriched",
                read,
            )
            assert row["words"] == 5
            read += 1
        assert read == kept
    state = await sheet_state(store, sheet)
    assert state["summary"] == [(kept, 0, 0, kept, 0, 1)]
    assert state["events"][0] == ("admission", 1, kept)
    return peak


def traced_size_of_input(rows: int) -> int:
    """What ``generated(rows)`` takes held as a list (``tracemalloc``)."""
    tracemalloc.start()
    try:
        held = list(generated(rows))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del held
    return peak


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_generator_input_is_admitted_in_bounded_memory_mapped_and_read_back(
    gateway: CountingGateway,
    store: SheetStore,
    strategy: Strategy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small budgets (chunks of SMALL_CHUNK_ROWS rows, commits of SMALL_RANGE_ROWS
    # positions a statement), so a few thousand rows make many chunks and several
    # commit ranges: an input four times as long must not take more memory to admit,
    # while what it takes as a list grows fourfold.
    import sheetplane.admission as admission_module
    from sheetplane.store import _staging

    monkeypatch.setattr(admission_module, "ADMISSION_CHUNK_ROWS", SMALL_CHUNK_ROWS)
    monkeypatch.setattr(_staging, "ADMISSION_COMMIT_RANGE_ROWS", SMALL_RANGE_ROWS)
    short, long = SMALL_ROWS, 4 * SMALL_ROWS
    peak_short = await admit_map_and_read_back(gateway, store, strategy, short)
    peak_long = await admit_map_and_read_back(gateway, store, strategy, long)
    held_short, held_long = traced_size_of_input(short), traced_size_of_input(long)
    # The runner holds a couple of chunks, the gateway one: the peak does not follow
    # the input (held as a list, the long input would add 3.6 MiB of these rows).
    assert peak_long < peak_short + (held_long - held_short) // 4, (
        f"peak traced memory {peak_short / MiB:.2f} MiB for {short} rows, "
        f"{peak_long / MiB:.2f} MiB for {long} rows"
    )
    assert peak_long < held_long // 2, f"peak traced memory {peak_long / MiB:.2f} MiB"


@pytest.mark.slow
@pytest.mark.parametrize("rows", CAMPAIGN_ROWS, ids=["300k", "1m"])
@pytest.mark.parametrize("strategy", ROADS)
async def test_a_generator_input_is_admitted_whole_mapped_and_read_back(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy, rows: int
) -> None:
    # The real budgets: the runner's side (and, in this process, the gateway's) holds
    # a few chunks, never the input: 100,000 of these rows as a list take about 30 MiB,
    # and the peak stays under this bound for a million (bench store: RSS).
    peak = await admit_map_and_read_back(gateway, store, strategy, rows)
    assert peak < 32 * MiB, f"peak traced memory {peak / MiB:.1f} MiB"


class Cancelled(Exception):
    pass


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_runner_cancelled_between_chunks_leaves_the_sheet_as_it_was(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play = new_play()
    sheet = sheet_of(play, "leads")
    async with runtime(gateway, strategy, play=play) as rt:
        first = await rt.writer("leads", CONTRACT).start(generated(10))
        before = await sheet_state(store, sheet)

        async def interrupted(scope: trio.CancelScope) -> AsyncIterator[dict[str, Any]]:
            for index, row in enumerate(generated(3 * ADMISSION_CHUNK_ROWS)):
                if index == 2 * ADMISSION_CHUNK_ROWS + 10:
                    # Two chunks have been cut; wait until both are staged, then
                    # cancel the runner before its third chunk and its commit.
                    with trio.fail_after(60):  # poll Postgres, with a deadline
                        while await count_chunks(store, sheet) < 2:  # noqa: ASYNC110
                            await trio.sleep(0.01)
                    scope.cancel()
                yield row

        with trio.CancelScope() as scope:
            await rt.writer("leads", CONTRACT).start(interrupted(scope))
        assert scope.cancelled_caught
        after = await sheet_state(store, sheet)
        # Nothing of the cancelled admission is visible; it was aborted, its rows dropped.
        assert {k: v for k, v in after.items() if k != "admissions"} == {
            k: v for k, v in before.items() if k != "admissions"
        }
        assert after["admissions"] == [("committed",), ("aborted",)]
        # A fresh start succeeds.
        again = await rt.writer("leads", CONTRACT).start(generated(20))
        assert again.write_version == first.write_version + 1
        assert (again.inserted, again.pending_count) == (10, 20)


async def count_chunks(store: SheetStore, sheet: SheetRef) -> int:
    names = sheet_names(sheet)
    found = await store.pool.run(
        lambda conn: conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(names.ident("stage_chunks_table"))
        ).fetchone()
    )
    return int(found[0]) if found else 0


@pytest.mark.parametrize("strategy", ROADS)
async def test_an_abandoned_admission_leaves_the_sheet_unchanged_and_is_expired_later(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    # A runner that dies (no abort, no commit) after two chunks: the gateway's
    # view of it is an open admission nobody finishes.
    play = new_play()
    sheet = sheet_of(play, "leads")
    async with runtime(gateway, strategy, play=play) as rt:
        await rt.writer("leads", CONTRACT).start(generated(5))
    before = await sheet_state(store, sheet)
    dead = uuid.uuid4().hex
    async with GatewayClient(gateway.base_url, gateway.token, play_name=play, org_id=ORG) as gc:
        await gc.begin_admission("leads", CONTRACT, dead, "run-dead")
        for seq in range(2):
            rows = list(generated(100))[seq * 50 : seq * 50 + 50]
            body = gc.admission_chunk_body(
                "leads", CONTRACT, dead, seq, seq * 50, prepare_chunk(rows, seq * 50)
            )
            assert await gc.stage_admission_chunk(body)
    abandoned = await sheet_state(store, sheet)
    assert abandoned["staged"] == 100
    assert {k: abandoned[k] for k in ("rows", "summary", "events")} == {
        k: before[k] for k in ("rows", "summary", "events")
    }
    # Once idle past ADMISSION_IDLE_MS (made so here), the next admission expires it.
    names = sheet_names(sheet)
    await store.pool.run(
        lambda conn: [
            conn.execute(
                sql.SQL("UPDATE {} SET created_at = created_at - interval '1 hour'").format(
                    names.ident(table)
                )
            )
            for table in ("admissions_table", "stage_chunks_table")
        ]
    )
    async with runtime(gateway, strategy, play=play) as rt:
        again = await rt.writer("leads", CONTRACT).start(generated(7))
    assert again.write_version == 2 and again.inserted == 2
    after = await sheet_state(store, sheet)
    assert (after["staged"], after["chunks"]) == (0, 0)
    assert ("expired",) in after["admissions"]


@pytest.mark.parametrize(
    ("strategy", "lost"),
    [
        ("gateway_only", "stage_sheet_admission_chunk"),
        ("gateway_only", "commit_sheet_admission"),
        ("direct", "commit_sheet_admission"),
    ],
)
async def test_a_chunk_or_commit_whose_answer_is_lost_is_applied_once(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy, lost: str
) -> None:
    play = new_play()
    sheet = sheet_of(play, "leads")
    n = 2 * ADMISSION_CHUNK_ROWS + 5
    headers = {FAULT_HEADER: f"{lost}=lost"}
    async with runtime(gateway, strategy, play=play, headers=headers) as rt:
        admission = await rt.writer("leads", CONTRACT).start(generated(n))
    assert gateway.state.faults.pending(lost) == 0  # the fault was met
    kept = n - n // DUP_EVERY
    assert (admission.write_version, admission.inserted) == (1, kept)
    state = await sheet_state(store, sheet)
    assert state["rows"] == (kept, 1)
    assert state["summary"] == [(kept, kept, 0, 0, 0, 1)]
    assert state["events"] == [("admission", 1, kept)]
    assert state["admissions"] == [("committed",)]


@pytest.mark.parametrize("strategy", ROADS)
@pytest.mark.parametrize("bad", ["not an object", "too large"])
async def test_bad_input_in_chunk_7_of_10_is_refused_by_position_and_commits_nothing(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy, bad: str
) -> None:
    play = new_play()
    sheet = sheet_of(play, "leads")
    chunk = 1_000
    position = 6 * chunk + 123  # in the seventh of ten chunks

    def rows() -> Iterator[Any]:
        for index, row in enumerate(generated(10 * chunk)):
            if index != position:
                yield row
            elif bad == "not an object":
                yield ["a", "list"]
            else:
                yield {"_key": "huge", "text": "x" * (MAX_ROW_BYTES + 1)}

    async with runtime(gateway, strategy, play=play) as rt:
        await rt.writer("leads", CONTRACT).start(generated(3))
        before = await sheet_state(store, sheet)
        # Smaller chunks, so the bad row is well past several staged ones.
        import sheetplane.admission as admission_module

        original = admission_module.ADMISSION_CHUNK_ROWS
        admission_module.ADMISSION_CHUNK_ROWS = chunk  # type: ignore[misc]
        try:
            with pytest.raises(InvalidInputError, match=f"row {position}"):
                await rt.writer("leads", CONTRACT).start(rows())
        finally:
            admission_module.ADMISSION_CHUNK_ROWS = original  # type: ignore[misc]
    after = await sheet_state(store, sheet)
    assert {k: after[k] for k in ("rows", "summary", "events", "staged", "chunks")} == {
        k: before[k] for k in ("rows", "summary", "events", "staged", "chunks")
    }
    assert after["admissions"][-1] == ("aborted",)


async def test_two_admissions_racing_in_interleaved_chunks_each_commit_whole(
    gateway: CountingGateway, store: SheetStore
) -> None:
    play = new_play()
    sheet = sheet_of(play, "leads")
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    rows_a = [{"_key": f"k{i:03d}", "text": f"a {i}"} for i in range(0, 300)]
    rows_b = [{"_key": f"k{i:03d}", "text": f"b {i}"} for i in range(150, 450)]
    await store.begin_admission(sheet, CONTRACT, a, "run-a")
    await store.begin_admission(sheet, CONTRACT, b, "run-b")
    for seq in range(3):
        for admission_id, rows in ((a, rows_a), (b, rows_b)):
            part = rows[seq * 100 : seq * 100 + 100]
            prepared = prepare_chunk(part, seq * 100)
            await store.stage_chunk(sheet, admission_id, seq, seq * 100, prepared)
    async with trio.open_nursery() as nursery:
        results: dict[str, Any] = {}

        async def commit(admission_id: str, run_id: str) -> None:
            results[admission_id] = await store.commit_admission(
                sheet, CONTRACT, admission_id, run_id, chunks=3, rows=300
            )

        nursery.start_soon(commit, a, "run-a")
        nursery.start_soon(commit, b, "run-b")
    versions = sorted(counts.write_version for counts in results.values())
    assert versions == [1, 2]
    later = a if results[a].write_version == 2 else b
    later_rows = rows_a if later == a else rows_b
    names = sheet_names(sheet)
    stored = await store.pool.run(
        lambda conn: conn.execute(
            sql.SQL("SELECT _key, text, (seq).write_version, _run_id FROM {} ORDER BY _key").format(
                names.ident("sheet_table")
            )
        ).fetchall()
    )
    assert len(stored) == 450
    # The later admission owns every row it admitted, with its values; the earlier
    # one keeps only the rows the later did not take in.
    owned = {key: (text, version, run) for key, text, version, run in stored}
    for row in later_rows:
        assert owned[row["_key"]] == (row["text"], 2, f"run-{'a' if later == a else 'b'}")
    earlier_only = set(owned) - {row["_key"] for row in later_rows}
    assert len(earlier_only) == 150
    assert all(owned[key][1] == 1 for key in earlier_only)
    state = await sheet_state(store, sheet)
    assert state["summary"] == [(450, 450, 0, 0, 0, 2)]
    assert [(kind, version) for kind, version, _ in state["events"]] == [
        ("admission", 1),
        ("admission", 2),
    ]


async def test_the_reaper_expires_an_abandoned_admission(database_url: str) -> None:
    async with counting_gateway(database_url, reaper_interval_ms=50) as gw:
        play = new_play()
        sheet = sheet_of(play, "leads")
        dead = uuid.uuid4().hex
        async with GatewayClient(gw.base_url, gw.token, play_name=play, org_id=ORG) as gc:
            await gc.begin_admission("leads", CONTRACT, dead, "run-dead")
            rows = prepare_chunk(list(generated(30)), 0)
            await gc.stage_admission_chunk(
                gc.admission_chunk_body("leads", CONTRACT, dead, 0, 0, rows)
            )
        store = gw.state.store
        names = sheet_names(sheet)
        await store.pool.run(
            lambda conn: [
                conn.execute(
                    sql.SQL("UPDATE {} SET created_at = created_at - interval '1 hour'").format(
                        names.ident(table)
                    )
                )
                for table in ("admissions_table", "stage_chunks_table")
            ]
        )
        progress = gw.state.reaper
        with trio.fail_after(30):
            await progress.wait_for_pass(progress.passes + 2)
        state = await sheet_state(store, sheet)
        assert (state["staged"], state["chunks"], state["admissions"]) == (0, 0, [("expired",)])
        assert progress.expired_admissions >= 1


def chunk_body(
    gc: GatewayClient, admission_id: str, seq: int, first: int, keys: bytes, rows: bytes
) -> bytes:
    """A chunk request around ``keys`` and ``rows`` written by hand (a client's own JSON)."""
    placeholder = prepare_chunk([{}] * rows.count(b"{"), first)
    body = gc.admission_chunk_body("leads", CONTRACT, admission_id, seq, first, placeholder)
    return body.replace(placeholder.keys, keys).replace(placeholder.rows, rows)


def stored_texts(store: SheetStore, sheet: SheetRef) -> Any:
    """Each row's key, input index and its ``text`` cell as Postgres writes it."""
    table = sheet_names(sheet).ident("sheet_table")
    return store.pool.run(
        lambda conn: conn.execute(
            sql.SQL("SELECT _key, _input_index, text::text FROM {} ORDER BY _input_index").format(
                table
            )
        ).fetchall()
    )


async def staged_as_sent(
    gateway: CountingGateway, store: SheetStore, keys: bytes, rows: bytes, count: int
) -> Any:
    """Stage one chunk of ``keys`` and ``rows`` (a client's own JSON) into a fresh sheet,
    commit it, and answer ``stored_texts``."""
    play = new_play()
    sheet = sheet_of(play, "leads")
    admission_id = uuid.uuid4().hex
    async with GatewayClient(gateway.base_url, gateway.token, play_name=play, org_id=ORG) as gc:
        await gc.begin_admission("leads", CONTRACT, admission_id, "run-1")
        assert await gc.stage_admission_chunk(chunk_body(gc, admission_id, 0, 0, keys, rows))
        counts = await gc.commit_admission(
            "leads", CONTRACT, admission_id, "run-1", chunks=1, rows=count
        )
    assert counts.inserted == count
    return await stored_texts(store, sheet)


async def test_a_chunk_sent_with_its_keys_is_staged_as_sent_not_decoded_and_encoded_again(
    gateway: CountingGateway, store: SheetStore
) -> None:
    # Python would read 1.50 as the float 1.5 and write it back as 1.5, and 1E2 as 100.0:
    # a cell that keeps the sent text shows the gateway never built the row in Python.
    rows = b'[{"text": 1.50}, {"text":1E2,"other":[1,{"x":null}]} ,{"_key":"ignored","text":"t"}]'
    stored = await staged_as_sent(gateway, store, b'["a", "b", "c"]', rows, 3)
    assert stored == [("a", 0, "1.50"), ("b", 1, "100"), ("c", 2, '"t"')]


async def test_a_chunk_of_many_shallow_nested_rows_is_staged_as_sent(
    gateway: CountingGateway, store: SheetStore
) -> None:
    # More brackets in the chunk than MAX_JSON_DEPTH, none of its rows anywhere near it:
    # the rows are measured one by one and still staged as sent.
    count = MAX_JSON_DEPTH
    keys = orjson.dumps([f"k{i}" for i in range(count)])
    rows = b"[" + b",".join(b'{"text":1.50,"n":[{"a":[1]}]}' for _ in range(count)) + b"]"
    stored = await staged_as_sent(gateway, store, keys, rows, count)
    assert len(stored) == count and {text for _, _, text in stored} == {"1.50"}


@pytest.mark.parametrize(
    ("keys", "rows", "refusal"),
    [
        # NaN is not JSON: a runner never sends it, but a gateway must refuse it.
        (b'["a","b"]', b'[{"text":"fine"},{"text":NaN}]', "row 11"),
        # Postgres refuses these as sent; the gateway then reads the rows and names the bad one.
        (b'["a","b"]', b'[{"text":"fine"},[1,2]]', "row 11 must be a JSON object"),
        (b'["a","b"]', b'[{"text":"fine"},"text"]', "row 11 must be a JSON object"),
        # Not the stored form: a \\u escape (here NUL), and nesting past MAX_JSON_DEPTH.
        (
            b'["a","b"]',
            b'[{"text":"fine"},{"text":"nul \\u0000"}]',
            "row 11 .*a string holds a NUL",
        ),
        (b'["a","b"]', b'[{"text":"fine"},{"t":' + b"[" * 300 + b"]" * 300 + b"}]", "row 11"),
        # Keys that are not one non-empty string per row.
        (b'["a"]', b'[{"text":"fine"},{"text":"too"}]', "one key per row"),
        (b'["a",""]', b'[{"text":"fine"},{"text":"too"}]', "the key of row 11"),
    ],
    ids=["nan", "array-row", "string-row", "nul", "deep", "key-count", "empty-key"],
)
async def test_the_gateway_refuses_a_bad_row_by_its_position_and_aborts(
    gateway: CountingGateway, store: SheetStore, keys: bytes, rows: bytes, refusal: str
) -> None:
    # The gateway checks what a runner may not have: position, abort, nothing kept.
    play = new_play()
    sheet = sheet_of(play, "leads")
    admission_id = uuid.uuid4().hex
    async with GatewayClient(gateway.base_url, gateway.token, play_name=play, org_id=ORG) as gc:
        await gc.begin_admission("leads", CONTRACT, admission_id, "run-1")
        good = prepare_chunk(list(generated(10)), 0)
        assert await gc.stage_admission_chunk(
            gc.admission_chunk_body("leads", CONTRACT, admission_id, 0, 0, good)
        )
        with pytest.raises(InvalidInputError, match=refusal):
            await gc.stage_admission_chunk(chunk_body(gc, admission_id, 1, 10, keys, rows))
    state = await sheet_state(store, sheet)
    assert (state["staged"], state["chunks"], state["admissions"]) == (0, 0, [("aborted",)])
    assert state["rows"] == (0, None)


async def test_a_chunk_sent_without_keys_is_keyed_by_the_gateway(
    gateway: CountingGateway, store: SheetStore
) -> None:
    # A client that leaves keying to the gateway (the request's keys are optional).
    play = new_play()
    sheet = sheet_of(play, "leads")
    admission_id = uuid.uuid4().hex
    rows = [{"_key": "carried", "text": "one"}, {"text": "two"}]
    async with GatewayClient(gateway.base_url, gateway.token, play_name=play, org_id=ORG) as gc:
        await gc.begin_admission("leads", CONTRACT, admission_id, "run-1")
        encoded = prepare_chunk(rows, 0)
        body = gc.admission_chunk_body("leads", CONTRACT, admission_id, 0, 0, encoded)
        keyless = body.replace(b',"keys":' + encoded.keys, b"")
        assert b'"keys"' not in keyless
        assert await gc.stage_admission_chunk(keyless)
        await gc.commit_admission("leads", CONTRACT, admission_id, "run-1", chunks=1, rows=2)
    derived = row_key({"text": "two"})
    assert await stored_texts(store, sheet) == [("carried", 0, '"one"'), (derived, 1, '"two"')]
