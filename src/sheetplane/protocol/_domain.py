"""Checking gateway answers and turning them into sheetplane values.

Every parser takes the decoded JSON object of a successful answer, reads it
as its wire class (``protocol/_messages.py``: the shape, under the camelCase
names), checks what the class cannot know (that a page echoes the request it
answers, that an acquired lease names its holder), and either returns a value
or raises ``GatewayProtocolError`` naming the action and what was wrong. No
parser retries or reads again: a malformed answer to an accepted request is a
gateway bug, and reading again could hide it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

from .._types import (
    InlineAdmission,
    Page,
    PageRequest,
    Receipt,
    ReceiptClaim,
    ReceiptCompletion,
    ResolvedPlay,
    StaleRow,
    Summary,
    TerminalWriteResult,
)
from ..errors import GatewayProtocolError
from . import _messages as m

T = TypeVar("T")


def protocol_error(action: str, what: str, status: int = 200) -> GatewayProtocolError:
    """A ``GatewayProtocolError`` for ``action``'s answer."""
    return GatewayProtocolError(status, None, f"{action} answer is malformed: {what}")


def read_as(value: object, cls: type[T], action: str, where: str = "") -> T:
    """``value`` as the wire class ``cls``; ``GatewayProtocolError`` naming the member."""
    try:
        return m.structure(value, cls)
    except m.WireError as exc:
        raise protocol_error(action, f"{where}{exc}") from None


def parse_ok(answer: Mapping[str, Any], action: str) -> None:
    """``{ok: true}``."""
    read_as(answer, m.OkAnswer, action)


def parse_admission(answer: Mapping[str, Any], action: str) -> InlineAdmission:
    """``{inserted, skipped, pendingRows, completedRows, tableNamespace, writeVersion}``."""
    read = read_as(answer, m.AdmissionAnswer, action)
    return InlineAdmission(
        inserted=read.inserted,
        skipped=read.skipped,
        pending_rows=tuple(read.pending_rows),
        completed_rows=tuple(read.completed_rows),
        write_version=read.write_version,
        table_namespace=read.table_namespace,
    )


def check_page(value: object, request: PageRequest, action: str, where: str) -> Page:
    """One page of a read answer, checked against the request it answers.

    It must echo the request's ``limit`` and ``offset`` and hold at most
    ``limit`` rows, each a JSON object.
    """
    page = read_as(value, m.PageWire, action, f"{where}: ")
    if (page.limit, page.offset) != (request.limit, request.offset):
        raise protocol_error(
            action,
            f"{where} answers limit={page.limit!r} offset={page.offset!r}, "
            f"but limit={request.limit} offset={request.offset} was requested",
        )
    if len(page.rows) > request.limit:
        raise protocol_error(action, f"{where} holds {len(page.rows)} rows, over its limit")
    return Page(rows=tuple(page.rows), limit=request.limit, offset=request.offset)


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
    keys = read_as(answer, m.ReadRowKeysAnswer, action).keys
    if len(keys) > request.limit:
        raise protocol_error(action, f"{len(keys)} keys over the limit {request.limit}")
    return keys


def parse_terminal_write(answer: Mapping[str, Any], action: str) -> TerminalWriteResult:
    """``{committedKeys, staleKeys, staleRows?, updated}``.

    A stale key without a reported row (a gateway that predates reasons, or
    one that listed fewer rows than keys) is reported as ``unreported``,
    which counts as superseded.
    """
    read = read_as(answer, m.TerminalWriteAnswer, action)
    reported: dict[str, StaleRow] = {}
    for row in [] if read.stale_rows is m.ABSENT else read.stale_rows:
        reported.setdefault(row.key, StaleRow(row.key, row.reason, row.row_version_stamp))
    stale_rows = dict(reported)
    for key in read.stale_keys:
        stale_rows.setdefault(key, StaleRow(key=key, reason="unreported", row_version_stamp=None))
    return TerminalWriteResult(
        committed_keys=tuple(dict.fromkeys(k for k in read.committed_keys if k not in stale_rows)),
        stale_rows=tuple(stale_rows.values()),
        updated=read.updated,
    )


def _receipt(receipt: m.ReceiptWire) -> Receipt:
    return Receipt(**attrs.asdict(receipt, recurse=False))


def parse_receipt_completion(
    answer: Mapping[str, Any], action: str, run_id: str
) -> ReceiptCompletion:
    """``{receipt: {key, result, runId, completedAt}, completionDisposition}``.

    A gateway that predates ``completionDisposition`` is answered by
    comparing run ids: the receipt is ``persisted`` when this run wrote it.
    """
    read = read_as(answer, m.ReceiptAnswer, action)
    receipt = _receipt(read.receipt)
    disposition = read.completion_disposition
    if disposition is m.ABSENT:
        disposition = "persisted" if receipt.run_id == run_id else "existing"
    return ReceiptCompletion(receipt=receipt, completion_disposition=disposition)


def parse_receipt_claim(answer: Mapping[str, Any], action: str, holder: str) -> ReceiptClaim:
    """``{acquired, holder, expiresAt, receipt?}``; an acquired lease must name ``holder``
    and an expiry, and a completed one carries no lease."""
    read = read_as(answer, m.ClaimAnswer, action)
    receipt = None if read.receipt is m.ABSENT else _receipt(read.receipt)
    if read.acquired and (read.holder != holder or read.expires_at is None or receipt is not None):
        raise protocol_error(action, "an acquired lease must name its holder and expiry")
    return ReceiptClaim(read.acquired, read.holder, read.expires_at, receipt)


def parse_released(answer: Mapping[str, Any], action: str) -> bool:
    """``{released}``."""
    return read_as(answer, m.ReleaseAnswer, action).released


def parse_resolved_play(answer: Mapping[str, Any], action: str) -> ResolvedPlay | None:
    """``{play: {playId, sourceCode?, artifact?, codeFormat?, contractSnapshot?} | null}``."""
    play = read_as(answer, m.ResolvePlayAnswer, action).play
    return None if play is None else m.copy_fields(play, ResolvedPlay)


def parse_summary(answer: Mapping[str, Any], action: str) -> Summary:
    """``{total, queued, running, completed, failed}``."""
    return Summary(**attrs.asdict(read_as(answer, m.SummaryAnswer, action)))
