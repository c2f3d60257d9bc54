"""The keyed writes, work receipts and plays families behave alike on both roads: one
suite, parametrized by road, runs each family's operations on the direct road and on
the gateway road (the terminal writes' suite is tests/test_road_writes.py).

* Keyed writes (pages/_keyed.py): ``DirectKeyedWrites`` (a scoped session to the
  store) and ``GatewayKeyedWrites`` (the client), each picked by a runtime of that
  strategy, through the writer.
* Receipts and plays (pages/_receipts.py, pages/_plays.py): ``store.StoreReceipts`` and
  ``store.StorePlays`` (the store, as the reference gateway answers through them) and
  the client itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from _runtime_helpers import (
    CONTRACT,
    ORG,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    runtime,
    sheet_exists,
    sheet_of,
)
from sheetplane._types import ResolvedPlay, new_lease_token
from sheetplane.pages import (
    DirectKeyedWrites,
    GatewayKeyedWrites,
    KeyedWrites,
    Plays,
    WorkReceipts,
)
from sheetplane.runtime import Runtime, Strategy
from sheetplane.store import StorePlays, StoreReceipts

#: The two roads of the play-level families: the store's and the client.
PLAY_ROADS = ("direct", "gateway")


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def _keyed(rt: Runtime, strategy: Strategy, play: str) -> KeyedWrites:
    sheet = sheet_of(play, "leads")
    if strategy == "direct":
        return DirectKeyedWrites(rt.sessions, sheet, CONTRACT, "run-1", None)
    return GatewayKeyedWrites(rt.client, "leads", CONTRACT, "run-1")


@pytest.mark.parametrize("strategy", ROADS)
async def test_keyed_writes_append_upsert_replace_and_replay_alike_on_both_roads(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as rt:
        keyed = _keyed(rt, strategy, play)
        assert keyed.road == ("direct" if strategy == "direct" else "gateway")
        rows = [{"text": "a"}, {"text": "b"}]
        first = await keyed.append_rows(rows, idempotency_key="append-1")
        replay = await keyed.append_rows(rows, idempotency_key="append-1")
        assert (first.written, first.replayed) == (2, False)
        assert (replay.written, replay.replayed) == (0, True)

        # The writer takes the road its runtime's strategy picked: the same behaviour.
        writer = rt.writer("leads", CONTRACT)
        upserted = await writer.upsert(
            [{"id": "u1", "text": "x"}, {"id": "u1", "text": "y"}],
            idempotency_key="up-1",
            key_field="id",
        )
        assert (upserted.written, upserted.replayed) == (1, False)
        replayed = await writer.upsert([{"id": "u1"}], idempotency_key="up-1", key_field="id")
        assert replayed.replayed
        assert await rt.dataset("leads").count() == 3

        replaced = await keyed.replace_rows([{"text": "only"}], idempotency_key="rep-1")
        assert (replaced.written, replaced.replayed) == (1, False)
        assert (await writer.replace([{"text": "z"}], idempotency_key="rep-1")).replayed
        rows_now = await rt.dataset("leads", "all").materialize()
    assert [(row["text"], row["_run_id"]) for row in rows_now] == [("only", "run-1")]


def _receipts(rt: Runtime, gateway: CountingGateway, road: str, play: str) -> WorkReceipts:
    if road == "direct":
        return StoreReceipts(gateway.state.store, ORG, play)
    return rt.client


@pytest.mark.parametrize("road", PLAY_ROADS)
async def test_work_receipts_claim_complete_and_release_alike_on_both_roads(
    gateway: CountingGateway, road: str
) -> None:
    play = new_play()
    async with runtime(gateway, "gateway_only", play=play) as rt:
        receipts = _receipts(rt, gateway, road, play)
        a, b = new_lease_token(), new_lease_token()
        held = await receipts.claim_work_receipt("job-1", "holder-a", lease_token=a)
        assert (held.acquired, held.holder, held.lease_token) == (True, "holder-a", a)
        refused = await receipts.claim_work_receipt("job-1", "holder-b", lease_token=b)
        assert (refused.acquired, refused.holder, refused.lease_token) == (False, "holder-a", None)
        assert not await receipts.release_work_receipt("job-1", "holder-a", b)  # not its token
        assert await receipts.release_work_receipt("job-1", "holder-a", a)

        taken = await receipts.claim_work_receipt("job-1", "holder-b", lease_token=b)
        assert taken.acquired
        done = await receipts.complete_work_receipt(
            "job-1", {"ok": 1}, "run-1", holder="holder-b", lease_token=b
        )
        assert (done.completion_disposition, done.receipt.result) == ("persisted", {"ok": 1})
        after = await receipts.claim_work_receipt("job-1", "holder-a", lease_token=a)
        assert (after.acquired, after.receipt) == (False, done.receipt)

        # Without a lease: the first writer's receipt wins, later ones get it back.
        once = await receipts.complete_work_receipt("job-2", [1], "run-1", run_attempt=2)
        again = await receipts.complete_work_receipt("job-2", [2], "run-2")
    assert (once.completion_disposition, again.completion_disposition) == ("persisted", "existing")
    assert again.receipt == once.receipt
    assert (once.receipt.result, once.receipt.run_id) == ([1], "run-1")


def _plays(rt: Runtime, gateway: CountingGateway, road: str, play: str) -> Plays:
    if road == "direct":
        return StorePlays(gateway.state.store, ORG, play)
    return rt.client


@pytest.mark.parametrize("road", PLAY_ROADS)
async def test_plays_ensure_a_sheet_and_register_and_resolve_alike_on_both_roads(
    gateway: CountingGateway, road: str
) -> None:
    play = new_play()
    async with runtime(gateway, "gateway_only", play=play) as rt:
        plays = _plays(rt, gateway, road, play)
        sheet = sheet_of(play, "Contacts")
        assert not await sheet_exists(gateway.state.store, sheet)
        await plays.ensure_sheet("Contacts", CONTRACT)
        await plays.ensure_sheet("Contacts", CONTRACT)  # idempotent
        assert await sheet_exists(gateway.state.store, sheet)

        play_id = f"id-{play}"
        assert await plays.resolve_play(play_id) is None
        definition = ResolvedPlay(play_id, source_code="export default 1", code_format="function")
        await plays.register_play(definition, name=f"name-{play}")
        by_id = await plays.resolve_play(play_id)
        by_name = await plays.resolve_play(f"name-{play}")
    assert by_id == by_name == definition
