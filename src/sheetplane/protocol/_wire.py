"""The gateway protocol's vocabulary, once: the route, the actions, the error
codes and the enumerations both sides speak.

The client (``gateway/client.py``), the reference server
(``gateway/server``), the fault injector, the sessions and the
``sheetplane.testing`` strategies all take these names from here, so the two
sides agree by construction rather than by copy. The enumerations are
derived from the ``Literal`` types of ``sheetplane._types`` (the domain
values every part shares), so a value added there is a value on the wire.

Bodies go through :func:`encode_body` and :func:`decode_body` on both sides
(defined in ``sheetplane._json``, which the store's ``jsonb`` loader shares):
orjson writes and msgspec reads where they give the same value as the
standard library, the standard library where they would not (see each
function).

Nothing here does I/O; importing it imports neither httpx nor psycopg.
"""

from __future__ import annotations

import hashlib
from typing import Final

from .._json import decode_body, encode_body
from .._types import BIGINT_MAX, BIGINT_MIN, LOGICAL_TABLES, OPERATIONS, ROW_MODES, STALE_REASONS

__all__ = [
    "ABORT_ADMISSION",
    "ACTIONS",
    "BEGIN_ADMISSION",
    "BIGINT_MAX",
    "BIGINT_MIN",
    "CLAIM_WORK_RECEIPT",
    "COMMIT_ADMISSION",
    "COMPLETE_MAP_ROWS",
    "COMPLETE_WORK_RECEIPT",
    "CREATE_DB_SESSION",
    "ENSURE_SHEET",
    "FAIL_MAP_ROWS",
    "HEALTHZ_PATH",
    "LOGICAL_TABLES",
    "METRICS_PATH",
    "OPERATIONS",
    "PAGE_READS",
    "READYZ_PATH",
    "READ_ROWS",
    "READ_ROWS_BATCH",
    "READ_ROW_KEYS",
    "REGISTER_PLAY",
    "RELEASE_WORK_RECEIPT",
    "RESOLVE_PLAY",
    "ROW_MODES",
    "RUNTIME_PATH",
    "SERVED_LOGICAL_TABLES",
    "STAGE_ADMISSION_CHUNK",
    "STALE_REASONS",
    "START_SHEET_DATASET",
    "SUMMARY",
    "UNSUPPORTED_ACTION_TEXT",
    "Code",
    "decode_body",
    "encode_body",
    "token_digest",
]

#: Where the gateway listens, under its base URL: every action is a POST here.
RUNTIME_PATH: Final = "/api/v2/plays/internal/runtime"
#: The operating routes (``GET``): liveness, readiness, Prometheus metrics.
HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"

# --- actions ------------------------------------------------------------------------

ENSURE_SHEET: Final = "ensure_sheet"
START_SHEET_DATASET: Final = "start_sheet_dataset"
CREATE_DB_SESSION: Final = "create_db_session"
READ_ROWS: Final = "runtime_sheet_read_rows"
READ_ROWS_BATCH: Final = "runtime_sheet_read_rows_batch"
READ_ROW_KEYS: Final = "runtime_sheet_read_row_keys"
COMPLETE_MAP_ROWS: Final = "runtime_sheet_complete_map_rows"
FAIL_MAP_ROWS: Final = "runtime_sheet_fail_map_rows"
COMPLETE_WORK_RECEIPT: Final = "complete_work_receipt"
CLAIM_WORK_RECEIPT: Final = "claim_work_receipt"
RELEASE_WORK_RECEIPT: Final = "release_work_receipt"
SUMMARY: Final = "runtime_sheet_summary"
RESOLVE_PLAY: Final = "resolve_play"
REGISTER_PLAY: Final = "register_play"
BEGIN_ADMISSION: Final = "begin_sheet_admission"
STAGE_ADMISSION_CHUNK: Final = "stage_sheet_admission_chunk"
COMMIT_ADMISSION: Final = "commit_sheet_admission"
ABORT_ADMISSION: Final = "abort_sheet_admission"

#: Every action of the runtime route, in the order the documents list them.
ACTIONS: Final = (
    ENSURE_SHEET,
    START_SHEET_DATASET,
    CREATE_DB_SESSION,
    READ_ROWS,
    READ_ROWS_BATCH,
    READ_ROW_KEYS,
    COMPLETE_MAP_ROWS,
    FAIL_MAP_ROWS,
    COMPLETE_WORK_RECEIPT,
    CLAIM_WORK_RECEIPT,
    RELEASE_WORK_RECEIPT,
    SUMMARY,
    RESOLVE_PLAY,
    REGISTER_PLAY,
    BEGIN_ADMISSION,
    STAGE_ADMISSION_CHUNK,
    COMMIT_ADMISSION,
    ABORT_ADMISSION,
)

#: The error text (before ``: <action>``) of a gateway that does not know an action;
#: the client recognises it in any gateway's answer.
UNSUPPORTED_ACTION_TEXT: Final = "Unsupported runtime data-plane action"

#: Reads whose 413 ``runtime_sheet_read_batch_too_large`` means "split me".
PAGE_READS: Final = frozenset({READ_ROWS, READ_ROWS_BATCH})


class Code:
    """The ``code`` member of every error body the gateway writes.

    Errors raised below the gateway (``InvalidInputError``, the store's
    errors) are answered with their own class's ``code`` (``sheetplane.errors``).
    """

    INVALID_REQUEST: Final = "invalid_request"
    UNSUPPORTED_ACTION: Final = "unsupported_action"
    ENCRYPTION_REQUIRED: Final = "encryption_required"
    UNAUTHORIZED: Final = "unauthorized"
    FORBIDDEN: Final = "forbidden"
    REQUEST_TOO_LARGE: Final = "request_too_large"
    BACKPRESSURE: Final = "runtime_postgres_admission_backpressure"
    SESSION_CAP: Final = "runtime_db_session_cap"
    READ_BATCH_TOO_LARGE: Final = "runtime_sheet_read_batch_too_large"
    ADMISSION_TOO_LARGE: Final = "runtime_sheet_admission_too_large"
    ADMISSION_STATE: Final = "runtime_sheet_admission_state"
    SHEET_NOT_FOUND: Final = "sheet_not_found"
    INVALID_TEST_FAULT: Final = "invalid_test_fault"
    TEST_FAULT: Final = "test_fault"
    INTERNAL_ERROR: Final = "internal_error"
    REQUEST_TIMEOUT: Final = "request_timeout"
    ACTION_TIMEOUT: Final = "gateway_action_timeout"
    DRAINING: Final = "gateway_draining"
    NOT_FOUND: Final = "not_found"


#: The logical tables the reference gateway serves. The protocol names three
#: (``LOGICAL_TABLES``: a runner may ask for any); this gateway keeps only
#: sheet rows, and answers 400 for the others.
SERVED_LOGICAL_TABLES: Final = ("sheet_rows",)


def token_digest(token: str) -> str:
    """The hex SHA-256 digest of an executor token (stripped).

    How every side names a token without holding it: the server's token
    table, the client's session cache keys, and the page reader's scopes.
    """
    return hashlib.sha256(token.strip().encode("utf-8")).hexdigest()
