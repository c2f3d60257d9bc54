"""What one tenant may take of the gateway's storage, against the real server and real
Postgres: wire numbers within their columns' bounds, sheets per org, staging rows that
belong to a live admission, staged bytes and open admissions."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import sql

from _session_helpers import aad_of
from sheetplane import SheetCapError, crypto
from sheetplane._types import INTEGER_MAX, ContractColumn, SheetContract, SheetRef
from sheetplane.budgets import MAX_ROW_KEY_BYTES
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.store import StoreQuotas, _quotas, open_store
from sheetplane.store._names import org_schema, sheet_names
from sheetplane.store._staging import sweep_admissions

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


async def begin(gw: RunningGateway, namespace: str, **fields: Any) -> str:
    admission_id = uuid.uuid4().hex
    response = await post(
        gw,
        "begin_sheet_admission",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        admissionId=admission_id,
        runId="run-1",
        **fields,
    )
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
async def quota_gateway(database_url: str, quotas: StoreQuotas) -> AsyncIterator[RunningGateway]:
    """A gateway with ``quotas`` whose two tokens belong to two new orgs (so each test
    starts with empty ones); TOKEN_A's org is ``CAPPED_ORG["a"]``."""
    CAPPED_ORG["a"] = f"org-cap-{uuid.uuid4().hex[:8]}"
    tokens = {TOKEN_A: CAPPED_ORG["a"], TOKEN_B: f"org-cap-{uuid.uuid4().hex[:8]}"}
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
        await post(
            capped,
            "begin_sheet_admission",
            play=play,
            tableNamespace="ns-staged",
            sheetContract=CONTRACT,
            admissionId=uuid.uuid4().hex,
            runId="run-1",
        ),
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


def hostile_stage(
    url: str, names: Any, admission_id: str, seq: int, key: str, *, record: bool = True
) -> str | None:
    """As the stage role: record a chunk (unless not ``record``) and COPY its staging
    row (one 2 KiB row under ``key``); the name of the error Postgres refused it
    with, or None."""
    try:
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            if record:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (admission_id, seq, first_position, row_count) "
                        "VALUES (%s, %s, 0, 1) ON CONFLICT DO NOTHING"
                    ).format(names.ident("stage_chunks_table")),
                    (admission_id, seq),
                )
            with conn.cursor().copy(
                sql.SQL(
                    "COPY {} (_admission_id, _seq, _first_position, _row_count, _keys, _rows) "
                    "FROM STDIN"
                ).format(names.ident("staging_table"))
            ) as copy:
                copy.write_row(
                    (admission_id, seq, 0, 1, f'["{key}"]', '[{"email": "' + "x" * 2048 + '"}]')
                )
    except psycopg.Error as exc:
        return type(exc).__name__
    return None


def staged_rows(database_url: str, names: Any) -> list[tuple[str, int]]:
    with psycopg.connect(database_url) as conn:
        return [
            (str(a), int(s))
            for a, s in conn.execute(
                sql.SQL("SELECT _admission_id, _seq FROM {} ORDER BY 1, 2").format(
                    names.ident("staging_table")
                )
            ).fetchall()
        ]


async def test_a_stage_role_cannot_leave_orphan_staging_rows_or_keys_past_the_cap(
    gateway: RunningGateway, database_url: str
) -> None:
    # A rows.stage role could COPY rows under an admission never begun, with 100 KB keys,
    # and abort, commit and the reaper's sweep (which delete by registered id) kept them.
    play = f"orphan-{uuid.uuid4().hex[:8]}"
    made = await post(gateway, "ensure_sheet", play=play, tableNamespace="leads")
    assert made.status_code == 200, made.text
    names = sheet_names(SheetRef(ORG_A, play, "leads"))
    url = await mint_stage_role(gateway, play, "leads")
    never_begun = uuid.uuid4().hex
    orphan = functools.partial(hostile_stage, record=False)
    refused = await trio.to_thread.run_sync(orphan, url, names, never_begun, 0, "k")
    assert refused == "ForeignKeyViolation"
    # Nor under a live admission without recording the chunk.
    live = await begin(gateway, "leads", playName=play)
    refused = await trio.to_thread.run_sync(orphan, url, names, live, 0, "k")
    assert refused == "ForeignKeyViolation"
    long_key = "k" * (MAX_ROW_KEY_BYTES + 1)
    refused = await trio.to_thread.run_sync(hostile_stage, url, names, live, 0, long_key)
    assert refused == "CheckViolation"
    # Rows the role stages for a live admission, left after that admission closed:
    # the sweep deletes what no open admission owns.
    assert await trio.to_thread.run_sync(hostile_stage, url, names, live, 0, "k") is None
    aborted = await post(
        gateway, "abort_sheet_admission", play=play, tableNamespace="leads", admissionId=live
    )
    assert aborted.status_code == 200, aborted.text
    assert await trio.to_thread.run_sync(hostile_stage, url, names, live, 0, "k") is None
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == [(live, 0)]
    async with open_store(database_url) as store:
        await sweep_admissions(store.pool)
    assert await trio.to_thread.run_sync(staged_rows, database_url, names) == []


def total_staged(database_url: str) -> int:
    """Staged bytes in every org's staging tables, as the quota counts them."""
    with psycopg.connect(database_url) as conn:
        return _quotas._staged_bytes(conn, None)


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
    refused = await post(
        gw,
        "begin_sheet_admission",
        tableNamespace="leads",
        sheetContract=CONTRACT,
        admissionId=uuid.uuid4().hex,
        runId="run-1",
    )
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "runtime_staging_quota"
    # A begin of an admission already open is a retry, not a new one.
    again = await post(
        gw,
        "begin_sheet_admission",
        tableNamespace="leads",
        sheetContract=CONTRACT,
        admissionId=opened[0],
        runId="run-1",
    )
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
