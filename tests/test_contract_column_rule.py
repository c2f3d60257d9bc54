"""A contract column's ``id`` and ``sql_name`` follow one rule on both roads.

The rule is ``ContractColumn``'s check: a string with a character that is not
whitespace (the seed trims ``sqlName`` and drops a column it leaves empty; a
column that silently stores nothing is refused here instead). The direct road
meets it building the column; the gateway reads a request's contract into
``ContractColumn``s and answers the same refusal 400, creating no table.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest
from psycopg import sql

from sheetplane import ContractColumn, InvalidInputError
from sheetplane._types import SheetRef
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.store import sheet_names

TOKEN = "tok-columns-9e4b1f0c"
ORG = "acme"
PLAY = "enrich-leads"
BLANKS = ["", " ", "\t\n", "\u3000"]


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}) as gw:
        yield gw


def _refusal(member: str, blank: str) -> str:
    with pytest.raises(InvalidInputError) as refused:
        if member == "id":
            ContractColumn(blank, "email", "input")
        else:
            ContractColumn("email", blank, "input")
    return str(refused.value)


@pytest.mark.parametrize("member", ["id", "sql_name"])
@pytest.mark.parametrize("blank", BLANKS)
def test_the_direct_road_refuses_a_blank_column_name(member: str, blank: str) -> None:
    assert "must be a non-empty string" in _refusal(member, blank)


@pytest.mark.parametrize(("member", "wire"), [("id", "id"), ("sql_name", "sqlName")])
async def test_the_gateway_refuses_a_blank_column_name_as_the_direct_road_does(
    gateway: RunningGateway, namespace: str, member: str, wire: str
) -> None:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        for blank in BLANKS:
            column = {"id": "email", "sqlName": "email", "source": "input", wire: blank}
            body = {
                "action": "ensure_sheet",
                "playName": PLAY,
                "tableNamespace": namespace,
                "sheetContract": {"columns": [column]},
            }
            response = await http.post(RUNTIME_PATH, json=body, headers=headers)
            assert response.status_code == 400, response.text
            assert response.json()["error"] == _refusal(member, blank)
    table = sheet_names(SheetRef(ORG, PLAY, namespace)).ident("sheet_table")
    with (
        psycopg.connect(gateway.state.config.database_url) as conn,
        pytest.raises(psycopg.errors.UndefinedTable),
    ):
        conn.execute(sql.SQL("SELECT 1 FROM {}").format(table))
