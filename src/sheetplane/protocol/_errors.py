"""The gateway's error answers in one table: each code's status, the exception a
client raises for it, and whether another attempt may succeed.

Every error answer is ``{error, code, ...}`` under an HTTP status. This table
is the only place that pairs them, and three readers derive from it:

* the reference server answers an exception with the rule of the nearest
  class in its MRO that the table lists under ``answers`` (:func:`rule_for_exception`):
  the status, the code, the text (a fixed one where the exception's own
  could name SQL or a value), and ``retry_after_ms`` where the rule names it;
* the client reads an answer by its code (:func:`rule_for_code`, through
  ``protocol/_receive.py``) and raises the rule's exception, or retries it
  when the rule is ``retryable``;
* the OpenAPI document describes each status by the rules answered with it
  (:func:`status_descriptions`), so a code added here is documented there.

A code is its rule only under the rule's status (a test fault, say, may
answer any status with its own code). A code the table does not know, or
under another status, is judged by its status alone (401/403 are
authentication, 429/502/503/504 are transient, anything else is a plain
``GatewayError``): another gateway may answer codes this one never writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from ..budgets import POSTGRES_BACKPRESSURE_RETRY_AFTER_MS, STAGING_QUOTA_RETRY_AFTER_MS
from ..errors import (
    AdmissionStagingTooLargeError,
    AdmissionStateError,
    AdmissionTooLargeError,
    BackpressureError,
    ConnectionSlotsExhaustedError,
    GatewayAuthError,
    GatewayError,
    InvalidInputError,
    PoolSaturatedError,
    ReadBatchTooLargeError,
    SheetCapError,
    SheetplaneError,
    StagingQuotaError,
    StatementTimeoutError,
    StoreError,
    StoreUnavailableError,
    TransactionConflictError,
    TransientGatewayError,
    UnsupportedActionError,
    WorkReceiptFencedError,
    WriteConflictError,
)
from ._messages import PAGE_READS, CommitAdmissionRequest, StageAdmissionChunkRequest, action_of
from ._wire import Code

__all__ = [
    "ERRORS",
    "TRANSIENT_STATUSES",
    "ErrorRule",
    "rule_for_code",
    "rule_for_exception",
    "status_descriptions",
]

#: HTTP statuses retried on the ladder whatever their body says (429: a cap such
#: as the gateway's live sessions per token, with the body's ``retry_after_ms``).
TRANSIENT_STATUSES: Final = frozenset({429, 502, 503, 504})


@attrs.frozen
class ErrorRule:
    """One error code of the protocol."""

    code: str
    """The body's ``code``."""
    status: int
    """The HTTP status it is answered with."""
    raises: type[SheetplaneError]
    """What a client raises for it (``GatewayError`` when it has no class of its own)."""
    retryable: bool
    """Whether the client tries again (on its ladder, or after ``retry_after_ms``)."""
    when: str
    """When the gateway answers it, for the OpenAPI document."""
    answers: tuple[type[BaseException], ...] = ()
    """The exceptions the server answers with this code (the nearest in an MRO wins)."""
    text: str | None = None
    """The fixed text the server answers with (None: the exception's own message,
    which is safe to show); a store failure's own text may name SQL or a value."""
    retry_after_ms: int | None = None
    """The ``retry_after_ms`` the server answers with, if any."""
    only_for: frozenset[str] | None = None
    """The actions whose answers raise ``raises`` (None: every action's); another
    action's answer with this code raises a plain ``GatewayError``."""

    def applies(self, action: str, status: int) -> bool:
        """Whether an answer to ``action`` under ``status`` with this code is this rule."""
        return status == self.status and (self.only_for is None or action in self.only_for)


_STORE_RETRY_MS: Final = POSTGRES_BACKPRESSURE_RETRY_AFTER_MS

#: Every code the gateway writes, most specific first within a status.
ERRORS: Final[tuple[ErrorRule, ...]] = (
    ErrorRule(Code.INVALID_REQUEST, 400, GatewayError, False, "a malformed request"),
    ErrorRule(
        InvalidInputError.code,
        400,
        InvalidInputError,
        False,
        "a value the store refuses (a staged row names its position in the input)",
        answers=(InvalidInputError,),
        only_for=frozenset(
            {action_of(StageAdmissionChunkRequest), action_of(CommitAdmissionRequest)}
        ),
    ),
    ErrorRule(
        Code.UNSUPPORTED_ACTION,
        400,
        UnsupportedActionError,
        False,
        "an action this gateway does not know",
    ),
    ErrorRule(Code.ENCRYPTION_REQUIRED, 400, GatewayError, False, "a session URL sent in clear"),
    ErrorRule(Code.INVALID_TEST_FAULT, 400, GatewayError, False, "a malformed test-fault header"),
    ErrorRule(Code.UNAUTHORIZED, 401, GatewayAuthError, False, "a missing or unknown token"),
    ErrorRule(Code.FORBIDDEN, 403, GatewayAuthError, False, "a request naming another org"),
    ErrorRule(
        Code.SHEET_NOT_FOUND, 404, GatewayError, False, "the sheet does not exist (ensure_sheet)"
    ),
    ErrorRule(Code.NOT_FOUND, 404, GatewayError, False, "an operating route that is off"),
    ErrorRule(Code.REQUEST_TIMEOUT, 408, GatewayError, False, "the body did not arrive in time"),
    ErrorRule(
        AdmissionStateError.code,
        409,
        AdmissionStateError,
        False,
        "a staged admission that cannot go on (aborted, expired, or committed otherwise)",
        answers=(AdmissionStateError,),
    ),
    ErrorRule(
        WriteConflictError.code,
        409,
        GatewayError,
        False,
        "one row given two results at one write version",
        answers=(WriteConflictError,),
    ),
    ErrorRule(
        WorkReceiptFencedError.code,
        409,
        WorkReceiptFencedError,
        False,
        "a completion fenced by another holder's live lease",
        answers=(WorkReceiptFencedError,),
    ),
    ErrorRule(
        Code.REQUEST_TOO_LARGE, 413, GatewayError, False, "a body over the transport ceiling"
    ),
    ErrorRule(
        ReadBatchTooLargeError.code,
        413,
        ReadBatchTooLargeError,
        False,
        "a page read over its response budget (observed_bytes; read smaller pages)",
        answers=(ReadBatchTooLargeError,),
        only_for=PAGE_READS,
    ),
    ErrorRule(
        AdmissionTooLargeError.code,
        413,
        AdmissionTooLargeError,
        False,
        "a one-request admission whose answer would pass the ceiling (observed_bytes)",
        answers=(AdmissionTooLargeError,),
    ),
    ErrorRule(
        AdmissionStagingTooLargeError.code,
        413,
        AdmissionStagingTooLargeError,
        False,
        "a staged chunk that would take its admission past ADMISSION_MAX_STAGED_BYTES",
        answers=(AdmissionStagingTooLargeError,),
    ),
    ErrorRule(
        Code.SESSION_CAP,
        429,
        TransientGatewayError,
        True,
        "the token's or the org's live DB sessions are at their cap (retry_after_ms)",
    ),
    ErrorRule(
        StagingQuotaError.code,
        429,
        TransientGatewayError,
        True,
        "the org's open admissions or staged bytes, or every org's staged bytes, are at "
        "their bound (retry_after_ms)",
        answers=(StagingQuotaError,),
        retry_after_ms=STAGING_QUOTA_RETRY_AFTER_MS,
    ),
    ErrorRule(
        SheetCapError.code,
        429,
        SheetCapError,
        False,
        "the org's sheets or plays' receipt tables are at their cap (not retried: "
        "waiting frees none)",
        answers=(SheetCapError,),
    ),
    ErrorRule(
        Code.TENANT_CAP,
        429,
        TransientGatewayError,
        True,
        "the token's or the org's requests in flight or connections are at their share"
        " of the gateway (retry_after_ms; refused before the body is read)",
    ),
    ErrorRule(
        Code.INTERNAL_ERROR, 500, GatewayError, False, "an unexpected failure (no trace, no secret)"
    ),
    ErrorRule(
        StoreError.code,
        500,
        GatewayError,
        False,
        "a Postgres operation failed",
        answers=(StoreError,),
        text="Runtime Postgres operation failed",
    ),
    ErrorRule(
        Code.BACKPRESSURE,
        503,
        BackpressureError,
        True,
        "Postgres admission back-pressure (retry_after_ms)",
        answers=(PoolSaturatedError,),
        text="Runtime Postgres admission is saturated; retry later",
        retry_after_ms=_STORE_RETRY_MS,
    ),
    ErrorRule(
        StoreUnavailableError.code,
        503,
        TransientGatewayError,
        True,
        "Postgres unavailable (retry_after_ms)",
        answers=(StoreUnavailableError,),
        text="Runtime Postgres is unavailable",
        retry_after_ms=_STORE_RETRY_MS,
    ),
    ErrorRule(
        ConnectionSlotsExhaustedError.code,
        503,
        TransientGatewayError,
        True,
        "Postgres out of connection slots (retry_after_ms)",
        answers=(ConnectionSlotsExhaustedError,),
        text="Runtime Postgres is unavailable",
        retry_after_ms=_STORE_RETRY_MS,
    ),
    ErrorRule(
        TransactionConflictError.code,
        503,
        TransientGatewayError,
        True,
        "a transaction aborted on conflict past its retries (retry_after_ms)",
        answers=(TransactionConflictError,),
        text="Runtime Postgres aborted the transaction on conflict; retry later",
        retry_after_ms=_STORE_RETRY_MS,
    ),
    ErrorRule(Code.DRAINING, 503, TransientGatewayError, True, "the gateway is draining"),
    ErrorRule(
        StatementTimeoutError.code,
        504,
        TransientGatewayError,
        True,
        "a Postgres statement timed out",
        answers=(StatementTimeoutError,),
        text="Runtime Postgres statement timed out",
    ),
    ErrorRule(
        Code.ACTION_TIMEOUT, 504, TransientGatewayError, True, "an action outlived its budget"
    ),
)

_BY_CODE: Final[Mapping[str, ErrorRule]] = {rule.code: rule for rule in ERRORS}
_BY_CLASS: Final[Mapping[type[BaseException], ErrorRule]] = {
    cls: rule for rule in ERRORS for cls in rule.answers
}
assert len(_BY_CODE) == len(ERRORS), "a code is listed twice"
assert sum(len(rule.answers) for rule in ERRORS) == len(_BY_CLASS), "a class is listed twice"


def rule_for_code(code: object) -> ErrorRule | None:
    """The rule of an answer's ``code``, or None for a code this table does not know."""
    return _BY_CODE.get(code) if isinstance(code, str) else None


def rule_for_exception(exc: BaseException) -> ErrorRule | None:
    """The rule the server answers ``exc`` with: its nearest class the table lists,
    or None (the server's own errors, and an unexpected failure)."""
    for cls in type(exc).__mro__:
        rule = _BY_CLASS.get(cls)
        if rule is not None:
            return rule
    return None


def status_descriptions() -> dict[str, str]:
    """Each error status the gateway answers, described by the rules answered with it."""
    by_status: dict[int, list[ErrorRule]] = {}
    for rule in ERRORS:
        by_status.setdefault(rule.status, []).append(rule)
    return {
        str(status): "; ".join(f"{rule.code}: {rule.when}" for rule in rules)
        for status, rules in sorted(by_status.items())
    }
