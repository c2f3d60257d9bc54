"""A batch read's pages are checked once on each road.

The direct road checks them where they enter the store (``check_page_batch``);
the gateway road where they enter the client (the same check) and where the
reference gateway decodes them (the wire class, whose result the store reads
as ``CheckedPages`` without checking again). A page's rules are counted by
the two places they live: the domain's ``check_int`` (``check_page_request``
and ``PageRequest``'s own validator call it) and ``PageRequestWire``'s
initialiser (its field rules).
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sheetplane import _types
from sheetplane._types import CheckedPages, PageRequest, SheetRef, check_page_batch
from sheetplane.budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS
from sheetplane.errors import InvalidInputError
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.protocol import _messages as m
from sheetplane.store import SheetStore

TOKEN = "tok-pages-5c1d7e2a"
ORG = "acme"
PLAY = "enrich-leads"
PAGES = [(2, 0), (2, 2), (5, 40)]


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How many times a page's ``limit`` was held to a rule, by where the rule lives."""
    seen: Counter[str] = Counter()
    check_int = _types.check_int

    def counted(what: str, value: object, minimum: int, maximum: int | None = None) -> int:
        if what == "limit":
            seen["domain"] += 1
        return check_int(what, value, minimum, maximum)

    wire_init = m.PageRequestWire.__init__

    def counted_init(self: m.PageRequestWire, **fields: Any) -> None:
        seen["wire"] += 1
        wire_init(self, **fields)

    monkeypatch.setattr(_types, "check_int", counted)
    monkeypatch.setattr(m.PageRequestWire, "__init__", counted_init)
    yield seen


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}) as gw:
        yield gw


def _answering_pages(request: httpx.Request) -> httpx.Response:
    pages = json.loads(request.content)["input"]["pages"]
    return httpx.Response(200, json={"pages": [{"rows": [], **page} for page in pages]})


def _client(handler: Any) -> GatewayClient:
    return GatewayClient(
        "http://gw.test", TOKEN, play_name=PLAY, transport=httpx.MockTransport(handler)
    )


def _never_sent(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"a refused batch was sent: {request.content!r}")


async def test_the_direct_road_checks_each_page_once_where_it_enters_the_store(
    store: SheetStore, namespace: str, checks: Counter[str]
) -> None:
    pages = [PageRequest(limit, offset) for limit, offset in PAGES]
    checks.clear()
    read = await store.read_rows_batch(SheetRef(ORG, PLAY, namespace), pages)
    assert [(p.limit, p.offset) for p in read] == PAGES
    assert checks == {"domain": len(PAGES)}


async def test_the_client_checks_each_page_once_and_writes_it_unchecked(
    checks: Counter[str],
) -> None:
    pages = [PageRequest(limit, offset) for limit, offset in PAGES]
    checks.clear()
    async with _client(_answering_pages) as client:
        read = await client.read_rows_batch("leads", pages)
    assert [(p.limit, p.offset) for p in read] == PAGES
    assert checks == {"domain": len(PAGES)}


async def test_the_gateway_checks_each_page_once_as_it_decodes_it(
    gateway: RunningGateway, namespace: str, checks: Counter[str]
) -> None:
    body = {
        "action": "runtime_sheet_read_rows_batch",
        "playName": PLAY,
        "input": {
            "tableNamespace": namespace,
            "pages": [{"limit": limit, "offset": offset} for limit, offset in PAGES],
        },
    }
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        response = await http.post(
            RUNTIME_PATH, json=body, headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert response.status_code == 200, response.text
        assert [(p["limit"], p["offset"]) for p in response.json()["pages"]] == PAGES
        assert checks == {"wire": len(PAGES)}
        checks.clear()
        body["input"]["pages"] = [{"limit": 0, "offset": 0}]
        refused = await http.post(
            RUNTIME_PATH, json=body, headers={"authorization": f"Bearer {TOKEN}"}
        )
    assert refused.status_code == 400
    assert refused.json() == {
        "error": f"input.pages[0].limit must be between 1 and {READ_PAGE_MAX_ROWS}, got 0",
        "code": "invalid_request",
    }
    assert checks == {"wire": 1}


@pytest.mark.parametrize(
    "pages",
    [
        [],
        [PageRequest(1, n) for n in range(READ_BATCH_MAX_PAGES + 1)],
        [PageRequest(READ_PAGE_MAX_ROWS + 1, 0)],
        [PageRequest(1, 0), PageRequest(1, 2**63)],
        [{"limit": 1, "offset": 0}],
        PageRequest(1, 0),
        "pages",
    ],
)
async def test_bad_pages_are_refused_alike_on_both_roads(
    store: SheetStore, namespace: str, pages: Any
) -> None:
    with pytest.raises(InvalidInputError) as direct:
        await store.read_rows_batch(SheetRef(ORG, PLAY, namespace), pages)
    async with _client(_never_sent) as client:
        with pytest.raises(InvalidInputError) as gateway:
            await client.read_rows_batch(namespace, pages)
    assert str(gateway.value) == str(direct.value)


def test_checked_pages_are_made_only_by_their_check() -> None:
    with pytest.raises(TypeError):
        CheckedPages([PageRequest(0 + 1, 0)], object())
    checked = check_page_batch([PageRequest(3, 6)])
    assert check_page_batch(checked) is checked
    assert pickle.loads(pickle.dumps(checked)) == checked
    assert type(pickle.loads(pickle.dumps(checked))) is CheckedPages
