"""Bad requests the gateway fuzzer found answered 500: each is a 400 now, with a JSON
body, and the server goes on answering."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sheetplane.budgets import MAX_ROW_KEY_BYTES
from sheetplane.gateway.server import RUNTIME_PATH
from sheetplane.testing.plugin import GatewayHandle

CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}


async def post(gw: GatewayHandle, content: bytes) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        return await http.post(
            RUNTIME_PATH,
            content=content,
            headers={"authorization": f"Bearer {gw.token}", "content-type": "application/json"},
        )


def admission(**changes: Any) -> dict[str, Any]:
    body = {
        "action": "start_sheet_dataset",
        "playName": "p",
        "tableNamespace": "ns",
        "sheetContract": CONTRACT,
        "rows": [{"_key": "a", "email": "a@x.org"}],
        "runId": "r1",
    }
    body.update(changes)
    return body


async def assert_400(gw: GatewayHandle, content: bytes) -> dict[str, Any]:
    response = await post(gw, content)
    assert response.status_code == 400, response.text[:300]
    body: dict[str, Any] = response.json()
    assert isinstance(body["error"], str) and isinstance(body["code"], str)
    alive = await post(
        gw, b'{"action": "runtime_sheet_summary", "playName": "p", "tableNamespace": "ns"}'
    )
    assert alive.status_code == 200
    return body


async def test_lone_surrogate_echoed_in_an_error_is_400_not_500(
    sheetplane_gateway: GatewayHandle,
) -> None:
    # The unknown action is echoed in the answer; its lone surrogate has no UTF-8 form.
    body = await assert_400(sheetplane_gateway, b'{"action": "\\ud800", "playName": "p"}')
    assert body["code"] == "invalid_request"


async def test_lone_surrogate_in_a_row_is_400_not_500(sheetplane_gateway: GatewayHandle) -> None:
    content = json.dumps(admission(rows=[{"_key": "a\udc00", "email": "x"}])).encode()
    await assert_400(sheetplane_gateway, content)


async def test_json_nested_past_the_decoder_stack_is_400_not_500(
    sheetplane_gateway: GatewayHandle,
) -> None:
    await assert_400(sheetplane_gateway, b"[" * 100_000)
    await assert_400(sheetplane_gateway, b'{"action": "ensure_sheet", "x": ' + b"[" * 5_000)


@pytest.mark.parametrize(
    "changes",
    [
        {"rows": [{"_key": "a", "email": "x\u0000y"}]},
        {"rows": [{"_key": "a\u0000", "email": "x"}]},
        {"runId": "r\u00001"},
        {
            "sheetContract": {
                "columns": [
                    *CONTRACT["columns"],
                    {"id": "i\u0000", "sqlName": "z", "source": "input"},
                ]
            }
        },
        {"rows": [{"_key": "a", "email": "DEEP"}]},
    ],
)
async def test_nul_or_deep_values_in_an_admission_are_400_not_500(
    sheetplane_gateway: GatewayHandle, changes: dict[str, Any]
) -> None:
    body = admission(**changes)
    if body["rows"][0]["email"] == "DEEP":  # nested past MAX_JSON_DEPTH
        deep: Any = 1
        for _ in range(300):
            deep = [deep]
        body["rows"] = [{"_key": "a", "email": deep}]
    await assert_400(sheetplane_gateway, json.dumps(body).encode())


async def test_a_key_past_the_btree_entry_limit_is_400_not_500(
    sheetplane_gateway: GatewayHandle,
) -> None:
    long_key = "é" * (MAX_ROW_KEY_BYTES // 2 + 1)
    content = json.dumps(admission(rows=[{"_key": long_key, "email": "x"}]), ensure_ascii=False)
    body = await assert_400(sheetplane_gateway, content.encode())
    assert "MAX_ROW_KEY_BYTES" in body["error"]


async def test_a_huge_session_limit_is_400(sheetplane_gateway: GatewayHandle) -> None:
    from sheetplane.crypto import generate_decryption_key

    body = {
        "action": "create_db_session",
        "playName": "p",
        "target": {"tableNamespace": "ns", "logicalTable": "sheet_rows"},
        "operations": ["rows.read"],
        "limits": {"maxRows": 10**300},
        "postgresUrlEncryption": generate_decryption_key().encryption_request(),
    }
    await assert_400(sheetplane_gateway, json.dumps(body).encode())


async def test_a_null_session_limit_is_400_not_an_unlimited_session(
    sheetplane_gateway: GatewayHandle,
) -> None:
    # The fuzzer found {"maxRows": null} minted a session with no row limit.
    body = {
        "action": "create_db_session",
        "playName": "p",
        "target": {"tableNamespace": "ns", "logicalTable": "sheet_rows"},
        "operations": ["rows.read"],
        "limits": {"maxRows": None},
        "postgresUrlEncryption": {"alg": "RSA-OAEP-256+A256GCM", "publicKeyJwk": {}},
    }
    answer = await assert_400(sheetplane_gateway, json.dumps(body).encode())
    assert "limits.maxRows" in answer["error"]


async def test_a_nul_in_a_skipped_sql_name_is_400_not_accepted(
    sheetplane_gateway: GatewayHandle,
) -> None:
    # The fuzzer found a contract column named "_key\x00" (an ``_`` name is not a table
    # column) answered 200: Postgres text cannot hold the NUL, so it is refused anyway.
    columns = [*CONTRACT["columns"], {"id": "skipped", "sqlName": "_key\x00", "source": "input"}]
    body = {
        "action": "ensure_sheet",
        "playName": "p",
        "tableNamespace": "ns",
        "sheetContract": {"columns": columns},
    }
    answer = await assert_400(sheetplane_gateway, json.dumps(body).encode())
    assert "NUL" in answer["error"]
