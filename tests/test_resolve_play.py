"""``resolve_play`` end to end: plays per org in the reference gateway (org-b never
resolves org-a's play), registered at run time or loaded by ``sheetplane serve
--plays DIR``, resolved through the runtime on both strategies, and the client's
own resolve-play ladder on virtual time."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from _serve_helpers import post_action, serving
from sheetplane import InvalidInputError, ResolvedPlay
from sheetplane.budgets import RESOLVE_PLAY_RETRY_DELAYS_MS
from sheetplane.errors import TransientGatewayError
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RunningGateway, running_gateway
from sheetplane.gateway.server._plays import load_plays
from sheetplane.runtime import Strategy, open_runtime

TOKEN_A = f"tok-a-{secrets.token_hex(6)}"
TOKEN_B = f"tok-b-{secrets.token_hex(6)}"
PLAY = ResolvedPlay(
    "play-enrich-1",
    source_code="export default async (row) => ({ domain: row.email.split('@')[1] })",
    artifact={"bundle": "v1", "size": 3},
    code_format="esm_module",
    contract_snapshot={"columns": [{"id": "email", "sqlName": "email", "source": "input"}]},
)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN_A: "org-a", TOKEN_B: "org-b"}) as gw:
        yield gw


def client(base_url: str, token: str) -> GatewayClient:
    return GatewayClient(base_url, token, play_name="any-play")


async def test_a_play_resolves_by_id_and_name_in_its_org_only(gateway: RunningGateway) -> None:
    async with client(gateway.base_url, TOKEN_A) as a, client(gateway.base_url, TOKEN_B) as b:
        await a.register_play(PLAY, name="enrich-leads")
        assert await a.resolve_play("play-enrich-1") == PLAY
        assert await a.resolve_play("enrich-leads") == PLAY
        assert await a.resolve_play("no-such-play") is None
        # org-b sees none of org-a's plays, by id or by name...
        assert await b.resolve_play("play-enrich-1") is None
        assert await b.resolve_play("enrich-leads") is None
        # ...and a play of the same id in org-b is org-b's own.
        await b.register_play(ResolvedPlay("play-enrich-1", source_code="b's"))
        assert await b.resolve_play("play-enrich-1") == ResolvedPlay("play-enrich-1", "b's")
        assert await a.resolve_play("play-enrich-1") == PLAY


async def test_registering_for_another_org_is_refused(gateway: RunningGateway) -> None:
    response = await post_action(
        gateway.base_url,
        TOKEN_B,
        "register_play",
        {"play": {"orgId": "org-a", "playId": "sneaky"}},
    )
    assert response.status_code == 400
    assert "orgId must be the token's org" in response.json()["error"]
    async with client(gateway.base_url, TOKEN_A) as a:
        assert await a.resolve_play("sneaky") is None


async def test_a_name_already_taken_is_refused(gateway: RunningGateway) -> None:
    async with client(gateway.base_url, TOKEN_A) as a:
        await a.register_play(ResolvedPlay("p-1"), name="shared-name")
        response = await post_action(
            gateway.base_url,
            TOKEN_A,
            "register_play",
            {"play": {"playId": "p-2", "name": "shared-name"}},
        )
        assert response.status_code == 400
        assert await a.resolve_play("shared-name") == ResolvedPlay("p-1")


@pytest.mark.parametrize("strategy", ["direct", "gateway_only"])
async def test_the_runtime_resolves_through_serve_plays_dir(
    database_url: str, tmp_path: Path, strategy: Strategy
) -> None:
    plays = tmp_path / "plays"
    plays.mkdir()
    (plays / "a.json").write_text(
        json.dumps(
            {
                "orgId": "org-a",
                "playId": PLAY.play_id,
                "name": "enrich-leads",
                "sourceCode": PLAY.source_code,
                "artifact": PLAY.artifact,
                "codeFormat": PLAY.code_format,
                "contractSnapshot": PLAY.contract_snapshot,
            }
        )
    )
    (plays / "b.json").write_text(json.dumps([{"orgId": "org-b", "playId": "b-only"}]))
    async with serving(
        "--database-url",
        database_url,
        "--plays",
        str(plays),
        tmp_path=tmp_path,
        env={"SHEETPLANE_GATEWAY_TOKENS": f"{TOKEN_A}=org-a,{TOKEN_B}=org-b"},
    ) as served:
        for token, org, mine, theirs in (
            (TOKEN_A, "org-a", "enrich-leads", "b-only"),
            (TOKEN_B, "org-b", "b-only", "enrich-leads"),
        ):
            async with open_runtime(
                base_url=served.base_url,
                token=token,
                org_id=org,
                play_name="enrich-leads",
                run_id="run-1",
                strategy=strategy,
            ) as rt:
                resolved = await rt.resolve_play(mine)
                assert resolved is not None
                assert await rt.resolve_play(theirs) is None
        assert resolved == ResolvedPlay("b-only")


def test_load_plays_names_the_bad_file_and_item(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text(json.dumps({"orgId": "o", "playId": "p"}))
    (tmp_path / "z.json").write_text(json.dumps([{"orgId": "o", "playId": "q"}, {"orgId": "o"}]))
    with pytest.raises(InvalidInputError, match=r"z\.json\[1\]: playId is required"):
        load_plays(tmp_path)
    (tmp_path / "z.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match=r"z\.json: not a JSON file"):
        load_plays(tmp_path)


async def test_resolve_play_rides_its_own_ladder(autojump_clock: Any) -> None:
    sent: list[float] = []

    async def unavailable(request: httpx.Request) -> httpx.Response:
        sent.append(trio.current_time())
        return httpx.Response(503, json={"error": "starting"})

    transport = httpx.MockTransport(unavailable)
    async with GatewayClient("http://gw.test", "tok", play_name="p", transport=transport) as c:
        start = trio.current_time()
        with pytest.raises(TransientGatewayError):
            await c.resolve_play("p")
    expected = [start]
    for delay in RESOLVE_PLAY_RETRY_DELAYS_MS:
        expected.append(expected[-1] + delay / 1000)
    assert sent == expected  # len(ladder) + 1 attempts, one rung apart
