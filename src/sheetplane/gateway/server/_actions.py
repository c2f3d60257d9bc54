"""One handler per runtime data-plane action: validate the camelCase request, call
the store, answer the camelCase shape DESIGN.md's wire facts give.

A handler raises :class:`ActionError` (or ``InvalidInputError``) for a bad
request; the app turns every error into a JSON body without a stack trace.
Every action acts on the caller's own org (the token's): the sheet is
``SheetRef(org_id, playName, tableNamespace)``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from ... import crypto
from ..._types import (
    BIGINT_MAX,
    BIGINT_MIN,
    OPERATIONS,
    ROW_MODES,
    AdmittedPart,
    CompleteRow,
    FailRow,
    InlineAdmission,
    Operation,
    Page,
    PageRequest,
    Receipt,
    RowMode,
    SheetContract,
    SheetRef,
    TerminalWriteResult,
    canonical_operations,
)
from ...budgets import (
    DB_SESSION_CAP_RETRY_AFTER_MS,
    MAX_ERROR_TEXT_BYTES,
    MAX_REQUEST_TEXT_BYTES,
    MAX_ROW_KEY_BYTES,
    MAX_RUN_ID_BYTES,
    MAX_USER_EMAIL_BYTES,
    READ_BATCH_MAX_PAGES,
    READ_PAGE_MAX_ROWS,
    TRANSPORT_CEILING_BYTES,
)
from ...errors import AdmissionTooLargeError, InvalidInputError, WorkReceiptFencedError
from ...sizes import json_byte_length_up_to
from ...store import RowCursor, SheetStore
from .. import _wire
from .._wire import SERVED_LOGICAL_TABLES, Code
from ..faults import FaultSchedule
from ._auth import TokenTable
from ._config import GatewayConfig
from ._http import ActionError, bad_request
from ._metrics import GatewayMetrics
from ._plays import play_answer, play_from_json
from ._roles import ReaperProgress, SessionCapReachedError, create_session_role, scoped_url

__all__ = ["HANDLERS", "Call", "GatewayState", "mint_preloaded_session", "unsupported"]

_LIMIT_NAMES: Final = ("maxRows", "maxBytes", "maxRequests")
_MS_PER_SECOND: Final = 1_000
#: The largest ``ttlSeconds`` accepted (then clamped to the session budget): its
#: milliseconds still fit a ``bigint``, like every other number a request carries.
_MAX_TTL_SECONDS: Final = BIGINT_MAX // _MS_PER_SECOND


@attrs.define(eq=False)
class GatewayState:
    """What one running gateway holds: its config, store, tokens, faults and reaper."""

    config: GatewayConfig
    store: SheetStore
    tokens: TokenTable
    faults: FaultSchedule
    reaper: ReaperProgress
    metrics: GatewayMetrics = attrs.field(factory=GatewayMetrics)
    """The gateway's Prometheus metrics: count with ``call.state.metrics.<name>``."""


@attrs.frozen
class Call:
    """One authenticated request."""

    state: GatewayState
    org_id: str
    """The token's org."""
    body: Mapping[str, Any]
    """The parsed JSON body."""
    token_id: str | None = None
    """The token's id in the session ledger (never the token itself)."""


Handler = Callable[[Call], Awaitable[Any]]


def unsupported(action: str) -> ActionError:
    """The answer of a gateway that does not know ``action``."""
    return ActionError(
        400, Code.UNSUPPORTED_ACTION, f"Unsupported runtime data-plane action: {action}"
    )


# --- request parsing ------------------------------------------------------------------


#: The longest text (UTF-8 bytes) each request field may carry; every other text
#: field stops at ``MAX_REQUEST_TEXT_BYTES``. Whatever the gateway stores is capped
#: before it reaches the store, so no request grows a table by more than its rows.
_TEXT_CAPS: Final[Mapping[str, int]] = {
    "runId": MAX_RUN_ID_BYTES,
    "holder": MAX_RUN_ID_BYTES,
    "userEmail": MAX_USER_EMAIL_BYTES,
    "error": MAX_ERROR_TEXT_BYTES,
    "key": MAX_ROW_KEY_BYTES,
}


def _capped(value: str, name: str, where: str) -> str:
    cap = _TEXT_CAPS.get(name, MAX_REQUEST_TEXT_BYTES)
    # At most 4 bytes a character: only a string that could be past the cap is encoded.
    if len(value) * 4 > cap and len(value.encode("utf-8", "surrogatepass")) > cap:
        raise bad_request(f"{where}{name} is longer than {cap} bytes")
    return value


def _text(container: Mapping[str, Any], name: str, *, where: str = "") -> str:
    value = container.get(name)
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"{where}{name} must be a non-empty string")
    return _capped(value, name, where)


def _optional_text(container: Mapping[str, Any], name: str, *, where: str = "") -> str | None:
    value = container.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{where}{name} must be a string or null")
    return _capped(value, name, where)


def _object(container: Mapping[str, Any], name: str, *, where: str = "") -> Mapping[str, Any]:
    value = container.get(name)
    if not isinstance(value, Mapping):
        raise bad_request(f"{where}{name} must be an object")
    return value


def _list(container: Mapping[str, Any], name: str, *, where: str = "") -> list[Any]:
    value = container.get(name)
    if not isinstance(value, list):
        raise bad_request(f"{where}{name} must be an array")
    return value


def _integer(value: object, what: str, minimum: int, maximum: int | None = None) -> int:
    """An integer (an integral JSON number is accepted), within bounds, else 400."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{what} must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise bad_request(f"{what} must be an integer")
        value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise bad_request(f"{what} must be {bound}, got {value}")
    return value


def _sheet(call: Call, container: Mapping[str, Any], *, where: str = "") -> SheetRef:
    play = _text(call.body, "playName")
    namespace = _text(container, "tableNamespace", where=where)
    return SheetRef(org_id=call.org_id, play_name=play, table_namespace=namespace)


def _contract(container: Mapping[str, Any], *, required: bool) -> SheetContract:
    value = container.get("sheetContract")
    if value is None and required:
        raise bad_request("sheetContract must be an object")
    return SheetContract.from_json(value)


def _user_email(body: Mapping[str, Any]) -> None:
    _optional_text(body, "userEmail")


def _row_objects(body: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    rows = _list(body, name)
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise bad_request(f"{name}[{index}] must be an object")
    return rows


def _admitted(spec: Mapping[str, Any]) -> AdmittedPart | None:
    """``input.admission``: null, or ``{writeVersion, part}`` (one admission's pending or
    completed rows)."""
    value = spec.get("admission")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request("input.admission must be null or an object")
    version = _integer(value.get("writeVersion"), "input.admission.writeVersion", 1, BIGINT_MAX)
    part = value.get("part")
    if part not in ("pending", "completed"):
        raise bad_request("input.admission.part must be 'pending' or 'completed'")
    return AdmittedPart(version, part)


def _read_scope(call: Call) -> tuple[Mapping[str, Any], SheetRef, str | None, RowMode]:
    spec = _object(call.body, "input")
    sheet = _sheet(call, spec, where="input.")
    run_id = _optional_text(spec, "runId", where="input.")
    mode = spec.get("rowMode", "output")
    if mode is None:
        mode = "output"
    if mode not in ROW_MODES:
        raise bad_request("input.rowMode must be 'output' or 'all'")
    return spec, sheet, run_id, mode


def _page_request(value: object, where: str) -> PageRequest:
    if not isinstance(value, Mapping):
        raise bad_request(f"{where} must be an object with limit and offset")
    limit = _integer(value.get("limit"), f"{where}.limit", 1, READ_PAGE_MAX_ROWS)
    offset = _integer(value.get("offset"), f"{where}.offset", 0)
    return PageRequest(limit=limit, offset=offset)


def _page_json(page: Page) -> dict[str, Any]:
    return {"rows": list(page.rows), "limit": page.limit, "offset": page.offset}


def _terminal_json(call: Call, result: TerminalWriteResult) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "committedKeys": list(result.committed_keys),
        "staleKeys": list(result.stale_keys),
        "updated": result.updated,
    }
    if not call.state.config.legacy:
        answer["staleRows"] = [
            {"key": row.key, "reason": row.reason, "rowVersionStamp": row.row_version_stamp}
            for row in result.stale_rows
        ]
    return answer


def _write_version(body: Mapping[str, Any]) -> int | None:
    value = body.get("writeVersion")
    if value is None:
        return None
    return _integer(value, "writeVersion", 0)


# --- sheet actions -------------------------------------------------------------------------


async def ensure_sheet(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract?, userEmail?}`` → ``{ok: true}``."""
    sheet = _sheet(call, call.body)
    contract = _contract(call.body, required=False)
    _user_email(call.body)
    await call.state.store.ensure_sheet(sheet, contract)
    return {"ok": True}


async def start_sheet_dataset(call: Call) -> dict[str, Any]:
    """Admission: ``{tableNamespace, sheetContract, rows, runId}`` →
    ``{inserted, skipped, pendingRows, completedRows, tableNamespace, writeVersion}``."""
    sheet = _sheet(call, call.body)
    contract = _contract(call.body, required=True)
    rows = _row_objects(call.body, "rows")
    run_id = _text(call.body, "runId")
    _user_email(call.body)
    store = call.state.store
    await store.ensure_sheet(sheet, contract)
    admission = await store.start_dataset(sheet, rows, run_id, contract, check=_fits_one_answer)
    call.state.metrics.admissions.inc()
    return _admission_json(admission)


def _admission_json(admission: InlineAdmission) -> dict[str, Any]:
    return {
        "inserted": admission.inserted,
        "skipped": admission.skipped,
        "pendingRows": list(admission.pending_rows),
        "completedRows": list(admission.completed_rows),
        "tableNamespace": admission.table_namespace,
        "writeVersion": admission.write_version,
    }


def _fits_one_answer(admission: InlineAdmission) -> None:
    """Refuse, before the commit, an admission whose answer would pass the ceiling.

    Runs inside the admission's transaction: ``AdmissionTooLargeError`` rolls
    it back, so the caller is never told "too large" about rows that were
    committed anyway. The answer is measured as the compact JSON the app
    sends, stopping at the ceiling.
    """
    measured = json_byte_length_up_to(_admission_json(admission), TRANSPORT_CEILING_BYTES)
    if measured.exceeded:
        raise AdmissionTooLargeError(measured.bytes)


async def runtime_sheet_complete_map_rows(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, runId, writeVersion?, rows: [{key, data,
    cellMetaPatch?}]}`` → ``{committedKeys, staleKeys, staleRows, updated}``."""
    sheet = _sheet(call, call.body)
    contract = _contract(call.body, required=True)
    run_id = _text(call.body, "runId")
    version = _write_version(call.body)
    rows = []
    for index, row in enumerate(_row_objects(call.body, "rows")):
        data = row.get("data", {})
        patch = row.get("cellMetaPatch")
        if not isinstance(data, Mapping):
            raise bad_request(f"rows[{index}].data must be an object")
        if patch is not None and not isinstance(patch, Mapping):
            raise bad_request(f"rows[{index}].cellMetaPatch must be an object")
        rows.append(CompleteRow(_text(row, "key", where=f"rows[{index}]."), data, patch))
    result = await call.state.store.complete_map_rows(
        sheet, contract, rows, run_id=run_id, write_version=version
    )
    return _terminal_json(call, result)


async def runtime_sheet_fail_map_rows(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, runId, writeVersion?, rows: [{key, error,
    data?}]}`` → the same shape as complete."""
    sheet = _sheet(call, call.body)
    contract = _contract(call.body, required=True)
    run_id = _text(call.body, "runId")
    version = _write_version(call.body)
    rows = []
    for index, row in enumerate(_row_objects(call.body, "rows")):
        data = row.get("data")
        if data is not None and not isinstance(data, Mapping):
            raise bad_request(f"rows[{index}].data must be an object")
        error = row.get("error")
        if not isinstance(error, str):
            raise bad_request(f"rows[{index}].error must be a string")
        _capped(error, "error", f"rows[{index}].")
        rows.append(FailRow(_text(row, "key", where=f"rows[{index}]."), error, data))
    result = await call.state.store.fail_map_rows(
        sheet, contract, rows, run_id=run_id, write_version=version
    )
    return _terminal_json(call, result)


async def runtime_sheet_summary(call: Call) -> dict[str, Any]:
    """``{tableNamespace}`` → ``{total, queued, running, completed, failed}``."""
    sheet = _sheet(call, call.body)
    summary = await call.state.store.summary(sheet)
    return {
        "total": summary.total,
        "queued": summary.queued,
        "running": summary.running,
        "completed": summary.completed,
        "failed": summary.failed,
    }


def _receipt_json(receipt: Receipt) -> dict[str, Any]:
    return {
        "key": receipt.key,
        "result": receipt.result,
        "runId": receipt.run_id,
        "completedAt": receipt.completed_at,
    }


async def complete_work_receipt(call: Call) -> dict[str, Any]:
    """``{key, result, runId, runAttempt?, holder?}`` →
    ``{receipt: {key, result, runId, completedAt}, completionDisposition}``.

    With ``holder`` the completion is fenced by that holder's lease: while
    another holder's unexpired lease owns the key it is refused 409
    ``work_receipt_fenced`` and nothing is written.
    """
    play = _text(call.body, "playName")
    key = _text(call.body, "key")
    run_id = _text(call.body, "runId")
    if "result" not in call.body:
        raise bad_request("result is required (null is allowed)")
    attempt_value = call.body.get("runAttempt")
    attempt = None if attempt_value is None else _integer(attempt_value, "runAttempt", 0)
    holder = _optional_text(call.body, "holder")
    try:
        completion = await call.state.store.complete_work_receipt(
            call.org_id, play, key, call.body["result"], run_id, run_attempt=attempt, holder=holder
        )
    except WorkReceiptFencedError as exc:
        raise ActionError(409, exc.code, str(exc)) from None
    return {
        "receipt": _receipt_json(completion.receipt),
        "completionDisposition": completion.completion_disposition,
    }


async def claim_work_receipt(call: Call) -> dict[str, Any]:
    """``{key, holder}`` → ``{acquired, holder, expiresAt, receipt?}``.

    Takes (or renews, for the same holder) the key's lease for
    ``WORK_RECEIPT_LEASE_TTL_MS`` on the database's clock. Not acquired while
    another holder's lease is live (``holder``/``expiresAt`` name it) or once
    the work is completed (``receipt`` is the completed receipt; ``holder``
    and ``expiresAt`` are null).
    """
    play = _text(call.body, "playName")
    key = _text(call.body, "key")
    holder = _text(call.body, "holder")
    claim = await call.state.store.claim_work_receipt(call.org_id, play, key, holder)
    answer: dict[str, Any] = {
        "acquired": claim.acquired,
        "holder": claim.holder,
        "expiresAt": claim.expires_at,
    }
    if claim.receipt is not None:
        answer["receipt"] = _receipt_json(claim.receipt)
    return answer


async def release_work_receipt(call: Call) -> dict[str, Any]:
    """``{key, holder}`` → ``{released}``: gives up ``holder``'s lease so another
    holder need not wait for it to expire (false when ``holder`` held none)."""
    play = _text(call.body, "playName")
    key = _text(call.body, "key")
    holder = _text(call.body, "holder")
    released = await call.state.store.release_work_receipt(call.org_id, play, key, holder)
    return {"released": released}


# --- plays ---------------------------------------------------------------------------


async def resolve_play(call: Call) -> dict[str, Any]:
    """``{playRef}`` → ``{play: {playId, sourceCode, artifact, codeFormat,
    contractSnapshot} | null}``: the token's org's play whose id, else whose
    name, is ``playRef``. Another org's play is never found."""
    ref = _text(call.body, "playRef")
    play = await call.state.store.resolve_play(call.org_id, ref)
    return {"play": None if play is None else play_answer(play)}


async def register_play(call: Call) -> dict[str, Any]:
    """``{play: {playId, name?, sourceCode?, artifact?, codeFormat?, contractSnapshot?}}``
    → ``{playId}``: registers (or replaces) a play of the token's org."""
    definition = play_from_json(_object(call.body, "play"), where="play.", org_id=call.org_id)
    await call.state.store.register_play(call.org_id, definition.play, name=definition.name)
    return {"playId": definition.play.play_id}


# --- reads -----------------------------------------------------------------------------


def _row_cursor(value: object) -> RowCursor | None:
    """``input.after``: null (from the start) or ``{inputIndex, createdAt, key}``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request("input.after must be null or an object")
    index = value.get("inputIndex")
    if index is not None:
        index = _integer(index, "input.after.inputIndex", BIGINT_MIN, BIGINT_MAX)
    created_text = _text(value, "createdAt", where="input.after.")
    try:
        created = dt.datetime.fromisoformat(created_text)
    except ValueError:
        raise bad_request("input.after.createdAt must be an ISO 8601 timestamp") from None
    if created.tzinfo is None:
        raise bad_request("input.after.createdAt must carry a time zone")
    key = _text(value, "key", where="input.after.")
    if "\x00" in key or not _encodable(key):
        raise bad_request("input.after.key must be text Postgres can store")
    return RowCursor(index, created, key)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _cursor_json(cursor: RowCursor | None) -> dict[str, Any] | None:
    if cursor is None:
        return None
    return {
        "inputIndex": cursor.input_index,
        "createdAt": cursor.created_at.isoformat(),
        "key": cursor.key,
    }


async def runtime_sheet_read_rows(call: Call) -> dict[str, Any]:
    """``{input: {tableNamespace, runId?, rowMode?, limit, offset, after?}}`` →
    ``{rows, limit, offset}``.

    With ``after`` (null, or the ``nextAfter`` of the previous answer) the page
    is read by keyset instead of offset and the answer adds ``nextAfter``
    (null once the sheet has no more rows); a legacy gateway ignores ``after``.
    """
    spec, sheet, run_id, mode = _read_scope(call)
    request = _page_request(spec, "input")
    store = call.state.store
    admitted = _admitted(spec)
    if "after" not in spec or call.state.config.legacy:
        page = await store.read_rows(
            sheet, request, run_id=run_id, row_mode=mode, admitted=admitted
        )
        return _page_json(page)
    cursor = _row_cursor(spec["after"])
    # The store measures the rows as they decode and raises ReadBatchTooLargeError
    # (answered 413) past READ_BATCH_MAX_RESPONSE_BYTES.
    rows, next_cursor = await store.read_rows_after(
        sheet, cursor, request.limit, run_id=run_id, row_mode=mode, admitted=admitted
    )
    return {
        "rows": rows,
        "limit": request.limit,
        "offset": request.offset,
        "nextAfter": _cursor_json(next_cursor),
    }


async def runtime_sheet_read_rows_batch(call: Call) -> dict[str, Any]:
    """``{input: {tableNamespace, runId?, rowMode?, pages: [{limit, offset}]}}`` →
    ``{pages: [{rows, limit, offset}]}``, positional; 413 over the response budget."""
    spec, sheet, run_id, mode = _read_scope(call)
    raw_pages = _list(spec, "pages", where="input.")
    if not 1 <= len(raw_pages) <= READ_BATCH_MAX_PAGES:
        raise bad_request(f"Runtime dataset read batch requires 1-{READ_BATCH_MAX_PAGES} pages.")
    requests = [_page_request(p, f"input.pages[{i}]") for i, p in enumerate(raw_pages)]
    pages = await call.state.store.read_rows_batch(
        sheet, requests, run_id=run_id, row_mode=mode, admitted=_admitted(spec)
    )
    return {"pages": [_page_json(page) for page in pages]}


async def runtime_sheet_read_row_keys(call: Call) -> dict[str, Any]:
    """``{input: {tableNamespace, runId?, limit, offset}}`` → ``{keys, limit, offset}``."""
    spec, sheet, run_id, _mode = _read_scope(call)
    request = _page_request(spec, "input")
    keys = await call.state.store.read_row_keys(
        sheet, request, run_id=run_id, admitted=_admitted(spec)
    )
    return {"keys": list(keys), "limit": request.limit, "offset": request.offset}


# --- scoped sessions -------------------------------------------------------------------------


def _operations(body: Mapping[str, Any]) -> tuple[Operation, ...]:
    raw = _list(body, "operations")
    if not raw:
        raise bad_request("operations must name at least one operation")
    for op in raw:
        if op not in OPERATIONS:
            raise bad_request(f"operations must be drawn from {list(OPERATIONS)}, got {op!r}")
    ops = canonical_operations(raw)
    assert ops is not None
    return ops


def _limits(body: Mapping[str, Any]) -> dict[str, int]:
    value = body.get("limits")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise bad_request("limits must be an object")
    unknown = set(value) - set(_LIMIT_NAMES)
    if unknown:
        raise bad_request(f"limits may carry only {list(_LIMIT_NAMES)}, got {sorted(unknown)}")
    # A limit is left out to mean "none"; an explicit null is refused like any
    # other non-integer, so a caller's bug never silently widens a session. The
    # largest is a Postgres bigint, past anything a session can use.
    return {
        name: _integer(value[name], f"limits.{name}", 1, BIGINT_MAX)
        for name in _LIMIT_NAMES
        if name in value
    }


def _ttl_ms(body: Mapping[str, Any], ceiling_ms: int) -> int:
    value = body.get("ttlSeconds")
    if value is None:
        return ceiling_ms
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request("ttlSeconds must be a number")
    # math.isfinite would overflow on an int past a float's range: only floats are asked.
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request("ttlSeconds must be a number")
    if not 1 <= value <= _MAX_TTL_SECONDS:
        raise bad_request(f"ttlSeconds must be between 1 and {_MAX_TTL_SECONDS}, got {value}")
    # Compared in seconds first: a huge value times 1000 may not be an exact integer.
    if value >= ceiling_ms / _MS_PER_SECOND:
        return ceiling_ms
    return int(value * _MS_PER_SECOND)


@attrs.frozen
class _Minted:
    answer: dict[str, Any]
    url: str = attrs.field(repr=False)
    aad: bytes


async def _mint(
    state: GatewayState,
    sheet: SheetRef,
    logical_table: str,
    operations: Sequence[Operation],
    limits: Mapping[str, int],
    contract: SheetContract,
    ttl_ms: int,
    token_id: str | None = None,
) -> _Minted:
    """Ensure the sheet, create its scoped role, and build the answer without a URL.

    429 (nothing created) when the org or the token holds its cap of live sessions.
    """
    await state.store.ensure_sheet(sheet, contract)
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=ttl_ms)
    try:
        minted = await create_session_role(
            state.store,
            sheet,
            operations,
            expires,
            bounds=state.config.session_bounds(),
            caps=state.config.session_caps(),
            token_id=token_id,
        )
    except SessionCapReachedError as exc:
        raise ActionError(
            429, Code.SESSION_CAP, str(exc), retry_after_ms=DB_SESSION_CAP_RETRY_AFTER_MS
        ) from None
    state.metrics.sessions_minted.inc()
    names = minted.names
    answer: dict[str, Any] = {
        "expiresAt": minted.expires_at,
        "playName": sheet.play_name,
        "target": {
            "orgId": sheet.org_id,
            "tableNamespace": sheet.table_namespace,
            "logicalTable": logical_table,
        },
        "operations": list(minted.operations),
        "limits": dict(limits),
        "postgres": {
            "schema": names.schema,
            "sheetTable": names.sheet_table,
            "eventTable": names.event_table,
            "summaryTable": names.summary_table,
            "columnSummaryTable": names.column_summary_table,
        },
    }
    aad = crypto.session_aad(
        org_id=sheet.org_id,
        play_name=sheet.play_name,
        table_namespace=sheet.table_namespace,
        logical_table=logical_table,
        operations=minted.operations,
        expires_at=minted.expires_at,
    )
    url = scoped_url(state.config.database_url, minted.role, minted.password)
    return _Minted(answer, url, aad)


async def create_db_session(call: Call) -> dict[str, Any]:
    """Mint a scoped Postgres role and answer its URL encrypted to the caller's key.

    ``{target: {tableNamespace, logicalTable}, operations, limits?, sheetContract?,
    ttlSeconds?, userEmail?, postgresUrlEncryption?: {alg, publicKeyJwk}}``.
    """
    body = call.body
    target = _object(body, "target")
    sheet = _sheet(call, target, where="target.")
    logical_table = _text(target, "logicalTable", where="target.")
    if logical_table not in SERVED_LOGICAL_TABLES:
        raise bad_request(f"target.logicalTable must be one of {list(SERVED_LOGICAL_TABLES)}")
    operations = _operations(body)
    limits = _limits(body)
    contract = _contract(body, required=False)
    ttl_ms = _ttl_ms(body, call.state.config.session_ttl_ms)
    _user_email(body)
    encryption = body.get("postgresUrlEncryption")
    if encryption is not None:
        if not isinstance(encryption, Mapping):
            raise bad_request("postgresUrlEncryption must be an object")
        if encryption.get("alg") != crypto.ENVELOPE_REQUEST_ALG:
            raise bad_request(f"postgresUrlEncryption.alg must be {crypto.ENVELOPE_REQUEST_ALG!r}")
        jwk = encryption.get("publicKeyJwk")
        if not isinstance(jwk, Mapping):
            raise bad_request("postgresUrlEncryption.publicKeyJwk must be an object")
        # Check the key before a role exists for it (InvalidInputError → 400).
        crypto.check_public_jwk(jwk)
    elif not call.state.config.allow_plain_session_urls:
        raise ActionError(
            400,
            Code.ENCRYPTION_REQUIRED,
            "postgresUrlEncryption is required: "
            "this gateway never sends a Postgres URL in the clear",
        )
    minted = await _mint(
        call.state, sheet, logical_table, operations, limits, contract, ttl_ms, call.token_id
    )
    if encryption is None:
        return {**minted.answer, "postgresUrl": minted.url}
    envelope = crypto.encrypt_postgres_url(minted.url, encryption["publicKeyJwk"], minted.aad)
    return {**minted.answer, "encryptedPostgresUrl": envelope}


async def mint_preloaded_session(
    state: GatewayState,
    *,
    org_id: str,
    play_name: str,
    table_namespace: str,
    operations: Sequence[str],
    logical_table: str = "sheet_rows",
    limits: Mapping[str, int] | None = None,
    contract: SheetContract | None = None,
    ttl_ms: int | None = None,
) -> dict[str, Any]:
    """A ``create_db_session`` answer minted ahead of a run (the harness path).

    Its ``encryptedPostgresUrl`` is sealed under the gateway's symmetric
    ``unwrap_key`` (JWE ``A256KW`` + ``A256GCM``) with the same AAD as a normal
    session, so a runner holding that key can open it. Raises
    ``InvalidInputError`` when the gateway has no unwrap key.
    """
    key = state.config.unwrap_key
    if key is None:
        raise InvalidInputError("this gateway has no unwrap key for preloaded sessions")
    if logical_table not in SERVED_LOGICAL_TABLES:
        raise InvalidInputError(f"logical_table must be one of {list(SERVED_LOGICAL_TABLES)}")
    ops = canonical_operations(operations)
    if not ops:
        raise InvalidInputError(f"operations must be drawn from {list(OPERATIONS)}")
    ceiling = state.config.session_ttl_ms
    sheet = SheetRef(org_id=org_id, play_name=play_name, table_namespace=table_namespace)
    minted = await _mint(
        state,
        sheet,
        logical_table,
        ops,
        dict(limits or {}),
        contract or SheetContract(),
        ceiling if ttl_ms is None else min(ttl_ms, ceiling),
    )
    envelope = crypto.encrypt_with_unwrap_key(minted.url, key, minted.aad)
    return {**minted.answer, "encryptedPostgresUrl": envelope}


#: Every action this gateway answers, by name.
HANDLERS: Final[Mapping[str, Handler]] = {
    _wire.ENSURE_SHEET: ensure_sheet,
    _wire.START_SHEET_DATASET: start_sheet_dataset,
    _wire.CREATE_DB_SESSION: create_db_session,
    _wire.READ_ROWS: runtime_sheet_read_rows,
    _wire.READ_ROWS_BATCH: runtime_sheet_read_rows_batch,
    _wire.READ_ROW_KEYS: runtime_sheet_read_row_keys,
    _wire.COMPLETE_MAP_ROWS: runtime_sheet_complete_map_rows,
    _wire.FAIL_MAP_ROWS: runtime_sheet_fail_map_rows,
    _wire.COMPLETE_WORK_RECEIPT: complete_work_receipt,
    _wire.CLAIM_WORK_RECEIPT: claim_work_receipt,
    _wire.RELEASE_WORK_RECEIPT: release_work_receipt,
    _wire.RESOLVE_PLAY: resolve_play,
    _wire.REGISTER_PLAY: register_play,
    _wire.SUMMARY: runtime_sheet_summary,
}

#: Actions a legacy gateway (``legacy=True``) does not know.
LEGACY_UNSUPPORTED: Final = frozenset({_wire.READ_ROWS_BATCH})
