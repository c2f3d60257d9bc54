"""Gateways made wrong on purpose, for the conformance kit's own tests.

A mutant is the reference gateway behind a wrapping HTTP transport that
rewrites one thing about requests or answers (pages out of order, a 413
without ``observed_bytes``, a stale write accepted...). The server's code
stays clean: every mutation lives here, between the kit and the real
gateway, and the kit must name the requirement each one breaks.

Two fake servers stand in for gateways that break the timed budgets: one
reads a body to its declared end before answering, one never closes a
stalled request.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import httpx

#: ``(action, request body, status, answer) -> (status, answer)``; answer bytes are
#: sent as they are (not JSON).
Answer = Callable[[str | None, Any, int, Any], tuple[int, Any]]
#: ``(action, request body, headers) -> request body`` (headers may be edited in place).
Request = Callable[[str | None, Any, dict[str, str]], Any]


@attrs.define(eq=False)
class Mutation:
    """One way of being wrong."""

    name: str
    answer: Answer | None = None
    request: Request | None = None


class MutantTransport(httpx.BaseTransport):
    """The real network, with one :class:`Mutation` applied to every exchange."""

    def __init__(self, mutation: Mutation) -> None:
        self._inner = httpx.HTTPTransport()
        self.mutation = mutation

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        content = request.read()
        try:
            body = json.loads(content) if content else None
        except ValueError:
            body = None
        action = body.get("action") if isinstance(body, dict) else None
        if self.mutation.request is not None and body is not None:
            headers = dict(request.headers)
            body = self.mutation.request(action, body, headers)
            headers.pop("content-length", None)
            request = httpx.Request(
                request.method, request.url, headers=headers, content=json.dumps(body).encode()
            )
        response = self._inner.handle_request(request)
        raw = response.read()
        response.close()
        if self.mutation.answer is None:
            return httpx.Response(response.status_code, headers=response.headers, content=raw)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw
        status, answer = self.mutation.answer(action, body, response.status_code, answer)
        if isinstance(answer, bytes):
            return httpx.Response(status, content=answer, headers={"content-type": "text/plain"})
        return httpx.Response(status, json=answer)

    def close(self) -> None:
        self._inner.close()


# --- building blocks ---------------------------------------------------------------------


def on_answer(action: str, change: Callable[[Any, Any, int], tuple[int, Any] | None]) -> Answer:
    """Apply ``change(answer, request, status)`` to ``action``'s answers (None: unchanged)."""

    def answer(got: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
        if got == action:
            changed = change(value, body, status)
            if changed is not None:
                return changed
        return status, value

    return answer


def ok_only(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any, int], tuple[int, Any] | None]:
    """Change only 200 answers: ``fn(answer, request)`` returns the new answer."""

    def change(value: Any, body: Any, status: int) -> tuple[int, Any] | None:
        return (200, fn(value, body)) if status == 200 and isinstance(value, dict) else None

    return change


def _rows_reversed(value: dict[str, Any], _: Any) -> dict[str, Any]:
    return {**value, "rows": value["rows"][::-1]}


def _swap_reason(reason: str) -> str:
    swap = {
        "newer_write_version": "older_write_version",
        "older_write_version": "newer_write_version",
    }
    return swap.get(reason, reason)


def _stale_rows(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Answer:
    def answer(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
        if action in ("runtime_sheet_complete_map_rows", "runtime_sheet_fail_map_rows") and (
            status == 200
        ):
            return status, {**value, "staleRows": [fn(dict(r)) for r in value["staleRows"]]}
        return status, value

    return answer


def _drop_write_version(action: str | None, body: Any, headers: dict[str, str]) -> Any:
    if action == "runtime_sheet_complete_map_rows":
        body.pop("writeVersion", None)
    return body


def _first_tables() -> Answer:
    """Every session answer names the first session's tables (a role reading another sheet)."""
    first: list[Any] = []

    def answer(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
        if action == "create_db_session" and status == 200:
            first.append(value["postgres"])
            return status, {**value, "postgres": first[0]}
        return status, value

    return answer


def _upsert_event_table(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if action == "create_db_session" and status == 200 and "rows.upsert" in body["operations"]:
        tables = value["postgres"]
        return status, {**value, "postgres": {**tables, "sheetTable": tables["eventTable"]}}
    return status, value


def _bad_aad(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if action == "create_db_session" and status == 200:
        envelope = dict(value["encryptedPostgresUrl"])
        envelope["aad"] = base64.urlsafe_b64encode(b'{"other":"session"}').rstrip(b"=").decode()
        return status, {**value, "encryptedPostgresUrl": envelope}
    return status, value


def token_a_for_all(token_a: str) -> Request:
    """Every request is sent with token A's authority (no tenant isolation)."""

    def request(action: str | None, body: Any, headers: dict[str, str]) -> Any:
        if "authorization" in headers:
            headers["authorization"] = f"Bearer {token_a}"
        return body

    return request


def _batch_request(fn: Callable[[list[Any]], list[Any]]) -> Request:
    def request(action: str | None, body: Any, headers: dict[str, str]) -> Any:
        if action == "runtime_sheet_read_rows_batch" and isinstance(body.get("input"), dict):
            body["input"]["pages"] = fn(list(body["input"].get("pages", [])))
        return body

    return request


def _fit_pages(pages: list[Any]) -> list[Any]:
    return (pages or [{"limit": 1, "offset": 0}])[:4]


def _drop_run_id(action: str | None, body: Any, headers: dict[str, str]) -> Any:
    if action == "runtime_sheet_read_rows" and isinstance(body.get("input"), dict):
        body["input"].pop("runId", None)
    return body


def _not_json_400(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    return (400, b"bad request") if status == 400 else (status, value)


def _auth_skipped(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    return (200, {"ok": True}) if status == 401 else (status, value)


def _unknown_404(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if status == 400 and isinstance(value, dict) and value.get("code") == "unsupported_action":
        return 404, {"error": "not found", "code": "not_found"}
    return status, value


def _no_observed_bytes(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if status == 413 and isinstance(value, dict):
        return status, {k: v for k, v in value.items() if k != "observed_bytes"}
    return status, value


def _no_retry_after(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if status == 503 and isinstance(value, dict):
        return status, {k: v for k, v in value.items() if k != "retry_after_ms"}
    return status, value


def _conflict_accepted(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if status == 409 and action == "runtime_sheet_complete_map_rows":
        keys = [row["key"] for row in body["rows"]]
        return 200, {"committedKeys": keys, "staleKeys": [], "staleRows": [], "updated": 0}
    return status, value


def _fence_ignored(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if status == 409 and action == "complete_work_receipt":
        receipt = {"key": body["key"], "result": body["result"], "runId": body["runId"]}
        receipt["completedAt"] = "2026-01-01T00:00:00+00:00"
        return 200, {"receipt": receipt, "completionDisposition": "persisted"}
    return status, value


def _openapi_404(action: str | None, body: Any, status: int, value: Any) -> tuple[int, Any]:
    if action is None and isinstance(value, dict) and "openapi" in value:
        return 404, {"error": "not found"}
    return status, value


def _page_field(field: str, fn: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    def change(value: Any, _: Any) -> Any:
        return {**value, "pages": [{**p, field: fn(p[field])} for p in value["pages"]]}

    return change


def _strip_label(value: Any, _: Any) -> Any:
    pages = [
        {**p, "rows": [{k: v for k, v in r.items() if k != "label"} for r in p["rows"]]}
        for p in value["pages"]
    ]
    return {**value, "pages": pages}


def _empty_offset_zero(value: Any, _: Any) -> Any:
    return {**value, "offset": 0} if value.get("rows") == [] else value


def _name_unresolved(value: Any, body: Any) -> Any:
    return {"play": None} if "play-name" in str(body.get("playRef")) else value


def _completed_as_pending(value: Any, _: Any) -> Any:
    pending = [*value["completedRows"], *value["pendingRows"]]
    return {**value, "pendingRows": pending, "completedRows": []}


def _failed_as_completed(value: Any, _: Any) -> Any:
    return {**value, "completed": value["completed"] + value["failed"], "failed": 0}


def _restaged(value: Any, _: Any) -> Any:
    return {**value, "staged": True}


def mutations(token_a: str) -> dict[str, Mutation]:
    """One mutation per requirement (by id): each breaks exactly what it names."""
    table: dict[str, tuple[str, Answer | None, Request | None]] = {
        "SP-AUTH-1": ("no token checked", _auth_skipped, None),
        "SP-ERR-1": ("unknown action answered 404", _unknown_404, None),
        "SP-ERR-2": ("400 answered as text", _not_json_400, None),
        "SP-SHEET-1": (
            "ensure_sheet answers ok: 'yes'",
            on_answer("ensure_sheet", ok_only(lambda v, _: {"ok": "yes"})),
            None,
        ),
        "SP-ADMIT-1": (
            "admission answer without inserted",
            on_answer(
                "start_sheet_dataset",
                ok_only(lambda v, _: {k: x for k, x in v.items() if k != "inserted"}),
            ),
            None,
        ),
        "SP-ADMIT-2": (
            "pendingRows reversed",
            on_answer(
                "start_sheet_dataset",
                ok_only(lambda v, _: {**v, "pendingRows": v["pendingRows"][::-1]}),
            ),
            None,
        ),
        "SP-ADMIT-3": (
            "repeated rows not counted as skipped",
            on_answer("start_sheet_dataset", ok_only(lambda v, _: {**v, "skipped": 0})),
            None,
        ),
        "SP-ADMIT-4": (
            "writeVersion always 1",
            on_answer("start_sheet_dataset", ok_only(lambda v, _: {**v, "writeVersion": 1})),
            None,
        ),
        "SP-READ-1": (
            "read_rows echoes offset 0",
            on_answer("runtime_sheet_read_rows", ok_only(lambda v, _: {**v, "offset": 0})),
            None,
        ),
        "SP-READ-2": (
            "read_rows pages reversed inside",
            on_answer("runtime_sheet_read_rows", ok_only(_rows_reversed)),
            None,
        ),
        "SP-READ-3": (
            "batch pages out of order",
            on_answer(
                "runtime_sheet_read_rows_batch",
                ok_only(lambda v, _: {**v, "pages": v["pages"][::-1]}),
            ),
            None,
        ),
        "SP-READ-4": (
            "batch pages echo limit + 1",
            on_answer(
                "runtime_sheet_read_rows_batch", ok_only(_page_field("limit", lambda x: x + 1))
            ),
            None,
        ),
        "SP-READ-5": (
            "batch rows lose a column",
            on_answer("runtime_sheet_read_rows_batch", ok_only(_strip_label)),
            None,
        ),
        "SP-READ-6": (
            "an empty page echoes offset 0",
            on_answer("runtime_sheet_read_rows", ok_only(_empty_offset_zero)),
            None,
        ),
        "SP-READ-7": ("any number of pages served", None, _batch_request(_fit_pages)),
        "SP-READ-8": (
            "row keys reversed",
            on_answer(
                "runtime_sheet_read_row_keys", ok_only(lambda v, _: {**v, "keys": v["keys"][::-1]})
            ),
            None,
        ),
        "SP-READ-9": ("runId ignored", None, _drop_run_id),
        "SP-READ-10": ("413 without observed_bytes", _no_observed_bytes, None),
        "SP-BUDGET-1": ("413 without observed_bytes", _no_observed_bytes, None),
        "SP-BP-1": ("503 without retry_after_ms", _no_retry_after, None),
        "SP-SESS-1": (
            "session answer carries the URL in the clear",
            on_answer(
                "create_db_session",
                ok_only(lambda v, _: {**v, "postgresUrl": "postgres://leaked@db/x"}),
            ),
            None,
        ),
        "SP-SESS-2": ("envelope aad of another session", _bad_aad, None),
        "SP-SESS-3": (
            "session names a table that does not exist",
            on_answer(
                "create_db_session",
                ok_only(
                    lambda v, _: {**v, "postgres": {**v["postgres"], "sheetTable": "sp_missing"}}
                ),
            ),
            None,
        ),
        "SP-SESS-4": ("every session names the first session's tables", _first_tables(), None),
        "SP-SESS-5": ("upsert session names its event table", _upsert_event_table, None),
        "SP-PLAY-1": (
            "unknown play answered {}",
            on_answer("resolve_play", ok_only(lambda v, _: {})),
            None,
        ),
        "SP-TENANT-1": ("every token acts as token A", None, token_a_for_all(token_a)),
        "SP-WRITE-1": (
            "complete answers updated 0",
            on_answer("runtime_sheet_complete_map_rows", ok_only(lambda v, _: {**v, "updated": 0})),
            None,
        ),
        "SP-WRITE-2": ("stale write accepted", None, _drop_write_version),
        "SP-WRITE-3": (
            "stale reason misnamed",
            _stale_rows(lambda r: {**r, "reason": _swap_reason(r["reason"])}),
            None,
        ),
        "SP-WRITE-4": (
            "unknown key stamped 0",
            _stale_rows(lambda r: {**r, "rowVersionStamp": r["rowVersionStamp"] or 0}),
            None,
        ),
        "SP-WRITE-5": (
            "replay counted as an update",
            on_answer(
                "runtime_sheet_complete_map_rows",
                ok_only(lambda v, _: {**v, "updated": len(v["committedKeys"])}),
            ),
            None,
        ),
        "SP-WRITE-6": ("conflicting result accepted", _conflict_accepted, None),
        "SP-WRITE-7": (
            "already_terminal reported as newer_write_version",
            _stale_rows(
                lambda r: {
                    **r,
                    "reason": "newer_write_version"
                    if r["reason"] == "already_terminal"
                    else r["reason"],
                }
            ),
            None,
        ),
        "SP-WRITE-8": (
            "fail answers updated 0",
            on_answer("runtime_sheet_fail_map_rows", ok_only(lambda v, _: {**v, "updated": 0})),
            None,
        ),
        "SP-WRITE-9": (
            "enriched rows answered as pending",
            on_answer("start_sheet_dataset", ok_only(_completed_as_pending)),
            None,
        ),
        "SP-SUM-1": (
            "failed counted as completed",
            on_answer("runtime_sheet_summary", ok_only(_failed_as_completed)),
            None,
        ),
        "SP-RCPT-1": (
            "first completion answered existing",
            on_answer(
                "complete_work_receipt",
                ok_only(lambda v, _: {**v, "completionDisposition": "existing"}),
            ),
            None,
        ),
        "SP-RCPT-2": (
            "receipt completed twice as persisted",
            on_answer(
                "complete_work_receipt",
                ok_only(lambda v, _: {**v, "completionDisposition": "persisted"}),
            ),
            None,
        ),
        "SP-LEASE-1": (
            "claims expire in the past",
            on_answer(
                "claim_work_receipt",
                ok_only(
                    lambda v, _: (
                        {**v, "expiresAt": "2000-01-01T00:00:00+00:00"} if v.get("acquired") else v
                    )
                ),
            ),
            None,
        ),
        "SP-LEASE-2": (
            "a held lease handed to another holder",
            on_answer(
                "claim_work_receipt",
                ok_only(
                    lambda v, body: (
                        {**v, "acquired": True, "holder": body["holder"]}
                        if v.get("holder") is not None
                        else v
                    )
                ),
            ),
            None,
        ),
        "SP-LEASE-3": ("fenced completion accepted", _fence_ignored, None),
        "SP-LEASE-4": (
            "release answers false",
            on_answer("release_work_receipt", ok_only(lambda v, _: {"released": False})),
            None,
        ),
        "SP-LEASE-5": (
            "claim of completed work without its receipt",
            on_answer(
                "claim_work_receipt",
                ok_only(lambda v, _: {k: x for k, x in v.items() if k != "receipt"}),
            ),
            None,
        ),
        "SP-STAGE-1": (
            "commit miscounts inserted",
            on_answer(
                "commit_sheet_admission", ok_only(lambda v, _: {**v, "inserted": v["inserted"] + 1})
            ),
            None,
        ),
        "SP-STAGE-2": (
            "a chunk staged again answers staged true",
            on_answer("stage_sheet_admission_chunk", ok_only(_restaged)),
            None,
        ),
        "SP-STAGE-3": (
            "abort always answers true",
            on_answer("abort_sheet_admission", ok_only(lambda v, _: {"aborted": True})),
            None,
        ),
        "SP-PLAY-2": (
            "plays do not resolve by name",
            on_answer("resolve_play", ok_only(_name_unresolved)),
            None,
        ),
        "SP-PLAY-3": ("every token acts as token A", None, token_a_for_all(token_a)),
        "SP-OPS-1": ("openapi.json answered 404", _openapi_404, None),
        "SP-SHARE-1": (
            "none answers no live share",
            on_answer(
                "claim_sheet_share",
                ok_only(lambda v, _: {**v, "live": 0} if v.get("outcome") == "none" else v),
            ),
            None,
        ),
        "SP-SHARE-2": (
            "renewal with any token answers renewed",
            on_answer("renew_sheet_share", ok_only(lambda v, _: {"outcome": "renewed"})),
            None,
        ),
        "SP-SHARE-3": (
            "a superseded claim answers none",
            on_answer(
                "claim_sheet_share",
                ok_only(
                    lambda v, _: {**v, "outcome": "none"} if v.get("outcome") == "superseded" else v
                ),
            ),
            None,
        ),
        "SP-SHARE-4": (
            "status counts no workers",
            on_answer("sheet_attempt_status", ok_only(lambda v, _: {**v, "workers": 0})),
            None,
        ),
        "SP-MODEL-1": ("stale write accepted", None, _drop_write_version),
    }
    return {rid: Mutation(name, answer, request) for rid, (name, answer, request) in table.items()}


#: The issue's headline mutants (and a few more), each run against the whole quick profile:
#: the requirement it must fail, and the requirement whose mutation it is (or None: its own).
HEADLINE: dict[str, tuple[str, str | None]] = {
    "pages out of order": ("SP-READ-3", "SP-READ-3"),
    "a 413 without observed_bytes": ("SP-READ-10", "SP-READ-10"),
    "a stale write accepted": ("SP-WRITE-2", "SP-WRITE-2"),
    "a stale reason misnamed": ("SP-WRITE-2", "SP-WRITE-3"),
    "a receipt completed twice as persisted": ("SP-RCPT-2", "SP-RCPT-2"),
    "an unknown action answered 404": ("SP-ERR-1", "SP-ERR-1"),
    "a batch answered with fewer pages": ("SP-READ-3", None),
    "back-pressure without retry_after_ms": ("SP-BP-1", "SP-BP-1"),
    "the runId filter ignored": ("SP-READ-9", "SP-READ-9"),
    "a conflicting result accepted": ("SP-WRITE-6", "SP-WRITE-6"),
    "a fenced completion accepted": ("SP-LEASE-3", "SP-LEASE-3"),
    "failed rows counted as completed": ("SP-SUM-1", "SP-SUM-1"),
}


def headline(name: str, token_a: str) -> tuple[str, Mutation]:
    """The requirement headline mutant ``name`` must fail, and the mutant."""
    requirement_id, source = HEADLINE[name]
    if source is not None:
        return requirement_id, mutations(token_a)[source]
    fewer = on_answer(
        "runtime_sheet_read_rows_batch", ok_only(lambda v, _: {**v, "pages": v["pages"][:-1]})
    )
    return requirement_id, Mutation(name, fewer)


# --- fake servers for the timed budgets ----------------------------------------------------


@contextmanager
def fake_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback server running ``handle(connection)`` per connection; yields its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()
    connections: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connections.append(conn)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in connections:
            conn.close()


def reads_whole_body(conn: socket.socket) -> None:
    """Read the declared body to its end before answering (never, for a body cut short)."""
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            chunk = conn.recv(65536)
            if not chunk:
                return
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    except OSError:
        return


def never_closes(conn: socket.socket) -> None:
    """Hold the connection open and silent until the server stops."""
    try:
        while conn.recv(65536):
            pass
    except OSError:
        return
