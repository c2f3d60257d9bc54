"""One lock order everywhere: write paths of one sheet, two at a time, across two
real ``sheetplane serve`` processes on one database, never deadlock and never
answer 500.

The paths are what a fleet of runners does to one sheet: admissions (one that
adds a contract column, so its sheet setup runs DDL, and one that does not),
terminal writes on both roads, append/upsert/replace through scoped sessions,
minting a session (sheet setup plus role grants) and recording receipts.
Every pair runs concurrently, one side through each gateway, on overlapping
rows given in opposite orders. The test then reads Postgres' own account:
``deadlock detected`` in the server log (when the suite started the server)
and ``pg_stat_database.deadlocks``, which must not move, and every counter must
still equal a recount of the rows.

Before the one lock order, the sheet setup of an admission that added a
column took ``ALTER TABLE``'s lock on the rows table and then waited for the
summary row another admission held while that admission waited for the rows
table: Postgres broke the cycle by aborting one, answered as HTTP 500.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import psycopg
import pytest
import trio

from _serve_helpers import serving
from _store_helpers import counters_match_rows
from sheetplane import AttemptSupersededError, GatewayError, WriteConflictError, crypto
from sheetplane._types import ContractColumn, SheetContract, SheetRef
from sheetplane.gateway.client import GatewayClient
from sheetplane.runtime import CompleteRow, FailRow, Runtime, open_runtime
from sheetplane.store import SheetStore, open_store

ROWS = 24
#: Rounds of every pair in CI; ``--campaign`` runs ``CAMPAIGN_ROUNDS``.
CI_ROUNDS = 1
CAMPAIGN_ROUNDS = 8
#: Rounds of three concurrent column-adding admissions (the reproduction).
CI_START_ROUNDS = 4
CAMPAIGN_START_ROUNDS = 30
#: How long the gateways' backends may take to exit once they are stopped.
SETTLE_S = 30
POLL_S = 0.05
BASE = (
    ContractColumn("company", "company", "input"),
    ContractColumn("score", "score", "output"),
)


def _contract(*extra: str) -> SheetContract:
    return SheetContract((*BASE, *(ContractColumn(name, name, "output") for name in extra)))


@attrs.define(eq=False)
class Fleet:
    """Two gateways on one database and one runtime per gateway and road."""

    org: str
    play: str
    token: str
    base_urls: tuple[str, str]
    runtimes: dict[tuple[int, str], Runtime]
    store: SheetStore
    key: crypto.DecryptionKey
    errors: list[BaseException] = attrs.Factory(list)
    columns: itertools.count[int] = attrs.Factory(itertools.count)

    def client(self, side: int) -> GatewayClient:
        return GatewayClient(self.base_urls[side], self.token, play_name=self.play, org_id=self.org)


@attrs.frozen
class Round:
    """One round's sheet: its admitted keys and their write version."""

    ns: str
    keys: tuple[str, ...]
    version: int


Path_ = Callable[[Fleet, Round, int, list[str]], Awaitable[None]]


async def _start_new_column(fleet: Fleet, rnd: Round, side: int, keys: list[str]) -> None:
    column = f"extra_{next(fleet.columns)}"
    writer = fleet.runtimes[(side, "gateway_only")].writer(rnd.ns, _contract(column))
    await writer.start([{"company": key} for key in keys])


async def _start(fleet: Fleet, rnd: Round, side: int, keys: list[str]) -> None:
    writer = fleet.runtimes[(side, "gateway_only")].writer(rnd.ns, _contract())
    await writer.start([{"company": key} for key in keys])


def _terminal(road: str, fail: bool) -> Path_:
    async def run(fleet: Fleet, rnd: Round, side: int, keys: list[str]) -> None:
        runtime = fleet.runtimes[(side, road)]
        writer = runtime.writer(rnd.ns, _contract(), write_version=rnd.version)
        if fail:
            await writer.fail([FailRow(key, "no score") for key in keys])
        else:
            await writer.complete([CompleteRow(key, {"score": len(key)}) for key in keys])

    return run


def _direct_write(kind: str) -> Path_:
    async def run(fleet: Fleet, rnd: Round, side: int, keys: list[str]) -> None:
        writer = fleet.runtimes[(side, "direct")].writer(rnd.ns, _contract())
        rows = [{"company": key, "_key": key} for key in keys]
        idempotency_key = f"{kind}-{uuid.uuid4().hex}"
        if kind == "append":
            await writer.append(rows, idempotency_key=idempotency_key)
        elif kind == "upsert":
            await writer.upsert(rows, idempotency_key=idempotency_key)
        else:
            await writer.replace(rows, idempotency_key=idempotency_key)

    return run


async def _mint(fleet: Fleet, rnd: Round, side: int, keys: list[str]) -> None:
    column = f"extra_{next(fleet.columns)}"
    async with fleet.client(side) as client:
        await client.create_db_session(
            table_namespace=rnd.ns,
            logical_table="sheet_rows",
            operations=["rows.read", "rows.upsert"],
            limits={"maxRows": len(keys)},
            contract=_contract(column),
            encryption=fleet.key.encryption_request(),
        )


async def _receipt(fleet: Fleet, rnd: Round, side: int, keys: list[str]) -> None:
    async with fleet.client(side) as client:
        for key in keys[:3]:
            await client.complete_work_receipt(f"{rnd.ns}-{key}", {"ok": side}, "run-locks")


PATHS: dict[str, Path_] = {
    "start+column": _start_new_column,
    "start": _start,
    "complete/gateway": _terminal("gateway_only", fail=False),
    "complete/direct": _terminal("direct", fail=False),
    "fail/gateway": _terminal("gateway_only", fail=True),
    "fail/direct": _terminal("direct", fail=True),
    "append": _direct_write("append"),
    "upsert": _direct_write("upsert"),
    "replace": _direct_write("replace"),
    "mint": _mint,
    "receipt": _receipt,
}

#: Outcomes of the domain, not failures: a newer admission (or a replace) fenced
#: the writer, or two writers gave one row different results at one version.
_EXPECTED = (AttemptSupersededError, WriteConflictError)


async def _guarded(fleet: Fleet, path: Path_, rnd: Round, side: int, keys: list[str]) -> None:
    try:
        await path(fleet, rnd, side, keys)
    except _EXPECTED:
        pass
    except GatewayError as exc:
        # The gateway road answers a write conflict 409 (the client raises it as is).
        if (exc.status, exc.gateway_code) != (409, WriteConflictError.code):
            fleet.errors.append(exc)
    except Exception as exc:
        fleet.errors.append(exc)


async def _new_round(fleet: Fleet) -> Round:
    ns = f"ns_{uuid.uuid4().hex[:10]}"
    async with fleet.client(0) as client:
        admission = await client.start_sheet_dataset(
            ns, _contract(), [{"company": f"c{i:03d}"} for i in range(ROWS)], "run-locks"
        )
    keys = tuple(row["_key"] for row in admission.pending_rows)
    return Round(ns, keys, admission.write_version)


@asynccontextmanager
async def running_fleet(database_url: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    """Two ``sheetplane serve`` processes on the test database, one org and play,
    a runtime per gateway and road, and a store; all closed when the block ends."""
    org = f"org-{uuid.uuid4().hex[:10]}"
    play = f"play-{uuid.uuid4().hex[:10]}"
    token = f"tok-{secrets.token_hex(10)}"
    url_file = tmp_path / "database-url"
    url_file.write_text(database_url)
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"{token}={org}\n")
    args = ("--database-url-file", str(url_file), "--tokens-file", str(tokens_file))
    async with contextlib.AsyncExitStack() as stack:
        served = [await stack.enter_async_context(serving(*args, tmp_path=tmp_path)) for _ in "ab"]
        runtimes: dict[tuple[int, str], Runtime] = {}
        for side, gateway in enumerate(served):
            for road in ("direct", "gateway_only"):
                runtimes[(side, road)] = await stack.enter_async_context(
                    open_runtime(
                        base_url=gateway.base_url,
                        token=token,
                        org_id=org,
                        play_name=play,
                        run_id="run-locks",
                        strategy=road,  # type: ignore[arg-type]
                    )
                )
        store = await stack.enter_async_context(open_store(database_url))
        urls = (served[0].base_url, served[1].base_url)
        key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
        yield Fleet(org, play, token, urls, runtimes, store, key)
    for gateway in served:
        assert "Traceback" not in gateway.stderr(), gateway.stderr()[-4000:]


def _backends(database_url: str) -> set[int]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchall()
    return {int(pid) for (pid,) in rows}


async def _settled_deadlocks(database_url: str, before: set[int]) -> int:
    """``pg_stat_database.deadlocks`` once every backend opened since ``before`` is gone.

    A backend reports its statistics when it exits, before it leaves
    ``pg_stat_activity`` (a live one may hold them back for seconds).
    """
    with trio.fail_after(SETTLE_S):
        # Postgres cannot notify us of a backend's exit: poll, within a deadline.
        while True:
            if not _backends(database_url) - before:
                return _deadlocks(database_url)
            await trio.sleep(POLL_S)


def _deadlocks(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _log_size(server_log: Path | None) -> int:
    return server_log.stat().st_size if server_log is not None else 0


def _new_log(server_log: Path | None, offset: int) -> str:
    if server_log is None:
        return ""
    with server_log.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


async def _pairs(fleet: Fleet, rounds: int) -> int:
    ran = 0
    for _ in range(rounds):
        for a, b in itertools.combinations_with_replacement(sorted(PATHS), 2):
            rnd = await _new_round(fleet)
            # Overlapping rows, in opposite orders: a lock order that depends on
            # the order rows arrive in would deadlock here.
            left = list(rnd.keys[: 2 * ROWS // 3])
            right = list(reversed(rnd.keys[ROWS // 3 :]))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_guarded, fleet, PATHS[a], rnd, 0, left)
                nursery.start_soon(_guarded, fleet, PATHS[b], rnd, 1, right)
            stored, recount = await counters_match_rows(
                fleet.store, SheetRef(fleet.org, fleet.play, rnd.ns)
            )
            assert stored == recount, (a, b)
            ran += 1
    return ran


@pytest.mark.heavy(15)
async def test_every_pair_of_write_paths_runs_without_deadlock_or_500(
    database_url: str, server_log: Path | None, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rounds = CAMPAIGN_ROUNDS if request.config.getoption("--campaign") else CI_ROUNDS
    before, offset = _backends(database_url), _log_size(server_log)
    deadlocks = _deadlocks(database_url)
    async with running_fleet(database_url, tmp_path) as fleet:
        ran = await _pairs(fleet, rounds)
    assert ran == rounds * len(PATHS) * (len(PATHS) + 1) // 2
    assert [repr(error) for error in fleet.errors] == []
    assert "deadlock detected" not in _new_log(server_log, offset)
    assert await _settled_deadlocks(database_url, before) == deadlocks


async def test_concurrent_admissions_adding_columns_do_not_deadlock(
    database_url: str, server_log: Path | None, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The reproduction: three ``start()`` on one existing sheet, each contract adding
    another new output column, through both gateways at once."""
    campaign = request.config.getoption("--campaign")
    rounds = CAMPAIGN_START_ROUNDS if campaign else CI_START_ROUNDS
    before, offset = _backends(database_url), _log_size(server_log)
    deadlocks = _deadlocks(database_url)
    async with running_fleet(database_url, tmp_path) as fleet:
        for _ in range(rounds):
            rnd = await _new_round(fleet)
            async with trio.open_nursery() as nursery:
                for side in (0, 1, 0):
                    nursery.start_soon(
                        _guarded, fleet, _start_new_column, rnd, side, list(rnd.keys)
                    )
    assert fleet.errors == []
    assert "deadlock detected" not in _new_log(server_log, offset)
    assert await _settled_deadlocks(database_url, before) == deadlocks
