"""The receive half of a gateway call, free of I/O: what one answer means.

:func:`receive` takes what arrived (the status, the headers, the body's
bytes) and says what to do with it, as h11 turns bytes into events without
touching a socket: an :class:`Answer` (a 2xx JSON object), a :class:`Retry`
(a failure another attempt may cure, with the error to raise if none does,
and the delay the answer named), or it raises the error no retry can help.
The client's shell (``gateway/client.py``) sends, reads the bytes under its
budgets, and loops on ``Retry``; it decides nothing about the answer itself.

The judgement, in order:

* a 2xx body must be a JSON object (not JSON at all, a truncated body: retry);
* an error whose code the error table (``protocol/_errors.py``) knows under
  its status raises that rule's own exception (a too-large read, a staged
  admission that cannot go on, a bad staged row, a fenced receipt...);
* 401 and 403 raise ``GatewayAuthError``; the text of a gateway that
  predates the action raises ``UnsupportedActionError``;
* a retryable rule (back-pressure: ``BackpressureError``, waiting
  ``retry_after_ms`` or ``DEFAULT_RETRY_AFTER_MS``), a transient status
  (429, 502, 503, 504) or a transient text (the runtime's own list) retries;
* anything else raises ``GatewayError``.

Texts pass through ``redact`` before they reach an error, so the token the
client holds never appears in one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from .._ints import is_int
from ..budgets import (
    DEFAULT_RETRY_AFTER_MS,
    MAX_RETRY_AFTER_MS,
    READ_BATCH_MAX_RESPONSE_BYTES,
    TRANSPORT_CEILING_BYTES,
)
from ..errors import (
    AdmissionStateError,
    AdmissionTooLargeError,
    BackpressureError,
    GatewayAuthError,
    GatewayError,
    InvalidInputError,
    QuotaExceededError,
    ReadBatchTooLargeError,
    TransientGatewayError,
    UnsupportedActionError,
    WorkReceiptFencedError,
)
from ._domain import protocol_error
from ._errors import TRANSIENT_STATUSES, rule_for_code
from ._wire import UNSUPPORTED_ACTION_TEXT, decode_body

__all__ = [
    "TRANSIENT_MESSAGE",
    "UNSUPPORTED_ACTION_MESSAGE",
    "Answer",
    "Retry",
    "is_transient_message",
    "receive",
    "retry_after_from_body",
    "retry_after_from_header",
]

#: Error texts of failures that are worth another attempt: the runtime's own list,
#: alternative for alternative (docs/gateway.md, "Retries").
TRANSIENT_MESSAGE: Final = re.compile(
    r"timeout exceeded when trying to connect|timed out|fetch failed|ECONNRESET|ECONNREFUSED"
    r"|UND_ERR_CONNECT_TIMEOUT|requested endpoint could not be found, or you don't have access"
    r"|Neon API request failed \((?:408|429|502|503|504)\)"
    r"|RUNTIME_SCHEDULER_(?:SATURATED|UNAVAILABLE|SCHEMA_NOT_READY)"
    r"|RUNTIME_RATE_STATE_UNAVAILABLE|Runtime scheduler DB pool is saturated"
    r"|Runtime scheduler DB circuit breaker is open|Runtime rate state .* is unavailable",
    re.IGNORECASE,
)

#: The answer of a gateway that predates an action.
UNSUPPORTED_ACTION_MESSAGE: Final = re.compile(re.escape(UNSUPPORTED_ACTION_TEXT), re.IGNORECASE)


@attrs.frozen
class Retry:
    """A failed attempt worth another: the error to raise if none follows."""

    error: GatewayError
    """What the call raises when the ladder or the budget runs out."""
    retry_after_ms: int | None = None
    """The delay the answer named (already clamped), if any."""


@attrs.frozen
class Answer:
    """A successful attempt: the decoded JSON object and its decoded size."""

    body: dict[str, Any]
    """The answer's JSON object."""
    size: int
    """Its decoded size in bytes."""


def _unchanged(text: str) -> str:
    return text


def is_transient_message(text: str) -> bool:
    """Whether an error text names a transient failure."""
    return TRANSIENT_MESSAGE.search(text) is not None


def retry_after_from_body(value: object) -> int | None:
    """A body's ``retry_after_ms``: a finite, non-negative number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return min(math.ceil(value), MAX_RETRY_AFTER_MS)


def retry_after_from_header(value: str | None) -> int | None:
    """A ``Retry-After`` header in delta-seconds, as milliseconds; ``None`` otherwise.

    The HTTP-date form is ignored: it would need a wall clock agreed with
    the server, and the ladder is a fine answer without one.
    """
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        return None
    # Compare digit counts first so a thousand-digit header is not converted.
    if len(text) > len(str(MAX_RETRY_AFTER_MS)):
        return MAX_RETRY_AFTER_MS
    return min(int(text) * 1000, MAX_RETRY_AFTER_MS)


_NOT_JSON: Final = object()


def _parse_json(raw: bytes) -> Any:
    """The JSON value of ``raw``, or ``_NOT_JSON``."""
    try:
        return decode_body(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _NOT_JSON


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    return next((v for k, v in headers.items() if k.lower() == name), None)


def _observed(body: Mapping[str, Any], floor: int) -> int:
    """A 413's ``observed_bytes``, or just past ``floor`` when it is missing or off."""
    observed = body.get("observed_bytes")
    if not is_int(observed) or observed < 0:
        return floor + 1
    return observed


def _details(value: Any, redact: Callable[[str], str]) -> Any:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return redact(value)
    text = json.dumps(value, default=str)
    redacted = redact(text)
    return redacted if redacted != text else value


def receive(
    action: str,
    status: int,
    headers: Mapping[str, str],
    raw: bytes,
    redact: Callable[[str], str] = _unchanged,
) -> Answer | Retry:
    """What the answer ``raw`` (under ``status`` and ``headers``) to ``action`` means.

    Returns an ``Answer`` or a ``Retry``; raises the error no retry can help.
    """
    parsed = _parse_json(raw)
    if 200 <= status < 300:
        if parsed is _NOT_JSON:
            return Retry(protocol_error(action, "the body is not JSON (truncated?)", status))
        if not isinstance(parsed, dict):
            raise protocol_error(action, "the body is not a JSON object", status)
        return Answer(parsed, len(raw))

    body: Mapping[str, Any] = parsed if isinstance(parsed, dict) else {}
    error_text = body.get("error")
    has_text = isinstance(error_text, str) and bool(error_text)
    message = redact(
        f"{action}: {error_text}" if has_text else f"{action} failed with HTTP {status}"
    )
    code = body.get("code") if isinstance(body.get("code"), str) else None
    raw_details = body.get("details")
    if raw_details in (None, ""):
        raw_details = body.get("debug_error")
    details = _details(raw_details, redact)
    searchable = f"{error_text or ''} {details or ''}"

    rule = rule_for_code(code)
    if rule is not None and rule.applies(action, status):
        cls = rule.raises
        if cls is ReadBatchTooLargeError:
            raise ReadBatchTooLargeError(_observed(body, READ_BATCH_MAX_RESPONSE_BYTES))
        if cls is AdmissionTooLargeError:
            raise AdmissionTooLargeError(_observed(body, TRANSPORT_CEILING_BYTES))
        if cls is AdmissionStateError or cls is WorkReceiptFencedError:
            raise cls(message)
        if issubclass(cls, QuotaExceededError) and not rule.retryable:
            # A cap that waiting does not free: a 429 like this is not retried.
            raise cls(redact(error_text) if error_text else message)
        if cls is InvalidInputError:
            # A bad row of a staged chunk: the text names its position in the input.
            raise InvalidInputError(redact(error_text) if error_text else message)
    if status in (401, 403):
        raise GatewayAuthError(status, code, message, details)
    if UNSUPPORTED_ACTION_MESSAGE.search(searchable):
        raise UnsupportedActionError(status, code, message, details)
    retry_after = retry_after_from_body(body.get("retry_after_ms"))
    if retry_after is None:
        retry_after = retry_after_from_header(_header(headers, "retry-after"))
    if rule is not None and rule.applies(action, status) and rule.raises is BackpressureError:
        if retry_after is None:
            retry_after = DEFAULT_RETRY_AFTER_MS
        return Retry(
            BackpressureError(status, code, message, details, retry_after_ms=retry_after),
            retry_after,
        )
    retryable = rule is not None and rule.applies(action, status) and rule.retryable
    if retryable or status in TRANSIENT_STATUSES or is_transient_message(searchable):
        return Retry(TransientGatewayError(status, code, message, details), retry_after)
    raise GatewayError(status, code, message, details)
