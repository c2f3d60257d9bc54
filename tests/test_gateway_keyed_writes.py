"""The gateway's keyed writes (``runtime_sheet_append_rows``, ``runtime_sheet_upsert_rows``,
``runtime_sheet_replace_rows``): refused requests write nothing, and a token reaches only
its own org's sheets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from _runtime_helpers import ORG, CountingGateway, counting_gateway, new_play, sheet_exists
from sheetplane._types import SheetRef
from sheetplane.budgets import TRANSPORT_CEILING_BYTES
from sheetplane.protocol import RUNTIME_PATH

OTHER_ORG = "acme-other"
OTHER_TOKEN = "tok-other-org-keyed"
CONTRACT = {"columns": [{"id": "text", "sqlName": "text", "source": "input"}]}
KEYED = ("runtime_sheet_append_rows", "runtime_sheet_upsert_rows", "runtime_sheet_replace_rows")


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[CountingGateway]:
    async with counting_gateway(database_url, more_tokens={OTHER_TOKEN: OTHER_ORG}) as gw:
        yield gw


async def _post(gw: CountingGateway, token: str, body: Any = None, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        return await http.post(RUNTIME_PATH, json=body, headers=headers, **kw)


def _write(action: str, play: str, rows: list[Any], key: str = "k-1") -> dict[str, Any]:
    return {
        "action": action,
        "playName": play,
        "tableNamespace": "notes",
        "sheetContract": CONTRACT,
        "rows": rows,
        "idempotencyKey": key,
        "runId": "run-1",
    }


async def _count(gw: CountingGateway, org: str, play: str) -> int:
    return (await gw.state.store.summary(SheetRef(org, play, "notes"))).total


@pytest.mark.parametrize("action", KEYED)
async def test_a_bad_row_is_refused_before_the_sheet_is_created(
    gateway: CountingGateway, action: str
) -> None:
    play = new_play()
    bad = await _post(gateway, gateway.token, _write(action, play, [{"text": "a"}, {"t": "\x00"}]))
    assert (bad.status_code, "row 1" in bad.json()["error"]) == (400, True)
    bad_run = await _post(gateway, gateway.token, {**_write(action, play, []), "runId": "r\x00"})
    assert (bad_run.status_code, "run_id" in bad_run.json()["error"]) == (400, True)
    assert not await sheet_exists(gateway.state.store, SheetRef(ORG, play, "notes"))


async def test_a_body_past_the_transport_ceiling_is_413_and_creates_nothing(
    gateway: CountingGateway,
) -> None:
    play = new_play()
    head = f'{{"action":"{KEYED[0]}","playName":"{play}","pad":"'.encode()
    huge = await _post(
        gateway, gateway.token, content=head + b"x" * TRANSPORT_CEILING_BYTES + b'"}'
    )
    assert (huge.status_code, huge.json()["code"]) == (413, "request_too_large")
    assert not await sheet_exists(gateway.state.store, SheetRef(ORG, play, "notes"))


async def test_a_token_writes_only_its_own_orgs_sheet(gateway: CountingGateway) -> None:
    play = new_play()
    mine = await _post(gateway, gateway.token, _write(KEYED[0], play, [{"text": "a"}]))
    assert mine.json() == {"written": 1, "replayed": False}
    # The other org's token, the same play and namespace: its own sheet, not this one.
    theirs = await _post(gateway, OTHER_TOKEN, _write(KEYED[2], play, [{"text": "x"}] * 3))
    assert theirs.json() == {"written": 3, "replayed": False}
    # Naming this org in the body does not lend it this org's sheet.
    named = await _post(
        gateway, OTHER_TOKEN, {**_write(KEYED[1], play, [{"text": "y"}]), "orgId": ORG}
    )
    assert named.status_code == 403
    assert (await _count(gateway, ORG, play), await _count(gateway, OTHER_ORG, play)) == (1, 3)
