"""Structured logs: the standard ``logging`` module with a JSON formatter.

Why not structlog: the gateway's dependencies (Hypercorn, psycopg_pool) log
through the standard module already, and a formatter of a few lines turns
all of it, theirs and ours, into one JSON object a line; structlog would add
a dependency and still need this bridge for their records.

Every record logged while a request is being answered carries that
request's id (a context variable set by the operations middleware; trio
copies it into the request's worker threads) and, inside a trace (the
caller's ``traceparent``, continued by the request's span), its ``trace_id``
and ``span_id``. The access line is ``{"event": "request", "request_id",
"method", "path", "action", "status", "duration_ms", "org_id", "trace_id"}``;
an answer of 500 logs ``"event": "internal_error"`` with the whole
``traceback``. Nothing here logs a token, a database URL or
row data: the fields are chosen, never a request's headers or body; and
since an exception's text may quote anything, every message and traceback
is passed through the formatter's redactor (``sheetplane._redact``): the
secrets each gateway registers on it (its database URL and password, its
executor and metrics tokens; ``Operations.redactor``) and any URL-shaped
credentials.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
import sys
import traceback
import uuid
from typing import Any, Final, TextIO

import attrs
import trio

from ... import _tracing
from ..._redact import Redactor

__all__ = [
    "REQUEST_ID_HEADER",
    "ClosedConnectionFilter",
    "JsonFormatter",
    "RequestInfo",
    "configure_logging",
    "current_request",
    "internal_error_fields",
    "is_closed_connection",
    "request_id_from",
]

#: The header a request id is taken from, and echoed in, on every answer.
REQUEST_ID_HEADER: Final = "x-request-id"

#: What a caller's request id may look like; anything else is replaced by a fresh one
#: (so a header cannot inject log lines, nor carry a long secret into them).
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:\-]{1,128}")

#: The attributes every ``LogRecord`` has; anything else on a record is an ``extra`` field.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def internal_error_fields(exc: BaseException, redact: Redactor) -> dict[str, str]:
    """The ``extra`` of a 500's log record: ``event`` and the whole ``traceback``,
    redacted here, so every handler (not only the JSON one) gets it without secrets."""
    text = "".join(traceback.format_exception(exc))
    return {"event": "internal_error", "traceback": redact(text)}


@attrs.define(eq=False)
class RequestInfo:
    """What the access line says about one request; the handler fills in the action and org."""

    request_id: str
    method: str
    path: str
    action: str | None = None
    org_id: str | None = None
    status: int | None = None
    trace_id: str | None = None
    """The trace the request's span belongs to (the caller's ``traceparent``), if any."""


_CURRENT: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar(
    "sheetplane_request", default=None
)


def current_request() -> RequestInfo | None:
    """The request being answered in this task (or its worker thread), if any."""
    return _CURRENT.get()


def set_current_request(info: RequestInfo | None) -> contextvars.Token[RequestInfo | None]:
    """Make ``info`` the current request; reset with the returned token."""
    return _CURRENT.set(info)


def reset_current_request(token: contextvars.Token[RequestInfo | None]) -> None:
    """Undo :func:`set_current_request`."""
    _CURRENT.reset(token)


def request_id_from(header: str | None) -> str:
    """The caller's ``x-request-id`` when it is a plain token of at most 128
    characters, else a fresh random id."""
    if header is not None and _REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``pid``, ``message``, the
    record's ``extra`` fields, the current request's id, and ``traceback``
    when the record carries an exception. Every text passes through ``redactor``."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor if redactor is not None else Redactor()

    def format(self, record: logging.LogRecord) -> str:
        redact = self.redactor
        entry: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": redact(record.getMessage()),
        }
        info = _CURRENT.get()
        if info is not None:
            entry["request_id"] = info.request_id
        trace_id = _tracing.current_trace_id()
        if trace_id is not None:
            entry["trace_id"] = trace_id
            entry["span_id"] = _tracing.current_span_id()
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["traceback"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["traceback"] = redact(record.exc_text)
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(entry, default=str, ensure_ascii=False)


#: What a connection the client closed (or reset) raises out of a send on it.
_CLOSED_CONNECTION: Final = (
    trio.BusyResourceError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


def is_closed_connection(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or every error of a group) is what a closed connection raises."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_closed_connection(inner) for inner in exc.exceptions)
    return isinstance(exc, _CLOSED_CONNECTION)


class ClosedConnectionFilter(logging.Filter):
    """Turns Hypercorn's "Error in ASGI Framework" for a connection the client closed
    into one info line naming the error's type.

    When a client resets or closes its connection while an answer goes out (a
    408 racing more body bytes, a client that gave up), the answer's send
    raises ``trio.BusyResourceError`` / ``BrokenResourceError`` /
    ``ClosedResourceError`` out of the app and Hypercorn logs it at error
    level with a traceback: no server error, nothing to act on, and enough of
    them bury the real ones. Every other record passes unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.exc_info:
            return True
        exc = record.exc_info[1]
        if not is_closed_connection(exc):
            return True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        record.msg, record.args = (
            "connection closed by the client during an answer: %s",
            (type(exc).__name__,),
        )
        record.exc_info, record.exc_text = None, None
        record.event = "connection_closed"
        return True


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> Redactor:
    """Send every log record of the process to ``stream`` (stderr) as JSON lines; return
    the redactor they pass through (a gateway registers its secrets on it)."""
    formatter = JsonFormatter()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    return formatter.redactor
