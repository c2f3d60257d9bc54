"""Terminal writes behave alike on both roads: one suite, parametrized by road, runs
each operation of the ``TerminalWrites`` family (pages/_writes.py) on the direct road
(a scoped session to the store) and on the gateway road (the client)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from _runtime_helpers import CONTRACT, ROADS, CountingGateway, counting_gateway, new_play, runtime
from sheetplane._types import SheetRef
from sheetplane.pages import DirectWrites, GatewayWrites, TerminalWrites
from sheetplane.runtime import CompleteRow, FailRow, Runtime, Strategy

KEYS = [f"k{i}" for i in range(4)]


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def _writes(rt: Runtime, strategy: Strategy, sheet: SheetRef) -> TerminalWrites:
    if strategy == "direct":
        return DirectWrites(rt.sessions, sheet, CONTRACT, "run-1", None)
    return GatewayWrites(rt.client, sheet.table_namespace, CONTRACT, "run-1")


@pytest.mark.parametrize("strategy", ROADS)
async def test_terminal_writes_commit_replay_and_fence_alike_on_both_roads(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    play = new_play()
    async with runtime(gateway, strategy, play=play) as rt:
        writer = rt.writer("leads", CONTRACT)
        admission = await writer.start([{"_key": key, "text": "a b"} for key in KEYS])
        version = admission.write_version
        writes = _writes(rt, strategy, SheetRef(rt.context.org_id, play, "leads"))
        assert writes.road == ("direct" if strategy == "direct" else "gateway")

        done = await writes.complete_map_rows(
            [CompleteRow("k0", {"words": 2}), CompleteRow("k1", {"words": 2})],
            write_version=version,
        )
        assert (sorted(done.committed_keys), done.stale_rows, done.updated) == (
            ["k0", "k1"],
            (),
            2,
        )
        failed = await writes.fail_map_rows([FailRow("k2", "no words")], write_version=version)
        assert (failed.committed_keys, failed.updated) == (("k2",), 1)
        # A replay by the same version commits again and writes nothing.
        again = await writes.complete_map_rows(
            [CompleteRow("k0", {"words": 2})], write_version=version
        )
        assert (again.committed_keys, again.updated) == (("k0",), 0)
        # A newer admission owns k3: the old version's write is fenced with its reason.
        await rt.writer("leads", CONTRACT).start([{"_key": "k3", "text": "c"}])
        stale = await writes.complete_map_rows(
            [CompleteRow("k3", {"words": 1})], write_version=version
        )
    assert stale.committed_keys == ()
    assert [(row.key, row.reason) for row in stale.stale_rows] == [("k3", "newer_write_version")]
