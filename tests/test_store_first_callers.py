"""Concurrent first callers of every DDL path in a new org: none may fail.

A new org has no schema yet; its first callers race to create it (and its
sheets' tables, its plays' receipts tables, its plays table), and on a new
database the gateway's workers race to create its session ledger. Each path takes
the org's DDL key and checks again after it (``store._schema.ensure_ddl``);
before that, 20 concurrent first claims in a fresh org answered 500
(``UniqueViolation`` on ``pg_namespace_nspname_index``) for about a quarter of
the callers.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from psycopg import sql
from psycopg.conninfo import make_conninfo

from _runtime_helpers import CONTRACT, counting_gateway
from _session_helpers import run_sql
from sheetplane._types import ResolvedPlay, SheetRef
from sheetplane.gateway.server._hardening import harden_database
from sheetplane.gateway.server._roles import GATEWAY_SCHEMA
from sheetplane.runtime import Runtime, open_runtime
from sheetplane.store import SheetStore, open_store

#: Concurrent first callers per org, and fresh orgs per test (the issue's 20 in each).
CALLERS = 20
ORGS = 4


Call = Callable[[], Awaitable[Any]]


async def _all_succeed(calls: list[Call]) -> list[str]:
    """Run every call at once; the repr of each error raised."""
    errors: list[str] = []

    async def one(call: Call) -> None:
        try:
            await call()
        except Exception as exc:
            errors.append(repr(exc))

    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(one, call)
    return errors


def _fresh_org() -> str:
    return f"org-{uuid.uuid4().hex}"


async def test_concurrent_first_claims_in_new_orgs_all_succeed(store: SheetStore) -> None:
    # The failure: every caller claims its own key in a play of a new org.
    for _ in range(ORGS):
        org = _fresh_org()
        calls = [
            partial(store.claim_work_receipt, org, "play", f"k{i}", f"h{i}") for i in range(CALLERS)
        ]
        assert await _all_succeed(calls) == []


def _first_callers(store: SheetStore, org: str, shared: SheetRef) -> list[Call]:
    """``CALLERS`` first callers of one new org, mixing every path that creates its
    schema: sheets (each its own, and several ensuring one), receipts tables of two
    plays, and the plays table."""
    calls: list[Call] = []
    for i in range(CALLERS):
        match i % 5:
            case 0:
                calls.append(partial(store.ensure_sheet, SheetRef(org, "p", f"ns{i}"), CONTRACT))
            case 1:
                calls.append(partial(store.ensure_sheet, shared, CONTRACT))
            case 2:
                calls.append(partial(store.claim_work_receipt, org, "play-a", f"k{i}", "h"))
            case 3:
                calls.append(partial(store.claim_work_receipt, org, "play-b", f"k{i}", "h"))
            case _:
                play = ResolvedPlay(f"id-{i}")
                calls.append(partial(store.register_play, org, play, name=f"n{i}"))
    return calls


async def test_every_ddl_path_of_a_new_org_races_safely(store: SheetStore) -> None:
    for _ in range(ORGS):
        org = _fresh_org()
        shared = SheetRef(org, "play-a", "ns-shared")
        assert await _all_succeed(_first_callers(store, org, shared)) == []
        # Everything was created once and works.
        assert await store.count(shared) == 0
        assert await store.resolve_play(org, "n4") == ResolvedPlay("id-4")
        claim = await store.claim_work_receipt(org, "play-b", "k-after", "h")
        assert claim.acquired


async def _once_square(rt: Runtime, results: dict[int, Any], i: int) -> None:
    async def fn() -> int:
        return i * i

    results[i] = await rt.receipts().once(f"key-{i}", fn)


async def test_concurrent_first_once_calls_through_the_gateway_all_succeed(
    database_url: str,
) -> None:
    # 20 once() calls at once in each of several fresh orgs, through the gateway:
    # each claims its key (the first claims create the org's schema), runs, records.
    orgs = {f"tok-{secrets.token_hex(8)}": _fresh_org() for _ in range(ORGS)}
    async with counting_gateway(database_url, more_tokens=orgs) as gateway:
        for token, org in orgs.items():
            async with open_runtime(
                base_url=gateway.base_url,
                token=token,
                org_id=org,
                play_name="play",
                run_id="run-1",
                strategy="gateway_only",
            ) as rt:
                results: dict[int, Any] = {}
                calls = [partial(_once_square, rt, results, i) for i in range(CALLERS)]
                assert await _all_succeed(calls) == []
                assert results == {i: i * i for i in range(CALLERS)}


async def test_the_gateways_ledger_and_every_ddl_path_of_a_new_database_race_safely(
    database_url: str,
) -> None:
    # The gateway's own DDL: every gateway worker or process starting on a new
    # database creates the session ledger (``harden_database`` ->
    # ``ensure_session_ledger``, the gateway's schema and table) while the first
    # callers of a new org create its schema, sheets, receipts and plays.
    database = f"sp_first_{uuid.uuid4().hex[:10]}"
    await run_sql(database_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    url = make_conninfo(database_url, dbname=database)
    try:
        async with open_store(url, max_connections=CALLERS) as store:
            org = _fresh_org()
            shared = SheetRef(org, "play-a", "ns-shared")
            gateways: list[Call] = [partial(harden_database, store) for _ in range(CALLERS // 2)]
            calls = [*_first_callers(store, org, shared), *gateways]
            assert await _all_succeed(calls) == []
            # The ledger was created once and works; so does the org's layout.
            rows = await store.pool.run(
                lambda conn: conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(
                        sql.Identifier(GATEWAY_SCHEMA, "sessions")
                    )
                ).fetchall()
            )
            assert rows == [(0,)]
            assert await store.count(shared) == 0
            assert await store.resolve_play(org, "n4") == ResolvedPlay("id-4")
    finally:
        await run_sql(
            database_url,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)),
        )
