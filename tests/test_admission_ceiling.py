"""The one-request admission (``start_sheet_dataset``) never commits what it cannot answer.

A request or an answer past ``TRANSPORT_CEILING_BYTES`` is refused 413
``runtime_sheet_admission_too_large`` before anything is written; the sheet is
checked with the superuser, outside the gateway, before and after.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from sheetplane import AdmissionTooLargeError
from sheetplane._types import CompleteRow, ContractColumn, SheetContract, SheetRef
from sheetplane.budgets import TRANSPORT_CEILING_BYTES, MiB
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.protocol import contract_json
from sheetplane.store import sheet_names

TOKEN = "tok-ceiling-1b2c3d"
ORG = "acme-ceiling"
PLAY = "enrich"
CONTRACT = SheetContract(
    (
        ContractColumn("email", "email", "input"),
        ContractColumn("profile", "profile", "output"),
    )
)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}) as gw:
        yield gw


def superuser_snapshot(database_url: str, sheet: SheetRef) -> dict[str, Any]:
    """Every row, the summary row (write version and counters) and the events, read
    with the superuser straight from Postgres."""
    names = sheet_names(sheet)
    with psycopg.connect(database_url, autocommit=True) as conn:

        def rows(table: str, order: str) -> list[tuple[Any, ...]]:
            return conn.execute(
                sql.SQL("SELECT * FROM {} ORDER BY {}").format(names.ident(table), sql.SQL(order))
            ).fetchall()

        return {
            "rows": rows("sheet_table", "_key"),
            "summary": rows("summary_table", "id"),
            "events": rows("event_table", "id"),
        }


async def test_answer_over_the_ceiling_is_refused_before_anything_is_written(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    # Five small input rows whose stored outputs are 4 MiB each: admitting them
    # again answers them as completedRows, 20 MiB, past the 16 MiB ceiling,
    # while the request itself is a few hundred bytes.
    store = gateway.state.store
    sheet = SheetRef(ORG, PLAY, namespace)
    small = [{"_key": f"k{i}", "email": f"u{i}@example.com"} for i in range(5)]
    first = await store.start_dataset(sheet, small, "run-1", CONTRACT)
    blob = "x" * (4 * MiB)
    await store.complete_map_rows(
        sheet,
        CONTRACT,
        [CompleteRow(f"k{i}", {"profile": blob}) for i in range(5)],
        run_id="run-1",
        write_version=first.write_version,
    )
    before = superuser_snapshot(database_url, sheet)

    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        response = await http.post(
            RUNTIME_PATH,
            json={
                "action": "start_sheet_dataset",
                "playName": PLAY,
                "tableNamespace": namespace,
                "sheetContract": contract_json(CONTRACT),
                "rows": small,
                "runId": "run-2",
            },
            headers={"authorization": f"Bearer {TOKEN}"},
        )
    assert response.status_code == 413
    answer = response.json()
    assert answer["code"] == "runtime_sheet_admission_too_large"
    assert answer["observed_bytes"] > TRANSPORT_CEILING_BYTES
    assert len(response.content) < 1024  # the refusal, not the rows

    after = superuser_snapshot(database_url, sheet)
    assert after == before  # no row, no write version, no event moved
    assert [event[1] for event in after["events"]].count("admission") == 1

    # The typed client raises the typed error, and still writes nothing.
    async with GatewayClient(gateway.base_url, TOKEN, play_name=PLAY, org_id=ORG) as client:
        with pytest.raises(AdmissionTooLargeError) as caught:
            await client.start_sheet_dataset(namespace, CONTRACT, small, "run-3")
    assert caught.value.code == "runtime_sheet_admission_too_large"
    assert caught.value.observed_bytes > TRANSPORT_CEILING_BYTES
    assert superuser_snapshot(database_url, sheet) == before


async def test_request_over_the_ceiling_is_refused_without_sending(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    store = gateway.state.store
    sheet = SheetRef(ORG, PLAY, namespace)
    await store.ensure_sheet(sheet, CONTRACT)
    before = superuser_snapshot(database_url, sheet)
    big = [{"email": f"u{i}@example.com", "pad": "p" * 1024} for i in range(17 * 1024)]
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    async with GatewayClient(gateway.base_url, TOKEN, play_name=PLAY, org_id=ORG) as client:
        assert client._http is not None
        client._http.event_hooks["request"] = [record]
        with pytest.raises(AdmissionTooLargeError) as caught:
            await client.start_sheet_dataset(namespace, CONTRACT, big, "run-1")
    assert caught.value.observed_bytes > TRANSPORT_CEILING_BYTES
    assert sent == []
    assert superuser_snapshot(database_url, sheet) == before
