"""The gateway protocol's vocabulary, once: the routes, the error codes and the
enumerations both sides speak (the actions are the request classes' own, in
``protocol/_messages.py``).

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
from ..errors import (
    AdmissionStateError,
    AdmissionTooLargeError,
    BackpressureError,
    ReadBatchTooLargeError,
    UnsupportedActionError,
)

__all__ = [
    "BIGINT_MAX",
    "BIGINT_MIN",
    "HEALTHZ_PATH",
    "LOGICAL_TABLES",
    "METRICS_PATH",
    "OPERATIONS",
    "PROTECTION_BYPASS_HEADER",
    "READYZ_PATH",
    "ROW_MODES",
    "RUNTIME_PATH",
    "SERVED_LOGICAL_TABLES",
    "STALE_REASONS",
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

#: The header that carries a deployment's protection-bypass token past its edge (the
#: runtime sends it on every request when it is given one). A secret, like the token.
PROTECTION_BYPASS_HEADER: Final = "x-vercel-protection-bypass"

#: The error text (before ``: <action>``) of a gateway that does not know an action;
#: the client recognises it in any gateway's answer.
UNSUPPORTED_ACTION_TEXT: Final = "Unsupported runtime data-plane action"


class Code:
    """The ``code`` member of every error body the gateway writes.

    A code that is also an exception's is that class's ``code``, stated there
    once. Errors raised below the gateway (``InvalidInputError``, the store's
    errors) are answered with their own class's ``code``; the statuses and the
    client's judgement of every code are the error table's
    (``protocol/_errors.py``).
    """

    INVALID_REQUEST: Final = "invalid_request"
    UNSUPPORTED_ACTION: Final = UnsupportedActionError.code
    ENCRYPTION_REQUIRED: Final = "encryption_required"
    UNAUTHORIZED: Final = "unauthorized"
    FORBIDDEN: Final = "forbidden"
    REQUEST_TOO_LARGE: Final = "request_too_large"
    BACKPRESSURE: Final = BackpressureError.code
    SESSION_CAP: Final = "runtime_db_session_cap"
    TENANT_CAP: Final = "gateway_tenant_cap"
    READ_BATCH_TOO_LARGE: Final = ReadBatchTooLargeError.code
    ADMISSION_TOO_LARGE: Final = AdmissionTooLargeError.code
    ADMISSION_STATE: Final = AdmissionStateError.code
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
