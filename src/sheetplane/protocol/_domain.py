"""Domain values to wire messages and back, in both directions, once.

Both sides convert here: the client builds its requests from domain values
(``contract_wire``, ``admitted_wire``) and reads answers into domain values
(the ``parse_*`` functions); the reference server reads requests into domain
values (``contract_of``, ``complete_rows_of``) and builds its answers from
the store's values (the ``*_answer`` functions). A pair that goes both ways
sits side by side, so the two directions cannot drift apart.

Every parser of an answer takes the decoded JSON object of a successful
answer, reads it as its wire class (``protocol/_messages.py``: the shape,
under the camelCase names), checks what the class cannot know (that a page
echoes the request it answers, that an acquired lease names its holder),
and either returns a value or raises ``GatewayProtocolError`` naming the
action and what was wrong. No parser retries or reads again: a malformed
answer to an accepted request is a gateway bug, and reading again could
hide it.
"""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar

import attrs

from .._attempts import AttemptStatus, ShareClaim, ShareRenewal
from .._rowchecks import CheckedObject, checked_outputs
from .._types import (
    OPERATIONS,
    AdmittedPart,
    CheckedPage,
    CheckedPages,
    CompleteRow,
    ContractColumn,
    DbSession,
    FailRow,
    InlineAdmission,
    Page,
    PageRequest,
    PostgresTables,
    Receipt,
    ReceiptClaim,
    ReceiptCompletion,
    ResolvedPlay,
    RowCursor,
    RowFilter,
    SessionLimits,
    SheetContract,
    StaleRow,
    Summary,
    TerminalWriteResult,
    WriteResult,
    canonical_operations,
    decoded_page_batch,
    unchecked,
)
from ..errors import GatewayProtocolError, InvalidInputError
from . import _messages as m
from ._converter import Checked, build_checked, check_text_cap, non_empty

__all__ = [
    "admission_answer",
    "admitted_of",
    "admitted_wire",
    "attempt_status_answer",
    "check_page",
    "claim_answer",
    "complete_rows_decoded",
    "complete_rows_json",
    "complete_rows_of",
    "complete_rows_wire",
    "contract_json",
    "contract_of",
    "contract_wire",
    "copy_fields",
    "fail_rows_decoded",
    "fail_rows_json",
    "fail_rows_of",
    "fail_rows_wire",
    "keyed_write_answer",
    "page_batch_of",
    "page_input",
    "pages_wire",
    "parse_admission",
    "parse_attempt_status",
    "parse_db_session",
    "parse_keyed_write",
    "parse_ok",
    "parse_pages",
    "parse_receipt_claim",
    "parse_receipt_completion",
    "parse_released",
    "parse_resolved_play",
    "parse_row_keys",
    "parse_share_claim",
    "parse_share_lease",
    "parse_summary",
    "parse_terminal_write",
    "play_wire",
    "protocol_error",
    "read_as",
    "read_contract",
    "receipt_answer",
    "receipt_of",
    "receipt_wire",
    "resolved_play_answer",
    "row_cursor_of",
    "row_cursor_wire",
    "row_filter_of",
    "session_limits_json",
    "session_limits_of",
    "share_claim_answer",
    "share_lease_answer",
    "summary_answer",
    "terminal_write_answer",
]

T = TypeVar("T")


# --- both directions ---------------------------------------------------------------------


def copy_fields(value: Any, cls: type[T], **given: Any) -> T:
    """A ``cls`` (a domain value or a wire class) holding ``value``'s members of the
    same names, but for those ``given``: where a message and a value agree field for
    field (a row list on the wire is a tuple in a value)."""
    fields = attrs.fields(typing.cast(Any, cls))
    return cls(
        **{f.name: given[f.name] if f.name in given else getattr(value, f.name) for f in fields}
    )


def contract_wire(contract: SheetContract) -> m.SheetContractWire:
    """A sheet contract as the wire carries it."""
    return m.SheetContractWire(
        columns=[
            m.ContractColumnWire(id=c.id, sql_name=c.sql_name, source=c.source, field=c.field)
            for c in contract.columns
        ]
    )


def contract_of(value: m.SheetContractWire | None) -> SheetContract:
    """The sheet contract a request carries (none: no columns)."""
    if value is None:
        return SheetContract()
    return SheetContract(
        tuple(ContractColumn(c.id, c.sql_name, c.source, c.field) for c in value.columns)
    )


def contract_json(contract: SheetContract) -> dict[str, Any]:
    """A sheet contract's decoded JSON ``{columns: [{id, sqlName, source, field?}]}``."""
    return m.unstructure(contract_wire(contract))


def read_contract(value: object) -> SheetContract:
    """A sheet contract from its decoded JSON ``{columns: [...]}``; ``WireError``
    naming the member if it is off."""
    read = m.structure(value, m.SheetContractWire)
    try:
        return contract_of(read)
    except InvalidInputError as exc:
        raise m.WireError(str(exc)) from None


def admitted_wire(part: AdmittedPart | None) -> m.AdmittedPartWire | None:
    """A read's ``input.admission`` filter."""
    return (
        None
        if part is None
        else m.AdmittedPartWire(
            write_version=part.write_version,
            part=part.part,
            first_index=part.first_index,
            last_index=part.last_index,
        )
    )


def admitted_of(value: m.AdmittedPartWire | None) -> AdmittedPart | None:
    """``input.admission``: null, or one admission's pending or completed rows."""
    if value is None:
        return None
    return AdmittedPart(value.write_version, value.part, value.first_index, value.last_index)


def row_filter_of(spec: m.ReadInput) -> RowFilter:
    """The rows a read's ``input`` asks for (no ``rowMode``: ``output``)."""
    return RowFilter(
        run_id=spec.run_id,
        row_mode="output" if spec.row_mode is None else spec.row_mode,
        admitted=admitted_of(spec.admission),
    )


def row_cursor_wire(cursor: RowCursor | None) -> m.RowCursorWire | None:
    """A keyset read's ``nextAfter``: null once the sheet has no more rows."""
    if cursor is None:
        return None
    return m.RowCursorWire(
        input_index=cursor.input_index, created_at=cursor.created_at.isoformat(), key=cursor.key
    )


def row_cursor_of(value: m.RowCursorWire | None) -> RowCursor | None:
    """``input.after``: null (from the start) or ``{inputIndex, createdAt, key}``, a
    ``nextAfter`` given back; ``WireError`` when its time has no zone or its key is
    text Postgres cannot store."""
    if value is None:
        return None
    try:
        created = dt.datetime.fromisoformat(value.created_at)
    except ValueError:
        raise m.WireError("input.after.createdAt must be an ISO 8601 timestamp") from None
    if created.tzinfo is None:
        raise m.WireError("input.after.createdAt must carry a time zone")
    if "\x00" in value.key or not _encodable(value.key):
        raise m.WireError("input.after.key must be text Postgres can store")
    return RowCursor(value.input_index, created, value.key)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


class _Paged(Protocol):
    """A page as a request carries it: a batch's ``PageRequestWire``, a read's ``input``."""

    @property
    def limit(self) -> int: ...
    @property
    def offset(self) -> int: ...


def page_batch_of(pages: Iterable[_Paged]) -> CheckedPages:
    """The pages a decoded read asks for (a batch's ``input.pages``, or a read's
    ``input`` itself), as the store reads them without checking them again:
    their wire classes held them to the page rules and the count as they were
    read, the reference gateway's one check of a page."""
    return decoded_page_batch((page.limit, page.offset) for page in pages)


def pages_wire(pages: CheckedPages) -> list[m.PageRequestWire]:
    """A batch read's ``input.pages`` from pages ``check_page_batch`` checked, written
    without holding them to the wire class's rules again (the same rules)."""
    return Checked(unchecked(m.PageRequestWire, limit=p.limit, offset=p.offset) for p in pages)


def page_input(cls: type[T], page: CheckedPage, **fields: Any) -> T:
    """A single-page read's ``input`` (``ReadRowsInput``, ``ReadRowKeysInput``) with the
    ``limit`` and ``offset`` of a page ``check_page_request`` checked written without
    holding them to the class's rules again (the same rules); the other members'
    rules run as ``m.build`` runs them."""
    return build_checked(cls, {"limit": page.limit, "offset": page.offset}, **fields)


def receipt_wire(receipt: Receipt) -> m.ReceiptWire:
    """A work receipt as an answer carries it."""
    return copy_fields(receipt, m.ReceiptWire)


def receipt_of(receipt: m.ReceiptWire) -> Receipt:
    """The work receipt an answer carries."""
    return copy_fields(receipt, Receipt)


def play_wire(play: ResolvedPlay) -> m.PlayWire:
    """The ``play`` member of a ``resolve_play`` answer."""
    snapshot = play.contract_snapshot
    return m.PlayWire(
        play_id=play.play_id,
        source_code=play.source_code,
        artifact=play.artifact,
        code_format=play.code_format,
        contract_snapshot=None if snapshot is None else dict(snapshot),
    )


def complete_rows_wire(rows: Iterable[CompleteRow]) -> list[m.CompleteRowWire]:
    """A complete request's ``rows``; ``WireError`` naming the first bad one."""
    return _built(
        m.CompleteRowWire,
        (
            {"key": r.key, "data": dict(r.data), "cell_meta_patch": _dict(r.cell_meta_patch)}
            for r in rows
        ),
    )


def complete_rows_json(rows: Iterable[CompleteRow]) -> list[dict[str, Any]]:
    """A complete request's ``rows`` as the converter writes ``complete_rows_wire``'s,
    made in one pass (a row's data and cell meta patch are JSON values, written as they
    are held): each key checked as ``CompleteRowWire`` checks it; ``WireError`` naming
    the first bad one. ``tests/test_wire_messages.py`` holds the two to one result."""
    out = []
    for position, row in enumerate(rows):
        problem = non_empty(row.key)
        if problem is not None:
            raise m.WireError(f"rows[{position}].key {problem}")
        wire = {"key": row.key, "data": _json_object(row.data)}
        if row.cell_meta_patch is not None:
            wire["cellMetaPatch"] = _json_object(row.cell_meta_patch)
        out.append(wire)
    return out


def fail_rows_json(rows: Iterable[FailRow]) -> list[dict[str, Any]]:
    """A fail request's ``rows`` as the converter writes ``fail_rows_wire``'s, in one
    pass, as ``complete_rows_json``."""
    out = []
    for position, row in enumerate(rows):
        problem = non_empty(row.key)
        if problem is not None:
            raise m.WireError(f"rows[{position}].key {problem}")
        if not isinstance(row.error, str):
            raise m.WireError(f"rows[{position}].error must be a string")
        wire: dict[str, Any] = {"key": row.key, "error": row.error}
        if row.data is not None:
            wire["data"] = _json_object(row.data)
        out.append(wire)
    return out


def _json_object(value: Mapping[str, Any]) -> dict[str, Any]:
    """A row's JSON object as it is held (map's are dicts), else copied into one."""
    return value if isinstance(value, dict) else dict(value)


def complete_rows_of(rows: Iterable[m.CompleteRowWire]) -> list[CompleteRow]:
    """The rows a complete request carries."""
    return [CompleteRow(row.key, row.data, row.cell_meta_patch) for row in rows]


#: The members a complete and a fail request's row may carry. A row with any other
#: (which the wire classes ignore) goes the wire classes' way.
_COMPLETE_MEMBERS: Final = frozenset({"key", "data", "cellMetaPatch"})
_FAIL_MEMBERS: Final = frozenset({"key", "error", "data"})


def complete_rows_decoded(rows: object) -> list[CompleteRow] | None:
    """A complete request's ``rows`` member as its body decoded it, read in one pass
    straight into the rows the store takes: each key held to ``CompleteRowWire``'s rules
    and each data and cell meta patch checked once (``checked_outputs``: a
    ``CheckedObject``, which the store takes as it is), with no wire object per row.

    None when any row is not in that plain form or fails a check: the caller then
    reads the request through the wire classes and the store, which refuse it with
    the error they name, so a bad row has one answer whichever way it came."""
    if type(rows) is not list:
        return None
    out = []
    try:
        for row in rows:
            if type(row) is not dict or not row.keys() <= _COMPLETE_MEMBERS:
                return None
            key = row.get("key")
            data = row.get("data", _EMPTY)
            meta = row.get("cellMetaPatch")
            if not _plain_key(key) or type(data) is not dict:
                return None
            if meta is not None and type(meta) is not dict:
                return None
            out.append(CompleteRow(key, _checked(data), None if meta is None else _checked(meta)))
    except InvalidInputError:
        return None
    return out


def fail_rows_decoded(rows: object) -> list[FailRow] | None:
    """A fail request's ``rows`` member read straight into the store's rows, as
    ``complete_rows_decoded`` reads a complete request's."""
    if type(rows) is not list:
        return None
    out = []
    try:
        for row in rows:
            if type(row) is not dict or not row.keys() <= _FAIL_MEMBERS:
                return None
            key = row.get("key")
            error = row.get("error")
            data = row.get("data")
            if not _plain_key(key) or type(error) is not str:
                return None
            if check_text_cap(error, "error") is not None:
                return None
            if data is not None and type(data) is not dict:
                return None
            out.append(FailRow(key, error, None if data is None else _checked(data)))
    except InvalidInputError:
        return None
    return out


_EMPTY: Final[dict[str, Any]] = {}


def _plain_key(key: object) -> typing.TypeGuard[str]:
    """Whether ``key`` passes a row wire's ``key`` rules (non-empty text within its cap)."""
    return non_empty(key) is None and check_text_cap(typing.cast(str, key), "key") is None


def _checked(value: dict[str, Any]) -> CheckedObject:
    """``value`` checked once as a row's JSON object (``InvalidInputError`` if it is not)."""
    return checked_outputs(value, lambda: "a row's JSON object")[0]


def fail_rows_wire(rows: Iterable[FailRow]) -> list[m.FailRowWire]:
    """A fail request's ``rows``; ``WireError`` naming the first bad one."""
    return _built(
        m.FailRowWire, ({"key": r.key, "error": r.error, "data": _dict(r.data)} for r in rows)
    )


def fail_rows_of(rows: Iterable[m.FailRowWire]) -> list[FailRow]:
    """The rows a fail request carries."""
    return [FailRow(row.key, row.error, row.data) for row in rows]


def _built(cls: type[T], rows: Iterable[dict[str, Any]]) -> list[T]:
    built = []
    for position, fields in enumerate(rows):
        try:
            built.append(m.build(cls, **fields))
        except m.WireError as exc:
            raise m.WireError(f"rows[{position}].{exc}") from None
    return built


def _dict(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else dict(value)


def session_limits_json(limits: SessionLimits) -> dict[str, Any]:
    """``{maxRows?, maxBytes?, maxRequests?}``: only the limits that are set."""
    set_ = {name: value for name, value in attrs.asdict(limits).items() if value is not None}
    return m.unstructure(m.SessionLimitsWire(**set_))


def session_limits_of(value: m.SessionLimitsWire) -> SessionLimits:
    """The limits a message carries (a limit left out is not limited)."""
    return SessionLimits(
        **{
            name: None if limit is m.ABSENT else limit
            for name, limit in attrs.asdict(value).items()
        }
    )


# --- domain values to answers (the server) -----------------------------------------------


def admission_answer(admission: InlineAdmission) -> dict[str, Any]:
    """``start_sheet_dataset``'s answer."""
    pending, completed = list(admission.pending_rows), list(admission.completed_rows)
    answer = copy_fields(
        admission, m.AdmissionAnswer, pending_rows=pending, completed_rows=completed
    )
    return m.unstructure(answer)


def terminal_write_answer(result: TerminalWriteResult, *, legacy: bool) -> dict[str, Any]:
    """A complete or fail answer; a ``legacy`` gateway leaves ``staleRows`` out."""
    stale_rows: list[m.StaleRowWire] | m.Absent = m.ABSENT
    if not legacy:
        stale_rows = [copy_fields(row, m.StaleRowWire) for row in result.stale_rows]
    answer = m.TerminalWriteAnswer(
        committed_keys=list(result.committed_keys),
        stale_keys=list(result.stale_keys),
        updated=result.updated,
        stale_rows=stale_rows,
    )
    return m.unstructure(answer)


def receipt_answer(completion: ReceiptCompletion) -> dict[str, Any]:
    """``complete_work_receipt``'s answer."""
    answer = m.ReceiptAnswer(
        receipt=receipt_wire(completion.receipt),
        completion_disposition=completion.completion_disposition,
    )
    return m.unstructure(answer)


def claim_answer(claim: ReceiptClaim) -> dict[str, Any]:
    """``claim_work_receipt``'s answer."""
    answer = m.ClaimAnswer(
        acquired=claim.acquired,
        holder=claim.holder,
        expires_at=claim.expires_at,
        receipt=m.ABSENT if claim.receipt is None else receipt_wire(claim.receipt),
        lease_token=m.ABSENT
        if not claim.acquired or claim.lease_token is None
        else claim.lease_token,
    )
    return m.unstructure(answer)


def summary_answer(summary: Summary) -> dict[str, Any]:
    """``runtime_sheet_summary``'s answer."""
    return m.unstructure(copy_fields(summary, m.SummaryAnswer))


def resolved_play_answer(play: ResolvedPlay | None) -> dict[str, Any]:
    """``resolve_play``'s answer."""
    return m.unstructure(m.ResolvePlayAnswer(play=None if play is None else play_wire(play)))


# --- answers to domain values (the client) -----------------------------------------------


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
    pending, completed = tuple(read.pending_rows), tuple(read.completed_rows)
    return copy_fields(read, InlineAdmission, pending_rows=pending, completed_rows=completed)


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


def parse_receipt_completion(
    answer: Mapping[str, Any], action: str, run_id: str
) -> ReceiptCompletion:
    """``{receipt: {key, result, runId, completedAt}, completionDisposition}``.

    A gateway that predates ``completionDisposition`` is answered by
    comparing run ids: the receipt is ``persisted`` when this run wrote it.
    """
    read = read_as(answer, m.ReceiptAnswer, action)
    receipt = receipt_of(read.receipt)
    disposition = read.completion_disposition
    if disposition is m.ABSENT:
        disposition = "persisted" if receipt.run_id == run_id else "existing"
    return ReceiptCompletion(receipt=receipt, completion_disposition=disposition)


def parse_receipt_claim(
    answer: Mapping[str, Any], action: str, holder: str, lease_token: str | None = None
) -> ReceiptClaim:
    """``{acquired, holder, expiresAt, receipt?, leaseToken?}``; an acquired lease must
    name ``holder``, an expiry and its token (``lease_token`` when the claim sent
    one), and a completed or refused one carries no lease."""
    read = read_as(answer, m.ClaimAnswer, action)
    receipt = None if read.receipt is m.ABSENT else receipt_of(read.receipt)
    token = None if read.lease_token is m.ABSENT else read.lease_token
    if read.acquired and (
        read.holder != holder
        or read.expires_at is None
        or receipt is not None
        or token is None
        or (lease_token is not None and token != lease_token)
    ):
        raise protocol_error(action, "an acquired lease must name its holder, expiry and token")
    if not read.acquired and token is not None:
        raise protocol_error(action, "a claim not acquired carries no lease token")
    return ReceiptClaim(read.acquired, read.holder, read.expires_at, receipt, token)


def keyed_write_answer(result: WriteResult) -> dict[str, Any]:
    """An append's, upsert's or replace's answer."""
    return m.unstructure(copy_fields(result, m.KeyedWriteAnswer))


def parse_keyed_write(answer: Mapping[str, Any], action: str) -> WriteResult:
    """``{written, replayed}``."""
    return copy_fields(read_as(answer, m.KeyedWriteAnswer, action), WriteResult)


def parse_released(answer: Mapping[str, Any], action: str) -> bool:
    """``{released}``."""
    return read_as(answer, m.ReleaseAnswer, action).released


def parse_resolved_play(answer: Mapping[str, Any], action: str) -> ResolvedPlay | None:
    """``{play: {playId, sourceCode?, artifact?, codeFormat?, contractSnapshot?} | null}``."""
    play = read_as(answer, m.ResolvePlayAnswer, action).play
    return None if play is None else copy_fields(play, ResolvedPlay)


def share_claim_answer(claim: ShareClaim) -> dict[str, Any]:
    """``claim_sheet_share``'s answer."""
    return m.unstructure(copy_fields(claim, m.ClaimShareAnswer))


def parse_share_claim(answer: Mapping[str, Any], action: str) -> ShareClaim:
    """``{outcome, share?, firstIndex?, lastIndex?, takenOver, live, retryAfterMs?}``; a
    claimed share names its number and a range, and nothing else does."""
    read = read_as(answer, m.ClaimShareAnswer, action)
    ranged = (read.share, read.first_index, read.last_index)
    claimed = read.outcome == "claimed"
    if claimed != all(part is not None for part in ranged) or (
        claimed and typing.cast(int, read.first_index) > typing.cast(int, read.last_index)
    ):
        raise protocol_error(action, "a claimed share carries its number and range, and only it")
    return copy_fields(read, ShareClaim)


def share_lease_answer(renewal: ShareRenewal) -> dict[str, Any]:
    """``renew_sheet_share``'s and ``release_sheet_share``'s answer."""
    return m.unstructure(m.ShareLeaseAnswer(outcome=renewal.outcome))


def parse_share_lease(answer: Mapping[str, Any], action: str) -> ShareRenewal:
    """``{outcome}``."""
    return ShareRenewal(read_as(answer, m.ShareLeaseAnswer, action).outcome)


def attempt_status_answer(status: AttemptStatus) -> dict[str, Any]:
    """``sheet_attempt_status``'s answer."""
    return m.unstructure(copy_fields(status, m.AttemptStatusAnswer))


def parse_attempt_status(answer: Mapping[str, Any], action: str) -> AttemptStatus:
    """``{pending, claimed, enriched, failed, workers, superseded}``."""
    return copy_fields(read_as(answer, m.AttemptStatusAnswer, action), AttemptStatus)


def parse_summary(answer: Mapping[str, Any], action: str) -> Summary:
    """``{total, queued, running, completed, failed}``."""
    return copy_fields(read_as(answer, m.SummaryAnswer, action), Summary)


def parse_db_session(answer: Mapping[str, Any]) -> tuple[DbSession, Mapping[str, Any] | None]:
    """A ``create_db_session`` answer: the session (its URL empty while sealed) and the
    sealed URL's envelope as it came (None for a URL sent in clear).

    ``GatewayProtocolError`` when it is malformed: not its wire class, an expiry
    without a time zone, no operation, or not exactly one of ``postgresUrl`` and
    ``encryptedPostgresUrl``. The envelope is handed on undecoded: its own strict
    reading (``sheetplane.crypto``) refuses what the class would have ignored.
    """
    action = m.action_of(m.CreateDbSessionRequest)
    read = read_as(answer, m.CreateDbSessionAnswer, action)
    try:
        expires = dt.datetime.fromisoformat(read.expires_at)
    except ValueError as exc:
        raise protocol_error(action, f"expiresAt {exc}") from None
    if expires.tzinfo is None:
        raise protocol_error(action, "expiresAt must carry a time zone")
    operations = canonical_operations(read.operations)
    if not operations:
        raise protocol_error(action, f"operations must be a non-empty subset of {OPERATIONS}")
    url, sealed = read.postgres_url, read.encrypted_postgres_url
    if (url is m.ABSENT) == (sealed is m.ABSENT):
        raise protocol_error(
            action, "exactly one of postgresUrl and encryptedPostgresUrl must be present"
        )
    session = DbSession(
        org_id=read.target.org_id,
        play_name=read.play_name,
        table_namespace=read.target.table_namespace,
        logical_table=read.target.logical_table,
        operations=operations,
        limits=session_limits_of(read.limits),
        expires_at=read.expires_at,
        expires_at_epoch=expires.timestamp(),
        postgres=copy_fields(read.postgres, PostgresTables),
        postgres_url=url if isinstance(url, str) else "",
    )
    return session, None if sealed is m.ABSENT else answer["encryptedPostgresUrl"]
