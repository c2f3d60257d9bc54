"""Writes through the runtime on both strategies, against real Postgres and the reference
gateway: admission, fenced terminal writes (superseded attempts raise and stop),
idempotent append/upsert/replace under scoped roles, receipts, and argument checks that
refuse bad input before anything is sent."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from _runtime_helpers import (
    CONTRACT,
    ORG,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    runtime,
    select_rows,
    sheet_exists,
    sheet_of,
)
from sheetplane import AttemptSupersededError, InvalidInputError
from sheetplane._types import StaleRow
from sheetplane.runtime import CompleteRow, FailRow, Strategy, open_runtime
from sheetplane.store import SheetStore


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def inputs(n: int) -> list[dict[str, Any]]:
    return [{"_key": f"r{i:04d}", "text": f"text number {i}"} for i in range(n)]


def outputs(row: dict[str, Any]) -> CompleteRow:
    return CompleteRow(row["_key"], {"words": len(str(row["text"]).split())})


@pytest.mark.parametrize("strategy", ROADS)
async def test_an_attempt_admits_maps_and_reads_back(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as rt:
        writer = rt.writer("leads", CONTRACT)
        admission = await writer.start(inputs(10))
        assert admission.inserted == 10
        assert writer.write_version == admission.write_version
        assert (admission.pending_count, admission.completed_count) == (10, 0)
        pending = await admission.pending().materialize()
        assert [row["_key"] for row in pending] == [f"r{i:04d}" for i in range(10)]
        done = await writer.complete([outputs(row) for row in pending[:7]])
        assert sorted(done.committed_keys) == [f"r{i:04d}" for i in range(7)]
        failed = await writer.fail([FailRow(row["_key"], "no words") for row in pending[7:]])
        assert failed.updated == 3
        rows = [row async for row in rt.dataset("leads", run_id="run-1")]
        again = await writer.complete([outputs(row) for row in pending[:7]])  # a replay
    assert again.updated == 0
    assert rows == await select_rows(store, sheet_of(play, "leads"))
    assert [row["_status"] for row in rows] == ["enriched"] * 7 + ["failed"] * 3
    assert [row["words"] for row in rows[:7]] == [3] * 7
    assert rows[9]["_error"] == "no words"


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_superseded_attempt_raises_and_writes_nothing_more(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as rt:
        first = rt.writer("leads", CONTRACT)
        admitted = await first.start(inputs(6))
        first_pending = await admitted.pending().materialize()
        await first.complete([outputs(row) for row in first_pending[:2]])
        retry = rt.writer("leads", CONTRACT)
        readmitted = await retry.start(inputs(6))
        assert readmitted.write_version > admitted.write_version
        completed = await readmitted.completed().materialize()
        assert [row["_key"] for row in completed] == ["r0000", "r0001"]
        assert [row["words"] for row in completed] == [3, 3]
        assert (readmitted.pending_count, readmitted.completed_count) == (4, 2)

        with pytest.raises(AttemptSupersededError) as raised:
            await first.complete([outputs(row) for row in first_pending[2:4]])
        error = raised.value
        assert error.superseded_rows == (
            StaleRow("r0002", "newer_write_version", readmitted.write_version),
            StaleRow("r0003", "newer_write_version", readmitted.write_version),
        )
        assert (error.table_namespace, error.run_id) == ("leads", rt.context.run_id)
        assert (error.write_version, error.submitted_rows) == (admitted.write_version, 2)
        assert str(error).startswith(
            'RUNTIME_SHEET_ATTEMPT_SUPERSEDED: Runtime Sheet table "leads" rejected 2 of 2 '
            f"terminal row write(s) from run {rt.context.run_id} "
            f"at write version {admitted.write_version} "
        )
        # The attempt has stopped: no further terminal write is sent.
        sent = gateway.requests
        with pytest.raises(AttemptSupersededError):
            await first.fail([FailRow("r0005", "late")])
        assert gateway.requests == sent

        await retry.complete([outputs(row) async for row in readmitted.pending()])
        assert rt.stats().fenced_rows == 2
    rows = await select_rows(store, sheet_of(play, "leads"))
    assert [row["_status"] for row in rows] == ["enriched"] * 6
    assert rows[5]["_error"] is None


async def test_an_attempt_resumes_on_another_road_with_its_write_version(
    gateway: CountingGateway, store: SheetStore
) -> None:
    play = new_play()
    async with (
        runtime(gateway, "gateway_only", play=play) as via_gateway,
        runtime(gateway, "direct", play=play) as direct,
    ):
        admission = await via_gateway.writer("leads", CONTRACT).start(inputs(4))
        resumed = direct.writer("leads", CONTRACT, write_version=admission.write_version)
        await resumed.complete([outputs(row) async for row in admission.pending()])
        stale = direct.writer("leads", CONTRACT, write_version=admission.write_version - 1)
        await via_gateway.writer("leads", CONTRACT).start(inputs(5))
        with pytest.raises(AttemptSupersededError):
            await stale.complete([CompleteRow("r0004", {"words": 1})])
    rows = await select_rows(store, sheet_of(play, "leads"))
    assert [row["_status"] for row in rows] == ["enriched"] * 4 + ["pending"]


@pytest.mark.parametrize("strategy", ROADS)
async def test_append_upsert_replace_run_under_scoped_roles_and_replay_once(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as rt:
        writer = rt.writer("notes", CONTRACT)
        first = await writer.append([{"text": "a"}, {"text": "b"}], idempotency_key="append-1")
        replay = await writer.append([{"text": "a"}, {"text": "b"}], idempotency_key="append-1")
        assert (first.written, first.replayed) == (2, False)
        assert (replay.written, replay.replayed) == (0, True)
        upserted = await writer.upsert(
            [{"_key": "u1", "text": "c"}, {"_key": "u1", "text": "d"}], idempotency_key="up-1"
        )
        assert upserted.written == 1
        texts = sorted(row["text"] for row in await rt.dataset("notes").materialize())
        assert texts == ["a", "b", "d"]
        replaced = await writer.replace([{"text": "only"}], idempotency_key="rep-1")
        assert replaced.written == 1
        assert (await writer.replace([{"text": "x"}], idempotency_key="rep-1")).replayed
        assert [row["text"] for row in await rt.dataset("notes").materialize()] == ["only"]


async def test_receipts_are_recorded_once(gateway: CountingGateway) -> None:
    play = new_play()
    async with runtime(gateway, "direct", play=play) as rt:
        recorder = rt.receipts()
        first = await recorder.complete("email-42", {"sent": True}, run_attempt=1)
        second = await recorder.complete("email-42", {"sent": False})
    assert first.completion_disposition == "persisted"
    assert second.completion_disposition == "existing"
    assert second.receipt.result == {"sent": True}
    assert second.receipt.run_id == "run-1"


GOOD: dict[str, Any] = {
    "base_url": "http://127.0.0.1:9",
    "token": "tok",
    "org_id": ORG,
    "play_name": "play",
    "run_id": "run",
}
BAD_CONTEXTS: dict[str, dict[str, Any]] = {
    "base_url not http": {"base_url": "ftp://example.com"},
    "empty token": {"token": " "},
    "token not str": {"token": b"tok"},
    "empty org": {"org_id": ""},
    "play with NUL": {"play_name": "p\x00"},
    "run not str": {"run_id": 7},
    "unknown strategy": {"strategy": "sideways"},
    "preloaded not sessions": {"preloaded_sessions": [{"session": {}}]},
    "short unwrap key": {"unwrap_key": b"short"},
    "headers not strings": {"headers": {"x-a": 1}},
}


@pytest.mark.parametrize("case", sorted(BAD_CONTEXTS))
async def test_bad_runtime_arguments_are_refused_before_connecting(case: str) -> None:
    with pytest.raises(InvalidInputError):
        async with open_runtime(**{**GOOD, **BAD_CONTEXTS[case]}):
            pytest.fail("the block must not run")


async def test_bad_write_and_read_arguments_send_nothing(
    gateway: CountingGateway, store: SheetStore
) -> None:
    play = new_play()
    async with runtime(gateway, "direct", play=play) as rt:
        sent = gateway.requests
        writer = rt.writer("leads", CONTRACT)
        attempts = [
            lambda: rt.writer("", CONTRACT),
            lambda: rt.writer("leads", {"columns": []}),  # type: ignore[arg-type]
            lambda: rt.writer("leads", CONTRACT, write_version=-1),
            lambda: rt.dataset("leads", "everything"),  # type: ignore[arg-type]
            lambda: rt.dataset("leads", run_id=""),
            lambda: rt.dataset("leads", page_rows=0),
        ]
        for attempt in attempts:
            with pytest.raises(InvalidInputError):
                attempt()
        for call in (
            writer.start("not rows"),  # type: ignore[arg-type]
            writer.start([{"text": "ok"}, ["not", "a", "row"]]),  # type: ignore[list-item]
            writer.complete([CompleteRow("r1", {"words": 1})]),  # no attempt yet
            writer.complete([{"key": "r1", "data": {}}]),  # type: ignore[list-item]
            writer.fail([FailRow("r1", 42)]),  # type: ignore[arg-type]
            writer.start([{"text": object()}]),
            writer.start([{"text": float("nan")}]),
            writer.append([{"text": "x"}], idempotency_key=""),
            writer.append([{"text": float("inf")}], idempotency_key="k"),
            writer.upsert([{"text": "x"}], idempotency_key="k", key_field=""),
            rt.receipts().complete("", 1),
            rt.receipts().complete("k", object()),
            rt.receipts().complete("k", float("nan")),
            rt.receipts().complete("k", 1, run_attempt=-2),
            rt.dataset("leads").at(-1),
        ):
            with pytest.raises(InvalidInputError):
                await call
        assert gateway.requests == sent
        assert rt.sessions.minted == 0
    assert not await sheet_exists(store, sheet_of(play, "leads"))


@pytest.mark.parametrize("strategy", ROADS)
async def test_outputs_that_are_not_json_are_refused_before_sending(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as rt:
        writer = rt.writer("leads", CONTRACT)
        await writer.start(inputs(2))
        sent = gateway.requests
        for call in (
            writer.complete([CompleteRow("r0000", {"words": object()})]),
            writer.complete([CompleteRow("r0000", {"words": 1}, {"meta": float("nan")})]),
            writer.fail([FailRow("r0001", "bad", {"words": {1, 2}})]),
        ):
            with pytest.raises(InvalidInputError):
                await call
        assert gateway.requests == sent
    rows = await select_rows(store, sheet_of(play, "leads"))
    assert [row["_status"] for row in rows] == ["pending", "pending"]


def test_the_token_never_shows_in_a_repr() -> None:
    from sheetplane.runtime import RuntimeContext

    secret = f"tok-{uuid.uuid4().hex}"
    context = RuntimeContext(**{**GOOD, "token": secret, "unwrap_key": b"k" * 32})
    assert secret not in repr(context)
    assert "kkkk" not in repr(context)


@pytest.mark.parametrize("strategy", ROADS)
async def test_an_error_in_the_block_comes_out_as_itself(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    """Not wrapped in an exception group by the runtime's internal nurseries."""
    with pytest.raises(KeyError, match="mine"):
        async with runtime(gateway, strategy, play=new_play()) as rt:
            await rt.dataset("nothing").count()
            raise KeyError("mine")
