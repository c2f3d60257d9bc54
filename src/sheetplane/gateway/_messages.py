"""The gateway's requests and answers as attrs classes, and the one cattrs
converter that reads and writes them under the wire's camelCase names.

Every request is ``{action, playName, ...}``; :data:`REQUESTS` maps each
action to its request class and :data:`ANSWERS` to its answer class. The
converter checks what the wire promises, strictly: a string is a ``str`` (never
a number turned into text), an integer is an ``int`` or an integral finite
number, an object is an object. A request that breaks a rule raises
:class:`WireError` whose message names the field as the wire spells it
(``input.pages[0].limit must be between 1 and 5000, got 0``). Members the
classes do not name are ignored, as the seed's gateway ignores them.

A field whose absence means something other than null (``input.after``: absent
reads by offset, null reads by keyset from the start) defaults to
:data:`ABSENT`, and is left out when written.

The OpenAPI document (``gateway/_openapi.py``) is generated from these classes.
"""

from __future__ import annotations

import enum
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeVar

import attrs
import cattrs

from .._types import (
    BIGINT_MAX,
    BIGINT_MIN,
    CodeFormat,
    LogicalTable,
    Operation,
    RowMode,
    StaleReason,
)
from ..budgets import (
    ADMISSION_CHUNK_ROWS,
    MAX_ERROR_TEXT_BYTES,
    MAX_REQUEST_TEXT_BYTES,
    MAX_ROW_KEY_BYTES,
    MAX_RUN_ID_BYTES,
    MAX_USER_EMAIL_BYTES,
    READ_BATCH_MAX_PAGES,
    READ_PAGE_MAX_ROWS,
)
from . import _wire

__all__ = [
    "ABSENT",
    "ANSWERS",
    "REQUESTS",
    "Absent",
    "WireError",
    "converter",
    "structure",
    "unstructure",
]

T = TypeVar("T")

#: The largest ``ttlSeconds`` accepted (then clamped to the session budget): its
#: milliseconds still fit a ``bigint``, like every other number a request carries.
MAX_TTL_SECONDS: Final = BIGINT_MAX // 1_000


class Absent(enum.Enum):
    """The type of :data:`ABSENT`."""

    ABSENT = "absent"


#: A member left out of the message (not the same as null).
ABSENT: Final = Absent.ABSENT


class WireError(ValueError):
    """A message that does not have its class's shape; the text names the field."""


class Verbatim(ValueError):
    """A rule whose message is the whole answer (a seed error text), not a field's."""


#: The longest text (UTF-8 bytes) a request member may carry, by wire name; every
#: other text member of a request stops at ``MAX_REQUEST_TEXT_BYTES``. What the
#: gateway stores is capped before it reaches the store, so no request grows a
#: table by more than its rows.
TEXT_CAPS: Final[Mapping[str, int]] = {
    "runId": MAX_RUN_ID_BYTES,
    "holder": MAX_RUN_ID_BYTES,
    "userEmail": MAX_USER_EMAIL_BYTES,
    "error": MAX_ERROR_TEXT_BYTES,
    "key": MAX_ROW_KEY_BYTES,
}


def check_text_cap(value: str, name: str) -> str | None:
    """Why ``value`` (the member ``name``) is too long, or None."""
    cap = TEXT_CAPS.get(name, MAX_REQUEST_TEXT_BYTES)
    # At most 4 bytes a character: only a string that could be past the cap is encoded.
    if len(value) * 4 > cap and len(value.encode("utf-8", "surrogatepass")) > cap:
        return f"is longer than {cap} bytes"
    return None


# --- field rules (attrs validators); each message starts after the field's name ----------


def _rule(check: Callable[[Any], str | None]) -> Any:
    def validate(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None or value is ABSENT:
            return
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)

    return validate


def _non_empty(value: str) -> str | None:
    return None if value.strip() else "must be a non-empty string"


def _between(minimum: int, maximum: int | None = None) -> Any:
    def check(value: int) -> str | None:
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            return f"must be {bound}, got {value}"
        return None

    return _rule(check)


def _count(minimum: int, maximum: int, verbatim: str | None = None) -> Any:
    def validate(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not minimum <= len(value) <= maximum:
            if verbatim is not None:
                raise Verbatim(verbatim)
            raise ValueError(f"must hold {minimum} to {maximum} items, got {len(value)}")

    return validate


_TEXT = _rule(_non_empty)


def _text() -> Any:
    """A required non-empty string."""
    return attrs.field(validator=_TEXT, metadata={"minLength": 1, "pattern": r"\S"})


def _admission_id() -> Any:
    """A staged admission's id: 32 lowercase hex digits (``uuid.uuid4().hex``)."""
    return attrs.field(
        validator=_rule(_hex_id), metadata={"pattern": "^[0-9a-f]{32}$", "minLength": 32}
    )


def _hex_id(value: object) -> str | None:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value):
        return None
    return "must be 32 lowercase hex digits"


def _optional_text() -> Any:
    return attrs.field(default=None)


def _int(minimum: int, maximum: int | None = None) -> Any:
    return attrs.field(
        validator=_between(minimum, maximum), metadata={"minimum": minimum, "maximum": maximum}
    )


def _optional_int(minimum: int, maximum: int | None = None) -> Any:
    return attrs.field(
        default=None,
        validator=_between(minimum, maximum),
        metadata={"minimum": minimum, "maximum": maximum},
    )


# --- shared parts ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ContractColumnWire:
    """One column of a sheet contract."""

    id: str = _text()
    sql_name: str = _text()
    source: Literal["input", "mapField", "output"]
    field: str | None = None


@attrs.frozen(kw_only=True)
class SheetContractWire:
    """``{columns: [{id, sqlName, source, field?}]}``."""

    columns: list[ContractColumnWire] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class PageRequestWire:
    """``{limit, offset}``."""

    limit: int = _int(1, READ_PAGE_MAX_ROWS)
    offset: int = _int(0, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class RowCursorWire:
    """A keyset cursor: ``{inputIndex, createdAt, key}``, as the previous page's ``nextAfter``."""

    input_index: int | None = _optional_int(BIGINT_MIN, BIGINT_MAX)
    created_at: str = _text()
    key: str = _text()


@attrs.frozen(kw_only=True)
class AdmittedPartWire:
    """One admission's pending or completed rows: ``{writeVersion, part}``."""

    write_version: int = _int(1, BIGINT_MAX)
    part: Literal["pending", "completed"]


@attrs.frozen(kw_only=True)
class Request:
    """What every request carries."""

    action: str
    play_name: str = _text()
    org_id: str | None = None
    """When present, it must be the token's org (403 otherwise)."""


# --- requests ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class EnsureSheetRequest(Request):
    action: Literal["ensure_sheet"] = "ensure_sheet"
    table_namespace: str = _text()
    sheet_contract: SheetContractWire | None = None
    user_email: str | None = _optional_text()


@attrs.frozen(kw_only=True)
class StartSheetDatasetRequest(Request):
    action: Literal["start_sheet_dataset"] = "start_sheet_dataset"
    table_namespace: str = _text()
    sheet_contract: SheetContractWire
    rows: list[dict[str, Any]]
    run_id: str = _text()
    user_email: str | None = _optional_text()


@attrs.frozen(kw_only=True)
class SessionTargetWire:
    table_namespace: str = _text()
    logical_table: LogicalTable
    org_id: str | None = None


@attrs.frozen(kw_only=True)
class SessionLimitsWire:
    """Advisory limits: a limit left out means none; an explicit null is refused."""

    max_rows: int | Absent = attrs.field(
        default=ABSENT, validator=_between(1, BIGINT_MAX), metadata={"minimum": 1}
    )
    max_bytes: int | Absent = attrs.field(
        default=ABSENT, validator=_between(1, BIGINT_MAX), metadata={"minimum": 1}
    )
    max_requests: int | Absent = attrs.field(
        default=ABSENT, validator=_between(1, BIGINT_MAX), metadata={"minimum": 1}
    )


@attrs.frozen(kw_only=True)
class UrlEncryptionWire:
    alg: Literal["RSA-OAEP-256+A256GCM"]
    public_key_jwk: dict[str, Any]


@attrs.frozen(kw_only=True)
class CreateDbSessionRequest(Request):
    action: Literal["create_db_session"] = "create_db_session"
    target: SessionTargetWire
    operations: list[Operation] = attrs.field(
        validator=_count(1, len(typing.get_args(Operation)) * 4), metadata={"minItems": 1}
    )
    limits: SessionLimitsWire | None = None
    sheet_contract: SheetContractWire | None = None
    ttl_seconds: float | None = attrs.field(
        default=None,
        validator=_between(1, MAX_TTL_SECONDS),
        metadata={"minimum": 1, "maximum": MAX_TTL_SECONDS},
    )
    """Clamped to the gateway's session budget; its milliseconds must fit a ``bigint``."""
    user_email: str | None = _optional_text()
    postgres_url_encryption: UrlEncryptionWire | None = None


@attrs.frozen(kw_only=True)
class ReadInput:
    """The ``input`` of a read."""

    table_namespace: str = _text()
    run_id: str | None = _optional_text()
    row_mode: RowMode | None = None
    admission: AdmittedPartWire | None = None
    org_id: str | None = None


@attrs.frozen(kw_only=True)
class ReadRowsInput(ReadInput):
    limit: int = _int(1, READ_PAGE_MAX_ROWS)
    offset: int = _int(0, BIGINT_MAX)
    after: RowCursorWire | Absent | None = ABSENT
    """Absent: read by offset. Null or a cursor: read by keyset, and answer ``nextAfter``."""


@attrs.frozen(kw_only=True)
class ReadRowsRequest(Request):
    action: Literal["runtime_sheet_read_rows"] = "runtime_sheet_read_rows"
    input: ReadRowsInput


@attrs.frozen(kw_only=True)
class ReadRowsBatchInput(ReadInput):
    pages: list[PageRequestWire] = attrs.field(
        validator=_count(
            1,
            READ_BATCH_MAX_PAGES,
            f"Runtime dataset read batch requires 1-{READ_BATCH_MAX_PAGES} pages.",
        ),
        metadata={"minItems": 1, "maxItems": READ_BATCH_MAX_PAGES},
    )


@attrs.frozen(kw_only=True)
class ReadRowsBatchRequest(Request):
    action: Literal["runtime_sheet_read_rows_batch"] = "runtime_sheet_read_rows_batch"
    input: ReadRowsBatchInput


@attrs.frozen(kw_only=True)
class ReadRowKeysInput(ReadInput):
    limit: int = _int(1, READ_PAGE_MAX_ROWS)
    offset: int = _int(0, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class ReadRowKeysRequest(Request):
    action: Literal["runtime_sheet_read_row_keys"] = "runtime_sheet_read_row_keys"
    input: ReadRowKeysInput


@attrs.frozen(kw_only=True)
class CompleteRowWire:
    key: str = _text()
    data: dict[str, Any] = attrs.field(factory=dict)
    cell_meta_patch: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class FailRowWire:
    key: str = _text()
    error: str
    data: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class TerminalWriteRequest(Request):
    """What a complete and a fail request share: the sheet, the attempt and its fence."""

    table_namespace: str = _text()
    sheet_contract: SheetContractWire
    run_id: str = _text()
    write_version: int | None = _optional_int(0, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class CompleteMapRowsRequest(TerminalWriteRequest):
    action: Literal["runtime_sheet_complete_map_rows"] = "runtime_sheet_complete_map_rows"
    rows: list[CompleteRowWire]


@attrs.frozen(kw_only=True)
class FailMapRowsRequest(TerminalWriteRequest):
    action: Literal["runtime_sheet_fail_map_rows"] = "runtime_sheet_fail_map_rows"
    rows: list[FailRowWire]


@attrs.frozen(kw_only=True)
class CompleteWorkReceiptRequest(Request):
    action: Literal["complete_work_receipt"] = "complete_work_receipt"
    key: str = _text()
    result: Any
    """Required; null is allowed."""
    run_id: str = _text()
    run_attempt: int | None = _optional_int(0, BIGINT_MAX)
    holder: str | None = _optional_text()


@attrs.frozen(kw_only=True)
class ClaimWorkReceiptRequest(Request):
    action: Literal["claim_work_receipt"] = "claim_work_receipt"
    key: str = _text()
    holder: str = _text()


@attrs.frozen(kw_only=True)
class ReleaseWorkReceiptRequest(Request):
    action: Literal["release_work_receipt"] = "release_work_receipt"
    key: str = _text()
    holder: str = _text()


@attrs.frozen(kw_only=True)
class ResolvePlayRequest(Request):
    action: Literal["resolve_play"] = "resolve_play"
    play_name: str | None = None  # type: ignore[assignment]
    """A play is resolved before its name is known: ``playName`` is optional here."""
    play_ref: str = _text()


@attrs.frozen(kw_only=True)
class PlayDefinitionWire:
    """A play to register (``_plays.play_from_json`` reads it); no other members."""

    org_id: str | None = None
    play_id: str = _text()
    name: str | None = None
    source_code: str | None = None
    artifact: Any = None
    code_format: CodeFormat | None = None
    contract_snapshot: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class RegisterPlayRequest(Request):
    action: Literal["register_play"] = "register_play"
    play_name: str | None = None  # type: ignore[assignment]
    play: PlayDefinitionWire


@attrs.frozen(kw_only=True)
class SummaryRequest(Request):
    action: Literal["runtime_sheet_summary"] = "runtime_sheet_summary"
    table_namespace: str = _text()


@attrs.frozen(kw_only=True)
class BeginAdmissionRequest(Request):
    action: Literal["begin_sheet_admission"] = "begin_sheet_admission"
    table_namespace: str = _text()
    sheet_contract: SheetContractWire
    admission_id: str = _admission_id()
    run_id: str = _text()
    user_email: str | None = _optional_text()


@attrs.frozen(kw_only=True)
class StageAdmissionChunkRequest(Request):
    action: Literal["stage_sheet_admission_chunk"] = "stage_sheet_admission_chunk"
    table_namespace: str = _text()
    sheet_contract: SheetContractWire
    admission_id: str = _admission_id()
    seq: int = _int(0, BIGINT_MAX)
    first_position: int = _int(0, BIGINT_MAX)
    rows: list[Any] = attrs.field(
        validator=_count(1, ADMISSION_CHUNK_ROWS),
        metadata={"minItems": 1, "maxItems": ADMISSION_CHUNK_ROWS},
    )
    """The chunk's rows; each is checked (an object, JSON, the row budget) by the store,
    which names a bad one by its position in the whole input."""


@attrs.frozen(kw_only=True)
class CommitAdmissionRequest(Request):
    action: Literal["commit_sheet_admission"] = "commit_sheet_admission"
    table_namespace: str = _text()
    sheet_contract: SheetContractWire
    admission_id: str = _admission_id()
    run_id: str = _text()
    chunks: int = _int(0, BIGINT_MAX)
    rows: int = _int(0, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class AbortAdmissionRequest(Request):
    action: Literal["abort_sheet_admission"] = "abort_sheet_admission"
    table_namespace: str = _text()
    admission_id: str = _admission_id()


# --- answers -----------------------------------------------------------------------------------


def _keyed(rows: list[dict[str, Any]]) -> str | None:
    for index, row in enumerate(rows):
        if not isinstance(row.get("_key"), str):
            return f"must hold objects with a string _key (item {index} has none)"
    return None


@attrs.frozen(kw_only=True)
class OkAnswer:
    ok: Literal[True] = True


@attrs.frozen(kw_only=True)
class AdmissionAnswer:
    inserted: int = _int(0)
    skipped: int = _int(0)
    pending_rows: list[dict[str, Any]] = attrs.field(validator=_rule(lambda rows: _keyed(rows)))
    completed_rows: list[dict[str, Any]] = attrs.field(validator=_rule(lambda rows: _keyed(rows)))
    table_namespace: str
    write_version: int = _int(0)


@attrs.frozen(kw_only=True)
class BeginAdmissionAnswer:
    admission_id: str
    chunk_rows: int = _int(1)
    chunk_bytes: int = _int(1)


@attrs.frozen(kw_only=True)
class StageAdmissionChunkAnswer:
    admission_id: str
    seq: int = _int(0)
    staged: bool
    """False when the chunk had been staged before (a retry): nothing was written."""


@attrs.frozen(kw_only=True)
class CommitAdmissionAnswer:
    admission_id: str
    write_version: int = _int(1)
    inserted: int = _int(0)
    skipped: int = _int(0)
    pending_count: int = _int(0)
    completed_count: int = _int(0)
    table_namespace: str


@attrs.frozen(kw_only=True)
class AbortAdmissionAnswer:
    aborted: bool


@attrs.frozen(kw_only=True)
class SessionTargetAnswer:
    org_id: str
    table_namespace: str
    logical_table: LogicalTable


@attrs.frozen(kw_only=True)
class PostgresTablesWire:
    schema: str
    sheet_table: str
    event_table: str
    summary_table: str
    column_summary_table: str


@attrs.frozen(kw_only=True)
class EnvelopeWire:
    """A flattened JWE (RFC 7516 §7.2.2)."""

    protected: str
    encrypted_key: str = attrs.field(metadata={"wire": "encrypted_key"})
    iv: str
    ciphertext: str
    tag: str
    aad: str


@attrs.frozen(kw_only=True)
class CreateDbSessionAnswer:
    expires_at: str
    play_name: str
    target: SessionTargetAnswer
    operations: list[Operation]
    limits: dict[str, int]
    postgres: PostgresTablesWire
    postgres_url: str | Absent = ABSENT
    encrypted_postgres_url: EnvelopeWire | Absent = ABSENT


@attrs.frozen(kw_only=True)
class PageWire:
    rows: list[dict[str, Any]]
    limit: int = _int(0)
    offset: int = _int(0)


@attrs.frozen(kw_only=True)
class ReadRowsAnswer(PageWire):
    next_after: RowCursorWire | Absent | None = ABSENT
    """Present (null at the end) when the request carried ``after``."""


@attrs.frozen(kw_only=True)
class ReadRowsBatchAnswer:
    pages: list[PageWire]


@attrs.frozen(kw_only=True)
class ReadRowKeysAnswer:
    keys: list[str]
    limit: int | Absent = attrs.field(
        default=ABSENT, validator=_between(0), metadata={"minimum": 0}
    )
    """Echoed by this gateway; the client reads only the keys."""
    offset: int | Absent = attrs.field(
        default=ABSENT, validator=_between(0), metadata={"minimum": 0}
    )


@attrs.frozen(kw_only=True)
class StaleRowWire:
    key: str
    reason: StaleReason
    row_version_stamp: int | None = None


@attrs.frozen(kw_only=True)
class TerminalWriteAnswer:
    committed_keys: list[str]
    stale_keys: list[str]
    updated: int = _int(0)
    stale_rows: list[StaleRowWire] | Absent = ABSENT
    """Left out by a legacy gateway."""


@attrs.frozen(kw_only=True)
class ReceiptWire:
    key: str
    result: Any
    run_id: str
    completed_at: str


@attrs.frozen(kw_only=True)
class ReceiptAnswer:
    receipt: ReceiptWire
    completion_disposition: Literal["persisted", "existing"] | Absent = ABSENT
    """Always written by this gateway; an older one leaves it out."""


@attrs.frozen(kw_only=True)
class ClaimAnswer:
    acquired: bool
    holder: str | None
    expires_at: str | None
    receipt: ReceiptWire | Absent = ABSENT


@attrs.frozen(kw_only=True)
class ReleaseAnswer:
    released: bool


@attrs.frozen(kw_only=True)
class PlayWire:
    play_id: str = _text()
    source_code: str | None = None
    artifact: Any = None
    code_format: CodeFormat | None = None
    contract_snapshot: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ResolvePlayAnswer:
    play: PlayWire | None


@attrs.frozen(kw_only=True)
class RegisterPlayAnswer:
    play_id: str


@attrs.frozen(kw_only=True)
class SummaryAnswer:
    total: int = _int(0)
    queued: int = _int(0)
    running: int = _int(0)
    completed: int = _int(0)
    failed: int = _int(0)


@attrs.frozen(kw_only=True)
class ErrorBody:
    """Every error answer: ``{error, code, ...}``."""

    error: str
    code: str
    retry_after_ms: int | Absent = ABSENT
    """With 503 back-pressure: when to try again."""
    observed_bytes: int | Absent = ABSENT
    """With 413: how many bytes were seen."""


#: Each action's request class.
REQUESTS: Final[Mapping[str, type[Request]]] = {
    _wire.ENSURE_SHEET: EnsureSheetRequest,
    _wire.START_SHEET_DATASET: StartSheetDatasetRequest,
    _wire.CREATE_DB_SESSION: CreateDbSessionRequest,
    _wire.READ_ROWS: ReadRowsRequest,
    _wire.READ_ROWS_BATCH: ReadRowsBatchRequest,
    _wire.READ_ROW_KEYS: ReadRowKeysRequest,
    _wire.COMPLETE_MAP_ROWS: CompleteMapRowsRequest,
    _wire.FAIL_MAP_ROWS: FailMapRowsRequest,
    _wire.COMPLETE_WORK_RECEIPT: CompleteWorkReceiptRequest,
    _wire.CLAIM_WORK_RECEIPT: ClaimWorkReceiptRequest,
    _wire.RELEASE_WORK_RECEIPT: ReleaseWorkReceiptRequest,
    _wire.RESOLVE_PLAY: ResolvePlayRequest,
    _wire.REGISTER_PLAY: RegisterPlayRequest,
    _wire.SUMMARY: SummaryRequest,
    _wire.BEGIN_ADMISSION: BeginAdmissionRequest,
    _wire.STAGE_ADMISSION_CHUNK: StageAdmissionChunkRequest,
    _wire.COMMIT_ADMISSION: CommitAdmissionRequest,
    _wire.ABORT_ADMISSION: AbortAdmissionRequest,
}

#: Each action's answer class (its 200 body).
ANSWERS: Final[Mapping[str, type[Any]]] = {
    _wire.ENSURE_SHEET: OkAnswer,
    _wire.START_SHEET_DATASET: AdmissionAnswer,
    _wire.CREATE_DB_SESSION: CreateDbSessionAnswer,
    _wire.READ_ROWS: ReadRowsAnswer,
    _wire.READ_ROWS_BATCH: ReadRowsBatchAnswer,
    _wire.READ_ROW_KEYS: ReadRowKeysAnswer,
    _wire.COMPLETE_MAP_ROWS: TerminalWriteAnswer,
    _wire.FAIL_MAP_ROWS: TerminalWriteAnswer,
    _wire.COMPLETE_WORK_RECEIPT: ReceiptAnswer,
    _wire.CLAIM_WORK_RECEIPT: ClaimAnswer,
    _wire.RELEASE_WORK_RECEIPT: ReleaseAnswer,
    _wire.RESOLVE_PLAY: ResolvePlayAnswer,
    _wire.REGISTER_PLAY: RegisterPlayAnswer,
    _wire.SUMMARY: SummaryAnswer,
    _wire.BEGIN_ADMISSION: BeginAdmissionAnswer,
    _wire.STAGE_ADMISSION_CHUNK: StageAdmissionChunkAnswer,
    _wire.COMMIT_ADMISSION: CommitAdmissionAnswer,
    _wire.ABORT_ADMISSION: AbortAdmissionAnswer,
}

#: Classes whose texts are not capped: answers whose texts the gateway wrote.
UNCAPPED: Final = frozenset(
    {PlayWire, PlayDefinitionWire, ReceiptWire, ErrorBody, EnvelopeWire, *ANSWERS.values()}
)
#: Classes whose unknown members are refused rather than ignored.
CLOSED: Final = frozenset({SessionLimitsWire, PlayDefinitionWire})
#: Answers write a null they hold (``rowVersionStamp: null``); requests leave it out.
_WRITES_NULLS: Final = frozenset(
    {
        *ANSWERS.values(),
        PageWire,
        StaleRowWire,
        ReceiptWire,
        PlayWire,
        RowCursorWire,
        SessionTargetAnswer,
        PostgresTablesWire,
        EnvelopeWire,
        ErrorBody,
    }
)


def wire_name(name: str | attrs.Attribute[Any]) -> str:
    """The wire name of a field: its ``wire`` metadata (a JWE member keeps its
    RFC 7516 name), else the camelCase of its Python name (``sql_name`` -> ``sqlName``)."""
    if not isinstance(name, str):
        return str(name.metadata.get("wire") or wire_name(name.name))
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# --- the converter ------------------------------------------------------------------------------

converter: Final = cattrs.Converter()


def _strict_str(value: object, _: type) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _strict_int(value: object, _: type) -> int:
    """An int, or an integral finite JSON number (``5.0``); never a bool or text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


def _strict_float(value: object, _: type) -> float:
    """A finite JSON number. An integer stays exact (10**300 has no float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a number")
    return value


def _strict_bool(value: object, _: type) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be a boolean")
    return value


def _object(value: object, _: type) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be an object")
    return value


def _array(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("must be an array")
    return value


converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(float, _strict_float)
converter.register_structure_hook(bool, _strict_bool)


def _is_dict(cls: Any) -> bool:
    origin: Any = typing.get_origin(cls)
    return origin is dict


converter.register_structure_hook_func(_is_dict, _object)
converter.register_structure_hook_func(lambda cls: cls is Any, lambda value, _: value)


def _is_list(cls: Any) -> bool:
    return typing.get_origin(cls) is list


def _list_hook(cls: Any) -> Callable[[Any, Any], list[Any]]:
    (item,) = typing.get_args(cls)
    inner = converter.get_structure_hook(item)

    def structure(value: Any, _: Any) -> list[Any]:
        out = []
        for index, element in enumerate(_array(value)):
            try:
                out.append(inner(element, item))
            except _Located as exc:
                raise _Located(_join(f"[{index}]", exc.where), exc.error) from None
            except (ValueError, TypeError) as exc:
                raise _Located(f"[{index}]", exc) from None
        return out

    return structure


converter.register_structure_hook_factory(_is_list, _list_hook)


def _literal_hook(cls: Any) -> Callable[[Any, Any], Any]:
    allowed = typing.get_args(cls)

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, bool) != isinstance(allowed[0], bool) or value not in allowed:
            raise ValueError(f"must be one of {list(allowed)}, got {value!r}")
        return value

    return structure


def _is_literal(cls: Any) -> bool:
    origin: Any = typing.get_origin(cls)
    return origin is Literal


converter.register_structure_hook_factory(_is_literal, _literal_hook)


def _union_hook(cls: Any) -> Callable[[Any, Any], Any]:
    """``X | None``, ``X | Absent`` and ``X | None | Absent``: null is None; else X."""
    members = [m for m in typing.get_args(cls) if m not in (type(None), Absent)]
    nullable = type(None) in typing.get_args(cls)
    (inner_type,) = members
    inner = converter.get_structure_hook(inner_type)

    def structure(value: Any, _: Any) -> Any:
        if value is None:
            if nullable:
                return None
            raise ValueError("must not be null")
        return inner(value, inner_type)

    return structure


def _is_optional(cls: Any) -> bool:
    args = typing.get_args(cls)
    return (
        typing.get_origin(cls) in (typing.Union, types.UnionType)
        and (type(None) in args or Absent in args)
        and len([m for m in args if m not in (type(None), Absent)]) == 1
    )


converter.register_structure_hook_factory(_is_optional, _union_hook)


@attrs.define
class _Located(Exception):
    """A structuring error with where it happened, innermost last."""

    where: str
    error: BaseException


def _class_hook(cls: type[Any]) -> Callable[[Any, Any], Any]:
    fields = attrs.fields(attrs.resolve_types(cls, globals()))
    names = {f.name: wire_name(f) for f in fields}
    hooks = {f.name: converter.get_structure_hook(f.type) for f in fields}
    closed = cls in CLOSED
    capped = {f.name for f in fields if cls not in UNCAPPED and f.type in (str, str | None)}

    def structure(value: Any, _: Any) -> Any:
        data = _object(value, cls)
        if closed:
            unknown = set(data) - set(names.values())
            if unknown:
                raise ValueError(f"may carry only {sorted(names.values())}, got {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for field in fields:
            key = names[field.name]
            if key not in data:
                if field.default is attrs.NOTHING:
                    raise _Located(key, ValueError("is required"))
                continue
            try:
                kwargs[field.name] = item = hooks[field.name](data[key], field.type)
                if field.name in capped and item is not None:
                    problem = check_text_cap(item, key)
                    if problem is not None:
                        raise ValueError(problem)
            except _Located as exc:
                raise _Located(_join(key, exc.where), exc.error) from None
            except (ValueError, TypeError) as exc:
                raise _Located(key, exc) from None
        try:
            return cls(**kwargs)
        except Verbatim as exc:
            raise _Located("", exc) from None
        except ValueError as exc:
            # A field rule: attrs runs validators in field order; find the field named.
            raise _Located(_failing_field(cls, kwargs), exc) from None

    return structure


def _failing_field(cls: type[Any], kwargs: dict[str, Any]) -> str:
    for field in attrs.fields(cls):
        if field.validator is None or field.name not in kwargs:
            continue
        try:
            field.validator(None, field, kwargs[field.name])
        except ValueError:
            return wire_name(field)
    return cls.__name__


def _join(outer: str, inner: str) -> str:
    return f"{outer}{inner}" if inner.startswith("[") else f"{outer}.{inner}"


converter.register_structure_hook_factory(attrs.has, _class_hook)


def _unstructure_hook(cls: type[Any]) -> Callable[[Any], dict[str, Any]]:
    fields = attrs.fields(attrs.resolve_types(cls, globals()))
    inner = {f.name: converter.get_unstructure_hook(f.type) for f in fields}
    omit_nulls = cls not in _WRITES_NULLS

    def unstructure(value: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in fields:
            item = getattr(value, field.name)
            if item is ABSENT:
                continue
            if item is None and omit_nulls and field.default is None:
                continue
            out[wire_name(field)] = inner[field.name](item)
        return out

    return unstructure


converter.register_unstructure_hook_factory(attrs.has, _unstructure_hook)


def structure(value: object, cls: type[T]) -> T:
    """``value`` (decoded JSON) as ``cls``; :class:`WireError` naming the field if it is off."""
    try:
        return converter.structure(value, cls)
    except _Located as exc:
        if isinstance(exc.error, Verbatim):
            raise WireError(str(exc.error)) from None
        raise WireError(f"{exc.where} {exc.error}") from None
    except (ValueError, TypeError) as exc:
        raise WireError(f"the body {exc}") from None


def unstructure(value: Any) -> dict[str, Any]:
    """The wire form of a message (camelCase, absent members left out)."""
    out: dict[str, Any] = converter.unstructure(value)
    return out
