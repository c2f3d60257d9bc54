"""Helpers for the runtime tests: a gateway that counts what it serves, fast seeding of big
sheets straight through the superuser, and the reference read done with one plain SELECT."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import attrs
import hypercorn.trio
import psycopg
import trio
from hypercorn.typing import ASGIFramework
from psycopg import sql
from starlette.applications import Starlette

from sheetplane._types import SheetRef
from sheetplane.gateway.server import GatewayConfig, GatewayState, create_app
from sheetplane.gateway.server._app import gateway_state
from sheetplane.gateway.server._serve import hypercorn_config
from sheetplane.runtime import ContractColumn, Runtime, SheetContract, Strategy, open_runtime
from sheetplane.store import SheetStore, sheet_names

ORG = "acme-runtime"
#: Both strategies, for the tests that run once on each road.
ROADS: tuple[Strategy, ...] = ("direct", "gateway_only")
CONTRACT = SheetContract(
    (
        ContractColumn("text", "text", "input"),
        ContractColumn("words", "words", "output"),
    )
)


@attrs.define
class CountingGateway:
    """A reference gateway on loopback, counting the HTTP requests it receives."""

    base_url: str
    token: str
    app: Starlette
    requests: int = 0
    #: The headers of the last HTTP request received (names lower-case).
    last_headers: dict[str, str] = attrs.field(factory=dict)

    @property
    def state(self) -> GatewayState:
        return gateway_state(self.app)


@asynccontextmanager
async def counting_gateway(
    database_url: str, *, more_tokens: dict[str, str] | None = None, **options: Any
) -> AsyncIterator[CountingGateway]:
    """The reference app behind a counter of HTTP requests, served by Hypercorn's trio worker.

    Its ``token`` is ``ORG``'s; ``more_tokens`` (token -> org) admit other orgs."""
    token = f"tok-{secrets.token_hex(8)}"
    tokens = {token: ORG, **(more_tokens or {})}
    config = GatewayConfig(database_url=database_url, tokens=tokens, **options)
    app = create_app(config)
    holder: list[CountingGateway] = []

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            holder[0].requests += 1
            holder[0].last_headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        await app(scope, receive, send)

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            partial(
                hypercorn.trio.serve,
                cast(ASGIFramework, counted),
                hypercorn_config("127.0.0.1", 0),
                shutdown_trigger=stop.wait,
            )
        )
        gateway = CountingGateway(binds[0], token, app)
        holder.append(gateway)
        try:
            yield gateway
        finally:
            stop.set()


def runtime(
    gateway: CountingGateway,
    strategy: Strategy,
    *,
    play: str,
    run_id: str = "run-1",
    headers: dict[str, str] | None = None,
) -> Any:
    """``open_runtime`` for ``gateway``'s org and token."""
    return open_runtime(
        base_url=gateway.base_url,
        token=gateway.token,
        org_id=ORG,
        play_name=play,
        run_id=run_id,
        strategy=strategy,
        headers=headers,
    )


def new_play() -> str:
    return f"play-{uuid.uuid4().hex[:12]}"


# Rows are shaped so every part of the read order matters: the last NULL_TAIL rows
# have no input index (NULLS LAST) and share one created_at (the key breaks the tie).
NULL_TAIL = 7


async def seed_sheet(store: SheetStore, sheet: SheetRef, n: int, *, run_id: str = "run-1") -> None:
    """``n`` pending rows in one ``INSERT ... SELECT generate_series`` (no admission).

    Row ``i`` (``i < n - NULL_TAIL``) has key ``k{i:07d}``, input index ``i`` and
    text ``"row i ..."`` of varying length; the counting triggers count them.
    """
    await store.ensure_sheet(sheet, CONTRACT)
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> None:
        # Seeding is the fixture, not the code under test: a million rows passed the
        # store's statement timeout at load 16.
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute(
            sql.SQL(
                "INSERT INTO {t} (_key, _status, _run_id, _input_index, seq.write_version, text)"
                " SELECT 'k' || lpad(i::text, 7, '0'), 'pending', %(run)s,"
                " CASE WHEN i < %(numbered)s THEN i END, 1,"
                " to_jsonb('row ' || i || ' ' || repeat('w ', i %% 13))"
                " FROM generate_series(0, %(n)s - 1) AS i"
            ).format(t=names.ident("sheet_table")),
            {"n": n, "numbered": max(0, n - NULL_TAIL), "run": run_id},
        )
        conn.execute(
            sql.SQL(
                "UPDATE {t} SET _created_at = '2020-01-01T00:00:00Z' WHERE _input_index IS NULL"
            ).format(t=names.ident("sheet_table"))
        )

    await store.pool.run(run)


async def drop_sheet(store: SheetStore, sheet: SheetRef) -> None:
    """Drop a sheet's tables, so big seeded sheets do not slow the rest of the suite
    (other tests digest every sheet table of the shared database)."""
    names = sheet_names(sheet)
    tables = (
        "sheet_table",
        "event_table",
        "summary_table",
        "column_summary_table",
        "counter_table",
        "lock_table",
    )

    def run(conn: psycopg.Connection[Any]) -> None:
        for table in tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(names.ident(table)))

    await store.pool.run(run)


Seed = Callable[..., Awaitable[None]]


@asynccontextmanager
async def seeding(store: SheetStore) -> AsyncIterator[Seed]:
    """``await seed(sheet, n, run_id=...)`` seeds like ``seed_sheet``; the sheets are
    dropped when the block ends (test modules wrap this in a ``seeded`` fixture)."""
    made: list[SheetRef] = []

    async def seed(sheet: SheetRef, n: int, **options: Any) -> None:
        made.append(sheet)
        await seed_sheet(store, sheet, n, **options)

    try:
        yield seed
    finally:
        for sheet in made:
            await drop_sheet(store, sheet)


async def select_rows(
    store: SheetStore, sheet: SheetRef, *, run_id: str | None = None
) -> list[dict[str, Any]]:
    """The sheet's rows in read order, as row mode ``output`` shapes them, by one SELECT."""
    names = sheet_names(sheet)

    def run(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
        where = sql.SQL("WHERE _run_id = %(run)s") if run_id is not None else sql.SQL("")
        cur = conn.execute(
            sql.SQL(
                "SELECT _key, text, words, _status, _error, _input_index FROM {t} {w}"
                " ORDER BY _input_index ASC NULLS LAST, _created_at ASC, _key ASC"
            ).format(t=names.ident("sheet_table"), w=where),
            {"run": run_id},
        )
        keys = ("_key", "text", "words", "_status", "_error", "_input_index")
        return [dict(zip(keys, record, strict=True)) for record in cur]

    return await store.pool.run(run)


async def session_connections(store: SheetStore) -> list[tuple[Any, ...]]:
    """Backends of scoped session roles right now: (role, state, query)."""

    def run(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        return conn.execute(
            "SELECT usename, state, query FROM pg_stat_activity WHERE usename LIKE 'sp\\_sess\\_%%'"
        ).fetchall()

    return await store.pool.run(run)


#: How long a closed connection's backend may take to leave pg_stat_activity.
BACKEND_EXIT_S = 5.0


async def no_session_connections(store: SheetStore) -> list[tuple[Any, ...]]:
    """Wait until no backend of a session role remains (a backend leaves
    pg_stat_activity when its process exits, just after the client closes the
    socket; there is nothing to wait on but the view), or return what remains."""
    with trio.move_on_after(BACKEND_EXIT_S):
        # Polling is the only way: Postgres offers nothing to wait on for a backend's exit.
        while left := await session_connections(store):  # noqa: ASYNC110
            await trio.sleep(BACKEND_EXIT_S / 100)
        return []
    return left


async def sheet_exists(store: SheetStore, sheet: SheetRef) -> bool:
    """Whether the sheet's table has been created."""
    qualified = sheet_names(sheet).ident("sheet_table")

    def run(conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute("SELECT to_regclass(%s)", (qualified.as_string(conn),)).fetchone()
        return row is not None and row[0] is not None

    return await store.pool.run(run)


def sheet_of(play: str, namespace: str) -> SheetRef:
    return SheetRef(ORG, play, namespace)


__all__ = [
    "CONTRACT",
    "NULL_TAIL",
    "ORG",
    "CountingGateway",
    "Runtime",
    "Seed",
    "counting_gateway",
    "drop_sheet",
    "new_play",
    "no_session_connections",
    "runtime",
    "seed_sheet",
    "seeding",
    "select_rows",
    "session_connections",
    "sheet_exists",
    "sheet_of",
]


def reap_session_roles(database_url: str) -> None:
    """Expire and drop every session role now, as the reaper would at expiry.

    For modules that mint many sessions: their roles would otherwise stay live
    for a whole session TTL and show in later tests' role counts.
    """
    from sheetplane.gateway.server._roles import ROLE_PREFIX, drop_role

    with psycopg.connect(database_url, autocommit=True) as conn:
        roles = [
            name
            for (name,) in conn.execute(
                "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", (ROLE_PREFIX,)
            )
        ]
        for role in roles:
            with conn.transaction():
                drop_role(conn, role)
