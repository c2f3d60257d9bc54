"""The gateway's requests and answers as attrs classes, read and written under
the wire's camelCase names by the converter built from ``protocol/_converter.py``.

Every request is ``{action, playName, ...}``; each request class names its
action once (its ``action`` member's default), and :data:`EXCHANGES` pairs
it with its answer class: :data:`ACTIONS`, :data:`REQUESTS` and
:data:`ANSWERS` are read off that table. A request
that breaks a rule raises :class:`WireError` whose message names the field as
the wire spells it. The converter's names are re-exported here, so a caller
reads and writes messages through this one module.

The OpenAPI document (``protocol/_openapi.py``) is generated from these classes.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeVar

import attrs

from .._types import (
    BIGINT_MAX,
    BIGINT_MIN,
    INTEGER_MAX,
    PAGE_LIMITS,
    PAGE_OFFSETS,
    CodeFormat,
    LogicalTable,
    Operation,
    RowMode,
    StaleReason,
)
from ..budgets import (
    ADMISSION_CHUNK_ROWS,
    READ_BATCH_MAX_PAGES,
    SHARE_LEASE_MIN_TTL_MS,
    SHARE_LEASE_TTL_MS,
    SHARE_MAX_ROWS,
)
from ._converter import (
    ABSENT,
    Absent,
    WireConverter,
    WireError,
    admission_id_field,
    between,
    build,
    count_rule,
    domain_text_field,
    int_field,
    lease_token_field,
    optional_int_field,
    optional_text_field,
    rule,
    text_field,
    wire_name,
)

T = TypeVar("T")

__all__ = [
    "ABSENT",
    "ACTIONS",
    "ANSWERS",
    "CLOSED",
    "CONVERTER",
    "EXCHANGES",
    "MAX_TTL_SECONDS",
    "PAGE_READS",
    "PROBE_ANSWERS",
    "REQUESTS",
    "UNCAPPED",
    "WRITES_NULLS",
    "AbortAdmissionAnswer",
    "AbortAdmissionRequest",
    "Absent",
    "AdmissionAnswer",
    "AdmittedPartWire",
    "AppendRowsRequest",
    "AttemptRequest",
    "AttemptStatusAnswer",
    "AttemptStatusRequest",
    "BeginAdmissionAnswer",
    "BeginAdmissionRequest",
    "ClaimAnswer",
    "ClaimShareAnswer",
    "ClaimShareRequest",
    "ClaimWorkReceiptRequest",
    "CommitAdmissionAnswer",
    "CommitAdmissionRequest",
    "CompleteMapRowsRequest",
    "CompleteRowWire",
    "CompleteWorkReceiptRequest",
    "ContractColumnWire",
    "CreateDbSessionAnswer",
    "CreateDbSessionRequest",
    "EnsureSheetRequest",
    "EnvelopeWire",
    "ErrorBody",
    "FailMapRowsRequest",
    "FailRowWire",
    "HealthAnswer",
    "KeyedWriteAnswer",
    "KeyedWriteRequest",
    "OkAnswer",
    "PageRequestWire",
    "PageWire",
    "PlayDefinitionWire",
    "PlayWire",
    "PostgresTablesWire",
    "ReadInput",
    "ReadRowKeysAnswer",
    "ReadRowKeysInput",
    "ReadRowKeysRequest",
    "ReadRowsAnswer",
    "ReadRowsBatchAnswer",
    "ReadRowsBatchInput",
    "ReadRowsBatchRequest",
    "ReadRowsInput",
    "ReadRowsRequest",
    "ReadyAnswer",
    "ReceiptAnswer",
    "ReceiptWire",
    "RegisterPlayAnswer",
    "RegisterPlayRequest",
    "ReleaseAnswer",
    "ReleaseShareRequest",
    "ReleaseWorkReceiptRequest",
    "RenewShareRequest",
    "ReplaceRowsRequest",
    "Request",
    "ResolvePlayAnswer",
    "ResolvePlayRequest",
    "RowCursorWire",
    "SessionLimitsAnswer",
    "SessionLimitsWire",
    "SessionTargetAnswer",
    "SessionTargetWire",
    "ShareLeaseAnswer",
    "SheetContractWire",
    "SheetRequest",
    "StageAdmissionChunkAnswer",
    "StageAdmissionChunkRequest",
    "StagedAdmissionRequest",
    "StaleRowWire",
    "StartSheetDatasetRequest",
    "SummaryAnswer",
    "SummaryRequest",
    "TerminalWriteAnswer",
    "TerminalWriteRequest",
    "UnreadyAnswer",
    "UnreadyReason",
    "UpsertRowsRequest",
    "UrlEncryptionWire",
    "WireError",
    "action_of",
    "build",
    "error_body",
    "structure",
    "unstructure",
    "wire_name",
]

#: The largest ``ttlSeconds`` accepted (then clamped to the session budget): its
#: milliseconds still fit a ``bigint``, like every other number a request carries.
MAX_TTL_SECONDS: Final = BIGINT_MAX // 1_000


# --- shared parts ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ContractColumnWire:
    """One column of a sheet contract (``ContractColumn`` checks ``id`` and ``sqlName``)."""

    id: str = domain_text_field()
    sql_name: str = domain_text_field()
    source: Literal["input", "mapField", "output"]
    field: str | None = None


@attrs.frozen(kw_only=True)
class SheetContractWire:
    """``{columns: [{id, sqlName, source, field?}]}``."""

    columns: list[ContractColumnWire] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class PageRequestWire:
    """``{limit, offset}``: decoding it is the reference gateway's one check of a page."""

    limit: int = int_field(*PAGE_LIMITS)
    offset: int = int_field(*PAGE_OFFSETS)


@attrs.frozen(kw_only=True)
class RowCursorWire:
    """A keyset cursor: ``{inputIndex, createdAt, key}``, as the previous page's ``nextAfter``."""

    input_index: int | None = optional_int_field(BIGINT_MIN, BIGINT_MAX)
    created_at: str = text_field()
    key: str = text_field()


@attrs.frozen(kw_only=True)
class AdmittedPartWire:
    """One admission's pending, completed or unsettled rows:
    ``{writeVersion, part, firstIndex?, lastIndex?}`` (the indexes: one share's range)."""

    write_version: int = int_field(1, BIGINT_MAX)
    part: Literal["pending", "completed", "unsettled"]
    first_index: int | None = optional_int_field(BIGINT_MIN, BIGINT_MAX)
    last_index: int | None = optional_int_field(BIGINT_MIN, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class Request:
    """What every request carries."""

    action: str
    play_name: str = text_field()
    org_id: str | None = None
    """When present, it must be the token's org (403 otherwise)."""


# --- requests ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class EnsureSheetRequest(Request):
    action: Literal["ensure_sheet"] = "ensure_sheet"
    table_namespace: str = text_field()
    sheet_contract: SheetContractWire | None = None
    user_email: str | None = optional_text_field()


@attrs.frozen(kw_only=True)
class SheetRequest(Request):
    """What a request that writes a sheet carries: the sheet and its contract."""

    table_namespace: str = text_field()
    sheet_contract: SheetContractWire


@attrs.frozen(kw_only=True)
class StartSheetDatasetRequest(SheetRequest):
    action: Literal["start_sheet_dataset"] = "start_sheet_dataset"
    rows: list[dict[str, Any]]
    run_id: str = text_field()
    user_email: str | None = optional_text_field()


@attrs.frozen(kw_only=True)
class SessionTargetWire:
    table_namespace: str = text_field()
    logical_table: LogicalTable
    org_id: str | None = None


@attrs.frozen(kw_only=True)
class SessionLimitsWire:
    """Advisory limits: a limit left out means none; an explicit null is refused."""

    max_rows: int | Absent = attrs.field(
        default=ABSENT, validator=between(1, BIGINT_MAX), metadata={"minimum": 1}
    )
    max_bytes: int | Absent = attrs.field(
        default=ABSENT, validator=between(1, BIGINT_MAX), metadata={"minimum": 1}
    )
    max_requests: int | Absent = attrs.field(
        default=ABSENT, validator=between(1, BIGINT_MAX), metadata={"minimum": 1}
    )


@attrs.frozen(kw_only=True)
class SessionLimitsAnswer(SessionLimitsWire):
    """The limits a session was minted with; a member a newer gateway adds is ignored."""


@attrs.frozen(kw_only=True)
class UrlEncryptionWire:
    alg: Literal["RSA-OAEP-256+A256GCM"]
    public_key_jwk: dict[str, Any]


@attrs.frozen(kw_only=True)
class CreateDbSessionRequest(Request):
    action: Literal["create_db_session"] = "create_db_session"
    target: SessionTargetWire
    operations: list[Operation] = attrs.field(
        validator=count_rule(1, len(typing.get_args(Operation)) * 4), metadata={"minItems": 1}
    )
    limits: SessionLimitsWire | None = None
    sheet_contract: SheetContractWire | None = None
    ttl_seconds: float | None = attrs.field(
        default=None,
        validator=between(1, MAX_TTL_SECONDS),
        metadata={"minimum": 1, "maximum": MAX_TTL_SECONDS},
    )
    """Clamped to the gateway's session budget; its milliseconds must fit a ``bigint``."""
    user_email: str | None = optional_text_field()
    postgres_url_encryption: UrlEncryptionWire | None = None


@attrs.frozen(kw_only=True)
class ReadInput:
    """The ``input`` of a read."""

    table_namespace: str = text_field()
    run_id: str | None = optional_text_field()
    row_mode: RowMode | None = None
    admission: AdmittedPartWire | None = None
    org_id: str | None = None


@attrs.frozen(kw_only=True)
class ReadRowKeysInput(ReadInput):
    """The ``input`` of a read of one page: ``limit`` rows from ``offset``."""

    limit: int = int_field(*PAGE_LIMITS)
    offset: int = int_field(*PAGE_OFFSETS)


@attrs.frozen(kw_only=True)
class ReadRowsInput(ReadRowKeysInput):
    after: RowCursorWire | Absent | None = ABSENT
    """Absent: read by offset. Null or a cursor: read by keyset, and answer ``nextAfter``."""


@attrs.frozen(kw_only=True)
class ReadRowsRequest(Request):
    action: Literal["runtime_sheet_read_rows"] = "runtime_sheet_read_rows"
    input: ReadRowsInput


@attrs.frozen(kw_only=True)
class ReadRowsBatchInput(ReadInput):
    pages: list[PageRequestWire] = attrs.field(
        validator=count_rule(
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
class ReadRowKeysRequest(Request):
    action: Literal["runtime_sheet_read_row_keys"] = "runtime_sheet_read_row_keys"
    input: ReadRowKeysInput


@attrs.frozen(kw_only=True)
class CompleteRowWire:
    key: str = text_field()
    data: dict[str, Any] = attrs.field(factory=dict)
    cell_meta_patch: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class FailRowWire:
    key: str = text_field()
    error: str
    data: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class TerminalWriteRequest(SheetRequest):
    """What a complete and a fail request share: the sheet, the attempt and its fence."""

    run_id: str = text_field()
    write_version: int | None = optional_int_field(0, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class CompleteMapRowsRequest(TerminalWriteRequest):
    action: Literal["runtime_sheet_complete_map_rows"] = "runtime_sheet_complete_map_rows"
    rows: list[CompleteRowWire]


@attrs.frozen(kw_only=True)
class FailMapRowsRequest(TerminalWriteRequest):
    action: Literal["runtime_sheet_fail_map_rows"] = "runtime_sheet_fail_map_rows"
    rows: list[FailRowWire]


@attrs.frozen(kw_only=True)
class KeyedWriteRequest(SheetRequest):
    """What an append, an upsert and a replace share: the rows, the write's idempotency
    key (a replay writes nothing) and the run stamped on the rows written."""

    rows: list[dict[str, Any]]
    idempotency_key: str = text_field()
    run_id: str = text_field()


@attrs.frozen(kw_only=True)
class AppendRowsRequest(KeyedWriteRequest):
    action: Literal["runtime_sheet_append_rows"] = "runtime_sheet_append_rows"


@attrs.frozen(kw_only=True)
class UpsertRowsRequest(KeyedWriteRequest):
    action: Literal["runtime_sheet_upsert_rows"] = "runtime_sheet_upsert_rows"
    key_field: str | None = optional_text_field()


@attrs.frozen(kw_only=True)
class ReplaceRowsRequest(KeyedWriteRequest):
    action: Literal["runtime_sheet_replace_rows"] = "runtime_sheet_replace_rows"


@attrs.frozen(kw_only=True)
class CompleteWorkReceiptRequest(Request):
    action: Literal["complete_work_receipt"] = "complete_work_receipt"
    key: str = text_field()
    result: Any
    """Required; null is allowed."""
    run_id: str = text_field()
    run_attempt: int | None = optional_int_field(0, INTEGER_MAX)
    holder: str | None = optional_text_field()
    lease_token: str | None = lease_token_field(required=False)
    """The holder's lease token (its claim's answer): a live lease of ``holder``
    fences the completion only with it."""


@attrs.frozen(kw_only=True)
class ClaimWorkReceiptRequest(Request):
    action: Literal["claim_work_receipt"] = "claim_work_receipt"
    key: str = text_field()
    holder: str = text_field()
    lease_token: str | None = lease_token_field(required=False)
    """Renews the caller's live lease; for a new lease, its token (a retried claim
    then renews); left out, the gateway makes one."""


@attrs.frozen(kw_only=True)
class ReleaseWorkReceiptRequest(Request):
    action: Literal["release_work_receipt"] = "release_work_receipt"
    key: str = text_field()
    holder: str = text_field()
    lease_token: str | None = lease_token_field(required=False)
    """The lease's token; without it nothing is released (``released: false``)."""


@attrs.frozen(kw_only=True)
class ResolvePlayRequest(Request):
    action: Literal["resolve_play"] = "resolve_play"
    play_name: str | None = None  # type: ignore[assignment]
    """A play is resolved before its name is known: ``playName`` is optional here."""
    play_ref: str = text_field()


@attrs.frozen(kw_only=True)
class PlayDefinitionWire:
    """A play to register or load (``_plays.play_from_json`` reads it); no other members."""

    org_id: str | None = optional_text_field(non_empty=True)
    """Whose play: required in a file, the token's org (or left out) in a request."""
    play_id: str = text_field()
    name: str | None = optional_text_field(non_empty=True)
    """A second reference to the play, besides its id."""
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
    table_namespace: str = text_field()


# --- shares of an attempt: many workers on one admission ---------------------------------


@attrs.frozen(kw_only=True)
class AttemptRequest(Request):
    """What a share request names: the sheet and the attempt (its admission's version)."""

    table_namespace: str = text_field()
    write_version: int = int_field(1, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class ClaimShareRequest(AttemptRequest):
    """Claim a share of the attempt's pending rows under a lease of ``ttlMs``."""

    action: Literal["claim_sheet_share"] = "claim_sheet_share"
    holder: str = text_field()
    lease_token: str = lease_token_field(required=True)
    ttl_ms: int = int_field(SHARE_LEASE_MIN_TTL_MS, SHARE_LEASE_TTL_MS)
    max_rows: int = int_field(1, SHARE_MAX_ROWS)


@attrs.frozen(kw_only=True)
class RenewShareRequest(AttemptRequest):
    """Push a held share's lease ``ttlMs`` on from now (its lease token)."""

    action: Literal["renew_sheet_share"] = "renew_sheet_share"
    share: int = int_field(1, INTEGER_MAX)
    lease_token: str = lease_token_field(required=True)
    ttl_ms: int = int_field(SHARE_LEASE_MIN_TTL_MS, SHARE_LEASE_TTL_MS)


@attrs.frozen(kw_only=True)
class ReleaseShareRequest(AttemptRequest):
    """Give a held share up: ``finished`` (done once its rows are written) or not."""

    action: Literal["release_sheet_share"] = "release_sheet_share"
    share: int = int_field(1, INTEGER_MAX)
    lease_token: str = lease_token_field(required=True)
    finished: bool


@attrs.frozen(kw_only=True)
class AttemptStatusRequest(AttemptRequest):
    """Where the attempt stands."""

    action: Literal["sheet_attempt_status"] = "sheet_attempt_status"


@attrs.frozen(kw_only=True)
class StagedAdmissionRequest(SheetRequest):
    """What the requests of one staged admission share: its sheet and its id."""

    admission_id: str = admission_id_field()


@attrs.frozen(kw_only=True)
class BeginAdmissionRequest(StagedAdmissionRequest):
    action: Literal["begin_sheet_admission"] = "begin_sheet_admission"
    run_id: str = text_field()
    user_email: str | None = optional_text_field()


@attrs.frozen(kw_only=True)
class StageAdmissionChunkRequest(StagedAdmissionRequest):
    action: Literal["stage_sheet_admission_chunk"] = "stage_sheet_admission_chunk"
    seq: int = int_field(0, INTEGER_MAX)
    first_position: int = int_field(0, BIGINT_MAX)
    keys: list[str] | None = attrs.field(
        default=None, metadata={"minItems": 1, "maxItems": ADMISSION_CHUNK_ROWS}
    )
    """The rows' keys, one per row in order (the runner keys each row where it encodes
    it); without them the gateway keys the rows itself."""
    rows: list[Any] = attrs.field(
        validator=count_rule(1, ADMISSION_CHUNK_ROWS),
        metadata={"minItems": 1, "maxItems": ADMISSION_CHUNK_ROWS},
    )
    """The chunk's rows; each is checked (an object, JSON, the row budget) by the store,
    which names a bad one by its position in the whole input."""


@attrs.frozen(kw_only=True)
class CommitAdmissionRequest(StagedAdmissionRequest):
    action: Literal["commit_sheet_admission"] = "commit_sheet_admission"
    run_id: str = text_field()
    chunks: int = int_field(0, INTEGER_MAX + 1)
    rows: int = int_field(0, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class AbortAdmissionRequest(Request):
    action: Literal["abort_sheet_admission"] = "abort_sheet_admission"
    table_namespace: str = text_field()
    admission_id: str = admission_id_field()


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
    inserted: int = int_field(0)
    skipped: int = int_field(0)
    pending_rows: list[dict[str, Any]] = attrs.field(validator=rule(lambda rows: _keyed(rows)))
    completed_rows: list[dict[str, Any]] = attrs.field(validator=rule(lambda rows: _keyed(rows)))
    table_namespace: str
    write_version: int = int_field(0)


@attrs.frozen(kw_only=True)
class BeginAdmissionAnswer:
    admission_id: str
    chunk_rows: int = int_field(1)
    chunk_bytes: int = int_field(1)


@attrs.frozen(kw_only=True)
class StageAdmissionChunkAnswer:
    admission_id: str
    seq: int = int_field(0)
    staged: bool
    """False when the chunk had been staged before (a retry): nothing was written."""


@attrs.frozen(kw_only=True)
class CommitAdmissionAnswer:
    admission_id: str
    write_version: int = int_field(1)
    inserted: int = int_field(0)
    skipped: int = int_field(0)
    pending_count: int = int_field(0)
    completed_count: int = int_field(0)
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
    """A flattened JWE (RFC 7516 §7.2.2), with ``alg`` = ``RSA-OAEP-256+A256GCM``
    beside it when sealed to the requester's public key (the seed's runtime
    branches on it)."""

    protected: str
    encrypted_key: str = attrs.field(metadata={"wire": "encrypted_key"})
    iv: str
    ciphertext: str
    tag: str
    aad: str
    alg: str | Absent = ABSENT


@attrs.frozen(kw_only=True)
class CreateDbSessionAnswer:
    expires_at: str
    play_name: str
    target: SessionTargetAnswer
    operations: list[Operation]
    limits: SessionLimitsAnswer
    postgres: PostgresTablesWire
    postgres_url: str | Absent = ABSENT
    encrypted_postgres_url: EnvelopeWire | Absent = ABSENT


@attrs.frozen(kw_only=True)
class PageWire:
    rows: list[dict[str, Any]]
    limit: int = int_field(0)
    offset: int = int_field(0)


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
    limit: int | Absent = attrs.field(default=ABSENT, validator=between(0), metadata={"minimum": 0})
    """Echoed by this gateway; the client reads only the keys."""
    offset: int | Absent = attrs.field(
        default=ABSENT, validator=between(0), metadata={"minimum": 0}
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
    updated: int = int_field(0)
    stale_rows: list[StaleRowWire] | Absent = ABSENT
    """Left out by a legacy gateway."""


@attrs.frozen(kw_only=True)
class KeyedWriteAnswer:
    written: int = int_field(0)
    replayed: bool


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
    lease_token: str | Absent = attrs.field(default=ABSENT, repr=False)
    """The lease's secret, answered to the claimant only, when ``acquired``."""


@attrs.frozen(kw_only=True)
class ReleaseAnswer:
    released: bool


@attrs.frozen(kw_only=True)
class PlayWire:
    play_id: str = text_field()
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
class ClaimShareAnswer:
    """``claimed`` (the share and its index range), ``none`` (``live`` shares held by
    others, the first expiring in ``retryAfterMs``) or ``superseded``."""

    outcome: Literal["claimed", "none", "superseded"]
    share: int | None = optional_int_field(1, INTEGER_MAX)
    first_index: int | None = optional_int_field(BIGINT_MIN, BIGINT_MAX)
    last_index: int | None = optional_int_field(BIGINT_MIN, BIGINT_MAX)
    taken_over: bool = False
    live: int = int_field(0)
    retry_after_ms: int | None = optional_int_field(0, BIGINT_MAX)


@attrs.frozen(kw_only=True)
class ShareLeaseAnswer:
    """A renewal's or release's outcome."""

    outcome: Literal["renewed", "released", "lost", "superseded"]


@attrs.frozen(kw_only=True)
class AttemptStatusAnswer:
    pending: int = int_field(0)
    claimed: int = int_field(0)
    enriched: int = int_field(0)
    failed: int = int_field(0)
    workers: int = int_field(0)
    superseded: bool = False


@attrs.frozen(kw_only=True)
class SummaryAnswer:
    total: int = int_field(0)
    queued: int = int_field(0)
    running: int = int_field(0)
    completed: int = int_field(0)
    failed: int = int_field(0)


@attrs.frozen(kw_only=True)
class ErrorBody:
    """Every error answer: ``{error, code, ...}``."""

    error: str
    code: str
    retry_after_ms: int | Absent = attrs.field(default=ABSENT, metadata={"wire": "retry_after_ms"})
    """With 429 and 503 (back-pressure, draining): when to try again. The seed spells it
    in snake case."""
    observed_bytes: int | Absent = attrs.field(default=ABSENT, metadata={"wire": "observed_bytes"})
    """With 413: how many bytes were seen. The seed spells it in snake case."""


# --- the operating routes ------------------------------------------------------------------

#: Why ``GET /readyz`` answers 503.
UnreadyReason = Literal["pool_saturated", "store_unavailable", "store_timeout", "store_error"]


@attrs.frozen(kw_only=True)
class HealthAnswer:
    """``GET /healthz``: the process serves (also while it drains)."""

    status: Literal["ok"] = "ok"
    worker: int = int_field(1)
    """The serving process's id (one of the gateway's workers)."""


@attrs.frozen(kw_only=True)
class ReadyAnswer:
    """``GET /readyz`` 200: the store answers within the readiness budget."""

    status: Literal["ready"] = "ready"


@attrs.frozen(kw_only=True)
class UnreadyAnswer:
    """``GET /readyz`` 503: why the store did not answer, and the budget it had."""

    status: Literal["unready"] = "unready"
    reason: UnreadyReason
    budget_ms: int = attrs.field(metadata={"wire": "budget_ms", "minimum": 1})


def error_body(
    message: str,
    code: str,
    *,
    retry_after_ms: int | Absent = ABSENT,
    observed_bytes: int | Absent = ABSENT,
) -> dict[str, Any]:
    """An error answer's decoded JSON (:class:`ErrorBody`)."""
    return unstructure(
        ErrorBody(
            error=message, code=code, retry_after_ms=retry_after_ms, observed_bytes=observed_bytes
        )
    )


def action_of(cls: type[Request]) -> str:
    """The action ``cls`` asks for: the default of its ``action`` member, the one
    place each action's name is written (beside its ``Literal`` type)."""
    action = attrs.fields(cls).action.default
    assert isinstance(action, str), cls
    return action


#: Each action's request class beside its answer class (its 200 body), in the order
#: the documents list them. The actions, their requests and their answers are all
#: read off this one table.
EXCHANGES: Final[tuple[tuple[type[Request], type[Any]], ...]] = (
    (EnsureSheetRequest, OkAnswer),
    (StartSheetDatasetRequest, AdmissionAnswer),
    (CreateDbSessionRequest, CreateDbSessionAnswer),
    (ReadRowsRequest, ReadRowsAnswer),
    (ReadRowsBatchRequest, ReadRowsBatchAnswer),
    (ReadRowKeysRequest, ReadRowKeysAnswer),
    (CompleteMapRowsRequest, TerminalWriteAnswer),
    (FailMapRowsRequest, TerminalWriteAnswer),
    (AppendRowsRequest, KeyedWriteAnswer),
    (UpsertRowsRequest, KeyedWriteAnswer),
    (ReplaceRowsRequest, KeyedWriteAnswer),
    (CompleteWorkReceiptRequest, ReceiptAnswer),
    (ClaimWorkReceiptRequest, ClaimAnswer),
    (ReleaseWorkReceiptRequest, ReleaseAnswer),
    (SummaryRequest, SummaryAnswer),
    (ResolvePlayRequest, ResolvePlayAnswer),
    (RegisterPlayRequest, RegisterPlayAnswer),
    (BeginAdmissionRequest, BeginAdmissionAnswer),
    (StageAdmissionChunkRequest, StageAdmissionChunkAnswer),
    (CommitAdmissionRequest, CommitAdmissionAnswer),
    (AbortAdmissionRequest, AbortAdmissionAnswer),
    (ClaimShareRequest, ClaimShareAnswer),
    (RenewShareRequest, ShareLeaseAnswer),
    (ReleaseShareRequest, ShareLeaseAnswer),
    (AttemptStatusRequest, AttemptStatusAnswer),
)

#: Each action's request class.
REQUESTS: Final[Mapping[str, type[Request]]] = {
    action_of(request): request for request, _ in EXCHANGES
}
#: Each action's answer class (its 200 body).
ANSWERS: Final[Mapping[str, type[Any]]] = {
    action_of(request): answer for request, answer in EXCHANGES
}
#: Every action of the runtime route, in the order the documents list them.
ACTIONS: Final = tuple(REQUESTS)
#: Reads whose 413 ``runtime_sheet_read_batch_too_large`` means "split me".
PAGE_READS: Final = frozenset({action_of(ReadRowsRequest), action_of(ReadRowsBatchRequest)})

#: The operating routes' answers.
PROBE_ANSWERS: Final = (HealthAnswer, ReadyAnswer, UnreadyAnswer)

#: Classes whose texts are not capped: answers whose texts the gateway wrote.
UNCAPPED: Final = frozenset(
    {
        PlayWire,
        PlayDefinitionWire,
        ReceiptWire,
        ErrorBody,
        EnvelopeWire,
        *ANSWERS.values(),
        *PROBE_ANSWERS,
    }
)
#: Classes whose unknown members are refused rather than ignored.
CLOSED: Final = frozenset({SessionLimitsWire, PlayDefinitionWire})
#: Answers write a null they hold (``rowVersionStamp: null``); requests leave it out.
WRITES_NULLS: Final = frozenset(
    {
        *ANSWERS.values(),
        *PROBE_ANSWERS,
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


#: The converter of every message above, built once from its whole policy.
CONVERTER: Final = WireConverter(closed=CLOSED, uncapped=UNCAPPED, writes_nulls=WRITES_NULLS)


def structure(value: object, cls: type[T]) -> T:
    """``value`` (decoded JSON) as the message class ``cls`` (``WireConverter.structure``)."""
    return CONVERTER.structure(value, cls)


def unstructure(value: Any) -> dict[str, Any]:
    """The wire form of a message (``WireConverter.unstructure``)."""
    return CONVERTER.unstructure(value)
