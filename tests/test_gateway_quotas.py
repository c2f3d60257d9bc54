"""What one tenant may take of the gateway's storage, against the real server and real
Postgres: wire numbers within their columns' bounds, sheets per org, staging rows that
belong to a live admission, staged bytes and open admissions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sheetplane._types import INTEGER_MAX
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway

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
