"""``Admission`` on both roads: counts that do not grow with the input, and
``pending()`` / ``completed()`` as lazy datasets read by keyset, in input order."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import attrs
import pytest

from _runtime_helpers import (
    CONTRACT,
    ROADS,
    CountingGateway,
    counting_gateway,
    new_play,
    reap_session_roles,
    runtime,
)
from sheetplane import Attempt
from sheetplane.admission import Admission
from sheetplane.runtime import CompleteRow, FailRow, Strategy


@pytest.fixture(scope="module", autouse=True)
def _drop_session_roles(database_url: str) -> Iterator[None]:
    """The direct road mints sessions here; drop their roles when the module ends."""
    yield
    reap_session_roles(database_url)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url) as gw:
        yield gw


def rows(keys: list[int]) -> list[dict[str, Any]]:
    return [{"_key": f"r{i:04d}", "text": f"text {i}"} for i in keys]


def keys_of(found: list[dict[str, Any]]) -> list[str]:
    return [row["_key"] for row in found]


def test_the_answer_holds_no_rows() -> None:
    names = [field.name for field in attrs.fields(Admission)]
    assert names == [
        "write_version",
        "inserted",
        "skipped",
        "pending_count",
        "completed_count",
        "table_namespace",
        "play_name",
        "run_id",
        "_open",
    ]


@pytest.mark.parametrize("strategy", ROADS)
async def test_pending_and_completed_are_lazy_datasets_in_input_order(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    async with runtime(gateway, strategy, play=new_play()) as rt:
        first = rt.writer("leads", CONTRACT)
        # r0003 repeats: the first occurrence is kept.
        one = await first.start(rows([3, 1, 4, 0, 3, 2]))
        assert (one.inserted, one.skipped, one.pending_count, one.completed_count) == (
            5,
            1,
            5,
            0,
        )
        c = rt.context
        assert one.attempt == Attempt(c.play_name, "leads", c.run_id, one.write_version)
        assert keys_of(await one.pending().materialize()) == [
            "r0003",
            "r0001",
            "r0004",
            "r0000",
            "r0002",
        ]
        assert await one.completed().materialize() == []
        await first.complete(
            [CompleteRow("r0001", {"words": 2}), CompleteRow("r0000", {"words": 2})]
        )
        await first.fail([FailRow("r0004", "boom")])

        # The work list does not shift while its rows are completed.
        assert await one.pending().count() == 5
        statuses = [row["_status"] async for row in one.pending()]
        assert statuses == ["pending", "enriched", "failed", "enriched", "pending"]

        # A new attempt over a new input order: enriched rows come back completed,
        # with their outputs; the failed and pending ones are re-admitted.
        retry = rt.writer("leads", CONTRACT)
        two = await retry.start(iter(rows([0, 5, 4, 3, 1, 2])))
        assert two.write_version == one.write_version + 1
        # The seed's counts: one new row inserted; the other five skipped (two
        # enriched, three open rows admitted again, which are pending all the same).
        assert (two.inserted, two.skipped, two.pending_count, two.completed_count) == (
            1,
            5,
            4,
            2,
        )
        pending = two.pending()
        completed = two.completed()
        assert keys_of(await pending.materialize()) == ["r0005", "r0004", "r0003", "r0002"]
        assert await pending.count() == 4
        assert keys_of(await pending.peek(2)) == ["r0005", "r0004"]
        third = await pending.at(2)
        assert third is not None and third["_key"] == "r0003" and third["text"] == "text 3"
        assert await pending.at(4) is None
        done = await completed.materialize()
        assert [(row["_key"], row["words"], row["_status"]) for row in done] == [
            ("r0000", 2, "enriched"),
            ("r0001", 2, "enriched"),
        ]
        assert await completed.count() == 2
        # The rows the retry took over left the first attempt's work list.
        assert await one.pending().materialize() == []
        assert keys_of(await one.completed().materialize()) == []


@pytest.mark.parametrize("strategy", ROADS)
async def test_start_takes_an_async_iterable(gateway: CountingGateway, strategy: Strategy) -> None:
    async def produce() -> AsyncIterator[dict[str, Any]]:
        for row in rows(list(range(7))):
            yield row

    async with runtime(gateway, strategy, play=new_play()) as rt:
        admission = await rt.writer("leads", CONTRACT).start(produce())
        assert admission.pending_count == 7
        assert [row["_input_index"] async for row in admission.pending()] == list(range(7))
