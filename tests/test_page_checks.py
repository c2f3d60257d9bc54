"""A page request is checked once on each road.

The direct road checks it where it enters the store (``check_page_batch``,
``check_page_request``, a keyset read's ``CheckedPage``); the gateway road
where it enters the client (the same checks, whose ``CheckedPage``s the client
writes without the wire class's rules) and where the reference gateway
decodes it (the wire class, whose result the store reads as ``CheckedPages``
or a ``CheckedPage`` without checking again). A page's rules are counted by
the two places they live: the domain's ``check_int`` (``check_page_request``,
``CheckedPage`` and ``PageRequest``'s own validator call it) and the wire
classes' initialisers (their field rules: ``PageRequestWire`` for a batch's
pages, ``ReadRowKeysInput`` and ``ReadRowsInput`` for a single read's).
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from _runtime_helpers import ROADS, counting_gateway, new_play, runtime, seeding, sheet_of
from sheetplane import _types
from sheetplane import protocol as m
from sheetplane._types import (
    CheckedPage,
    CheckedPages,
    ContractColumn,
    PageRequest,
    SheetContract,
    SheetRef,
    check_page_batch,
    check_page_request,
)
from sheetplane.budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS
from sheetplane.errors import InvalidInputError
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.protocol import WireError, build_checked
from sheetplane.runtime import Strategy
from sheetplane.store import RowFilter, SheetStore

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

    monkeypatch.setattr(_types, "check_int", counted)
    for cls in (m.PageRequestWire, m.ReadRowKeysInput, m.ReadRowsInput):
        monkeypatch.setattr(cls, "__init__", _counted_init(cls.__init__, seen))
    yield seen


def _counted_init(init: Any, seen: Counter[str]) -> Any:
    def counted_init(self: object, **fields: Any) -> None:
        seen["wire"] += 1
        init(self, **fields)

    return counted_init


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


# --- single-page reads: read_rows, read_rows_after, read_row_keys ----------------------------

#: The single-page reads, by the name of the store's and the client's method.
SINGLE_READS = ["read_rows", "read_rows_after", "read_row_keys"]
PAGE = (4, 8)
CONTRACT = SheetContract((ContractColumn("Company", "company", "input"),))


async def _direct(store: SheetStore, sheet: SheetRef, action: str, page: Any) -> object:
    if action == "read_rows_after":
        return await store.read_rows_after(sheet, None, page)
    read = store.read_rows if action == "read_rows" else store.read_row_keys
    return await read(sheet, page)


async def _through_client(client: GatewayClient, action: str, page: Any) -> object:
    if action == "read_rows_after":
        return await client.read_rows_after("leads", None, page, 0)
    read = client.read_rows if action == "read_rows" else client.read_row_keys
    return await read("leads", page)


def _answering_one_page(sent: list[dict[str, Any]]) -> Any:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        spec = body["input"]
        echo = {"limit": spec["limit"], "offset": spec["offset"]}
        if body["action"] == "runtime_sheet_read_row_keys":
            return httpx.Response(200, json={"keys": [], **echo})
        extra = {"nextAfter": None} if "after" in spec else {}
        return httpx.Response(200, json={"rows": [], **echo, **extra})

    return answer


@pytest.fixture
async def made_sheet(store: SheetStore, namespace: str) -> SheetRef:
    """The test's sheet, made (a read of a sheet never made returns before it reads)."""
    sheet = SheetRef(ORG, PLAY, namespace)
    await store.ensure_sheet(sheet, CONTRACT)
    return sheet


@pytest.mark.parametrize("action", SINGLE_READS)
async def test_the_direct_road_checks_a_single_page_once_where_it_enters_the_store(
    store: SheetStore, made_sheet: SheetRef, checks: Counter[str], action: str
) -> None:
    page: Any = PAGE[0] if action == "read_rows_after" else PageRequest(*PAGE)
    checks.clear()
    await _direct(store, made_sheet, action, page)
    assert checks == {"domain": 1}


@pytest.mark.parametrize("action", SINGLE_READS)
async def test_the_client_checks_a_single_page_once_and_writes_it_unchecked(
    checks: Counter[str], action: str
) -> None:
    page: Any = PAGE[0] if action == "read_rows_after" else PageRequest(*PAGE)
    sent: list[dict[str, Any]] = []
    checks.clear()
    async with _client(_answering_one_page(sent)) as client:
        await _through_client(client, action, page)
    assert checks == {"domain": 1}
    (body,) = sent
    offset = 0 if action == "read_rows_after" else PAGE[1]
    assert body["input"] == {
        "tableNamespace": "leads",
        "limit": PAGE[0],
        "offset": offset,
        **({"after": None} if action == "read_rows_after" else {}),
    }


@pytest.mark.parametrize("action", SINGLE_READS)
async def test_the_gateway_checks_a_single_page_once_as_it_decodes_it(
    gateway: RunningGateway, made_sheet: SheetRef, checks: Counter[str], action: str
) -> None:
    namespace = made_sheet.table_namespace
    wire_action = (
        "runtime_sheet_read_row_keys" if action == "read_row_keys" else ("runtime_sheet_read_rows")
    )
    spec: dict[str, Any] = {"tableNamespace": namespace, "limit": PAGE[0], "offset": PAGE[1]}
    if action == "read_rows_after":
        spec["after"] = None
    body = {"action": wire_action, "playName": PLAY, "input": spec}
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        response = await http.post(RUNTIME_PATH, json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert (response.json()["limit"], response.json()["offset"]) == PAGE
        assert checks == {"wire": 1}
        checks.clear()
        spec["limit"] = READ_PAGE_MAX_ROWS + 1
        refused = await http.post(RUNTIME_PATH, json=body, headers=headers)
    assert refused.status_code == 400
    assert refused.json() == {
        "error": f"input.limit must be between 1 and {READ_PAGE_MAX_ROWS}, "
        f"got {READ_PAGE_MAX_ROWS + 1}",
        "code": "invalid_request",
    }
    assert checks == {"wire": 1}


@pytest.mark.parametrize("action", ["read_rows", "read_row_keys"])
@pytest.mark.parametrize(
    "page",
    [
        PageRequest(READ_PAGE_MAX_ROWS + 1, 0),
        PageRequest(1, 2**63),
        {"limit": 1, "offset": 0},
        (1, 0),
        None,
    ],
)
async def test_bad_single_pages_are_refused_alike_on_both_roads(
    store: SheetStore, namespace: str, action: str, page: Any
) -> None:
    with pytest.raises(InvalidInputError) as direct:
        await _direct(store, SheetRef(ORG, PLAY, namespace), action, page)
    async with _client(_never_sent) as client:
        with pytest.raises(InvalidInputError) as gateway:
            await _through_client(client, action, page)
    assert str(gateway.value) == str(direct.value)


@pytest.mark.parametrize("limit", [0, -1, READ_PAGE_MAX_ROWS + 1, "4", True, 1.5, None])
async def test_bad_keyset_limits_are_refused_alike_on_both_roads(
    store: SheetStore, namespace: str, limit: Any
) -> None:
    with pytest.raises(InvalidInputError) as direct:
        await _direct(store, SheetRef(ORG, PLAY, namespace), "read_rows_after", limit)
    async with _client(_never_sent) as client:
        with pytest.raises(InvalidInputError) as gateway:
            await _through_client(client, "read_rows_after", limit)
    assert str(gateway.value) == str(direct.value)


def test_a_checked_page_is_a_page_request_checked_once() -> None:
    plain = PageRequest(3, 6)
    checked = check_page_request(plain)
    assert type(checked) is CheckedPage
    assert check_page_request(checked) is checked
    assert checked == plain and plain == checked
    assert (checked != plain) is False and (plain != checked) is False
    assert hash(checked) == hash(plain) and repr(checked) == repr(plain)
    assert type(pickle.loads(pickle.dumps(checked))) is CheckedPage
    assert all(type(page) is CheckedPage for page in check_page_batch([plain]))
    with pytest.raises(InvalidInputError, match="limit must be between 1 and"):
        CheckedPage(READ_PAGE_MAX_ROWS + 1, 0)
    with pytest.raises(InvalidInputError, match="offset must be between 0 and"):
        CheckedPage(1, -1)


def test_a_single_read_input_built_around_a_checked_page_keeps_the_other_rules() -> None:
    page = CheckedPage(*PAGE)
    fields = {"table_namespace": "leads", "run_id": "run-1"}
    built = build_checked(m.ReadRowsInput, {"limit": page.limit, "offset": page.offset}, **fields)
    assert built == m.build(m.ReadRowsInput, limit=page.limit, offset=page.offset, **fields)
    with pytest.raises(WireError) as around:
        build_checked(m.ReadRowKeysInput, {"limit": 1, "offset": 0}, table_namespace=" ")
    with pytest.raises(WireError) as whole:
        m.build(m.ReadRowKeysInput, limit=1, offset=0, table_namespace=" ")
    assert str(around.value) == str(whole.value) == "tableNamespace must be a non-empty string"


@pytest.mark.parametrize("strategy", ROADS)
async def test_a_runtime_road_checks_each_page_once(
    store: SheetStore, database_url: str, checks: Counter[str], strategy: Strategy
) -> None:
    """The runtime hands the store and the client the pages it checked: the page
    reader's (``normalize_page_request``, read in a batch), a road's ``read_after``'s,
    and a run's ``count`` on the gateway road (it reads keys by pages)."""
    play, ns = new_play(), "keyset"
    async with seeding(store) as seed, counting_gateway(database_url) as gw:
        await seed(sheet_of(play, ns), 10)
        async with runtime(gw, strategy, play=play) as rt:
            road = rt.road(ns, RowFilter(run_id="run-1"))
            await road.count()  # the session exists before counting
            checks.clear()
            rows, _ = await road.read_after(None, 4)
            assert len(rows) == 4
            via_gateway = strategy != "direct"
            assert checks == ({"domain": 1, "wire": 1} if via_gateway else {"domain": 1})
            checks.clear()
            assert await road.count() == 10
            assert checks == ({"domain": 1, "wire": 1} if via_gateway else {})
            checks.clear()
            page = await rt.reader.read_page(road, 3, 2)
            assert (len(page.rows), page.limit, page.offset) == (3, 3, 2)
            assert checks == ({"domain": 1, "wire": 1} if via_gateway else {"domain": 1})
