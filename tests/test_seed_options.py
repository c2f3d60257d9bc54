"""The runtime's options by their seed names: disable_postgres_pool_cache,
protection_bypass_token and upsert's skip_ensure_sheet (with its derived idempotency key)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import psycopg
import pytest
import trio

from _runtime_helpers import (
    CONTRACT,
    CountingGateway,
)
from sheetplane import InvalidInputError
from sheetplane._types import ContractColumn, SheetContract, SheetRef
from sheetplane.gateway.server._roles import ROLE_PREFIX
from sheetplane.runtime import open_runtime
from sheetplane.runtime._writer import _upsert_key

ORG = "acme-runtime"
BYPASS = "bypass-7e6d5c4b3a29"


@pytest.fixture
def gateway(runtime_gateway: CountingGateway) -> CountingGateway:
    return runtime_gateway


def _runtime(gateway: CountingGateway, play: str, **options: Any) -> Any:
    return open_runtime(
        base_url=gateway.base_url,
        token=gateway.token,
        org_id=ORG,
        play_name=play,
        run_id="run-1",
        **options,
    )


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"_key": f"k{i:03d}", "text": f"row {i}"} for i in range(n)]


def _session_connections(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE starts_with(usename, %s)",
            (ROLE_PREFIX,),
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _words(row: dict[str, Any]) -> dict[str, Any]:
    return {"words": len(str(row["text"]).split())}


@pytest.mark.parametrize("disable", [False, True])
async def test_the_direct_road_works_with_and_without_pool_caching(
    gateway: CountingGateway, database_url: str, disable: bool
) -> None:
    # That an uncached pool opens and closes with each use is
    # test_sessions.py::test_without_pool_caching_every_use_opens_and_closes_its_own_pool.
    play = f"pools-{uuid.uuid4().hex[:8]}"
    async with _runtime(gateway, play, disable_postgres_pool_cache=disable) as rt:
        report = await rt.map("leads", CONTRACT, _rows(30), _words)
        dataset = rt.dataset("leads")
        assert await dataset.count() == 30
        assert [row["words"] for row in await dataset.materialize()] == [2] * 30
        if not disable:
            # Cached: the session's pool keeps its connection for the next operation.
            assert await trio.to_thread.run_sync(_session_connections, database_url) >= 1
    assert (report.completed, report.failed) == (30, 0)


async def test_disable_postgres_pool_cache_must_be_a_bool(gateway: CountingGateway) -> None:
    with pytest.raises(InvalidInputError, match="disable_postgres_pool_cache"):
        async with _runtime(gateway, "p", disable_postgres_pool_cache="yes"):
            pass


async def test_the_bypass_token_reaches_the_gateway_on_every_request(
    gateway: CountingGateway,
) -> None:
    async with _runtime(
        gateway, f"bypass-{uuid.uuid4().hex[:8]}", protection_bypass_token=BYPASS
    ) as rt:
        await rt.writer("leads", CONTRACT).start(_rows(2))
        assert gateway.last_headers["x-vercel-protection-bypass"] == BYPASS
        assert await rt.dataset("leads").count() == 2
        assert gateway.last_headers["x-vercel-protection-bypass"] == BYPASS
        assert BYPASS not in repr(rt) and BYPASS not in repr(rt.context)
        assert BYPASS not in repr(rt.client)


async def test_upsert_ensures_the_sheet_first_only_when_asked(gateway: CountingGateway) -> None:
    wider = SheetContract((*CONTRACT.columns, ContractColumn("city", "city", "input")))
    async with _runtime(gateway, f"upsert-{uuid.uuid4().hex[:8]}") as rt:
        writer = rt.writer("leads", wider)
        await writer.upsert([{"text": "a", "city": "Oslo"}], idempotency_key="one")
        sent = gateway.requests
        await writer.upsert([{"text": "b"}], idempotency_key="two")  # the session is cached
        assert gateway.requests == sent
        await writer.upsert([{"text": "c"}], idempotency_key="three", skip_ensure_sheet=False)
        assert gateway.requests == sent + 1  # ensure_sheet, then the cached session
        assert sorted(row["text"] for row in await rt.dataset("leads").materialize()) == [
            "a",
            "b",
            "c",
        ]
        with pytest.raises(InvalidInputError, match="skip_ensure_sheet"):
            await writer.upsert([{"text": "d"}], skip_ensure_sheet=None)  # type: ignore[arg-type]


async def test_upsert_without_a_key_derives_the_runtimes_key(gateway: CountingGateway) -> None:
    play = f"Upsert-{uuid.uuid4().hex[:8]}"
    rows = [{"text": "a"}, {"text": "b"}]
    async with _runtime(gateway, play) as rt:
        writer = rt.writer("Leads", CONTRACT)
        first = await writer.upsert(rows)
        again = await writer.upsert(rows)
        other = await writer.upsert([{"text": "c"}])
    assert (first.written, first.replayed) == (2, False)
    assert (again.written, again.replayed) == (0, True)
    assert (other.written, other.replayed) == (1, False)


def test_the_derived_upsert_key_is_sha1_of_play_namespace_run_and_rows() -> None:
    # The runtime's upsertRuntimeRows key, over the normalised names.
    material = 'enrich:leads:run-1:[{"text":"a","n":1},{"text":"b"}]'
    expected = hashlib.sha1(material.encode(), usedforsecurity=False).hexdigest()
    rows = [{"text": "a", "n": 1}, {"text": "b"}]
    assert _upsert_key(SheetRef(ORG, "Enrich", " Leads "), "run-1", rows) == expected
