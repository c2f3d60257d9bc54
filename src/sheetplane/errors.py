"""The exceptions sheetplane raises.

Every class carries a stable ``code`` (a class attribute) that logs, metrics and
tests can match on. Errors caused by bad input also derive from ``ValueError``
or ``TypeError`` so generic handlers keep working.

The tree::

    SheetplaneError
    ├── InvalidInputError (ValueError)        bad arguments; nothing was written
    ├── BatchingError
    │   ├── LaneWedgedError                   a value waited past max_wait
    │   ├── OversizedValueError (ValueError)  one value exceeds the retained-bytes cap
    │   ├── BatchContractError                execute broke its contract
    │   ├── BatcherClosedError                submit outside or after the batcher
    │   └── ValueCancelledError               pending.cancel() withdrew the value
    ├── ReadBatchTooLargeError                a batch read exceeds the response budget
    ├── ResponseTooLargeError                 a response exceeds its action's budget
    ├── AdmissionTooLargeError                a one-request admission would pass the ceiling
    ├── AdmissionStateError                   a staged admission that cannot go on
    ├── QuotaExceededError                    a bound on what a tenant keeps (staged bytes...)
    │   ├── SheetCapError                     the org's sheets or receipt tables are at their cap
    │   ├── StagingQuotaError                 open admissions or staged bytes at their bound (429)
    │   └── AdmissionStagingTooLargeError     one admission's staged bytes past its bound (413)
    ├── GatewayError                          the gateway answered an error
    │   ├── GatewayAuthError                  401 / 403
    │   ├── UnsupportedActionError            a gateway that predates the action
    │   │   └── GatewayActionMissingError     known before a call that needs it began
    │   ├── TransientGatewayError             retryable, and retries ran out
    │   │   ├── GatewayUnreachableError       no URL has ever answered (a wrong URL, most likely)
    │   │   ├── BackpressureError             503 runtime_postgres_admission_backpressure
    │   │   └── GatewayTimeoutError           an attempt outlived REQUEST_TIMEOUT_MS
    │   └── GatewayProtocolError              a malformed or inconsistent answer
    ├── StoreError                            Postgres failed an operation
    │   ├── StoreUnavailableError             could not connect within the ladder
    │   │   └── ConnectionSlotsExhaustedError no connection slot freed within the ladder
    │   ├── PoolSaturatedError                no pooled connection freed in time (back-pressure)
    │   ├── TransactionConflictError          deadlock or serialization failure on every attempt
    │   ├── StatementTimeoutError             a statement ran past its timeout
    │   └── DatabaseNotHardenedError          PUBLIC keeps privileges a tenant could abuse
    │       └── GatewayRoleLacksPrivilegesError a non-superuser gateway cannot bound sessions
    ├── AttemptSupersededError                a newer admission fenced this attempt
    ├── WriteConflictError                    same version, different values
    ├── WorkReceiptFencedError                another holder's live claim owns the receipt
    ├── LeaseError                            a work receipt's lease
    │   ├── LeaseHeldError                    another holder holds the lease
    │   ├── LeaseLostError                    the lease was lost; the block's body was cancelled
    │   └── ReceiptCompletedError             the work is already done (its receipt is on it)
    └── SessionError                          scoped DB sessions
        ├── SessionExpiredError
        ├── SessionPrewarmError               a preloaded session could not be opened and checked
        └── EnvelopeDecryptionError           the encrypted Postgres URL did not open

No message ever contains a secret: tokens and database URLs are redacted
before they reach an exception.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ._types import Receipt, StaleRow


class SheetplaneError(Exception):
    """Base class of every error sheetplane raises on purpose."""

    code: ClassVar[str] = "sheetplane_error"


class InvalidInputError(SheetplaneError, ValueError):
    """An argument was rejected before anything was read or written."""

    code = "invalid_input"


# --- batching -----------------------------------------------------------------


class BatchingError(SheetplaneError):
    """Base of the errors raised by ``BoundedBatchFunction``."""

    code = "batching_error"


class LaneWedgedError(BatchingError):
    """The value's ``max_wait`` passed before its batch started executing.

    The value is withdrawn and is never handed to ``execute`` afterwards.
    """

    code = "lane_wedged"


class OversizedValueError(BatchingError, ValueError):
    """One value's estimate alone exceeds ``max_retained_bytes``."""

    code = "oversized_value"


class BatchContractError(BatchingError):
    """``execute`` returned something other than one result per value."""

    code = "batch_contract_violation"


class BatcherClosedError(BatchingError):
    """``submit`` outside the batcher's ``async with`` block, or after it was torn down."""

    code = "batcher_closed"


class ValueCancelledError(BatchingError):
    """A value submitted with ``submit_nowait`` was withdrawn by ``pending.cancel()``.

    If it was still queued it is never handed to ``execute``.
    """

    code = "value_cancelled"


# --- response budgets -------------------------------------------------------------


class ReadBatchTooLargeError(SheetplaneError):
    """A batch read would answer more than ``READ_BATCH_MAX_RESPONSE_BYTES``.

    ``observed_bytes`` is a lower bound on the decoded size that was seen. The
    message is the runtime's ``RuntimeSheetDatasetReadBatchTooLargeError`` text,
    word for word.
    """

    code = "runtime_sheet_read_batch_too_large"

    def __init__(self, observed_bytes: int) -> None:
        from .budgets import READ_BATCH_MAX_RESPONSE_BYTES

        self.observed_bytes = observed_bytes
        super().__init__(
            f"Runtime dataset read batch exceeds the {READ_BATCH_MAX_RESPONSE_BYTES} byte "
            f"decoded response budget (observed at least {observed_bytes} bytes)."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.observed_bytes,))


class ResponseTooLargeError(SheetplaneError):
    """A gateway response exceeded the byte budget of its action.

    The runtime's ``RuntimeApiResponseTooLargeError``: the same fields
    (``action``, ``limit_bytes``, ``observed_bytes``, a lower bound on the size
    seen) and its message, word for word.
    """

    code = "response_too_large"

    def __init__(self, action: str, limit_bytes: int, observed_bytes: int) -> None:
        self.action = action
        self.limit_bytes = limit_bytes
        self.observed_bytes = observed_bytes
        super().__init__(
            f"Runtime API {action} response exceeds the {limit_bytes} byte decoded-body budget "
            f"(observed at least {observed_bytes} bytes)."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.action, self.limit_bytes, self.observed_bytes))


class AdmissionTooLargeError(SheetplaneError):
    """A one-request admission (``start_sheet_dataset``) whose request or answer would
    pass ``TRANSPORT_CEILING_BYTES``: refused (413) before anything was written.

    ``observed_bytes`` is a lower bound on the size that was seen. Admit such an
    input with ``RowWriter.start``, which stages it in chunks.
    """

    code = "runtime_sheet_admission_too_large"

    def __init__(self, observed_bytes: int) -> None:
        from .budgets import TRANSPORT_CEILING_BYTES

        self.observed_bytes = observed_bytes
        super().__init__(
            f"the admission's request or answer would pass the {TRANSPORT_CEILING_BYTES} byte "
            f"transport ceiling (observed at least {observed_bytes} bytes); nothing was written"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.observed_bytes,))


class AdmissionStateError(SheetplaneError):
    """A staged admission that cannot take this step: unknown, of another run,
    aborted, expired (idle past ``ADMISSION_IDLE_MS``), or committed with chunks
    that do not add up. Nothing of it was committed; start the admission again.
    """

    code = "runtime_sheet_admission_state"


#: The text an ``AdmissionStateError`` carries when the admission's staging rows
#: were lost (the staging table is ``UNLOGGED``: a database crash empties it); the
#: gateway sends it in the error text, so a runner recognises it on either road.
STAGING_LOST_TEXT = "its staging rows were lost"


# --- gateway ----------------------------------------------------------------------


class QuotaExceededError(SheetplaneError):
    """A bound on what a tenant may keep in the store is reached (its sheets, its
    staged bytes, its open admissions); nothing was written."""

    code = "runtime_quota_exceeded"


class SheetCapError(QuotaExceededError):
    """The org has ``MAX_SHEETS_PER_ORG`` sheets (or ``MAX_RECEIPT_TABLES_PER_ORG``
    plays' receipt tables): a new one is refused until the operator removes some.
    Not retried: waiting frees nothing."""

    code = "runtime_org_sheet_cap"


class StagingQuotaError(QuotaExceededError):
    """The org's open admissions or staged bytes (or every org's together) are at
    their bound; the chunk or begin wrote nothing. Retried after ``retry_after_ms``:
    commits and expiries free room."""

    code = "runtime_staging_quota"


class AdmissionStagingTooLargeError(QuotaExceededError):
    """One admission's staged bytes would pass ``ADMISSION_MAX_STAGED_BYTES``: the
    chunk is refused and nothing written. Not retried: admit a smaller input."""

    code = "runtime_admission_staging_too_large"


class GatewayError(SheetplaneError):
    """The runtime gateway answered with an error.

    ``status`` is the HTTP status (0 when no response arrived), ``gateway_code``
    the body's ``code`` if any, ``details`` the body's ``details`` or
    ``debug_error``.
    """

    code = "gateway_error"

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        details: Any = None,
    ) -> None:
        self.status = status
        self.gateway_code = code
        self.message = message
        self.details = details
        text = message if status == 0 else f"HTTP {status}: {message}"
        if code:
            text = f"{text} [{code}]"
        if details not in (None, "", {}, []):
            text = f"{text} ({details})"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.gateway_code, self.message, self.details))


class GatewayAuthError(GatewayError):
    """401 (no valid token) or 403 (the token's org does not own the sheet)."""

    code = "gateway_auth"


class UnsupportedActionError(GatewayError):
    """The gateway predates the action ("Unsupported runtime data-plane action")."""

    code = "unsupported_action"


class GatewayActionMissingError(UnsupportedActionError):
    """The gateway does not serve ``action``, which ``needed_by`` needs.

    Learned from the gateway before the call began (``GatewayClient.probe_action``),
    so nothing was admitted or written: for example ``rt.map`` on the gateway
    road of a gateway that serves only the runtime's own actions, which has
    no terminal-write action.
    """

    code = "gateway_action_missing"

    def __init__(self, action: str, needed_by: str) -> None:
        self.action = action
        self.needed_by = needed_by
        super().__init__(
            400,
            "unsupported_action",
            f"the gateway does not serve {action}, which {needed_by} needs; nothing was "
            "admitted or written (a gateway that serves only the runtime's own actions "
            "leaves row writes to the direct road)",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.action, self.needed_by))


class TransientGatewayError(GatewayError):
    """A retryable failure (connect error, reset, 502/503/504, a transient message)
    that outlasted the retry ladder or the call's budget."""

    code = "transient_gateway_error"


class GatewayUnreachableError(TransientGatewayError):
    """No gateway URL of the client has ever answered (refused, DNS, unreachable), and
    ``GATEWAY_FIRST_CONTACT_BUDGET_MS`` has passed: the message names the URLs and what
    was tried. Most likely a wrong ``base_url``, or a gateway that is not running."""

    code = "gateway_unreachable"


class BackpressureError(TransientGatewayError):
    """503 ``runtime_postgres_admission_backpressure``; ``retry_after_ms`` says when to retry."""

    code = "runtime_postgres_admission_backpressure"

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        details: Any = None,
        retry_after_ms: int | None = None,
    ) -> None:
        self.retry_after_ms = retry_after_ms
        super().__init__(status, code, message, details)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.status, self.gateway_code, self.message, self.details, self.retry_after_ms),
        )


class GatewayTimeoutError(TransientGatewayError):
    """An attempt did not finish within ``REQUEST_TIMEOUT_MS``."""

    code = "gateway_timeout"


class GatewayProtocolError(GatewayError):
    """The gateway's answer was malformed, truncated or inconsistent with the request."""

    code = "gateway_protocol_error"


# --- store ----------------------------------------------------------------------------


class StoreError(SheetplaneError):
    """Postgres failed a sheetplane operation."""

    code = "store_error"


class StoreUnavailableError(StoreError):
    """No connection could be made within the connect-retry ladder, or the
    connection was lost.

    ``transient`` is False when the server answered with something another
    attempt will not change (a refused password, an unknown database): the
    direct road retries only transient ones. ``waited_ms`` is set when the
    error ends a wait for a connection that spent the whole connect budget
    (``POSTGRES_CONNECT_BUDGET_MS``): the milliseconds really waited. The
    direct road does not wait again after one (Postgres is down).
    """

    code = "store_unavailable"

    def __init__(self, *args: object, transient: bool = True, waited_ms: int | None = None) -> None:
        super().__init__(*args)
        self.transient = transient
        self.waited_ms = waited_ms


class ConnectionSlotsExhaustedError(StoreUnavailableError):
    """Postgres refused every connect within the connect budget for lack of
    connection slots (SQLSTATE 53300, "too many connections", "remaining
    connection slots are reserved"): back-pressure, waited for and then given
    up on; nothing ran. Retryable."""

    code = "store_connection_slots_exhausted"


class PoolSaturatedError(StoreError):
    """No pooled connection freed within ``acquire_timeout_ms``: back-pressure, retry later."""

    code = "store_pool_saturated"


class TransactionConflictError(StoreError):
    """Postgres aborted the transaction (``40P01`` deadlock, ``40001`` serialization
    failure) on every attempt within its retry budget; nothing was written. Retryable."""

    code = "store_transaction_conflict"


class StatementTimeoutError(StoreError):
    """A statement ran past ``POSTGRES_STATEMENT_TIMEOUT_MS`` and was cancelled."""

    code = "statement_timeout"


class DatabaseNotHardenedError(StoreError):
    """Every role (``PUBLIC``) may still call built-in functions one tenant could
    use against another (advisory locks, sleeps, large objects...), and the
    gateway's role is not a superuser that could revoke them."""

    code = "database_not_hardened"


class GatewayRoleLacksPrivilegesError(DatabaseNotHardenedError):
    """The gateway's role is not a superuser and lacks what it needs to bound
    session roles: ``CREATEROLE`` (to mint and drop them), membership in
    ``pg_read_all_stats`` (to see their backends' state in ``pg_stat_activity``)
    or in ``pg_signal_backend`` (to end them). ``missing`` names each."""

    code = "gateway_role_lacks_privileges"

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


# --- fencing ----------------------------------------------------------------------------


class AttemptSupersededError(SheetplaneError):
    """A terminal write found rows that a different admission owns: the attempt must stop.

    Raised as the runtime raises ``RUNTIME_SHEET_ATTEMPT_SUPERSEDED``, with the
    same fields: ``table_namespace``, ``run_id``, ``write_version`` (the
    writer's, ``None`` for an unversioned write), ``submitted_rows`` (the
    distinct keys the write carried) and ``superseded_rows`` (the
    ``StaleRow`` records that superseded it, ``already_terminal`` excluded).
    The message counts them by reason, in the order first seen, and samples
    the first five keys with their stored write versions.
    """

    code = "attempt_superseded"

    def __init__(
        self,
        table_namespace: str,
        run_id: str,
        write_version: int | None,
        submitted_rows: int,
        superseded_rows: Sequence[StaleRow],
    ) -> None:
        self.table_namespace = table_namespace
        self.run_id = run_id
        self.write_version = write_version
        self.submitted_rows = submitted_rows
        self.superseded_rows: tuple[StaleRow, ...] = tuple(superseded_rows)
        counts: dict[str, int] = {}
        for row in self.superseded_rows:
            counts[row.reason] = counts.get(row.reason, 0) + 1
        reasons = ", ".join(f"{reason}={n}" for reason, n in counts.items()) or "unreported"
        sample = "; ".join(
            f"key={row.key} row_write_version="
            f"{'unknown' if row.row_version_stamp is None else row.row_version_stamp}"
            for row in self.superseded_rows[:5]
        )
        version = "none" if write_version is None else write_version
        super().__init__(
            f'RUNTIME_SHEET_ATTEMPT_SUPERSEDED: Runtime Sheet table "{table_namespace}" '
            f"rejected {len(self.superseded_rows)} of {submitted_rows} terminal row write(s) "
            f"from run {run_id} at write version {version} "
            f"because the rows are owned by a different write version ({reasons}). "
            "This attempt has been superseded by a newer admission of these rows and must stop "
            f"executing: nothing it persists from here on can be accepted. Sample: {sample}."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (
                self.table_namespace,
                self.run_id,
                self.write_version,
                self.submitted_rows,
                self.superseded_rows,
            ),
        )


class WriteConflictError(SheetplaneError):
    """A replay at the same write version carried different values than the stored ones."""

    code = "write_conflict"


class WorkReceiptFencedError(SheetplaneError):
    """A work receipt's completion was refused: another holder's unexpired claim owns it.

    The caller's claim expired and another attempt took the work over; the
    caller must drop its result. Nothing was written.
    """

    code = "work_receipt_fenced"


# --- leases --------------------------------------------------------------------------


class LeaseError(SheetplaneError):
    """Base of the errors of a work receipt's lease (``ReceiptRecorder.claim`` and ``once``)."""

    code = "lease_error"


class LeaseHeldError(LeaseError):
    """Another holder holds the lease on ``key`` until ``expires_at`` (the gateway's clock)."""

    code = "lease_held"

    def __init__(self, key: str, holder: str | None, expires_at: dt.datetime | None) -> None:
        self.key = key
        self.holder = holder
        self.expires_at = expires_at
        until = "" if expires_at is None else f" until {expires_at.isoformat()}"
        super().__init__(f"work receipt {key!r} is leased by {holder!r}{until}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.holder, self.expires_at))


class LeaseLostError(LeaseError):
    """The lease on ``key`` was lost while the block ran: a renewal was refused or
    failed, or could not land before the lease would expire. The body was
    cancelled before the expiry instant, so no other holder ran it meanwhile."""

    code = "lease_lost"

    def __init__(self, key: str, reason: str, what: str = "work receipt") -> None:
        self.key = key
        self.reason = reason
        self.what = what
        """What the lease was on: a ``work receipt``, or a ``share`` of an attempt."""
        super().__init__(f"the lease on {what} {key!r} was lost: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.reason, self.what))


class ReceiptCompletedError(LeaseError):
    """The work is already done: ``receipt`` is the completed receipt (no lease was taken)."""

    code = "receipt_completed"

    def __init__(self, receipt: Receipt) -> None:
        self.receipt = receipt
        super().__init__(
            f"work receipt {receipt.key!r} was completed by run {receipt.run_id!r} "
            f"at {receipt.completed_at}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.receipt,))


# --- sessions -----------------------------------------------------------------------


class SessionError(SheetplaneError):
    """A scoped database session could not be created, matched or used."""

    code = "db_session_error"


class SessionExpiredError(SessionError):
    """The session expired (or is inside its renewal window) and cannot be used."""

    code = "db_session_expired"


class SessionPrewarmError(SessionError):
    """Prewarming a preloaded session failed: a non-transient error, or the last of
    ``POSTGRES_PREWARM_MAX_ATTEMPTS`` tries. The message names the session's
    identity (org, play, namespace, logical table, operations), never its URL;
    the cause is the last store error (its text redacted by the store)."""

    code = "db_session_prewarm_failed"


class EnvelopeDecryptionError(SessionError):
    """The encrypted Postgres URL failed to decrypt or authenticate."""

    code = "envelope_decryption_failed"
