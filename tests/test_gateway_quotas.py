"""What one tenant may take of the gateway's storage, against the real server and real
Postgres: wire numbers within their columns' bounds, sheets per org, staging rows that
belong to a live admission, staged bytes and open admissions."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
import trio
from psycopg import sql

from _session_helpers import aad_of, run_sql
from sheetplane import SheetCapError, StagingQuotaError, crypto
from sheetplane._types import INTEGER_MAX, ContractColumn, SheetContract, SheetRef
from sheetplane.budgets import (
    ADMISSION_SWEEP_LOCK_WAIT_MS,
    MAX_ROW_KEY_BYTES,
    STAGING_CHUNK_RECORD_BYTES,
)
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.gateway.server._roles import LEDGER
from sheetplane.protocol import prepare_chunk
from sheetplane.store import SheetStore, StoreQuotas, _quotas, _staging, open_store
from sheetplane.store._names import org_schema, sheet_names
from sheetplane.store._staging import sweep_admissions
from sheetplane.testing.plugin import SecretURL

TOKEN_A = "tok-quota-a-5d1e7b2c"
TOKEN_B = "tok-quota-b-9c4a3f8e"
ORG_A = "org-quota-a"
ORG_B = "org-quota-b"
CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN_A: ORG_A, TOKEN_B: ORG_B}) as gw:
        yield gw


@pytest.fixture
async def own_database(database_url: str) -> AsyncIterator[str]:
    """A database of the test's own on the suite's server (its URL: a secret), dropped
    after with the session roles minted in it (its gateway's ledger names them)."""
    database = f"sp_quota_{uuid.uuid4().hex[:10]}"
    await run_sql(database_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    url = SecretURL(urlsplit(database_url)._replace(path=f"/{database}").geturl())
    try:
        yield url
    finally:
        try:
            minted = await run_sql(url, sql.SQL("SELECT role FROM {}").format(LEDGER))
        except psycopg.errors.UndefinedTable:
            minted = []  # no gateway started on it
        await run_sql(
            database_url,
            sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)),
        )
        for (role,) in minted:
            await run_sql(
                database_url, sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role))
            )


async def post(
    gw: RunningGateway,
    action: str,
    *,
    token: str = TOKEN_A,
    play: str = "quota-play",
    **fields: Any,
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        return await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": play, **fields},
            headers={"authorization": f"Bearer {token}"},
        )


async def begin_answer(
    gw: RunningGateway, namespace: str, admission_id: str | None = None, **fields: Any
) -> httpx.Response:
    """The answer to a begin of ``admission_id`` (a new one when None) for run-1."""
    return await post(
        gw,
        "begin_sheet_admission",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        admissionId=admission_id or uuid.uuid4().hex,
        runId="run-1",
        **fields,
    )


async def begin(gw: RunningGateway, namespace: str, **fields: Any) -> str:
    admission_id = uuid.uuid4().hex
    response = await begin_answer(gw, namespace, admission_id, **fields)
    assert response.status_code == 200, response.text
    return admission_id


async def stage(
    gw: RunningGateway, namespace: str, admission_id: str, seq: int, rows: list[Any], **fields: Any
) -> httpx.Response:
    return await post(
        gw,
        "stage_sheet_admission_chunk",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        admissionId=admission_id,
        seq=seq,
        firstPosition=fields.pop("firstPosition", 0),
        rows=rows,
        **fields,
    )


@pytest.mark.parametrize("seq", [INTEGER_MAX + 1, 2**63 - 1])
async def test_a_chunk_seq_past_the_integer_column_is_400_not_500(
    gateway: RunningGateway, seq: int
) -> None:
    # The staging tables keep seq as an integer: 2**31 reached Postgres and was a 500.
    admission_id = await begin(gateway, "leads")
    refused = await stage(gateway, "leads", admission_id, seq, [{"email": "a@example.com"}])
    assert refused.status_code == 400, refused.text
    assert "seq" in refused.text
    # Refused on the wire, before the store: the admission is still open.
    first = await stage(gateway, "leads", admission_id, 0, [{"email": "a@example.com"}])
    assert first.status_code == 200, first.text


async def test_a_receipt_run_attempt_past_the_integer_column_is_400(
    gateway: RunningGateway,
) -> None:
    refused = await post(
        gateway,
        "complete_work_receipt",
        key="k-1",
        result={"ok": True},
        runId="run-1",
        runAttempt=INTEGER_MAX + 1,
    )
    assert refused.status_code == 400, refused.text
    assert "run_attempt" in refused.text or "runAttempt" in refused.text


def org_tables(database_url: str, org: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r'",
            (org_schema(org),),
        ).fetchone()
    assert row is not None
    return int(row[0])


#: The org of TOKEN_A behind ``capped``: a new one per test, so each starts empty.
CAPPED_ORG: dict[str, str] = {}


@contextlib.asynccontextmanager
async def quota_gateway(
    database_url: str, quotas: StoreQuotas, *, more_tokens: Sequence[str] = ()
) -> AsyncIterator[RunningGateway]:
    """A gateway with ``quotas`` whose two tokens belong to two new orgs (so each test
    starts with empty ones); TOKEN_A's org is ``CAPPED_ORG["a"]``, and also that of
    each of ``more_tokens``."""
    CAPPED_ORG["a"] = f"org-cap-{uuid.uuid4().hex[:8]}"
    tokens = {TOKEN_A: CAPPED_ORG["a"], TOKEN_B: f"org-cap-{uuid.uuid4().hex[:8]}"}
    tokens.update((token, CAPPED_ORG["a"]) for token in more_tokens)
    async with running_gateway(database_url, tokens=tokens, quotas=quotas) as gw:
        yield gw


@pytest.fixture
async def capped(database_url: str) -> AsyncIterator[RunningGateway]:
    quotas = StoreQuotas(max_sheets_per_org=3, max_receipt_tables_per_org=2)
    async with quota_gateway(database_url, quotas) as gw:
        yield gw


async def test_an_org_past_its_sheet_cap_is_refused_429_on_every_road_that_creates_one(
    capped: RunningGateway, database_url: str
) -> None:
    # 150 ensure_sheet calls of one token made 1,500 tables with nothing refusing.
    play = f"cap-{uuid.uuid4().hex[:8]}"
    for i in range(3):
        made = await post(capped, "ensure_sheet", play=play, tableNamespace=f"ns{i}")
        assert made.status_code == 200, made.text
    tables = await trio.to_thread.run_sync(org_tables, database_url, CAPPED_ORG["a"])
    refusals = [
        await post(capped, "ensure_sheet", play=play, tableNamespace="ns-new"),
        await post(
            capped,
            "start_sheet_dataset",
            play=play,
            tableNamespace="ns-admit",
            sheetContract=CONTRACT,
            rows=[{"_key": "k", "email": "a@example.com"}],
            runId="run-1",
        ),
        await begin_answer(capped, "ns-staged", play=play),
    ]
    for refused in refusals:
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "runtime_org_sheet_cap"
    # Nothing was created by the refused calls; the org's existing sheets still serve,
    # and another org has its own room.
    assert await trio.to_thread.run_sync(org_tables, database_url, CAPPED_ORG["a"]) == tables
    again = await post(capped, "ensure_sheet", play=play, tableNamespace="ns0")
    assert again.status_code == 200, again.text
    other = await post(capped, "ensure_sheet", token=TOKEN_B, play=play, tableNamespace="ns-new")
    assert other.status_code == 200, other.text
    # The client raises the cap at once instead of retrying a 429 that waiting cannot free.
    async with GatewayClient(
        capped.base_url, TOKEN_A, play_name=play, org_id=CAPPED_ORG["a"]
    ) as gc:
        with trio.fail_after(5), pytest.raises(SheetCapError):
            await gc.ensure_sheet(
                "ns-client", SheetContract((ContractColumn("email", "email", "input"),))
            )


async def test_a_first_claim_on_a_new_play_past_the_receipt_table_cap_is_429(
    capped: RunningGateway,
) -> None:
    plays = [f"rcpt-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for play in plays[:2]:
        claimed = await post(capped, "claim_work_receipt", play=play, key="k", holder="h")
        assert claimed.status_code == 200, claimed.text
    refused = await post(capped, "claim_work_receipt", play=plays[2], key="k", holder="h")
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "runtime_org_sheet_cap"
    again = await post(capped, "claim_work_receipt", play=plays[0], key="k2", holder="h")
    assert again.status_code == 200, again.text


async def test_concurrent_first_sheets_of_one_org_never_pass_the_cap(database_url: str) -> None:
    org = f"org-race-{uuid.uuid4().hex[:8]}"
    contract = SheetContract((ContractColumn("email", "email", "input"),))
    refused = 0
    async with open_store(database_url, quotas=StoreQuotas(max_sheets_per_org=4)) as store:

        async def make(i: int) -> None:
            nonlocal refused
            try:
                await store.ensure_sheet(SheetRef(org, "race", f"ns{i}"), contract)
            except SheetCapError:
                refused += 1

        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(make, i)
    assert refused == 6


async def mint_stage_role(gw: RunningGateway, play: str, namespace: str) -> str:
    """The Postgres URL of a new ``rows.stage`` session of ORG_A on the sheet."""
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    response = await post(
        gw,
        "create_db_session",
        play=play,
        target={"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        operations=["rows.stage"],
        sheetContract=CONTRACT,
        postgresUrlEncryption=key.encryption_request(),
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    return crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))


async def stage_role_sheet(
    gw: RunningGateway, org: str, play: str | None = None
) -> tuple[str, Any, str, str]:
    """The sheet ``leads`` of ``play`` (a new one when None) of ``org`` (TOKEN_A's), its
    names, the Postgres URL of a new ``rows.stage`` session on it and a new admission
    of it: ``(play, names, url, admission id)``."""
    play = play or f"stage-{uuid.uuid4().hex[:8]}"
    made = await post(gw, "ensure_sheet", play=play, tableNamespace="leads")
    assert made.status_code == 200, made.text
    url = await mint_stage_role(gw, play, "leads")
    return play, sheet_names(SheetRef(org, play, "leads")), url, await begin(gw, "leads", play=play)


def hostile_stage(
    url: str,
    names: Any,
    admission_id: str,
    seq: int,
    key: str,
    *,
    record: bool = True,
    copy_row: bool = True,
    size: int = 2048,
    count: int = 1,
    repeatable_read: bool = False,
) -> str | None:
    """As the stage role, in one transaction: record chunks ``seq .. seq + count - 1``
    (unless not ``record``) and COPY their staging rows in one statement (each one row
    of ``size`` bytes under ``key``, naming no chunk before it; unless not
    ``copy_row``), under ``REPEATABLE READ`` when ``repeatable_read``; the name of
    the error Postgres refused it with, or None."""
    seqs = range(seq, seq + count)
    try:
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            if repeatable_read:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if record:
                for each in seqs:
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} (admission_id, seq, first_position, row_count) "
                            "VALUES (%s, %s, 0, 1) ON CONFLICT DO NOTHING"
                        ).format(names.ident("stage_chunks_table")),
                        (admission_id, each),
                    )
            if not copy_row:
                return None
            with conn.cursor().copy(
                sql.SQL(
                    "COPY {} (_admission_id, _seq, _first_position, _row_count, _keys, _rows) "
                    "FROM STDIN"
                ).format(names.ident("staging_table"))
            ) as copy:
                for each in seqs:
                    copy.write_row(
                        (
                            admission_id,
                            each,
                            0,
                            1,
                            f'["{key}"]',
                            '[{"email": "' + "x" * size + '"}]',
                        )
                    )
    except psycopg.Error as exc:
        return type(exc).__name__
    return None


def staged_rows(
    database_url: str, names: Any, table: str = "staging_table"
) -> list[tuple[str, int]]:
    """The ``(admission id, seq)`` of the sheet's staging rows (or chunk records)."""
    columns = "admission_id, seq" if table == "stage_chunks_table" else "_admission_id, _seq"
    with psycopg.connect(database_url) as conn:
        return [
            (str(a), int(s))
            for a, s in conn.execute(
                sql.SQL("SELECT {} FROM {} ORDER BY 1, 2").format(
                    sql.SQL(columns), names.ident(table)
                )
            ).fetchall()
        ]


chunk_rows = functools.partial(staged_rows, table="stage_chunks_table")


async def test_a_stage_role_cannot_leave_orphan_staging_rows_or_keys_past_the_cap(
    gateway: RunningGateway, database_url: str
) -> None:
    # A rows.stage role could COPY rows under an admission never begun, with 100 KB keys,
    # and abort, commit and the reaper's sweep (which delete by registered id) kept them.
    play, names, url, live = await stage_role_sheet(gateway, ORG_A)
    never_begun = uuid.uuid4().hex
    orphan = functools.partial(hostile_stage, record=False)
    refused = await trio.to_thread.run_sync(orphan, url, names, never_begun, 0, "k")
    assert refused == "ForeignKeyViolation"
    # Nor under a live admission without recording the chunk.
    refused = await trio.to_thread.run_sync(orphan, url, names, live, 0, "k")
    assert refused == "ForeignKeyViolation"
    long_key = "k" * (MAX_ROW_KEY_BYTES + 1)
    refused = await trio.to_thread.run_sync(hostile_stage, url, names, live, 0, long_key)
    assert refused == "CheckViolation"
    # Rows the role stages for a live admission go with it when it closes; after it
    # closed, the staging triggers refuse a row and a chunk record for it, and the
    # sweep deletes whatever no open admission owns.
    assert await trio.to_thread.run_sync(hostile_stage, url, names, live, 0, "k") is None
    aborted = await post(
        gateway, "abort_sheet_admission", play=play, tableNamespace="leads", admissionId=live
    )
    assert aborted.status_code == 200, aborted.text
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == []
    refused = await trio.to_thread.run_sync(hostile_stage, url, names, live, 0, "k")
    assert refused == "ObjectNotInPrerequisiteState"
    alone = functools.partial(hostile_stage, copy_row=False)
    refused = await trio.to_thread.run_sync(alone, url, names, live, 0, "k")
    assert refused == "ObjectNotInPrerequisiteState"
    assert await trio.to_thread.run_sync(chunk_rows, database_url, names) == []
    async with open_store(database_url) as store:
        await sweep_admissions(store.pool)
    assert await trio.to_thread.run_sync(chunk_rows, database_url, names) == []
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == []


def open_hostile_stage(url: str, names: Any, admission_id: str) -> psycopg.Connection[Any]:
    """As the stage role: record chunk 0 of ``admission_id`` and COPY its staging row
    in a transaction left open (and idle) until the returned connection commits."""
    conn = psycopg.connect(url)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (admission_id, seq, first_position, row_count) VALUES (%s, 0, 0, 1)"
        ).format(names.ident("stage_chunks_table")),
        (admission_id,),
    )
    with conn.cursor().copy(
        sql.SQL(
            "COPY {} (_admission_id, _seq, _first_position, _row_count, _keys, _rows) FROM STDIN"
        ).format(names.ident("staging_table"))
    ) as copy:
        copy.write_row((admission_id, 0, 0, 1, '["k"]', '[{"email": "a@example.com"}]'))
    return conn


@contextlib.asynccontextmanager
async def org_a_stage_role_holding(
    gw: RunningGateway, play: str | None = None
) -> AsyncIterator[tuple[str, Any, str, str, str]]:
    """ORG_A's stage role, on the sheet ``leads`` of ``play`` (a new one when None),
    sits in an open transaction after staging chunk 0 of a new admission; ORG_B has an
    admission of its own sheet of the same names. Yields ``(play, names, url, held,
    other)`` (the two admission ids); the role's transaction commits when the block
    ends without error (which fails if the session was ended meanwhile)."""
    play, names, url, held = await stage_role_sheet(gw, ORG_A, play)
    other = await begin(gw, "leads", token=TOKEN_B, play=play)
    hostile = await trio.to_thread.run_sync(open_hostile_stage, url, names, held)
    try:
        yield play, names, url, held, other
        await trio.to_thread.run_sync(hostile.commit)
    finally:
        await trio.to_thread.run_sync(hostile.close)


#: How long another org's chunk may take while one org's stage role sits in an open
#: transaction (a chunk alone takes tens of milliseconds; the idle bound is 5 s).
OTHER_ORG_CHUNK_BOUND_S = 2.0


async def test_a_stage_role_idle_in_its_transaction_does_not_stall_another_orgs_staging(
    gateway: RunningGateway, database_url: str
) -> None:
    # Every staging row's trigger updated the one total counter row and held its lock
    # until the chunk's transaction ended: org-a's stage role COPYd one row and sat
    # idle in its transaction, and every other org's chunk waited for the session's
    # idle bound to end it (and again each time it repeated).
    async with org_a_stage_role_holding(gateway) as (play, names, url, held, other):
        started = trio.current_time()
        staged = await stage(gateway, "leads", other, 0, rows_of(2), token=TOKEN_B, play=play)
        took = trio.current_time() - started
        assert staged.status_code == 200, staged.text
        assert took < OTHER_ORG_CHUNK_BOUND_S, f"org-b's chunk took {took:.2f} s"
    # The stage role's transaction was open all along (it committed), and kept its row.
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == [(held, 0)]
    # The total is read afresh by each row's trigger: a transaction whose snapshot
    # would hide what other orgs committed since it began is refused.
    snapshot = functools.partial(hostile_stage, repeatable_read=True)
    assert await trio.to_thread.run_sync(snapshot, url, names, held, 1, "k") == (
        "FeatureNotSupported"
    )
    for token, admission_id in ((TOKEN_A, held), (TOKEN_B, other)):
        aborted = await post(
            gateway,
            "abort_sheet_admission",
            token=token,
            play=play,
            tableNamespace="leads",
            admissionId=admission_id,
        )
        assert aborted.status_code == 200, aborted.text


#: How long any one step of the reaper's sweep may take while one org's stage role holds
#: its rows: that org's sheets wait ADMISSION_SWEEP_LOCK_WAIT_MS once, then are left to
#: the next pass (before the fix each waited for the session's idle bound,
#: DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS, 5 s). Each step of the pass (a sheet's
#: expiry, its counter compaction, an org's reconciliation) is timed on its own, so the
#: bound measures the wait, not the pass's length (every sheet in the database, and
#: the machine's load).
SWEEP_STEP_BOUND_S = 4 * ADMISSION_SWEEP_LOCK_WAIT_MS / 1000
#: The steps of the sweep (``store/_staging.py``), each run on a pool connection.
SWEEP_STEPS = ("_expire_unless_busy", "_compact_unless_busy", "reconcile_org", "reconcile_tokens")


#: Set in the task whose sweep is timed (pool calls run in threads with a copy of the
#: calling task's context): the gateway's own reaper may sweep meanwhile, untimed.
_TIMED_SWEEP: contextvars.ContextVar[list[tuple[str, str, float, Any]] | None] = (
    contextvars.ContextVar("timed_sweep", default=None)
)


async def timed_sweep(store: SheetStore, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Run ``store``'s sweep; ``(step, schema, seconds, result)`` for each step it ran
    (the schema is "" for the token-wide step)."""

    def timed(name: str, step: Any) -> Any:
        def run(conn: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            result = step(conn, *args, **kwargs)
            steps = _TIMED_SWEEP.get()
            if steps is not None:
                names = kwargs.get("names")
                schema = names.schema if names is not None else kwargs.get("schema", "")
                steps.append((name, schema, time.monotonic() - started, result))
            return result

        return run

    for name in SWEEP_STEPS:
        monkeypatch.setattr(_staging, name, timed(name, getattr(_staging, name)))
    steps: list[tuple[str, str, float, Any]] = []
    token = _TIMED_SWEEP.set(steps)
    try:
        await store.sweep_admissions()
    finally:
        _TIMED_SWEEP.reset(token)
    return steps


async def test_the_sweep_expires_other_orgs_admissions_while_a_stage_role_holds_its_orgs_rows(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweep expired sheet after sheet in one pass: an expiry of org-a's waited for
    # the org's counter row (its release updates it) behind org-a's stage role sitting
    # in an open transaction, and every other org's expiry waited after it.
    # On a database of its own: a pass visits every sheet in the database, and the
    # stage role's transaction must outlive it (its idle bound is 5 s); in the suite's
    # database, hundreds of sheets by its end, a pass under load took longer.
    async with running_gateway(own_database, tokens={TOKEN_A: ORG_A, TOKEN_B: ORG_B}) as gw:
        await sweep_past_a_held_stage_role(gw, own_database, monkeypatch)


async def sweep_past_a_held_stage_role(
    gateway: RunningGateway, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    play = f"sweep-{uuid.uuid4().hex[:8]}"
    # Org-a's, expired by the sweep (begun first: a begin of org-a waits for the role).
    due = await begin(gateway, "other", play=play)
    async with org_a_stage_role_holding(gateway, play) as (_, names, _, held, other):
        async with open_store(database_url, quotas=StoreQuotas(admission_lifetime_ms=1)) as store:
            steps = await timed_sweep(store, monkeypatch)
        # Org-a's held sheet was found busy once, and the org's later sheets were left.
        org_a = [s for s in steps if s[0] == "_expire_unless_busy" and s[1] == names.schema]
        assert [result for *_, result in org_a].count(None) == 1, org_a
        assert org_a[-1][3] is None, org_a
        slowest = max(steps, key=lambda s: s[2])
        assert slowest[2] < SWEEP_STEP_BOUND_S, f"{slowest[:3]} of {len(steps)} steps"
        expired = await stage(gateway, "leads", other, 0, rows_of(1, 10), token=TOKEN_B, play=play)
        assert expired.status_code == 409, expired.text
    # The next pass, with nothing held, expires what the busy org's sheets kept.
    async with open_store(database_url, quotas=StoreQuotas(admission_lifetime_ms=1)) as store:
        await store.sweep_admissions()
    for namespace, admission_id in (("leads", held), ("other", due)):
        late = await stage(gateway, namespace, admission_id, 1, rows_of(1, 10), play=play)
        assert late.status_code == 409, late.text


def counter(database_url: str, scope: str, key: str) -> tuple[int, int]:
    """A staging counter's ``(staged_bytes, open_admissions)`` (0, 0 when it has none)."""
    with psycopg.connect(database_url) as conn:
        if conn.execute("SELECT to_regclass('sheetplane_staging.quotas')").fetchone() == (None,):
            return (0, 0)  # no admission was begun yet
        row = conn.execute(
            sql.SQL(
                "SELECT staged_bytes, open_admissions FROM {} WHERE scope = %s AND key = %s"
            ).format(sql.Identifier(_quotas.QUOTA_SCHEMA, "quotas")),
            (scope, key),
        ).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def total_staged(database_url: str) -> int:
    """Staged bytes every org's open admissions hold, as the quota counts them: every
    org's counter summed (the total's row keeps only its bound)."""
    with psycopg.connect(database_url) as conn:
        if conn.execute("SELECT to_regclass('sheetplane_staging.quotas')").fetchone() == (None,):
            return 0  # no admission was begun yet
        row = conn.execute(
            sql.SQL("SELECT coalesce(sum(staged_bytes), 0) FROM {} WHERE scope = 'org'").format(
                sql.Identifier(_quotas.QUOTA_SCHEMA, "quotas")
            )
        ).fetchone()
    return 0 if row is None else int(row[0])


def rows_of(n: int, size: int = 5_000) -> list[dict[str, str]]:
    return [{"email": f"{i}-" + "x" * size} for i in range(n)]


@pytest.fixture
async def staging_capped(database_url: str) -> AsyncIterator[RunningGateway]:
    # A chunk of 2 rows stages about 10 KB: an admission holds two such chunks, an
    # org about three less a little, and every org together just under four more
    # than what is staged now.
    baseline = await trio.to_thread.run_sync(total_staged, database_url)
    quotas = StoreQuotas(
        max_admission_staged_bytes=25_000,
        max_org_staged_bytes=28_000,
        max_total_staged_bytes=baseline + 38_000,
        max_open_admissions_per_org=3,
    )
    async with quota_gateway(database_url, quotas) as gw:
        yield gw


async def test_staged_bytes_are_bounded_per_admission_per_org_and_in_total(
    staging_capped: RunningGateway, database_url: str
) -> None:
    # One token staged 195 MB in 7.6 s with nothing refusing.
    gw = staging_capped
    first = await begin(gw, "leads")
    assert (await stage(gw, "leads", first, 0, rows_of(2))).status_code == 200
    assert (await stage(gw, "leads", first, 1, rows_of(2), firstPosition=2)).status_code == 200
    # A third chunk would take this admission past its bound: 413, nothing written.
    before = await trio.to_thread.run_sync(total_staged, database_url)
    refused = await stage(gw, "leads", first, 2, rows_of(2), firstPosition=4)
    assert refused.status_code == 413, refused.text
    assert refused.json()["code"] == "runtime_admission_staging_too_large"
    assert await trio.to_thread.run_sync(total_staged, database_url) == before
    # A second admission of the org: its first chunk would pass the org's bound.
    second = await begin(gw, "other")
    refused = await stage(gw, "other", second, 0, rows_of(2))
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "runtime_staging_quota"
    assert refused.json()["retry_after_ms"] > 0
    # Another org has room of its own, until every org's staged bytes reach the total.
    other_org = await begin(gw, "leads", token=TOKEN_B)
    ok = await stage(gw, "leads", other_org, 0, rows_of(2), token=TOKEN_B)
    assert ok.status_code == 200, ok.text
    refused = await stage(gw, "leads", other_org, 1, rows_of(2), token=TOKEN_B, firstPosition=2)
    assert refused.status_code == 429, refused.text
    assert "staging space is full" in refused.json()["error"]
    # Aborting the first admission frees the org's room.
    aborted = await post(gw, "abort_sheet_admission", tableNamespace="leads", admissionId=first)
    assert aborted.status_code == 200, aborted.text
    assert (await stage(gw, "other", second, 0, rows_of(2))).status_code == 200


async def test_open_admissions_are_bounded_per_org_and_an_admission_has_a_lifetime(
    staging_capped: RunningGateway, database_url: str
) -> None:
    gw = staging_capped
    opened = [await begin(gw, "leads") for _ in range(3)]
    refused = await begin_answer(gw, "leads")
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "runtime_staging_quota"
    # A begin of an admission already open is a retry, not a new one.
    again = await begin_answer(gw, "leads", opened[0])
    assert again.status_code == 200, again.text
    # However often it is fed, an admission older than its lifetime is expired by the
    # sweep (before, each chunk extended its idle expiry without end).
    assert (await stage(gw, "leads", opened[0], 0, rows_of(1, 10))).status_code == 200
    async with open_store(database_url, quotas=StoreQuotas(admission_lifetime_ms=1)) as store:
        assert await store.sweep_admissions() >= 3
    expired = await stage(gw, "leads", opened[0], 1, rows_of(1, 10), firstPosition=1)
    assert expired.status_code == 409, expired.text
    assert "expired" in expired.json()["error"]
    assert (await begin(gw, "leads")) is not None


#: Two new tokens of ``CAPPED_ORG["a"]`` behind ``token_capped`` (a token's counter
#: outlives its gateway: each test takes new ones).
TWO_TOKENS: list[str] = []


@pytest.fixture
async def token_capped(database_url: str) -> AsyncIterator[RunningGateway]:
    # Two tokens of one org, each holding at most two of the org's three admissions.
    TWO_TOKENS[:] = [f"tok-quota-{uuid.uuid4().hex}" for _ in range(2)]
    quotas = StoreQuotas(max_open_admissions_per_org=3, max_open_admissions_per_token=2)
    async with quota_gateway(database_url, quotas, more_tokens=TWO_TOKENS) as gw:
        yield gw


def admission_tokens(database_url: str, org: str) -> list[str | None]:
    """The token id each admission of ``org`` records (checking that no registry row
    holds a token's text)."""
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname LIKE %s",
            (org_schema(org), r"%\_admissions"),
        ).fetchall()
        found: list[str | None] = []
        for (table,) in tables:
            for token_id, text in conn.execute(
                sql.SQL("SELECT token_id, a::text FROM {} AS a").format(
                    sql.Identifier(org_schema(org), table)
                )
            ).fetchall():
                assert not any(token in text for token in TWO_TOKENS)
                found.append(token_id)
    return found


async def test_open_admissions_are_bounded_per_token_by_its_digest(
    token_capped: RunningGateway, database_url: str
) -> None:
    # The registry recorded no token: one token could hold all of its org's admissions.
    gw = token_capped
    first, second = TWO_TOKENS
    opened = [await begin(gw, "leads", token=first) for _ in range(2)]
    tables = await trio.to_thread.run_sync(org_tables, database_url, CAPPED_ORG["a"])
    refused = await begin_answer(gw, "other", token=first)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "runtime_staging_quota"
    assert "this token holds 2 open admissions" in refused.json()["error"]
    # Refused before anything was written: not even the new sheet's tables.
    assert await trio.to_thread.run_sync(org_tables, database_url, CAPPED_ORG["a"]) == tables
    # A retried begin is not a new admission; the org's other token has room of its own
    # until the org's bound.
    again = await begin_answer(gw, "leads", opened[0], token=first)
    assert again.status_code == 200, again.text
    assert await begin(gw, "leads", token=second)
    by_org = await begin_answer(gw, "leads", token=second)
    assert by_org.status_code == 429, by_org.text
    assert "the org holds 3 open admissions" in by_org.json()["error"]
    # Refused begins kept nothing; each admission names its token by a digest only.
    tokens = await trio.to_thread.run_sync(admission_tokens, database_url, CAPPED_ORG["a"])
    assert len(tokens) == 3 and None not in tokens
    assert len(set(tokens)) == 2
    # An abort gives the token its room back.
    aborted = await post(
        gw, "abort_sheet_admission", token=first, tableNamespace="leads", admissionId=opened[1]
    )
    assert aborted.status_code == 200, aborted.text
    assert await begin(gw, "other", token=first)


def hold_admissions(database_url: str, names: list[Any], ids: list[str]) -> psycopg.Connection[Any]:
    """A connection holding the registry rows of ``ids`` (``FOR UPDATE``) until closed:
    a chunk of one of them waits at its chunk record's foreign key."""
    conn = psycopg.connect(database_url)
    for sheet_names_, admission_id in zip(names, ids, strict=True):
        conn.execute(
            sql.SQL("SELECT FROM {} WHERE admission_id = %s FOR UPDATE").format(
                sheet_names_.ident("admissions_table")
            ),
            (admission_id,),
        )
    return conn


def lock_waiters(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()
    return 0 if row is None else int(row[0])


async def wait_for_lock_waiters(database_url: str, count: int) -> None:
    """Poll Postgres until at least ``count`` backends wait on a lock."""
    with trio.fail_after(30):
        while True:
            if await trio.to_thread.run_sync(lock_waiters, database_url) >= count:
                return
            await trio.sleep(0.02)


RACERS = 6


def org_counters(database_url: str, orgs: Sequence[str]) -> tuple[int, int]:
    """``(staged_bytes, open_admissions)`` of the counters of ``orgs`` together."""
    found = [counter(database_url, "org", org_schema(org)) for org in orgs]
    return (sum(held for held, _ in found), sum(open_ for _, open_ in found))


@pytest.mark.parametrize("bound", ["org", "total"])
async def test_concurrent_chunks_take_exactly_the_room_left_and_give_it_all_back(
    database_url: str, bound: str
) -> None:
    # Each chunk was counted in its own transaction before it was written: chunks
    # racing each other each saw the room before any of them and together passed it.
    # An org's bound is exact; the total is read without locking (no row lock couples
    # two orgs), so it is passed by at most one chunk of each other org in flight.
    orgs = [f"org-race-{uuid.uuid4().hex[:8]}" for _ in range(1 if bound == "org" else 2)]
    contract = SheetContract((ContractColumn("email", "email", "input"),))
    chunk = prepare_chunk(rows_of(2), 0)
    size = len(chunk.keys) + len(chunk.rows)
    baseline = await trio.to_thread.run_sync(total_staged, database_url)
    room = 3 * size + size // 2  # three chunks, not four
    quotas = StoreQuotas(
        max_org_staged_bytes=room if bound == "org" else 100 * size,
        max_total_staged_bytes=baseline + room if bound == "total" else baseline + 100 * size,
        max_open_admissions_per_org=RACERS,
    )
    sheets = [SheetRef(orgs[i % len(orgs)], "race", f"ns{i % 2}") for i in range(RACERS)]
    names = [sheet_names(sheet) for sheet in sheets]
    outcomes: list[str] = []
    async with open_store(database_url, quotas=quotas) as store:
        ids = []
        for sheet in sheets:
            ids.append(uuid.uuid4().hex)
            await store.begin_admission(sheet, contract, ids[-1], "run-1")
        blocker = await trio.to_thread.run_sync(hold_admissions, database_url, names, ids)

        async def race(sheet: SheetRef, admission_id: str) -> None:
            try:
                await store.stage_chunk(sheet, admission_id, 0, 0, chunk)
                outcomes.append(admission_id)
            except StagingQuotaError:
                outcomes.append("refused")

        async with trio.open_nursery() as nursery:
            for sheet, admission_id in zip(sheets, ids, strict=True):
                nursery.start_soon(race, sheet, admission_id)
            # Every chunk has passed whatever it checks before writing, and waits.
            await wait_for_lock_waiters(database_url, RACERS)
            await trio.to_thread.run_sync(blocker.close)
        staged = [admission_id for admission_id in outcomes if admission_id != "refused"]
        # Exactly the room per org; in total the room and at most one chunk of the
        # other org, which was in flight when the last chunk read the total.
        assert (len(staged) == 3) if bound == "org" else (3 <= len(staged) <= 4), outcomes
        held, held_open = await trio.to_thread.run_sync(org_counters, database_url, orgs)
        assert held_open == RACERS
        assert held == await trio.to_thread.run_sync(total_staged, database_url) - baseline
        one = held // len(staged)  # every chunk stages the same bytes
        assert held == one * len(staged) and size * 0.9 < one < size * 1.1
        assert held <= (room if bound == "org" else room + one)
        # Commit, abort and the sweep each give back what their admission held.
        committed, aborted = staged[0], staged[1]
        where = {admission_id: sheet for sheet, admission_id in zip(sheets, ids, strict=True)}
        await store.commit_admission(
            where[committed], contract, committed, "run-1", chunks=1, rows=2
        )
        assert await store.abort_admission(where[aborted], aborted)
        left = await trio.to_thread.run_sync(org_counters, database_url, orgs)
        assert left[1] == RACERS - 2
        assert 0 < left[0] == held - 2 * one
    async with open_store(database_url, quotas=StoreQuotas(admission_lifetime_ms=1)) as sweeper:
        assert await sweeper.sweep_admissions() >= RACERS - 2
    assert await trio.to_thread.run_sync(org_counters, database_url, orgs) == (0, 0)


@pytest.fixture
async def stage_capped(
    database_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[RunningGateway]:
    """A gateway with the test's quotas (its parameter)."""
    async with quota_gateway(database_url, request.param) as gw:
        yield gw


# An admission holds at most about two and a half of the stage role's 2 KiB rows.
@pytest.mark.parametrize(
    "stage_capped", [StoreQuotas(max_admission_staged_bytes=5_500)], indirect=True
)
async def test_a_stage_role_copy_past_its_admissions_staged_bytes_is_refused_in_postgres(
    stage_capped: RunningGateway, database_url: str
) -> None:
    # Only the gateway counted staged bytes: a direct runner's rows.stage session COPYd
    # into staging bounded only by the admission's lifetime and the sweep.
    gw = stage_capped
    play, names, url, live = await stage_role_sheet(gw, CAPPED_ORG["a"])
    assert await trio.to_thread.run_sync(hostile_stage, url, names, live, 0, "k") is None
    # One COPY of two more rows: the first fits, the second passes the bound, and the
    # statement (and its transaction's chunk records) keeps nothing.
    two = functools.partial(hostile_stage, count=2)
    assert await trio.to_thread.run_sync(two, url, names, live, 1, "k") == "ProgramLimitExceeded"
    one_big = functools.partial(hostile_stage, size=6_000)
    refused = await trio.to_thread.run_sync(one_big, url, names, live, 1, "k")
    assert refused == "ProgramLimitExceeded"
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == [(live, 0)]
    assert await trio.to_thread.run_sync(chunk_rows, database_url, names) == [(live, 0)]
    # Nor can the role move a counter or switch the trigger off.
    quotas_table = sql.Identifier(_quotas.QUOTA_SCHEMA, "quotas")
    for statement in (
        sql.SQL("UPDATE {} SET staged_bytes = 0").format(names.ident("admissions_table")),
        sql.SQL("UPDATE {} SET staged_bytes = 0").format(quotas_table),
        sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(names.ident("staging_table")),
        sql.SQL("SET session_replication_role = replica"),
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await run_sql(url, statement)
    # The room left is still there: one more row fits.
    assert await trio.to_thread.run_sync(hostile_stage, url, names, live, 1, "k") is None
    held = await trio.to_thread.run_sync(counter, database_url, "org", org_schema(CAPPED_ORG["a"]))
    assert 4_096 < held[0] <= 5_500
    # Staged rows go with their admission, and so do their bytes.
    aborted = await post(
        gw, "abort_sheet_admission", play=play, tableNamespace="leads", admissionId=live
    )
    assert aborted.status_code == 200, aborted.text
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == []
    assert await trio.to_thread.run_sync(
        counter, database_url, "org", org_schema(CAPPED_ORG["a"])
    ) == (0, 0)


# One transaction of an org stages at most about two of the stage role's 2 KiB rows.
@pytest.mark.parametrize(
    "stage_capped", [StoreQuotas(max_transaction_staged_bytes=5_000)], indirect=True
)
async def test_one_transaction_stages_at_most_its_bound_so_other_orgs_see_the_total_within_it(
    stage_capped: RunningGateway, database_url: str
) -> None:
    # The total is read without a lock, so what one org's transaction in flight has
    # reserved is hidden from every other org's check until it commits: a stage
    # role's one transaction could reserve its org's whole room out of their sight.
    gw = stage_capped
    play, names, url, live = await stage_role_sheet(gw, CAPPED_ORG["a"])
    three = functools.partial(hostile_stage, count=3)
    refused = await trio.to_thread.run_sync(three, url, names, live, 0, "k")
    assert refused == "ConfigurationLimitExceeded"
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == []
    # Each transaction has a room of its own; the gateway's chunks, one per
    # transaction, each fit.
    two = functools.partial(hostile_stage, count=2)
    assert await trio.to_thread.run_sync(two, url, names, live, 0, "k") is None
    assert await trio.to_thread.run_sync(two, url, names, live, 2, "k") is None
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == [
        (live, seq) for seq in range(4)
    ]
    fed = await begin(gw, "other", play=play)
    for seq in range(3):
        staged = await stage(gw, "other", fed, seq, rows_of(1, 3_000), firstPosition=seq, play=play)
        assert staged.status_code == 200, staged.text
    for namespace, admission_id in (("leads", live), ("other", fed)):
        aborted = await post(
            gw,
            "abort_sheet_admission",
            play=play,
            tableNamespace=namespace,
            admissionId=admission_id,
        )
        assert aborted.status_code == 200, aborted.text


def make_older_layout(database_url: str, names: Any, layout: str) -> None:
    """Take the sheet's staging tables back to ``layout``: ``before-quotas`` (no quota
    columns on the registry, no quota triggers) or ``before-trigger`` (the staging
    row reserved by the first, ``BEFORE INSERT``, trigger)."""
    staging, admissions = names.ident("staging_table"), names.ident("admissions_table")
    with psycopg.connect(database_url) as conn:
        for trigger, table in _quotas.QUOTA_TRIGGERS:
            if layout == "before-quotas" or table == "staging_table":
                conn.execute(
                    sql.SQL("DROP TRIGGER {} ON {}").format(
                        sql.Identifier(trigger), names.ident(table)
                    )
                )
        if layout == "before-quotas":
            conn.execute(
                sql.SQL(
                    "ALTER TABLE {} DROP COLUMN token_id, DROP COLUMN staged_bytes, "
                    "DROP COLUMN max_staged_bytes, DROP COLUMN open_counted"
                ).format(admissions)
            )
        else:
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER sheetplane_staged_bytes BEFORE INSERT ON {} FOR EACH ROW "
                    "EXECUTE FUNCTION sheetplane_staging.reserve_chunk({}, {})"
                ).format(staging, sql.Literal(admissions.as_string(conn)), names.schema)
            )


@pytest.mark.parametrize("layout", ["before-quotas", "before-trigger"])
async def test_an_older_sheets_staging_gains_the_quotas_and_counts_each_chunk_once(
    database_url: str, layout: str
) -> None:
    org = f"org-upgrade-{uuid.uuid4().hex[:8]}"
    sheet = SheetRef(org, "upgrade", "leads")
    names = sheet_names(sheet)
    contract = SheetContract((ContractColumn("email", "email", "input"),))
    chunk = prepare_chunk(rows_of(2), 0)
    async with open_store(database_url) as store:
        await store.ensure_sheet(sheet, contract)
    await trio.to_thread.run_sync(make_older_layout, database_url, names, layout)
    old = uuid.uuid4().hex
    with psycopg.connect(database_url) as conn:  # begun by the older code
        conn.execute(
            sql.SQL("INSERT INTO {} (admission_id, run_id) VALUES (%s, 'run-1')").format(
                names.ident("admissions_table")
            ),
            (old,),
        )
    async with open_store(database_url) as store:
        assert await store.stage_chunk(sheet, old, 0, 0, chunk)  # older code's trigger
        new = uuid.uuid4().hex
        await store.begin_admission(sheet, contract, new, "run-1")  # upgrades the sheet
        assert await store.stage_chunk(sheet, old, 1, 2, prepare_chunk(rows_of(2), 2))
        assert await store.stage_chunk(sheet, new, 0, 0, chunk)

        def stored() -> dict[str, int]:
            with psycopg.connect(database_url) as conn:
                found = conn.execute(
                    sql.SQL(
                        "SELECT a.admission_id, a.staged_bytes, (SELECT coalesce(sum("
                        "pg_column_size(s._keys) + pg_column_size(s._rows)), 0) FROM {} AS s "
                        "WHERE s._admission_id = a.admission_id),"
                        " (SELECT count(*) FROM {} AS c WHERE c.admission_id = a.admission_id)"
                        " FROM {} AS a"
                    ).format(
                        names.ident("staging_table"),
                        names.ident("stage_chunks_table"),
                        names.ident("admissions_table"),
                    )
                ).fetchall()
            # Each admission's counter is its rows' bytes and its chunk records' (less
            # what it staged before the counters existed): nothing is counted twice.
            return {
                str(a): int(held) - int(rows) - int(records) * STAGING_CHUNK_RECORD_BYTES
                for a, held, rows, records in found
            }

        kept = await trio.to_thread.run_sync(stored)
        assert kept[new] == 0
        size = len(chunk.keys) + len(chunk.rows)
        if layout == "before-quotas":
            assert -2 * size < kept[old] < -size // 2  # its first chunk counts nothing
        else:
            # Counted once, by the superseded trigger (which read the row's size
            # before it was stored: a header byte or three more) and then the new one.
            assert 0 <= kept[old] < size // 2
        await store.commit_admission(sheet, contract, old, "run-1", chunks=2, rows=4)
        assert await store.abort_admission(sheet, new)
    assert await trio.to_thread.run_sync(counter, database_url, "org", org_schema(org)) == (0, 0)


async def test_the_sweep_sets_the_counters_back_when_a_registry_is_dropped_with_open_admissions(
    database_url: str,
) -> None:
    # Counters move only with the registry's rows: a sheet's tables dropped with an
    # open admission (an operator's cleanup) left its org's and token's room taken.
    org = f"org-drift-{uuid.uuid4().hex[:8]}"
    token_id = f"tok-drift-{uuid.uuid4().hex[:8]}"
    contract = SheetContract((ContractColumn("email", "email", "input"),))
    dropped, kept = SheetRef(org, "drift", "gone"), SheetRef(org, "drift", "kept")
    async with open_store(database_url) as store:
        for sheet in (dropped, kept):
            admission_id = uuid.uuid4().hex
            await store.begin_admission(sheet, contract, admission_id, "run-1", token_id=token_id)
            await store.stage_chunk(sheet, admission_id, 0, 0, prepare_chunk(rows_of(2), 0))
        org_key = org_schema(org)
        held = await trio.to_thread.run_sync(counter, database_url, "org", org_key)
        assert held[1] == 2

        def drop() -> None:
            names = sheet_names(dropped)
            with psycopg.connect(database_url) as conn:
                for table in ("staging_table", "stage_chunks_table", "admissions_table"):
                    conn.execute(sql.SQL("DROP TABLE {}").format(names.ident(table)))

        await trio.to_thread.run_sync(drop)
        assert await trio.to_thread.run_sync(counter, database_url, "org", org_key) == held
        await store.sweep_admissions()
        org_bytes, org_open = await trio.to_thread.run_sync(counter, database_url, "org", org_key)
        assert (org_open, 0 < org_bytes < held[0]) == (1, True)
        assert await trio.to_thread.run_sync(counter, database_url, "token", token_id) == (0, 1)


# --- third pass, finding 4: chunk records are bounded like staged bytes ------------------


def insert_chunk_records(
    url: str, names: Any, admission_id: str, first: int, count: int
) -> str | None:
    """As the stage role, in one statement: record chunks ``first .. first + count - 1``
    (no staging rows); the name of the error Postgres refused it with, or None."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (admission_id, seq, first_position, row_count)"
                    " SELECT %s, g, g, 1 FROM generate_series(%s::int, %s::int) AS g"
                ).format(names.ident("stage_chunks_table")),
                (admission_id, first, first + count - 1),
            )
    except psycopg.Error as exc:
        return type(exc).__name__
    return None


def admission_staged(database_url: str, names: Any, admission_id: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            sql.SQL("SELECT staged_bytes FROM {} WHERE admission_id = %s").format(
                names.ident("admissions_table")
            ),
            (admission_id,),
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_stage_roles_chunk_records_count_against_the_staged_byte_bounds(
    database_url: str,
) -> None:
    # A rows.stage role inserted 300,000 chunk records (44 MB) under its open
    # admission, and every staged-byte counter stayed at 0. Each record now reserves
    # what it costs on disk, on its admission, its org and the total, by the trigger
    # that reserves a staging row's bytes: past a bound the statement is refused.
    quotas = StoreQuotas(max_admission_staged_bytes=100 * STAGING_CHUNK_RECORD_BYTES)
    async with quota_gateway(database_url, quotas) as gw:
        play, names, url, admission_id = await stage_role_sheet(gw, CAPPED_ORG["a"])
        kept = await trio.to_thread.run_sync(insert_chunk_records, url, names, admission_id, 0, 50)
        assert kept is None
        staged = await trio.to_thread.run_sync(admission_staged, database_url, names, admission_id)
        assert staged == 50 * STAGING_CHUNK_RECORD_BYTES
        refused = await trio.to_thread.run_sync(
            insert_chunk_records, url, names, admission_id, 50, 300
        )
        assert refused == "ProgramLimitExceeded"
        assert len(await trio.to_thread.run_sync(chunk_rows, database_url, names)) == 50
        # Aborted, the admission gives its bytes back to its org.
        before = await trio.to_thread.run_sync(total_staged, database_url)
        aborted = await post(
            gw, "abort_sheet_admission", play=play, tableNamespace="leads", admissionId=admission_id
        )
        assert aborted.status_code == 200, aborted.text
        after = await trio.to_thread.run_sync(total_staged, database_url)
        assert before - after == staged
