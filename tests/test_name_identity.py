"""Play names and table namespaces are identities: every spelling that normalises alike
reaches one sheet, on both roads and on the gateway, and a blank name is refused."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from _runtime_helpers import (
    CONTRACT,
    ORG,
    ROADS,
    CountingGateway,
    runtime,
)
from _session_helpers import aad_of
from sheetplane import InvalidInputError, crypto
from sheetplane._types import SheetRef
from sheetplane.gateway.server import RUNTIME_PATH
from sheetplane.protocol import contract_json
from sheetplane.runtime import Strategy, open_runtime
from sheetplane.store import SheetStore, sheet_names


@pytest.fixture
def gateway(runtime_gateway: CountingGateway) -> CountingGateway:
    return runtime_gateway


def _rows(keys: range) -> list[dict[str, Any]]:
    return [{"_key": f"k{i}", "text": f"text {i}"} for i in keys]


async def _post(gw: CountingGateway, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        return await http.post(
            RUNTIME_PATH, json=body, headers={"authorization": f"Bearer {gw.token}"}
        )


@pytest.mark.parametrize("strategy", ROADS)
async def test_normtest_normtest_and_padded_normtest_are_one_sheet(
    gateway: CountingGateway, store: SheetStore, strategy: Strategy
) -> None:
    tag = uuid.uuid4().hex[:8]
    async with runtime(gateway, strategy, play=f"Play-{tag}") as rt:
        first = await rt.writer("NormTest", CONTRACT).start(_rows(range(3)))
        again = await rt.writer("normtest", CONTRACT).start(_rows(range(5)))
        padded = rt.dataset(" NormTest ")
        assert await padded.count() == 5
        assert [row["_key"] for row in await padded.materialize()] == [f"k{i}" for i in range(5)]
    # The three admitted first are open again, not inserted: skipped (the seed's count).
    assert (first.inserted, again.inserted, again.skipped) == (3, 2, 3)
    assert again.write_version == first.write_version + 1
    # The same sheet from another runtime that spells the play otherwise.
    async with runtime(gateway, strategy, play=f"  PLAY-{tag.upper()}") as rt:
        assert await rt.dataset("NORMTEST").count() == 5
    assert await store.count(SheetRef(ORG, f"play-{tag}", "normtest")) == 5


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_blank_namespace_is_refused_before_anything_is_sent(
    gateway: CountingGateway, strategy: Strategy
) -> None:
    async with runtime(gateway, strategy, play=f"play-{uuid.uuid4().hex[:8]}") as rt:
        sent = gateway.requests
        for blank in ("", "   ", "\t\n"):
            with pytest.raises(InvalidInputError, match="table_namespace"):
                rt.writer(blank, CONTRACT)
            with pytest.raises(InvalidInputError, match="table_namespace"):
                rt.dataset(blank)
            with pytest.raises(InvalidInputError, match="table_namespace"):
                await rt.map(blank, CONTRACT, _rows(range(1)), _echo)
        assert gateway.requests == sent


async def _echo(row: dict[str, Any]) -> dict[str, Any]:
    return {"words": 1}


async def test_a_blank_play_name_is_refused_before_anything_connects() -> None:
    with pytest.raises(InvalidInputError, match="play_name"):
        async with open_runtime(
            base_url="http://127.0.0.1:9", token="t", org_id=ORG, play_name=" \t ", run_id="r"
        ):
            pass


async def test_spellings_of_one_namespace_share_one_read_lane(gateway: CountingGateway) -> None:
    async with runtime(gateway, "direct", play="Lanes") as rt:
        assert rt.road(" NormTest ").scope == rt.road("normtest").scope
        assert rt.writer(" NormTest ", CONTRACT).table_namespace == "normtest"


async def test_the_gateway_normalises_the_names_a_seed_client_sends(
    gateway: CountingGateway, store: SheetStore
) -> None:
    tag = uuid.uuid4().hex[:8]
    base = {"action": "start_sheet_dataset", "sheetContract": contract_json(CONTRACT)}
    spellings = [
        (f"Seed-{tag}", "NormTest"),
        (f" seed-{tag} ", " NormTest "),
        (f"SEED-{tag}", "normtest"),
    ]
    answers = []
    for n, (play, namespace) in enumerate(spellings):
        body = {**base, "playName": play, "tableNamespace": namespace, "runId": f"run-{n}"}
        response = await _post(gateway, {**body, "rows": _rows(range(n + 1))})
        assert response.status_code == 200, response.text
        answers.append(response.json())
    assert [answer["inserted"] for answer in answers] == [1, 1, 1]
    assert [answer["writeVersion"] for answer in answers] == [1, 2, 3]
    # Each answer names the namespace as its request spelled it, as the runtime does.
    assert [answer["tableNamespace"] for answer in answers] == [ns for _, ns in spellings]
    assert await store.count(SheetRef(ORG, f"seed-{tag}", "normtest")) == 3


@pytest.mark.parametrize(
    ("member", "value"),
    [("tableNamespace", "   "), ("tableNamespace", ""), ("playName", " \t ")],
)
async def test_the_gateway_refuses_a_name_that_normalises_to_nothing(
    gateway: CountingGateway, member: str, value: str
) -> None:
    body = {
        "action": "ensure_sheet",
        "playName": "play-blank",
        "tableNamespace": "ns",
        "sheetContract": contract_json(CONTRACT),
        member: value,
    }
    response = await _post(gateway, body)
    assert response.status_code == 400, response.text
    assert response.json()["code"] in ("invalid_input", "invalid_request")


async def test_a_session_answer_names_the_sheet_as_the_request_spelled_it(
    gateway: CountingGateway,
) -> None:
    # A runtime matches preloaded sessions by the play name it sent, exactly.
    key = crypto.generate_decryption_key()
    body = {
        "action": "create_db_session",
        "playName": " Seed-Play ",
        "target": {"tableNamespace": "NormTest", "logicalTable": "sheet_rows"},
        "operations": ["rows.read"],
        "postgresUrlEncryption": key.encryption_request(),
    }
    response = await _post(gateway, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["playName"] == " Seed-Play "
    assert answer["target"]["tableNamespace"] == "NormTest"
    url = crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))
    # The role is the normalised sheet's: it reads what "normtest" of "seed-play" holds.
    tables = answer["postgres"]
    assert tables["sheetTable"] == sheet_names(SheetRef(ORG, "seed-play", "normtest")).sheet_table
    assert url.startswith("postgresql://")
