"""The seed profile's checks: the actions the seed's runtime calls, their answers, their errors.

(Scoped sessions are in ``_sessions``, the timed budgets in ``_budgets``.)
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from ..budgets import READ_BATCH_MAX_PAGES, READ_BATCH_MAX_RESPONSE_BYTES
from ._context import CONTRACT, CheckFailed, CheckSkipped, Context, check, expect, ok, rows_of
from ._http import Exchange

BACKPRESSURE_CODE: Final = "runtime_postgres_admission_backpressure"
READ_BATCH_TOO_LARGE: Final = "runtime_sheet_read_batch_too_large"
#: The reference gateway's test-fault header (honoured only when it allows test faults).
FAULT_HEADER: Final = "x-sheetplane-test-fault"


def json_error(exchange: Exchange, status: int, what: str) -> None:
    expect(
        exchange.status == status and isinstance(exchange.json_object.get("error"), str),
        f"{what}: {status} with a JSON body whose error is a string",
        exchange,
    )


def row_keys_of(rows: Any) -> list[Any]:
    return [row.get("_key") for row in rows] if isinstance(rows, list) else []


def _page_ok(page: Any, limit: int, offset: int) -> bool:
    return (
        isinstance(page, dict)
        and page.get("limit") == limit
        and page.get("offset") == offset
        and isinstance(page.get("rows"), list)
        and len(page["rows"]) <= limit
        and all(isinstance(row, dict) for row in page["rows"])
    )


@check("SP-AUTH-1")
def no_token(ctx: Context) -> None:
    payload = {"tableNamespace": ctx.namespace("auth"), "sheetContract": CONTRACT}
    json_error(ctx.wire.post("ensure_sheet", payload, token=None), 401, "no token")
    wrong = f"{ctx.prefix}-not-a-token-{uuid.uuid4().hex}"
    json_error(ctx.wire.post("ensure_sheet", payload, token=wrong), 401, "an unknown token")


@check("SP-ERR-1")
def unknown_action(ctx: Context) -> None:
    answer = ctx.wire.post("conformance_unknown_action", {})
    expect(
        answer.unsupported,
        "400 whose error contains 'Unsupported runtime data-plane action'",
        answer,
    )


@check("SP-ERR-2")
def malformed(ctx: Context) -> None:
    json_error(ctx.wire.post_body([1, 2, 3]), 400, "a body that is not a JSON object")
    json_error(ctx.wire.post_body({"playName": ctx.prefix}), 400, "a body without action")
    no_input = ctx.wire.post("runtime_sheet_read_rows", {})
    json_error(no_input, 400, "runtime_sheet_read_rows without input")


@check("SP-SHEET-1")
def ensure_sheet(ctx: Context) -> None:
    payload = {"tableNamespace": ctx.namespace("ensure"), "sheetContract": CONTRACT}
    for _ in range(2):
        answer = ctx.wire.post("ensure_sheet", payload)
        expect(ok(answer).get("ok") is True, "{ok: true}", answer)


@check("SP-ADMIT-1")
def admission_answer(ctx: Context) -> None:
    admitted = ctx.fresh(range(5), tag="admit")
    namespace = admitted.namespace
    body = admitted.answer.json_object
    expect(
        body.get("inserted") == 5
        and body.get("skipped") == 0
        and body.get("completedRows") == []
        and body.get("tableNamespace") == namespace
        and isinstance(body.get("writeVersion"), int)
        and len(body.get("pendingRows") or []) == 5,
        "inserted 5, skipped 0, five pendingRows, no completedRows, the tableNamespace "
        "echoed and an integer writeVersion for five new rows",
        admitted.answer,
    )


@check("SP-ADMIT-2")
def admission_keys(ctx: Context) -> None:
    admitted = ctx.fresh([3, 1, 4, 0, 2], tag="keys")
    pending = admitted.answer.json_object["pendingRows"]
    expect(
        [row.get("n") for row in pending] == [3, 1, 4, 0, 2]
        and len(set(admitted.keys)) == 5
        and all(key for key in admitted.keys),
        "pendingRows in input order (n = 3, 1, 4, 0, 2), each with its own non-empty _key",
        admitted.answer,
    )


@check("SP-ADMIT-3")
def admission_dedupe(ctx: Context) -> None:
    admitted = ctx.fresh([7, 8, 7], tag="dedupe")
    body = admitted.answer.json_object
    expect(
        body.get("inserted") == 2
        and body.get("skipped") == 1
        and [row.get("n") for row in body["pendingRows"]] == [7, 8],
        "inserted 2, skipped 1 and pendingRows n = 7, 8 for rows 7, 8, 7",
        admitted.answer,
    )


@check("SP-ADMIT-4")
def admission_versions(ctx: Context) -> None:
    first = ctx.fresh([1], tag="versions")
    second = ctx.admit(first.namespace, rows_of([1, 2], first.salt), ctx.name("run"))
    third = ctx.fresh([3], tag="versions")
    expect(
        first.write_version < second.write_version < third.write_version,
        f"increasing writeVersions (first {first.write_version}, second {second.write_version})",
        third.answer,
    )


@check("SP-READ-1")
def read_rows(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    answer = ctx.read(sheet.namespace, 4, 2)
    body = ok(answer)
    expect(
        _page_ok(body, 4, 2)
        and len(body["rows"]) == 4
        and all(isinstance(r.get("_key"), str) for r in body["rows"]),
        "{rows, limit: 4, offset: 2} with 4 row objects carrying _key",
        answer,
    )


@check("SP-READ-2")
def read_order(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    keys: list[Any] = []
    for offset in range(0, 12, 3):
        answer = ctx.read(sheet.namespace, 3, offset)
        keys.extend(row_keys_of(ok(answer).get("rows")))
    expect(
        keys == list(sheet.keys),
        f"pages of 3 to return the ten keys in input order, once each: {list(sheet.keys)}",
        detail=f"got {keys}",
    )


def _batch_pages(answer: Exchange, count: int) -> list[Any]:
    pages = ok(answer).get("pages")
    expect(
        isinstance(pages, list) and len(pages) == count,
        f"{{pages: [...]}} holding {count} pages",
        answer,
    )
    assert isinstance(pages, list)
    return pages


@check("SP-READ-3")
def batch_order(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    requested = [(2, 6), (2, 0), (3, 3), (1, 9)]
    answer = ctx.read_batch(sheet.namespace, requested)
    pages = _batch_pages(answer, len(requested))
    got = [(page.get("limit"), page.get("offset")) for page in pages]
    want = [list(sheet.keys[offset : offset + limit]) for limit, offset in requested]
    expect(
        got == requested and [row_keys_of(page.get("rows")) for page in pages] == want,
        f"pages in request order {requested}, page i holding the rows at its offset",
        answer,
    )


@check("SP-READ-4")
def batch_echo(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    requested = [(5, 0), (5, 8), (10, 3)]
    answer = ctx.read_batch(sheet.namespace, requested)
    pages = _batch_pages(answer, len(requested))
    expect(
        all(
            _page_ok(p, limit, offset) for p, (limit, offset) in zip(pages, requested, strict=True)
        ),
        f"each page echoing its (limit, offset) of {requested} with at most limit row objects",
        answer,
    )


@check("SP-READ-5")
def batch_matches_single(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    requested = [(3, 1), (4, 5)]
    batch = ctx.read_batch(sheet.namespace, requested)
    pages = _batch_pages(batch, len(requested))
    for page, (limit, offset) in zip(pages, requested, strict=True):
        single = ctx.read(sheet.namespace, limit, offset)
        expect(
            isinstance(page, dict) and page.get("rows") == ok(single).get("rows"),
            f"the batch page ({limit}, {offset}) to hold the rows a single read answers",
            batch,
        )


@check("SP-READ-6")
def past_the_end(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    single = ctx.read(sheet.namespace, 5, 40)
    body = ok(single)
    expect(_page_ok(body, 5, 40) and body["rows"] == [], "{rows: [], limit: 5, offset: 40}", single)
    batch = ctx.read_batch(sheet.namespace, [(5, 40), (2, 9)])
    pages = _batch_pages(batch, 2)
    expect(
        _page_ok(pages[0], 5, 40)
        and pages[0]["rows"] == []
        and _page_ok(pages[1], 2, 9)
        and len(pages[1]["rows"]) == 1,
        "a page past the end empty with its limit and offset, a page over the end short",
        batch,
    )


@check("SP-READ-7")
def batch_page_count(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    for pages in ([], [(1, i) for i in range(READ_BATCH_MAX_PAGES + 1)]):
        answer = ctx.read_batch(sheet.namespace, pages)
        json_error(answer, 400, f"a batch of {len(pages)} pages")


@check("SP-READ-8")
def row_keys(ctx: Context) -> None:
    sheet = ctx.shared_sheet()
    spec = {"tableNamespace": sheet.namespace, "limit": 4, "offset": 3}
    answer = ctx.wire.post("runtime_sheet_read_row_keys", {"input": spec})
    body = ok(answer)
    expect(
        body.get("keys") == list(sheet.keys[3:7])
        and body.get("limit") == 4
        and body.get("offset") == 3,
        f"{{keys: {list(sheet.keys[3:7])}, limit: 4, offset: 3}}",
        answer,
    )


@check("SP-READ-9")
def read_by_run(ctx: Context) -> None:
    first = ctx.fresh([1, 2], tag="byrun")
    second = ctx.fresh([3, 4, 5], tag="byrun")
    for admitted in (first, second):
        answer = ctx.read(admitted.namespace, 10, 0, runId=admitted.run_id)
        expect(
            row_keys_of(ok(answer).get("rows")) == list(admitted.keys),
            f"only the rows run {admitted.run_id} admitted: {list(admitted.keys)}",
            answer,
        )


def fault_headers(ctx: Context, spec: str) -> dict[str, str]:
    """The reference gateway's test-fault header arming ``spec`` once (a fresh nonce)."""
    return {FAULT_HEADER: f"{spec}; nonce={ctx.name('fault')}"}


def too_large_ok(answer: Exchange) -> bool:
    """413 ``runtime_sheet_read_batch_too_large``, a numeric ``observed_bytes`` past the budget."""
    body = answer.json_object
    observed = body.get("observed_bytes")
    return (
        answer.status == 413
        and body.get("code") == READ_BATCH_TOO_LARGE
        and isinstance(observed, int | float)
        and not isinstance(observed, bool)
        and observed > READ_BATCH_MAX_RESPONSE_BYTES
    )


@check("SP-READ-10")
def batch_too_large(ctx: Context) -> None:
    from ._budgets import big_sheet

    if ctx.quick:
        sheet = ctx.shared_sheet()
        headers = fault_headers(ctx, "runtime_sheet_read_rows_batch=413")
        answer = ctx.read_batch(sheet.namespace, [(1, 0)], headers=headers)
        if answer.status == 200:
            raise CheckSkipped(
                "--quick and the gateway ignores the test-fault header: no body over 12 MiB "
                "was built to provoke the 413"
            )
    else:
        answer = ctx.read_batch(big_sheet(ctx).namespace, [(50, 0)] * READ_BATCH_MAX_PAGES)
    expect(
        too_large_ok(answer),
        f"413 code {READ_BATCH_TOO_LARGE} with a numeric observed_bytes over "
        f"{READ_BATCH_MAX_RESPONSE_BYTES}",
        answer,
    )


@check("SP-BP-1")
def backpressure(ctx: Context) -> None:
    payload = {"tableNamespace": ctx.namespace("bp"), "sheetContract": CONTRACT}
    provoked = ctx.wire.post(
        "ensure_sheet", payload, headers=fault_headers(ctx, "ensure_sheet=backpressure")
    )
    seen = [
        e
        for e in ctx.wire.exchanges
        if e.status == 503 and e.json_object.get("code") == BACKPRESSURE_CODE
    ]
    if provoked.status != 503 and not seen:
        raise CheckSkipped(
            "the gateway answered no back-pressure in this run (the test-fault header "
            "was ignored; the reference gateway honours it with --allow-test-faults)"
        )
    for exchange in seen or [provoked]:
        retry = exchange.json_object.get("retry_after_ms")
        expect(
            exchange.json_object.get("code") == BACKPRESSURE_CODE
            and isinstance(retry, int)
            and not isinstance(retry, bool)
            and retry >= 0,
            f"503 code {BACKPRESSURE_CODE} with a non-negative integer retry_after_ms",
            exchange,
        )
    if provoked.status == 503:
        again = ctx.wire.post("ensure_sheet", payload)
        expect(ok(again).get("ok") is True, "the retried request to succeed: {ok: true}", again)


@check("SP-PLAY-1")
def unknown_play(ctx: Context) -> None:
    answer = ctx.wire.post("resolve_play", {"playRef": ctx.name("no-such-play")})
    body = ok(answer)
    expect("play" in body and body["play"] is None, "{play: null}", answer)


@check("SP-TENANT-1")
def other_org_reads_nothing(ctx: Context) -> None:
    if ctx.wire_b is None:
        raise CheckSkipped("needs a second org's token (--token-b)")
    sheet = ctx.shared_sheet()
    answer = ctx.wire_b.post(
        "runtime_sheet_read_rows",
        {"input": {"tableNamespace": sheet.namespace, "limit": 10, "offset": 0}},
    )
    if answer.status == 200:
        rows = ok(answer).get("rows")
        expect(rows == [], "another org to read no rows of this sheet", answer)
    elif answer.status in (401, 403):
        raise CheckFailed("the second token to be a valid token of another org", answer)
    else:
        expect(
            400 <= answer.status < 500 and "error" in answer.json_object,
            "another org's read answered 200 with no rows or a JSON 4xx",
            answer,
        )
