"""The sheetplane profile's checks: gateway writes and fencing, summary, receipts and
leases, staged admission, plays and the operating routes."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ._checks_seed import json_error, row_keys_of
from ._context import CONTRACT, Admitted, CheckSkipped, Context, check, expect, ok, rows_of
from ._http import Exchange

#: The actions the sheetplane profile expects the OpenAPI document to name.
SHEETPLANE_ACTIONS: Final = (
    "ensure_sheet",
    "start_sheet_dataset",
    "create_db_session",
    "runtime_sheet_read_rows",
    "runtime_sheet_read_rows_batch",
    "runtime_sheet_read_row_keys",
    "runtime_sheet_complete_map_rows",
    "runtime_sheet_fail_map_rows",
    "runtime_sheet_append_rows",
    "runtime_sheet_upsert_rows",
    "runtime_sheet_replace_rows",
    "complete_work_receipt",
    "claim_work_receipt",
    "release_work_receipt",
    "runtime_sheet_summary",
    "resolve_play",
    "register_play",
    "begin_sheet_admission",
    "stage_sheet_admission_chunk",
    "commit_sheet_admission",
    "abort_sheet_admission",
    "claim_sheet_share",
    "renew_sheet_share",
    "release_sheet_share",
    "sheet_attempt_status",
)
#: Members of a claim answer the kit knows; any other (a lease token) is sent back
#: with the holder's completion and release.
_CLAIM_MEMBERS: Final = frozenset({"acquired", "holder", "expiresAt", "receipt"})


def complete(
    ctx: Context,
    sheet: Admitted,
    keys: Sequence[str],
    *,
    out: Any = "done",
    version: int | object | None = ...,
    run_id: str | None = None,
) -> Exchange:
    """``runtime_sheet_complete_map_rows`` of ``keys`` (default: at the sheet's version)."""
    payload: dict[str, Any] = {
        "tableNamespace": sheet.namespace,
        "sheetContract": CONTRACT,
        "runId": run_id or sheet.run_id,
        "rows": [{"key": key, "data": {"out": out}} for key in keys],
    }
    written = sheet.write_version if version is ... else version
    if written is not None:
        payload["writeVersion"] = written
    return ctx.wire.post("runtime_sheet_complete_map_rows", payload)


def terminal(answer: Exchange) -> dict[str, Any]:
    """A terminal write's answer, checked for its four members."""
    body = ok(answer)
    expect(
        isinstance(body.get("committedKeys"), list)
        and isinstance(body.get("staleKeys"), list)
        and isinstance(body.get("staleRows"), list)
        and isinstance(body.get("updated"), int),
        "{committedKeys, staleKeys, staleRows, updated}",
        answer,
    )
    return body


def _stale(answer: Exchange, key: str, reason: str, stamp: Any) -> None:
    body = terminal(answer)
    expect(
        body["committedKeys"] == []
        and body["staleKeys"] == [key]
        and body["updated"] == 0
        and body["staleRows"] == [{"key": key, "reason": reason, "rowVersionStamp": stamp}],
        f"nothing committed, staleRows [{{key, reason: {reason}, rowVersionStamp: {stamp}}}]",
        answer,
    )


def _row(ctx: Context, namespace: str, key: str) -> dict[str, Any]:
    rows = [r for r in ctx.all_rows(namespace) if r.get("_key") == key]
    expect(len(rows) == 1, f"the sheet to hold row {key} once")
    return rows[0]


def _fresh(ctx: Context, tag: str, n_values: Sequence[int] = (1, 2, 3)) -> Admitted:
    return ctx.fresh(n_values, tag=tag)


@check("SP-WRITE-1")
def write_current(ctx: Context) -> None:
    sheet = _fresh(ctx, "write")
    answer = complete(ctx, sheet, sheet.keys[:2])
    body = terminal(answer)
    expect(
        body["committedKeys"] == list(sheet.keys[:2])
        and body["staleKeys"] == []
        and body["staleRows"] == []
        and body["updated"] == 2,
        "both keys committed, none stale, updated 2",
        answer,
    )
    row = _row(ctx, sheet.namespace, sheet.keys[0])
    expect(
        row.get("_status") == "enriched" and row.get("out") == "done",
        "the row to read back _status enriched with out 'done'",
        ctx.wire.exchanges[-1],
    )


@check("SP-WRITE-2")
def write_stale_attempt(ctx: Context) -> None:
    old = _fresh(ctx, "stale")
    new = ctx.admit(old.namespace, rows_of([1, 2, 3], old.salt), ctx.name("run"))
    answer = complete(ctx, old, old.keys[:1])
    _stale(answer, old.keys[0], "newer_write_version", new.write_version)
    row = _row(ctx, old.namespace, old.keys[0])
    expect(row.get("_status") == "pending", "the row left pending", ctx.wire.exchanges[-1])


@check("SP-WRITE-3")
def write_from_the_future(ctx: Context) -> None:
    sheet = _fresh(ctx, "future")
    answer = complete(ctx, sheet, sheet.keys[:1], version=sheet.write_version + 1)
    _stale(answer, sheet.keys[0], "older_write_version", sheet.write_version)


@check("SP-WRITE-4")
def write_unknown_key(ctx: Context) -> None:
    sheet = _fresh(ctx, "nokey")
    missing = f"{ctx.prefix}-no-such-key"
    _stale(complete(ctx, sheet, [missing]), missing, "newer_write_version", None)


@check("SP-WRITE-5")
def write_replay(ctx: Context) -> None:
    sheet = _fresh(ctx, "replay")
    terminal(complete(ctx, sheet, sheet.keys[:1]))
    answer = complete(ctx, sheet, sheet.keys[:1])
    body = terminal(answer)
    expect(
        body["committedKeys"] == [sheet.keys[0]]
        and body["updated"] == 0
        and body["staleRows"] == [],
        "the replay committed again with updated 0",
        answer,
    )


@check("SP-WRITE-6")
def write_conflict(ctx: Context) -> None:
    sheet = _fresh(ctx, "conflict")
    terminal(complete(ctx, sheet, sheet.keys[:1], out="first"))
    answer = complete(ctx, sheet, sheet.keys[:2], out="second")
    expect(
        answer.status == 409 and answer.json_object.get("code") == "write_conflict",
        "409 write_conflict",
        answer,
    )
    rows = {r.get("_key"): r for r in ctx.all_rows(sheet.namespace)}
    expect(
        rows[sheet.keys[0]].get("out") == "first"
        and rows[sheet.keys[1]].get("_status") == "pending",
        "nothing written: the first result kept, the other key still pending",
        ctx.wire.exchanges[-1],
    )


@check("SP-WRITE-7")
def write_unversioned_terminal(ctx: Context) -> None:
    sheet = _fresh(ctx, "unversioned")
    terminal(complete(ctx, sheet, sheet.keys[:1]))
    answer = complete(ctx, sheet, sheet.keys[:1], version=None, out="again")
    _stale(answer, sheet.keys[0], "already_terminal", sheet.write_version)


@check("SP-WRITE-8")
def fail_then_readmit(ctx: Context) -> None:
    sheet = _fresh(ctx, "fail")
    answer = ctx.wire.post(
        "runtime_sheet_fail_map_rows",
        {
            "tableNamespace": sheet.namespace,
            "sheetContract": CONTRACT,
            "runId": sheet.run_id,
            "writeVersion": sheet.write_version,
            "rows": [{"key": sheet.keys[0], "error": "conformance failure"}],
        },
    )
    body = terminal(answer)
    expect(
        body["committedKeys"] == [sheet.keys[0]] and body["updated"] == 1,
        "the failure committed, updated 1",
        answer,
    )
    row = _row(ctx, sheet.namespace, sheet.keys[0])
    expect(
        row.get("_status") == "failed" and row.get("_error") == "conformance failure",
        "the row to read back failed with its error",
        ctx.wire.exchanges[-1],
    )
    again = ctx.admit(sheet.namespace, rows_of([1], sheet.salt), ctx.name("run"))
    expect(
        again.keys == (sheet.keys[0],) and again.write_version > sheet.write_version,
        "the failed row re-admitted in pendingRows under a newer writeVersion",
        again.answer,
    )


@check("SP-WRITE-9")
def enriched_not_readmitted(ctx: Context) -> None:
    sheet = _fresh(ctx, "enriched")
    terminal(complete(ctx, sheet, sheet.keys[:1]))
    again = ctx.admit(sheet.namespace, rows_of([1, 2], sheet.salt), ctx.name("run"))
    body = again.answer.json_object
    expect(
        row_keys_of(body.get("completedRows")) == [sheet.keys[0]]
        and list(again.keys) == [sheet.keys[1]]
        and body.get("skipped") == 2
        and body.get("inserted") == 0,
        "the enriched row in completedRows with its _key, the other pending (skipped 2: "
        "every input row not inserted, as the seed counts)",
        again.answer,
    )


@check("SP-SUM-1")
def summary(ctx: Context) -> None:
    # The summary counts a whole sheet: this check needs one of its own.
    sheet = ctx.admit(ctx.namespace("summary"), rows_of([1, 2, 3, 4]), ctx.name("run"))
    terminal(complete(ctx, sheet, sheet.keys[:2]))
    terminal(
        ctx.wire.post(
            "runtime_sheet_fail_map_rows",
            {
                "tableNamespace": sheet.namespace,
                "sheetContract": CONTRACT,
                "runId": sheet.run_id,
                "writeVersion": sheet.write_version,
                "rows": [{"key": sheet.keys[2], "error": "no"}],
            },
        )
    )
    answer = ctx.wire.post("runtime_sheet_summary", {"tableNamespace": sheet.namespace})
    want = {"total": 4, "queued": 1, "running": 0, "completed": 2, "failed": 1}
    body = ok(answer)
    expect({k: body.get(k) for k in want} == want, f"{want}", answer)


# --- receipts and leases -----------------------------------------------------------------


def _receipt(ctx: Context, key: str, result: Any, run_id: str, **extra: Any) -> Exchange:
    return ctx.wire.post(
        "complete_work_receipt", {"key": key, "result": result, "runId": run_id, **extra}
    )


def claim(ctx: Context, key: str, holder: str, extras: Mapping[str, Any] | None = None) -> Exchange:
    """``claim_work_receipt``; ``extras`` (``lease_extras`` of the holder's claim) renew."""
    return ctx.wire.post("claim_work_receipt", {"key": key, "holder": holder, **(extras or {})})


def lease_extras(answer: Exchange) -> dict[str, Any]:
    """What a claim answer carries beyond the documented members (a lease token): the
    holder sends it back with its completion and release."""
    return {k: v for k, v in answer.json_object.items() if k not in _CLAIM_MEMBERS}


def _future(text: Any) -> bool:
    try:
        when = dt.datetime.fromisoformat(str(text))
    except ValueError:
        return False
    return when.tzinfo is not None and when > dt.datetime.now(dt.UTC)


def _receipt_body(answer: Exchange, key: str, result: Any, run_id: str, disposition: str) -> None:
    body = ok(answer)
    receipt = body.get("receipt")
    expect(
        body.get("completionDisposition") == disposition
        and isinstance(receipt, dict)
        and receipt.get("key") == key
        and receipt.get("result") == result
        and receipt.get("runId") == run_id
        and isinstance(receipt.get("completedAt"), str),
        f"completionDisposition {disposition} and receipt {{key, result: {result}, "
        f"runId: {run_id}, completedAt}}",
        answer,
    )


@check("SP-RCPT-1")
def receipt_persisted(ctx: Context) -> None:
    key, run_id = ctx.name("receipt"), ctx.name("run")
    _receipt_body(_receipt(ctx, key, {"v": 1}, run_id), key, {"v": 1}, run_id, "persisted")


@check("SP-RCPT-2")
def receipt_existing(ctx: Context) -> None:
    key, first_run = ctx.name("receipt"), ctx.name("run")
    _receipt_body(_receipt(ctx, key, [1], first_run), key, [1], first_run, "persisted")
    again = _receipt(ctx, key, [2], ctx.name("run"))
    _receipt_body(again, key, [1], first_run, "existing")


@check("SP-LEASE-1")
def lease_acquired(ctx: Context) -> None:
    key, holder = ctx.name("lease"), ctx.name("holder")
    answer = claim(ctx, key, holder)
    body = ok(answer)
    expect(
        body.get("acquired") is True
        and body.get("holder") == holder
        and _future(body.get("expiresAt")),
        f"acquired true, holder {holder}, an expiresAt in the future",
        answer,
    )


@check("SP-LEASE-2")
def lease_held(ctx: Context) -> None:
    key, first, second = ctx.name("lease"), ctx.name("holder"), ctx.name("holder")
    ok(claim(ctx, key, first))
    answer = claim(ctx, key, second)
    body = ok(answer)
    expect(
        body.get("acquired") is False
        and body.get("holder") == first
        and _future(body.get("expiresAt")),
        f"acquired false naming the live holder {first} and its expiresAt",
        answer,
    )


@check("SP-LEASE-3")
def lease_fences_completion(ctx: Context) -> None:
    key, first, second = ctx.name("lease"), ctx.name("holder"), ctx.name("holder")
    taken = claim(ctx, key, first)
    ok(taken)
    answer = _receipt(ctx, key, "late", ctx.name("run"), holder=second)
    expect(
        answer.status == 409 and answer.json_object.get("code") == "work_receipt_fenced",
        "409 work_receipt_fenced",
        answer,
    )
    after = claim(ctx, key, first, lease_extras(taken))
    expect(
        ok(after).get("acquired") is True and "receipt" not in after.json_object,
        "nothing written: the holder still renews its lease and no receipt exists",
        after,
    )


@check("SP-LEASE-4")
def lease_release(ctx: Context) -> None:
    key, first, second = ctx.name("lease"), ctx.name("holder"), ctx.name("holder")
    taken = claim(ctx, key, first)
    ok(taken)
    answer = ctx.wire.post(
        "release_work_receipt", {"key": key, "holder": first, **lease_extras(taken)}
    )
    expect(ok(answer).get("released") is True, "{released: true}", answer)
    then = claim(ctx, key, second)
    expect(
        ok(then).get("acquired") is True and then.json_object.get("holder") == second,
        f"the released key acquired by {second}",
        then,
    )


@check("SP-LEASE-5")
def lease_on_completed(ctx: Context) -> None:
    key, holder, run_id = ctx.name("lease"), ctx.name("holder"), ctx.name("run")
    taken = claim(ctx, key, holder)
    ok(taken)
    done = _receipt(ctx, key, "ok", run_id, holder=holder, **lease_extras(taken))
    _receipt_body(done, key, "ok", run_id, "persisted")
    answer = claim(ctx, key, ctx.name("holder"))
    body = ok(answer)
    receipt = body.get("receipt")
    expect(
        body.get("acquired") is False
        and body.get("holder") is None
        and isinstance(receipt, dict)
        and receipt.get("result") == "ok",
        "acquired false, holder null and the completed receipt",
        answer,
    )


# --- staged admission -----------------------------------------------------------------------


def _staged(ctx: Context, namespace: str, admission_id: str, run_id: str) -> dict[str, Any]:
    return {
        "tableNamespace": namespace,
        "sheetContract": CONTRACT,
        "admissionId": admission_id,
        "runId": run_id,
    }


def _chunk(
    base: Mapping[str, Any], seq: int, first: int, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    chunk = {k: v for k, v in base.items() if k != "runId"}
    return {**chunk, "seq": seq, "firstPosition": first, "rows": rows}


def _begin(ctx: Context, tag: str) -> tuple[dict[str, Any], Exchange]:
    base = _staged(ctx, ctx.namespace(tag), uuid.uuid4().hex, ctx.name("run"))
    return base, ctx.wire.post("begin_sheet_admission", base)


def _commit(ctx: Context, base: Mapping[str, Any], chunks: int, rows: int) -> Exchange:
    return ctx.wire.post("commit_sheet_admission", {**base, "chunks": chunks, "rows": rows})


# --- shares of an attempt ----------------------------------------------------------------

_SHARE_TTL_MS: Final = 60_000


def _share_token(ctx: Context) -> str:
    return (ctx.name("share-token") + "x" * 16)[:64]


def share_claim(ctx: Context, sheet: Admitted, token: str, max_rows: int) -> Exchange:
    """``claim_sheet_share`` of ``sheet``'s attempt."""
    return ctx.wire.post(
        "claim_sheet_share",
        {
            "tableNamespace": sheet.namespace,
            "writeVersion": sheet.write_version,
            "holder": ctx.name("worker"),
            "leaseToken": token,
            "ttlMs": _SHARE_TTL_MS,
            "maxRows": max_rows,
        },
    )


def share_lease(
    ctx: Context, action: str, sheet: Admitted, share: int, token: str, **fields: Any
) -> Exchange:
    """``renew_sheet_share`` or ``release_sheet_share`` of ``share``."""
    payload = {
        "tableNamespace": sheet.namespace,
        "writeVersion": sheet.write_version,
        "share": share,
        "leaseToken": token,
        **fields,
    }
    return ctx.wire.post(action, payload)


@check("SP-SHARE-1")
def shares_divide_the_rows(ctx: Context) -> None:
    sheet = _fresh(ctx, "share")
    first = ok(share_claim(ctx, sheet, _share_token(ctx), 2))
    second = ok(share_claim(ctx, sheet, _share_token(ctx), 2))
    expect(
        first.get("outcome") == "claimed"
        and first.get("share") == 1
        and second.get("outcome") == "claimed"
        and second.get("share") == 2
        and isinstance(first.get("lastIndex"), int)
        and isinstance(second.get("firstIndex"), int)
        and first["lastIndex"] < second["firstIndex"],
        "shares 1 and 2, claimed, the second's range after the first's",
    )
    answer = share_claim(ctx, sheet, _share_token(ctx), 2)
    body = ok(answer)
    expect(
        body.get("outcome") == "none" and body.get("live") == 2,
        "outcome none with live 2",
        answer,
    )


@check("SP-SHARE-2")
def shares_need_their_token(ctx: Context) -> None:
    sheet = _fresh(ctx, "share")
    token = _share_token(ctx)
    ok(share_claim(ctx, sheet, token, 5))
    renewed = share_lease(ctx, "renew_sheet_share", sheet, 1, token, ttlMs=_SHARE_TTL_MS)
    expect(ok(renewed).get("outcome") == "renewed", "outcome renewed", renewed)
    other = share_lease(ctx, "renew_sheet_share", sheet, 1, _share_token(ctx), ttlMs=1_000)
    expect(ok(other).get("outcome") == "lost", "outcome lost for another token", other)
    released = share_lease(ctx, "release_sheet_share", sheet, 1, token, finished=True)
    expect(ok(released).get("outcome") == "released", "outcome released", released)
    again = share_claim(ctx, sheet, _share_token(ctx), 5)
    body = ok(again)
    expect(
        body.get("outcome") == "claimed"
        and body.get("share") == 1
        and body.get("takenOver") is True,
        "share 1 claimed again, takenOver true (its rows were never written)",
        again,
    )


@check("SP-SHARE-3")
def shares_of_an_older_attempt_are_superseded(ctx: Context) -> None:
    sheet = _fresh(ctx, "share")
    token = _share_token(ctx)
    ok(share_claim(ctx, sheet, token, 5))
    _fresh(ctx, "share")  # a newer admission of the same sheet
    claimed = share_claim(ctx, sheet, _share_token(ctx), 5)
    expect(ok(claimed).get("outcome") == "superseded", "claim: outcome superseded", claimed)
    renewed = share_lease(ctx, "renew_sheet_share", sheet, 1, token, ttlMs=_SHARE_TTL_MS)
    expect(ok(renewed).get("outcome") == "superseded", "renew: outcome superseded", renewed)


@check("SP-SHARE-4")
def attempt_status_counts(ctx: Context) -> None:
    sheet = _fresh(ctx, "share")
    ok(share_claim(ctx, sheet, _share_token(ctx), 2))
    terminal(complete(ctx, sheet, sheet.keys[:1]))
    answer = ctx.wire.post(
        "sheet_attempt_status",
        {"tableNamespace": sheet.namespace, "writeVersion": sheet.write_version},
    )
    body = ok(answer)
    expected = {
        "pending": 2,
        "claimed": 1,
        "enriched": 1,
        "failed": 0,
        "workers": 1,
        "superseded": False,
    }
    expect(
        {k: body.get(k) for k in expected} == expected,
        f"the counts {expected}",
        answer,
    )


@check("SP-STAGE-1")
def staged_admission(ctx: Context) -> None:
    base, begun = _begin(ctx, "staged")
    body = ok(begun)
    expect(
        body.get("admissionId") == base["admissionId"]
        and isinstance(body.get("chunkRows"), int)
        and isinstance(body.get("chunkBytes"), int),
        "{admissionId, chunkRows, chunkBytes}",
        begun,
    )
    for seq, first, values in ((0, 0, [5, 3]), (1, 2, [9, 3, 1])):
        staged = ctx.wire.post(
            "stage_sheet_admission_chunk", _chunk(base, seq, first, rows_of(values))
        )
        expect(ok(staged).get("staged") is True, "{staged: true}", staged)
    committed = _commit(ctx, base, 2, 5)
    counts = ok(committed)
    expect(
        counts.get("inserted") == 4
        and counts.get("skipped") == 1
        and counts.get("pendingCount") == 4
        and counts.get("completedCount") == 0
        and isinstance(counts.get("writeVersion"), int)
        and counts.get("tableNamespace") == base["tableNamespace"],
        "inserted 4, skipped 1 (row 3 twice), pendingCount 4, completedCount 0, a writeVersion",
        committed,
    )
    order = [r.get("n") for r in ctx.all_rows(base["tableNamespace"])]
    expect(order == [5, 3, 9, 1], f"rows readable in input order [5, 3, 9, 1], got {order}")


@check("SP-STAGE-2")
def staged_retries(ctx: Context) -> None:
    base, begun = _begin(ctx, "retries")
    ok(begun)
    chunk = _chunk(base, 0, 0, rows_of([1, 2]))
    ok(ctx.wire.post("stage_sheet_admission_chunk", chunk))
    again = ctx.wire.post("stage_sheet_admission_chunk", chunk)
    expect(ok(again).get("staged") is False, "{staged: false} for a chunk staged before", again)
    first = ok(_commit(ctx, base, 1, 2))
    repeat = _commit(ctx, base, 1, 2)
    expect(ok(repeat) == first, f"the repeated commit to answer the same counts {first}", repeat)
    rows = ctx.all_rows(base["tableNamespace"])
    expect(len(rows) == 2, "two rows, written once", ctx.wire.exchanges[-1])


@check("SP-STAGE-3")
def staged_abort(ctx: Context) -> None:
    base, begun = _begin(ctx, "abort")
    ok(begun)
    ok(ctx.wire.post("stage_sheet_admission_chunk", _chunk(base, 0, 0, rows_of([1]))))
    target = {"tableNamespace": base["tableNamespace"], "admissionId": base["admissionId"]}
    first = ctx.wire.post("abort_sheet_admission", target)
    expect(ok(first).get("aborted") is True, "{aborted: true}", first)
    second = ctx.wire.post("abort_sheet_admission", target)
    expect(ok(second).get("aborted") is False, "{aborted: false} the second time", second)
    late = ctx.wire.post("stage_sheet_admission_chunk", _chunk(base, 1, 1, rows_of([2])))
    expect(late.status == 409, "409 for a chunk of an aborted admission", late)


# --- plays and operating routes ---------------------------------------------------------------


def _register(ctx: Context) -> tuple[str, str, dict[str, Any]]:
    play_id, name = ctx.name("play-id"), ctx.name("play-name")
    play = {
        "playId": play_id,
        "name": name,
        "sourceCode": "export default 1",
        "codeFormat": "esm_module",
    }
    answer = ctx.wire.post("register_play", {"play": play})
    expect(ok(answer).get("playId") == play_id, f"{{playId: {play_id}}}", answer)
    return play_id, name, play


@check("SP-PLAY-2")
def play_resolves(ctx: Context) -> None:
    play_id, name, play = _register(ctx)
    for ref in (play_id, name):
        answer = ctx.wire.post("resolve_play", {"playRef": ref})
        found = ok(answer).get("play")
        expect(
            isinstance(found, dict)
            and found.get("playId") == play_id
            and found.get("sourceCode") == play["sourceCode"],
            f"resolve_play {ref!r} to answer the play {play_id} with its sourceCode",
            answer,
        )


@check("SP-PLAY-3")
def play_other_org(ctx: Context) -> None:
    if ctx.wire_b is None:
        raise CheckSkipped("needs a second org's token (--token-b)")
    play_id, _, _ = _register(ctx)
    answer = ctx.wire_b.post("resolve_play", {"playRef": play_id})
    expect(ok(answer).get("play", "absent") is None, "{play: null} for another org", answer)


@check("SP-OPS-1")
def operating_routes(ctx: Context) -> None:
    health = ctx.wire.get("/healthz")
    expect(health.status == 200, "GET /healthz answered 200", health)
    document = ctx.wire.get("/api/v2/plays/internal/runtime/openapi.json")
    body = ok(document)
    text = json.dumps(body)
    expect(
        str(body.get("openapi", "")).startswith("3.1")
        and all(action in text for action in SHEETPLANE_ACTIONS),
        "an OpenAPI 3.1 document naming every action",
        document,
    )
    json_error(ctx.wire.post("conformance_unknown_action", {}), 400, "an unknown action")
