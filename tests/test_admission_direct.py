"""The direct road's admission in one transaction (``store/_direct.py``): new rows written
once, straight into the sheet; committed once or not at all; racing admissions
queue on the writer lock; and the inputs it does not take go the staged way."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, overload

import psycopg
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from psycopg import sql

from _runtime_helpers import (
    CONTRACT,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    reap_session_roles,
    runtime,
    sheet_of,
)
from sheetplane import InvalidInputError, budgets
from sheetplane._types import SheetRef
from sheetplane.pages import DirectAdmissions, GatewayAdmissions, _admits
from sheetplane.runtime import Strategy
from sheetplane.store import SheetStore, _direct, sheet_names

CHUNK = 100


@pytest.fixture(scope="module", autouse=True)
def _drop_session_roles(database_url: str) -> Iterator[None]:
    yield
    reap_session_roles(database_url)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of CHUNK rows, so a few hundred rows make several COPY statements."""
    monkeypatch.setattr(_direct, "DIRECT_ADMISSION_CHUNK_ROWS", CHUNK)
    monkeypatch.setattr(_admits, "ADMISSION_CHUNK_ROWS", CHUNK)


def generated(keys: list[int], label: str = "t") -> Iterator[dict[str, Any]]:
    for i in keys:
        yield {"_key": f"k{i:04d}", "text": f"{label} {i}"}


def listed(keys: list[int], label: str = "t") -> list[dict[str, Any]]:
    """A sequence: what the one transaction takes."""
    return list(generated(keys, label))


async def rows_and_registry(store: SheetStore, sheet: SheetRef) -> dict[str, Any]:
    """The sheet's rows (key, text, status, versions, input index, in input order), its
    write version, its events and its staged admissions."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
        def all_of(query: sql.Composable) -> list[tuple[Any, ...]]:
            return conn.execute(query).fetchall()

        return {
            "rows": all_of(
                sql.SQL(
                    "SELECT _key, text, _status, (seq).write_version, (seq).admitted_version, "
                    "_input_index "
                    "FROM {} ORDER BY _input_index"
                ).format(names.ident("sheet_table"))
            ),
            "version": all_of(
                sql.SQL("SELECT write_version FROM {}").format(names.ident("summary_table"))
            ),
            "events": all_of(
                sql.SQL("SELECT kind, write_version, row_count FROM {} ORDER BY id").format(
                    names.ident("event_table")
                )
            ),
            "staged": all_of(
                sql.SQL("SELECT state FROM {} ORDER BY created_at").format(
                    names.ident("admissions_table")
                )
            ),
        }

    return await store.pool.run(run)


@pytest.mark.parametrize("piece", [1_000, 7])
async def test_a_sequence_is_written_once_in_input_order_first_occurrence_kept(
    gateway: CountingGateway, store: SheetStore, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    # 7: each chunk's COPY is sent in pieces, and a repeat is met mid-chunk.
    monkeypatch.setattr(_direct, "_PIECE_ROWS", piece)
    play = new_play()
    # 350 rows over four chunks; keys 10-19 come back in the third chunk, and 200 repeats
    # within its own chunk: each repeat is dropped, its first occurrence kept.
    keys = [*range(200), *range(10, 20), 200, 200, *range(201, 329)]
    async with runtime(gateway, "direct", play=play) as rt:
        admission = await rt.writer("leads", CONTRACT).start(listed(keys))
        pending = [row["_key"] async for row in admission.pending()]
    assert (admission.write_version, admission.inserted, admission.skipped) == (1, 329, 11)
    assert (admission.pending_count, admission.completed_count) == (329, 0)
    assert pending == [f"k{i:04d}" for i in range(329)]
    state = await rows_and_registry(store, sheet_of(play, "leads"))
    assert state["rows"] == [(f"k{i:04d}", f"t {i}", "pending", 1, 1, i) for i in range(329)]
    assert state["version"] == [(1,)]
    assert state["events"] == [("admission", 1, 329)]
    assert state["staged"] == []  # written straight into the sheet, nothing staged


async def test_each_chunk_runs_with_the_admissions_work_mem(
    gateway: CountingGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chunk's inserted rows are kept for its statement triggers in memory, not
    # spilled: the transaction's work_mem is the budget's from the first chunk on.
    seen: list[str] = []
    chunk = _direct._admit_chunk

    def watched(conn: psycopg.Connection[Any], *args: Any) -> tuple[int, int]:
        row = conn.execute("SELECT current_setting('work_mem')").fetchone()
        assert row is not None
        seen.append(row[0])
        return chunk(conn, *args)

    monkeypatch.setattr(_direct, "_admit_chunk", watched)
    async with runtime(gateway, "direct", play=new_play()) as rt:
        admission = await rt.writer("leads", CONTRACT).start(listed(list(range(250))))
    assert admission.inserted == 250
    expected = f"{budgets.DIRECT_ADMISSION_WORK_MEM_BYTES // budgets.MiB}MB"
    assert seen == [expected] * 4  # three chunks, and the read that finds the input's end


def _copy_text_value(field: str) -> Any:
    """What Postgres reads from one COPY text field of a jsonb column (None: SQL NULL)."""
    if field == "\\N":
        return None
    escapes = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\":
            out.append(escapes[field[i + 1]])
            i += 2
        else:
            assert field[i] not in "\t\n\r", field
            out.append(field[i])
            i += 1
    return json.loads("".join(out))


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(
        st.sampled_from('"\\\t\n\r\x7f\x1f\u2028 éN')
        | st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
@example('quote " inside')
@example("back\\slash \\N")
def test_a_column_field_is_read_back_as_the_value(value: Any) -> None:
    """Sans-IO: a value's COPY text field (the direct path for plain strings and ints,
    orjson for the rest) is one field, and reads back as the value (JSON null as NULL)."""
    field = _direct._column_field(value)
    assert "\t" not in field and "\n" not in field and "\r" not in field
    assert _copy_text_value(field) == value


ODD_VALUES: list[Any] = [
    "tab\there",
    "line\nbreak\r\n",
    'quote " and back\\slash \\N',
    "\u2028 \x7f \x1f é 𝄞 \\t",
    "",
    0,
    -(2**70),
    1.5,
    True,
    None,
    {"nested": ["a\tb", {"c": "\\"}], "n": None},
    ["x", 1, False],
]


async def test_odd_values_and_keys_are_stored_as_given(
    gateway: CountingGateway, store: SheetStore
) -> None:
    """The COPY text encoding: every value comes back from the sheet's jsonb as it went in
    (JSON null as SQL NULL), keys with tabs, backslashes and newlines too."""
    play = new_play()
    rows = [{"_key": f"k\t{i}\\\n", "text": value} for i, value in enumerate(ODD_VALUES)]
    async with runtime(gateway, "direct", play=play) as rt:
        admission = await rt.writer("leads", CONTRACT).start(rows)
    assert admission.inserted == len(rows)
    names = sheet_names(sheet_of(play, "leads"))

    def run(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        query = sql.SQL("SELECT _key, text FROM {} ORDER BY _input_index")
        return conn.execute(query.format(names.ident("sheet_table"))).fetchall()

    assert await store.pool.run(run) == [(row["_key"], row["text"]) for row in rows]
    assert (await rows_and_registry(store, sheet_of(play, "leads")))["staged"] == []


@pytest.mark.parametrize("piece", [1_000, 7])
async def test_a_bad_row_past_several_chunks_leaves_nothing_visible(
    gateway: CountingGateway, store: SheetStore, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    # 7: the bad row is met while its chunk's COPY is being sent.
    monkeypatch.setattr(_direct, "_PIECE_ROWS", piece)
    play = new_play()
    sheet = sheet_of(play, "leads")

    rows: list[Any] = listed(list(range(500)))
    rows[350] = ["not", "a", "row"]

    async with runtime(gateway, "direct", play=play) as rt:
        with pytest.raises(InvalidInputError, match="row 350"):
            await rt.writer("leads", CONTRACT).start(rows)
        # Three chunks were copied into the sheet in the transaction; it rolled back,
        # version and all, so the next admission takes version 1 on an empty sheet.
        assert (await rows_and_registry(store, sheet))["rows"] == []
        again = await rt.writer("leads", CONTRACT).start(listed([1, 2]))
    assert (again.write_version, again.inserted) == (1, 2)
    state = await rows_and_registry(store, sheet)
    assert state["events"] == [("admission", 1, 2)]
    assert state["staged"] == []


async def test_a_cancelled_admission_leaves_nothing_visible(
    gateway: CountingGateway, store: SheetStore
) -> None:
    play = new_play()
    sheet = sheet_of(play, "leads")

    token = trio.lowlevel.current_trio_token()
    async with runtime(gateway, "direct", play=play) as rt:
        with trio.CancelScope() as scope:
            await rt.writer("leads", CONTRACT).start(CancellingRows(scope, token))
        assert scope.cancelled_caught
        state = await rows_and_registry(store, sheet)
        assert (state["rows"], state["events"], state["staged"]) == ([], [], [])
        assert state["version"] in ([], [(0,)])


class CancellingRows(Sequence[dict[str, Any]]):
    """1,000 rows made on demand; reading row 450 (on a worker thread, inside the open
    transaction) cancels the admission's caller."""

    def __init__(self, scope: trio.CancelScope, token: trio.lowlevel.TrioToken) -> None:
        self.scope, self.token = scope, token

    def __len__(self) -> int:
        return 1_000

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self):
            raise IndexError(index)
        if index == 450:
            trio.from_thread.run_sync(self.scope.cancel, trio_token=self.token)
        return {"_key": f"k{index:04d}", "text": f"t {index}"}


async def test_inputs_the_one_transaction_does_not_take_are_staged(
    gateway: CountingGateway, store: SheetStore
) -> None:
    play = new_play()
    sheet = sheet_of(play, "leads")

    async def async_rows(keys: list[int], label: str) -> AsyncIterator[dict[str, Any]]:
        for row in generated(keys, label):
            yield row

    async with runtime(gateway, "direct", play=play) as rt:
        first = await rt.writer("leads", CONTRACT).start(async_rows(list(range(150)), "a"))
        assert (await rows_and_registry(store, sheet))["staged"] == [("committed",)]
        # An iterator is one-shot: staged too (an empty sheet all the same).
        other = rt.writer("other", CONTRACT)
        await other.start(generated(list(range(10)), "i"))
        assert (await rows_and_registry(store, sheet_of(play, "other")))["staged"] == [
            ("committed",)
        ]
        # The sheet holds rows now: re-admitting them is the gateway's, so a sequence
        # (and an iterator alike) goes the staged way, rows re-admitted in the new order.
        second = await rt.writer("leads", CONTRACT).start(listed([*range(100, 250)], "b"))
    assert (first.write_version, second.write_version) == (1, 2)
    # inserted: new rows (and revived stale ones); skipped: the rest of the input.
    assert (second.inserted, second.skipped, second.pending_count) == (100, 50, 150)
    state = await rows_and_registry(store, sheet)
    assert state["staged"] == [("committed",), ("committed",)]
    by_key = {row[0]: row for row in state["rows"]}
    assert by_key["k0100"] == ("k0100", "b 100", "pending", 2, 2, 0)
    assert by_key["k0099"][2:5] == ("pending", 1, 1)


async def test_racing_admissions_of_one_sheet_queue_on_the_writer_lock(
    gateway: CountingGateway, store: SheetStore
) -> None:
    play = new_play()
    sheet = sheet_of(play, "leads")
    answers: dict[str, Any] = {}

    async def admit(label: str, keys: list[int]) -> None:
        async with runtime(gateway, "direct", play=play) as rt:
            answers[label] = await rt.writer("leads", CONTRACT).start(listed(keys, label))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(admit, "a", list(range(0, 300)))
        nursery.start_soon(admit, "b", list(range(150, 450)))
    assert sorted(a.write_version for a in answers.values()) == [1, 2]
    later = max(answers, key=lambda label: answers[label].write_version)
    state = await rows_and_registry(store, sheet)
    assert len(state["rows"]) == 450
    # The first took the empty sheet in one transaction; the second waited for its
    # lock, found rows and was staged: it owns every row it admitted.
    assert state["staged"] == [("committed",)]
    later_keys = range(0, 300) if later == "a" else range(150, 450)
    owned = {row[0]: row for row in state["rows"]}
    assert all(owned[f"k{i:04d}"][1:4] == (f"{later} {i}", "pending", 2) for i in later_keys)
    assert [(kind, version) for kind, version, _ in state["events"]] == [
        ("admission", 1),
        ("admission", 2),
    ]


async def test_past_the_hold_bound_a_sequence_is_rolled_back_and_staged_from_its_start(
    gateway: CountingGateway, store: SheetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bound of 0 ms: the transaction is past it after its first chunk (of 100 rows).
    monkeypatch.setattr(_admits, "DIRECT_ADMISSION_HOLD_MS", 0)
    play = new_play()
    sheet = sheet_of(play, "leads")
    async with runtime(gateway, "direct", play=play) as rt:
        admission = await rt.writer("leads", CONTRACT).start(listed(list(range(300))))
    assert (admission.write_version, admission.inserted) == (1, 300)
    state = await rows_and_registry(store, sheet)
    assert state["staged"] == [("committed",)]
    assert [row[0] for row in state["rows"]] == [f"k{i:04d}" for i in range(300)]


@pytest.mark.parametrize("strategy", ROADS)
async def test_each_strategy_admits_through_its_own_admission_road(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    """The runtime hands the writer its strategy's admission road; the gateway road has
    no way in at once (it answers None without a request) and stages the sequence the
    direct road writes in one transaction: the same rows either way."""
    play = new_play()
    roads = {"direct": DirectAdmissions, "gateway_only": GatewayAdmissions}
    async with runtime(gateway, strategy, play=play) as rt:
        writer = rt.writer("leads", CONTRACT)
        road = writer._target.admissions
        assert type(road) is roads[strategy]
        if strategy == "gateway_only":
            before = gateway.requests
            assert await road.admit_at_once(listed([1, 2])) is None
            assert gateway.requests == before
        admission = await writer.start(listed([3, 1, 2, 1]))
        pending = [row["_key"] async for row in admission.pending()]
    assert (admission.inserted, admission.skipped) == (3, 1)
    assert pending == ["k0003", "k0001", "k0002"]
    state = await rows_and_registry(store, sheet_of(play, "leads"))
    assert [row[0] for row in state["rows"]] == pending
    assert state["staged"] == ([] if strategy == "direct" else [("committed",)])
