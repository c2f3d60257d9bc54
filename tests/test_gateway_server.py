"""The reference gateway end to end: a real server on 127.0.0.1 port 0 against real Postgres.

Requests go over raw httpx so the wire shapes themselves are asserted.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio

from sheetplane import crypto
from sheetplane.budgets import (
    POSTGRES_BACKPRESSURE_RETRY_AFTER_MS,
    READ_BATCH_MAX_PAGES,
    READ_BATCH_MAX_RESPONSE_BYTES,
    READ_PAGE_MAX_ROWS,
    TRANSPORT_CEILING_BYTES,
    KiB,
)
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, _actions, running_gateway

TOKEN = "tok-acme-7f3a9c1e"
OTHER_TOKEN = "tok-globex-55d2b0aa"
ORG = "acme"
OTHER_ORG = "globex"
PLAY = "enrich-leads"
CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG, OTHER_TOKEN: OTHER_ORG}) as gw:
        yield gw


async def post(
    gw: RunningGateway,
    body: Any,
    *,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
    content: bytes | None = None,
) -> httpx.Response:
    sent = dict(headers or {})
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        if content is not None:
            return await http.post(RUNTIME_PATH, content=content, headers=sent)
        return await http.post(RUNTIME_PATH, json=body, headers=sent)


async def act(gw: RunningGateway, action: str, **fields: Any) -> Any:
    response = await post(gw, {"action": action, "playName": PLAY, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"_key": f"k{i:05d}", "email": f"user{i}@example.com"} for i in range(start, start + n)]


async def admit(gw: RunningGateway, namespace: str, n: int, run_id: str = "run-1") -> Any:
    return await act(
        gw,
        "start_sheet_dataset",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        rows=rows(n),
        runId=run_id,
    )


# --- every action --------------------------------------------------------------------


async def test_ensure_sheet_is_idempotent(gateway: RunningGateway, namespace: str) -> None:
    for _ in range(2):
        answer = await act(
            gateway, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT
        )
        assert answer == {"ok": True}


async def test_start_sheet_dataset_admits_in_input_order(
    gateway: RunningGateway, namespace: str
) -> None:
    answer = await admit(gateway, namespace, 5)
    assert answer["inserted"] == 5
    assert answer["skipped"] == 0
    assert answer["tableNamespace"] == namespace
    assert answer["writeVersion"] >= 1
    assert [row["_key"] for row in answer["pendingRows"]] == [f"k{i:05d}" for i in range(5)]
    assert answer["completedRows"] == []
    again = await admit(gateway, namespace, 5, run_id="run-2")
    assert again["writeVersion"] > answer["writeVersion"]
    assert again["inserted"] == 0


async def test_reads_single_batch_and_keys(gateway: RunningGateway, namespace: str) -> None:
    await admit(gateway, namespace, 12)
    page = await act(
        gateway,
        "runtime_sheet_read_rows",
        input={"tableNamespace": namespace, "limit": 5, "offset": 3},
    )
    assert (page["limit"], page["offset"]) == (5, 3)
    assert [row["_key"] for row in page["rows"]] == [f"k{i:05d}" for i in range(3, 8)]
    assert page["rows"][0]["email"] == "user3@example.com"

    batch = await act(
        gateway,
        "runtime_sheet_read_rows_batch",
        input={
            "tableNamespace": namespace,
            "pages": [
                {"limit": 4, "offset": 0},
                {"limit": 4, "offset": 10},
                {"limit": 2, "offset": 50},
            ],
        },
    )
    assert [(p["limit"], p["offset"], len(p["rows"])) for p in batch["pages"]] == [
        (4, 0, 4),
        (4, 10, 2),
        (2, 50, 0),
    ]
    assert [r["_key"] for r in batch["pages"][1]["rows"]] == ["k00010", "k00011"]

    keys = await act(
        gateway,
        "runtime_sheet_read_row_keys",
        input={"tableNamespace": namespace, "limit": 3, "offset": 1},
    )
    assert keys == {"keys": ["k00001", "k00002", "k00003"], "limit": 3, "offset": 1}

    all_mode = await act(
        gateway,
        "runtime_sheet_read_rows",
        input={
            "tableNamespace": namespace,
            "rowMode": "all",
            "runId": "run-1",
            "limit": 1,
            "offset": 0,
        },
    )
    assert all_mode["rows"][0]["_run_id"] == "run-1"
    assert "_write_version" in all_mode["rows"][0]


async def test_terminal_writes_fence_and_summary_counts(
    gateway: RunningGateway, namespace: str
) -> None:
    first = await admit(gateway, namespace, 4)
    version = first["writeVersion"]
    done = await act(
        gateway,
        "runtime_sheet_complete_map_rows",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        runId="run-1",
        writeVersion=version,
        rows=[
            {"key": "k00000", "data": {"score": 10}, "cellMetaPatch": {"score": {"src": "t"}}},
            {"key": "k00001", "data": {"score": 11}},
        ],
    )
    assert done["committedKeys"] == ["k00000", "k00001"]
    assert done["staleKeys"] == [] and done["staleRows"] == []
    assert done["updated"] == 2

    failed = await act(
        gateway,
        "runtime_sheet_fail_map_rows",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        runId="run-1",
        writeVersion=version,
        rows=[{"key": "k00002", "error": "provider said no"}],
    )
    assert failed["committedKeys"] == ["k00002"]

    # A newer admission re-admits the pending and failed rows: the old attempt is fenced.
    second = await admit(gateway, namespace, 4, run_id="run-2")
    stale = await act(
        gateway,
        "runtime_sheet_complete_map_rows",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        runId="run-1",
        writeVersion=version,
        rows=[{"key": "k00003", "data": {"score": 13}}],
    )
    assert stale["committedKeys"] == []
    assert stale["staleKeys"] == ["k00003"]
    assert stale["staleRows"] == [
        {
            "key": "k00003",
            "reason": "newer_write_version",
            "rowVersionStamp": second["writeVersion"],
        }
    ]


async def test_summary_counts_follow_terminal_writes_and_readmission(
    gateway: RunningGateway, namespace: str
) -> None:
    first = await admit(gateway, namespace, 4)
    fields = {"tableNamespace": namespace, "sheetContract": CONTRACT, "runId": "run-1"}
    version = first["writeVersion"]
    await act(
        gateway,
        "runtime_sheet_complete_map_rows",
        **fields,
        writeVersion=version,
        rows=[{"key": "k00000", "data": {"score": 1}}, {"key": "k00001", "data": {"score": 2}}],
    )
    await act(
        gateway,
        "runtime_sheet_fail_map_rows",
        **fields,
        writeVersion=version,
        rows=[{"key": "k00002", "error": "no"}],
    )
    summary = await act(gateway, "runtime_sheet_summary", tableNamespace=namespace)
    assert summary == {"total": 4, "queued": 1, "running": 0, "completed": 2, "failed": 1}
    await admit(gateway, namespace, 4, run_id="run-2")  # re-admits the failed row
    summary = await act(gateway, "runtime_sheet_summary", tableNamespace=namespace)
    assert summary == {"total": 4, "queued": 2, "running": 0, "completed": 2, "failed": 0}


async def test_work_receipt_persisted_then_existing(gateway: RunningGateway) -> None:
    key = f"receipt-{uuid.uuid4().hex}"
    first = await act(gateway, "complete_work_receipt", key=key, result={"n": 1}, runId="run-1")
    assert first["completionDisposition"] == "persisted"
    assert first["receipt"]["key"] == key
    assert first["receipt"]["result"] == {"n": 1}
    assert first["receipt"]["runId"] == "run-1"
    assert first["receipt"]["completedAt"]
    second = await act(gateway, "complete_work_receipt", key=key, result={"n": 2}, runId="run-2")
    assert second["completionDisposition"] == "existing"
    assert second["receipt"]["result"] == {"n": 1}
    assert second["receipt"]["runId"] == "run-1"


async def test_create_db_session_answers_an_envelope_that_opens(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, namespace, 3)
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    answer = await act(
        gateway,
        "create_db_session",
        target={"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        operations=["rows.read"],
        limits={"maxRows": 100},
        ttlSeconds=120,
        postgresUrlEncryption=key.encryption_request(),
    )
    assert "postgresUrl" not in answer
    assert answer["playName"] == PLAY
    assert answer["target"] == {
        "orgId": ORG,
        "tableNamespace": namespace,
        "logicalTable": "sheet_rows",
    }
    assert answer["operations"] == ["rows.read"]
    assert answer["limits"] == {"maxRows": 100}
    assert set(answer["postgres"]) == {
        "schema",
        "sheetTable",
        "eventTable",
        "summaryTable",
        "columnSummaryTable",
    }
    aad = crypto.session_aad(
        org_id=ORG,
        play_name=PLAY,
        table_namespace=namespace,
        logical_table="sheet_rows",
        operations=answer["operations"],
        expires_at=answer["expiresAt"],
    )
    url = crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad)
    schema, table = answer["postgres"]["schema"], answer["postgres"]["sheetTable"]

    def count() -> int:
        with psycopg.connect(url) as conn:
            query = psycopg.sql.SQL("SELECT count(*) FROM {}").format(
                psycopg.sql.Identifier(schema, table)
            )
            row = conn.execute(query).fetchone()
            assert row is not None
            return int(row[0])

    assert await trio.to_thread.run_sync(count) == 3


async def test_create_db_session_refuses_plain_urls_unless_configured(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    body = {
        "action": "create_db_session",
        "playName": PLAY,
        "target": {"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        "operations": ["rows.read"],
    }
    refused = await post(gateway, body)
    assert refused.status_code == 400
    assert refused.json()["code"] == "encryption_required"
    async with running_gateway(
        database_url, tokens={TOKEN: ORG}, allow_plain_session_urls=True
    ) as plain:
        answer = (await post(plain, body)).json()
    assert answer["postgresUrl"].startswith("postgresql://sp_sess_")
    assert "encryptedPostgresUrl" not in answer


# --- 400 / 401 / 403 -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([1, 2], "JSON object"),
        ({"playName": PLAY}, "action"),
        (
            {
                "action": "runtime_sheet_read_rows",
                "playName": PLAY,
                "input": {"tableNamespace": "x", "limit": 0, "offset": 0},
            },
            "input.limit",
        ),
        (
            {
                "action": "runtime_sheet_read_rows",
                "playName": PLAY,
                "input": {"tableNamespace": "x", "limit": READ_PAGE_MAX_ROWS + 1, "offset": 0},
            },
            "input.limit",
        ),
        (
            {
                "action": "runtime_sheet_read_rows",
                "playName": PLAY,
                "input": {"tableNamespace": "x", "limit": 1.5, "offset": 0},
            },
            "input.limit",
        ),
        (
            {
                "action": "runtime_sheet_read_rows",
                "playName": PLAY,
                "input": {"tableNamespace": "x", "limit": 1, "offset": -1},
            },
            "input.offset",
        ),
        (
            {
                "action": "runtime_sheet_read_rows",
                "playName": PLAY,
                "input": {"tableNamespace": "x", "rowMode": "raw", "limit": 1, "offset": 0},
            },
            "rowMode",
        ),
        *(
            (
                {
                    "action": "runtime_sheet_read_rows",
                    "playName": PLAY,
                    "input": {
                        "tableNamespace": "x",
                        "limit": 1,
                        "offset": 0,
                        "after": {"inputIndex": 1, "createdAt": created_at, "key": key},
                    },
                },
                fragment,
            )
            for created_at, key, fragment in [
                ("soon", "k", "input.after.createdAt must be an ISO 8601 timestamp"),
                ("2026-01-02T03:04:05", "k", "input.after.createdAt must carry a time zone"),
                ("2026-01-02T03:04:05Z", "a\x00b", "input.after.key must be text"),
            ]
        ),
        (
            {
                "action": "runtime_sheet_read_rows_batch",
                "playName": PLAY,
                "input": {"tableNamespace": "x", "pages": []},
            },
            "1-4 pages",
        ),
        (
            {
                "action": "runtime_sheet_read_rows_batch",
                "playName": PLAY,
                "input": {
                    "tableNamespace": "x",
                    "pages": [{"limit": 1, "offset": 0}] * (READ_BATCH_MAX_PAGES + 1),
                },
            },
            "1-4 pages",
        ),
        ({"action": "ensure_sheet", "tableNamespace": "x"}, "playName"),
        (
            {
                "action": "ensure_sheet",
                "playName": PLAY,
                "tableNamespace": "x",
                "sheetContract": {"columns": [{"id": "a"}]},
            },
            "sqlName",
        ),
        (
            {
                "action": "start_sheet_dataset",
                "playName": PLAY,
                "tableNamespace": "x",
                "sheetContract": CONTRACT,
                "rows": [1],
                "runId": "r",
            },
            "rows[0]",
        ),
        (
            {
                "action": "create_db_session",
                "playName": PLAY,
                "target": {"tableNamespace": "x", "logicalTable": "sheet_rows"},
                "operations": ["rows.drop"],
            },
            "operations",
        ),
        (
            {
                "action": "create_db_session",
                "playName": PLAY,
                "target": {"tableNamespace": "x", "logicalTable": "other"},
                "operations": ["rows.read"],
            },
            "logicalTable",
        ),
        (
            {
                "action": "create_db_session",
                "playName": PLAY,
                "target": {"tableNamespace": "x", "logicalTable": "sheet_rows"},
                "operations": ["rows.read"],
                "postgresUrlEncryption": {
                    "alg": "RSA-OAEP-256+A256GCM",
                    "publicKeyJwk": {"kty": "RSA", "n": "AQAB", "e": "AQAB"},
                },
            },
            "2048",
        ),
    ],
)
async def test_malformed_requests_answer_400(
    gateway: RunningGateway, body: Any, fragment: str
) -> None:
    response = await post(gateway, body)
    assert response.status_code == 400
    answer = response.json()
    assert set(answer) == {"error", "code"}
    assert fragment in answer["error"]


async def test_body_that_is_not_json_answers_400(gateway: RunningGateway) -> None:
    response = await post(gateway, None, content=b"{not json")
    assert response.status_code == 400
    assert response.json() == {"error": "request body must be JSON", "code": "invalid_request"}


async def test_unknown_action_answers_unsupported(gateway: RunningGateway) -> None:
    response = await post(gateway, {"action": "launch_rockets", "playName": PLAY})
    assert response.status_code == 400
    assert response.json() == {
        "error": "Unsupported runtime data-plane action: launch_rockets",
        "code": "unsupported_action",
    }


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer not-a-token"},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": "Bearer"},
        {"authorization": f"Bearer {TOKEN}x"},
    ],
)
async def test_missing_or_unknown_token_answers_401(
    gateway: RunningGateway, headers: dict[str, str]
) -> None:
    response = await post(
        gateway,
        {"action": "ensure_sheet", "playName": PLAY, "tableNamespace": "x"},
        token=None,
        headers=headers,
    )
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
    assert TOKEN not in response.text and "not-a-token" not in response.text


@pytest.mark.parametrize(
    "body",
    [
        {
            "action": "runtime_sheet_summary",
            "playName": PLAY,
            "tableNamespace": "x",
            "orgId": OTHER_ORG,
        },
        {
            "action": "runtime_sheet_read_rows",
            "playName": PLAY,
            "input": {"orgId": OTHER_ORG, "tableNamespace": "x", "limit": 1, "offset": 0},
        },
        {
            "action": "create_db_session",
            "playName": PLAY,
            "target": {"orgId": OTHER_ORG, "tableNamespace": "x", "logicalTable": "sheet_rows"},
            "operations": ["rows.read"],
        },
    ],
)
async def test_another_orgs_sheet_answers_403(gateway: RunningGateway, body: Any) -> None:
    response = await post(gateway, body)
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"


async def test_orgs_never_see_each_others_sheets(gateway: RunningGateway, namespace: str) -> None:
    await admit(gateway, namespace, 3)
    same_org = await post(
        gateway,
        {
            "action": "runtime_sheet_summary",
            "playName": PLAY,
            "tableNamespace": namespace,
            "orgId": ORG,
        },
    )
    assert same_org.json()["total"] == 3
    # The other org's token addresses its own sheet of that name: empty, never acme's rows.
    other = await post(
        gateway,
        {
            "action": "runtime_sheet_read_rows",
            "playName": PLAY,
            "input": {"tableNamespace": namespace, "limit": 10, "offset": 0},
        },
        token=OTHER_TOKEN,
    )
    assert other.status_code == 200
    assert other.json()["rows"] == []


# --- budgets and back-pressure ---------------------------------------------------------


async def test_batch_read_over_budget_answers_413(gateway: RunningGateway, namespace: str) -> None:
    store = gateway.state.store
    from sheetplane._types import SheetRef
    from sheetplane.protocol import read_contract

    sheet = SheetRef(ORG, PLAY, namespace)
    contract = read_contract(CONTRACT)
    blob = "x" * (512 * KiB)
    big = [{"_key": f"b{i:03d}", "email": blob} for i in range(28)]  # 14 MiB of row data
    await store.ensure_sheet(sheet, contract)
    await store.start_dataset(sheet, big, "run-big", contract)

    pages = [{"limit": 7, "offset": 7 * i} for i in range(4)]
    response = await post(
        gateway,
        {
            "action": "runtime_sheet_read_rows_batch",
            "playName": PLAY,
            "input": {"tableNamespace": namespace, "pages": pages},
        },
    )
    assert response.status_code == 413
    answer = response.json()
    assert answer["code"] == "runtime_sheet_read_batch_too_large"
    assert answer["observed_bytes"] > READ_BATCH_MAX_RESPONSE_BYTES
    assert len(response.content) < 4 * KiB  # the refusal, not the pages

    # Under budget, the same rows read fine.
    small = await act(
        gateway,
        "runtime_sheet_read_rows_batch",
        input={"tableNamespace": namespace, "pages": [{"limit": 7, "offset": 0}]},
    )
    assert len(small["pages"][0]["rows"]) == 7


async def _read_body(gw: RunningGateway, namespace: str, limit: int) -> httpx.Response:
    return await post(
        gw,
        {
            "action": "runtime_sheet_read_rows_batch",
            "playName": PLAY,
            "input": {"tableNamespace": namespace, "pages": [{"limit": limit, "offset": 0}]},
        },
    )


async def test_batch_read_budget_is_the_answer_body_byte_for_byte(
    gateway: RunningGateway, namespace: str
) -> None:
    """The budget counts the bytes the gateway sends: an answer of exactly
    READ_BATCH_MAX_RESPONSE_BYTES is sent, whole, and one byte more is refused."""
    store = gateway.state.store
    from sheetplane._types import SheetRef
    from sheetplane.protocol import read_contract
    from sheetplane.store import sheet_names

    sheet = SheetRef(ORG, PLAY, namespace)
    contract = read_contract(CONTRACT)
    await store.ensure_sheet(sheet, contract)
    # Two rows; the second's email (escapes and multi-byte text included) sets the size.
    await store.start_dataset(
        sheet,
        [{"_key": "a", "email": 'ü\n"\t☃ ' * 8}, {"_key": "b", "email": "x"}],
        "run-1",
        contract,
    )
    small = await _read_body(gateway, namespace, 2)
    assert small.status_code == 200
    assert small.json()["pages"][0]["rows"][1]["email"] == "x"
    table = sheet_names(sheet).ident("sheet_table")

    def set_email(length: int) -> None:
        with psycopg.connect(gateway.state.config.database_url) as conn:
            conn.execute(
                psycopg.sql.SQL(
                    "UPDATE {} SET email = to_jsonb(repeat('x', %s)) WHERE _key = 'b'"
                ).format(table),
                (length,),
            )

    fill = 1 + READ_BATCH_MAX_RESPONSE_BYTES - len(small.content)
    set_email(fill)
    exact = await _read_body(gateway, namespace, 2)
    assert exact.status_code == 200
    assert len(exact.content) == READ_BATCH_MAX_RESPONSE_BYTES
    assert len(exact.json()["pages"][0]["rows"][1]["email"]) == fill
    set_email(fill + 1)
    over = await _read_body(gateway, namespace, 2)
    assert over.status_code == 413
    assert over.json()["observed_bytes"] == READ_BATCH_MAX_RESPONSE_BYTES + 1


async def test_a_stored_number_no_float_holds_is_refused_not_written_null(
    gateway: RunningGateway, namespace: str
) -> None:
    """jsonb holds numbers past a float's range; JSON on the wire cannot carry
    what Python reads them as (infinity), wherever the row stands in the page."""
    store = gateway.state.store
    from sheetplane._types import SheetRef
    from sheetplane.protocol import read_contract
    from sheetplane.store import sheet_names

    sheet = SheetRef(ORG, PLAY, namespace)
    await store.start_dataset(sheet, rows(8), "run-1", read_contract(CONTRACT))
    with psycopg.connect(gateway.state.config.database_url) as conn:
        conn.execute(
            psycopg.sql.SQL(
                "UPDATE {} SET score = ('1' || repeat('0', 400) || '.5')::jsonb"
                " WHERE _key = 'k00005'"
            ).format(sheet_names(sheet).ident("sheet_table"))
        )
    for after in ({}, {"after": None}):
        response = await post(
            gateway,
            {
                "action": "runtime_sheet_read_rows",
                "playName": PLAY,
                "input": {"tableNamespace": namespace, "limit": 8, "offset": 0, **after},
            },
        )
        assert response.status_code == 400, response.text
        assert "no JSON form" in response.json()["error"]


async def test_request_body_over_transport_ceiling_answers_413(gateway: RunningGateway) -> None:
    content = b'{"action":"ensure_sheet","pad":"' + b"x" * TRANSPORT_CEILING_BYTES + b'"}'
    response = await post(gateway, None, content=content)
    assert response.status_code == 413
    assert response.json()["code"] == "request_too_large"


async def test_saturated_pool_answers_503_backpressure(database_url: str, namespace: str) -> None:
    release = threading.Event()
    async with running_gateway(
        database_url, tokens={TOKEN: ORG}, max_connections=1, pool_acquire_timeout_ms=200
    ) as gw:
        await act(gw, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
        held = trio.Event()

        def hold(conn: psycopg.Connection[Any]) -> None:
            trio.from_thread.run_sync(held.set)
            release.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: gw.state.store.pool.run(hold))
            await held.wait()
            try:
                response = await post(
                    gw,
                    {
                        "action": "runtime_sheet_summary",
                        "playName": PLAY,
                        "tableNamespace": namespace,
                    },
                )
            finally:
                release.set()
        assert response.status_code == 503
        assert response.json() == {
            "error": "Runtime Postgres admission is saturated; retry later",
            "code": "runtime_postgres_admission_backpressure",
            "retry_after_ms": POSTGRES_BACKPRESSURE_RETRY_AFTER_MS,
        }
        # Once the connection is free again, the same request succeeds.
        assert (await act(gw, "runtime_sheet_summary", tableNamespace=namespace))["total"] == 0


# --- no trace, no secret ----------------------------------------------------------------------


async def test_unexpected_error_answers_500_without_trace_or_secret(
    gateway: RunningGateway,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def explode(call: Any) -> Any:
        raise RuntimeError(f"boom while holding {database_url}")

    monkeypatch.setitem(_actions.HANDLERS, "runtime_sheet_summary", explode)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG):
        response = await post(
            gateway, {"action": "runtime_sheet_summary", "playName": PLAY, "tableNamespace": "x"}
        )
    assert response.status_code == 500
    assert response.json() == {"error": "internal error", "code": "internal_error"}
    assert database_url not in caplog.text
    assert "RuntimeError" in caplog.text
    # The log record carries the whole traceback, under the request's id, redacted.
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "internal_error"]
    trace = record.traceback  # type: ignore[attr-defined]
    assert "Traceback (most recent call last)" in trace
    assert "in explode" in trace
    assert "boom while holding" in trace
    assert database_url not in trace
    assert response.headers["x-request-id"]


# --- legacy -------------------------------------------------------------------------------------


async def test_legacy_gateway_lacks_batch_reads_and_stale_reasons(
    database_url: str, namespace: str
) -> None:
    async with running_gateway(database_url, tokens={TOKEN: ORG}, legacy=True) as gw:
        first = await admit(gw, namespace, 2)
        response = await post(
            gw,
            {
                "action": "runtime_sheet_read_rows_batch",
                "playName": PLAY,
                "input": {"tableNamespace": namespace, "pages": [{"limit": 1, "offset": 0}]},
            },
        )
        assert response.status_code == 400
        assert response.json()["error"] == (
            "Unsupported runtime data-plane action: runtime_sheet_read_rows_batch"
        )
        await admit(gw, namespace, 2, run_id="run-2")
        stale = await act(
            gw,
            "runtime_sheet_complete_map_rows",
            tableNamespace=namespace,
            sheetContract=CONTRACT,
            runId="run-1",
            writeVersion=first["writeVersion"],
            rows=[{"key": "k00000", "data": {"score": 1}}],
        )
        assert stale["staleKeys"] == ["k00000"]
        assert "staleRows" not in stale
        single = await act(
            gw,
            "runtime_sheet_read_rows",
            input={"tableNamespace": namespace, "limit": 1, "offset": 0},
        )
        assert len(single["rows"]) == 1
