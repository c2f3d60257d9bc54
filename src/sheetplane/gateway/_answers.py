"""Checking gateway answers and turning them into sheetplane values.

Every parser takes the decoded JSON object of a successful answer and either
returns a value or raises ``GatewayProtocolError`` naming the action and what
was wrong. No parser retries or reads again: a malformed answer to an
accepted request is a gateway bug, and reading again could hide it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from .._types import (
    CODE_FORMATS,
    STALE_REASONS,
    InlineAdmission,
    Page,
    PageRequest,
    Receipt,
    ReceiptClaim,
    ReceiptCompletion,
    ResolvedPlay,
    StaleReason,
    StaleRow,
    Summary,
    TerminalWriteResult,
)
from ..errors import GatewayProtocolError


def protocol_error(action: str, what: str, status: int = 200) -> GatewayProtocolError:
    """A ``GatewayProtocolError`` for ``action``'s answer."""
    return GatewayProtocolError(status, None, f"{action} answer is malformed: {what}")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(answer: Mapping[str, Any], name: str, action: str) -> int:
    value = answer.get(name)
    if not _is_int(value) or value < 0:
        raise protocol_error(action, f"{name} must be a non-negative integer, got {value!r}")
    return value


def _str(answer: Mapping[str, Any], name: str, action: str) -> str:
    value = answer.get(name)
    if not isinstance(value, str):
        raise protocol_error(action, f"{name} must be a string, got {type(value).__name__}")
    return value


def _str_list(answer: Mapping[str, Any], name: str, action: str) -> tuple[str, ...]:
    value = answer.get(name)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise protocol_error(action, f"{name} must be a list of strings")
    return tuple(value)


def _keyed_rows(answer: Mapping[str, Any], name: str, action: str) -> tuple[dict[str, Any], ...]:
    value = answer.get(name)
    if not isinstance(value, list):
        raise protocol_error(action, f"{name} must be a list")
    for index, row in enumerate(value):
        if not isinstance(row, dict) or not isinstance(row.get("_key"), str):
            raise protocol_error(action, f"{name}[{index}] must be an object with a string _key")
    return tuple(value)


def parse_ok(answer: Mapping[str, Any], action: str) -> None:
    """``{ok: true}``."""
    if answer.get("ok") is not True:
        raise protocol_error(action, "expected {ok: true}")


def parse_admission(answer: Mapping[str, Any], action: str) -> InlineAdmission:
    """``{inserted, skipped, pendingRows, completedRows, tableNamespace, writeVersion}``."""
    return InlineAdmission(
        inserted=_int(answer, "inserted", action),
        skipped=_int(answer, "skipped", action),
        pending_rows=_keyed_rows(answer, "pendingRows", action),
        completed_rows=_keyed_rows(answer, "completedRows", action),
        write_version=_int(answer, "writeVersion", action),
        table_namespace=_str(answer, "tableNamespace", action),
    )


def check_page(value: object, request: PageRequest, action: str, where: str) -> Page:
    """One page of a read answer, checked against the request it answers.

    It must echo the request's ``limit`` and ``offset`` and hold at most
    ``limit`` rows, each a JSON object.
    """
    if not isinstance(value, dict):
        raise protocol_error(action, f"{where} must be an object")
    limit, offset, rows = value.get("limit"), value.get("offset"), value.get("rows")
    if (
        not _is_int(limit)
        or not _is_int(offset)
        or (limit, offset)
        != (
            request.limit,
            request.offset,
        )
    ):
        raise protocol_error(
            action,
            f"{where} answers limit={limit!r} offset={offset!r}, "
            f"but limit={request.limit} offset={request.offset} was requested",
        )
    if not isinstance(rows, list):
        raise protocol_error(action, f"{where} rows must be a list")
    if len(rows) > request.limit:
        raise protocol_error(action, f"{where} holds {len(rows)} rows, over its limit {limit}")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise protocol_error(action, f"{where} row {index} is not an object")
    return Page(rows=tuple(rows), limit=request.limit, offset=request.offset)


def parse_pages(
    answer: Mapping[str, Any], requests: Sequence[PageRequest], action: str
) -> list[Page]:
    """``{pages: [{rows, limit, offset}]}``: one page per request, positionally."""
    pages = answer.get("pages")
    if not isinstance(pages, list) or len(pages) != len(requests):
        count = len(pages) if isinstance(pages, list) else type(pages).__name__
        raise protocol_error(action, f"expected {len(requests)} page(s), got {count}")
    return [
        check_page(page, request, action, f"page {index}")
        for index, (page, request) in enumerate(zip(pages, requests, strict=True))
    ]


def parse_row_keys(answer: Mapping[str, Any], request: PageRequest, action: str) -> list[str]:
    """``{keys: [str]}``, at most ``limit`` of them."""
    keys = _str_list(answer, "keys", action)
    if len(keys) > request.limit:
        raise protocol_error(action, f"{len(keys)} keys over the limit {request.limit}")
    return list(keys)


def _stale_row(value: object, action: str) -> StaleRow:
    if not isinstance(value, dict):
        raise protocol_error(action, "staleRows entries must be objects")
    key, reason, stamp = value.get("key"), value.get("reason"), value.get("rowVersionStamp")
    if not isinstance(key, str) or not _is_stale_reason(reason):
        raise protocol_error(action, f"malformed stale row {value!r}")
    if stamp is not None and not _is_int(stamp):
        raise protocol_error(action, f"stale row {key!r} has rowVersionStamp {stamp!r}")
    return StaleRow(key=key, reason=reason, row_version_stamp=stamp)


def _is_stale_reason(value: object) -> TypeGuard[StaleReason]:
    return isinstance(value, str) and value in STALE_REASONS


def parse_terminal_write(answer: Mapping[str, Any], action: str) -> TerminalWriteResult:
    """``{committedKeys, staleKeys, staleRows?, updated}``.

    A stale key without a reported row (a gateway that predates reasons, or
    one that listed fewer rows than keys) is reported as ``unreported``,
    which counts as superseded.
    """
    committed = _str_list(answer, "committedKeys", action)
    stale_keys = _str_list(answer, "staleKeys", action)
    raw_rows = answer.get("staleRows")
    if raw_rows is not None and not isinstance(raw_rows, list):
        raise protocol_error(action, "staleRows must be a list")
    reported: dict[str, StaleRow] = {}
    for raw in raw_rows or ():
        row = _stale_row(raw, action)
        reported.setdefault(row.key, row)
    stale_rows = dict(reported)
    for key in stale_keys:
        stale_rows.setdefault(key, StaleRow(key=key, reason="unreported", row_version_stamp=None))
    return TerminalWriteResult(
        committed_keys=tuple(dict.fromkeys(k for k in committed if k not in stale_rows)),
        stale_rows=tuple(stale_rows.values()),
        updated=_int(answer, "updated", action),
    )


def _receipt(receipt: object, action: str) -> Receipt:
    if not isinstance(receipt, dict):
        raise protocol_error(action, "receipt must be an object")
    if "result" not in receipt:
        raise protocol_error(action, "receipt has no result")
    return Receipt(
        key=_str(receipt, "key", action),
        result=receipt["result"],
        run_id=_str(receipt, "runId", action),
        completed_at=_str(receipt, "completedAt", action),
    )


def parse_receipt_completion(
    answer: Mapping[str, Any], action: str, run_id: str
) -> ReceiptCompletion:
    """``{receipt: {key, result, runId, completedAt}, completionDisposition}``.

    A gateway that predates ``completionDisposition`` is answered by
    comparing run ids: the receipt is ``persisted`` when this run wrote it.
    """
    value = _receipt(answer.get("receipt"), action)
    disposition = answer.get("completionDisposition")
    if disposition is None:
        disposition = "persisted" if value.run_id == run_id else "existing"
    if disposition == "persisted":
        return ReceiptCompletion(receipt=value, completion_disposition="persisted")
    if disposition == "existing":
        return ReceiptCompletion(receipt=value, completion_disposition="existing")
    raise protocol_error(action, f"unknown completionDisposition {disposition!r}")


def _optional_str(answer: Mapping[str, Any], name: str, action: str) -> str | None:
    value = answer.get(name)
    if value is not None and not isinstance(value, str):
        raise protocol_error(action, f"{name} must be a string or null")
    return value


def parse_receipt_claim(answer: Mapping[str, Any], action: str, holder: str) -> ReceiptClaim:
    """``{acquired, holder, expiresAt, receipt?}``; an acquired lease must name ``holder``
    and an expiry, and a completed one carries no lease."""
    acquired = answer.get("acquired")
    if not isinstance(acquired, bool):
        raise protocol_error(action, "acquired must be a boolean")
    current = _optional_str(answer, "holder", action)
    expires_at = _optional_str(answer, "expiresAt", action)
    raw = answer.get("receipt")
    receipt = None if raw is None else _receipt(raw, action)
    if acquired and (current != holder or expires_at is None or receipt is not None):
        raise protocol_error(action, "an acquired lease must name its holder and expiry")
    return ReceiptClaim(acquired, current, expires_at, receipt)


def parse_released(answer: Mapping[str, Any], action: str) -> bool:
    """``{released}``."""
    released = answer.get("released")
    if not isinstance(released, bool):
        raise protocol_error(action, "released must be a boolean")
    return released


def parse_resolved_play(answer: Mapping[str, Any], action: str) -> ResolvedPlay | None:
    """``{play: {playId, sourceCode?, artifact?, codeFormat?, contractSnapshot?} | null}``."""
    if "play" not in answer:
        raise protocol_error(action, "the answer has no play (null when none resolves)")
    play = answer["play"]
    if play is None:
        return None
    if not isinstance(play, dict):
        raise protocol_error(action, "play must be an object or null")
    snapshot = play.get("contractSnapshot")
    code_format = play.get("codeFormat")
    if snapshot is not None and not isinstance(snapshot, dict):
        raise protocol_error(action, "play.contractSnapshot must be an object or null")
    if code_format is not None and code_format not in CODE_FORMATS:
        raise protocol_error(action, f"play.codeFormat {code_format!r} is not a code format")
    play_id = _str(play, "playId", action)
    if not play_id.strip():
        raise protocol_error(action, "play.playId is empty")
    return ResolvedPlay(
        play_id=play_id,
        source_code=_optional_str(play, "sourceCode", action),
        artifact=play.get("artifact"),
        code_format=code_format,
        contract_snapshot=snapshot,
    )


def parse_summary(answer: Mapping[str, Any], action: str) -> Summary:
    """``{total, queued, running, completed, failed}``."""
    return Summary(
        total=_int(answer, "total", action),
        queued=_int(answer, "queued", action),
        running=_int(answer, "running", action),
        completed=_int(answer, "completed", action),
        failed=_int(answer, "failed", action),
    )
