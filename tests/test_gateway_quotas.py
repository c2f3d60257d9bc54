"""What one tenant may take of the gateway's storage, against the real server and real
Postgres: wire numbers within their columns' bounds, sheets per org, staging rows that
belong to a live admission, staged bytes and open admissions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio

from sheetplane import SheetCapError
from sheetplane._types import INTEGER_MAX, ContractColumn, SheetContract, SheetRef
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.store import StoreQuotas, open_store
from sheetplane.store._names import org_schema

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
    highest = await stage(gateway, "leads", admission_id, INTEGER_MAX, [{"email": "a@x.io"}])
    assert highest.status_code == 200, highest.text


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


@pytest.fixture
async def capped(database_url: str) -> AsyncIterator[RunningGateway]:
    quotas = StoreQuotas(max_sheets_per_org=3, max_receipt_tables_per_org=2)
    CAPPED_ORG["a"] = f"org-cap-{uuid.uuid4().hex[:8]}"
    tokens = {TOKEN_A: CAPPED_ORG["a"], TOKEN_B: f"org-cap-{uuid.uuid4().hex[:8]}"}
    async with running_gateway(database_url, tokens=tokens, quotas=quotas) as gw:
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
