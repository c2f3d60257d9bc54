"""Test faults: a request header asks the reference gateway to misbehave on purpose.

Clients and their retry ladders are only trustworthy if they are tested
against the failures a real gateway fleet produces. A request may carry::

    x-sheetplane-test-fault: <action>=<kind>[:<n>][, <action>=<kind>[:<n>] ...][; nonce=<text>]

which arms the server to answer the next ``n`` (default 1) requests of
``<action>`` with ``<kind>``, counting the request that carries the header
if it is one of them. Several specs for one action run in the order given.

Arming is idempotent per header value: a second request carrying the same
value (a retry, or every request of a client configured with the header)
does not arm again, so "the first two batch reads fail with 503, the third
succeeds" is simply ``runtime_sheet_read_rows_batch=503:2`` on every
request. To arm the same schedule again on one server, change the value,
for example with a different ``; nonce=...``.

The server honours the header only when started with ``allow_test_faults``
(``sheetplane serve --allow-test-faults``); otherwise it is ignored
entirely. Kinds (:data:`FAULT_KINDS`):

``502`` / ``503`` / ``504``
    That status with a JSON error body (``code`` ``test_fault``).
``backpressure``
    503 ``runtime_postgres_admission_backpressure`` with ``retry_after_ms``.
``413``
    413 ``runtime_sheet_read_batch_too_large`` with ``observed_bytes``.
``unsupported``
    400 "Unsupported runtime data-plane action: <action>", as a gateway
    that predates the action answers.
``malformed``
    200 whose body is not JSON.
``truncated``
    200 whose ``Content-Length`` promises more bytes than are sent before
    the connection closes.
``reset``
    The connection closes before any final response: the client sees the
    server disconnect without an answer.
``hang``
    No answer at all until the client gives up and disconnects (or the
    server shuts down).
``lost``
    The request is applied (its handler runs to the end), then the
    connection closes as with ``reset``: the answer is lost after the server
    applied it, so a retry meets the effect of the first attempt.

This module holds the parser, the per-server schedule (plain state, no I/O)
and the ASGI responders that render each kind.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Final, Literal, cast, get_args

import attrs
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .._ints import check_int
from ..budgets import POSTGRES_BACKPRESSURE_RETRY_AFTER_MS, READ_BATCH_MAX_RESPONSE_BYTES
from ..errors import InvalidInputError, ReadBatchTooLargeError
from ..protocol import UNSUPPORTED_ACTION_TEXT, Code, encode_body, error_body

__all__ = [
    "FAULT_HEADER",
    "FAULT_KINDS",
    "FaultKind",
    "FaultResponse",
    "FaultSchedule",
    "FaultSpec",
    "format_fault_header",
    "parse_fault_header",
]

#: The request header that arms test faults (lower case, as ASGI presents it).
FAULT_HEADER: Final = "x-sheetplane-test-fault"

FaultKind = Literal[
    "502",
    "503",
    "504",
    "backpressure",
    "413",
    "unsupported",
    "malformed",
    "truncated",
    "reset",
    "hang",
    "lost",
]

#: Every fault kind the server knows.
FAULT_KINDS: Final[frozenset[str]] = frozenset(get_args(FaultKind))

#: Longest header value the server parses; longer values are refused whole.
_MAX_HEADER_CHARS: Final = 4096

#: Header values remembered as already armed, per server (a test server's
#: lifetime); past this the oldest are forgotten.
_MAX_ARMED_VALUES: Final = 1024


@attrs.frozen
class FaultSpec:
    """One armed fault: answer the next ``count`` requests of ``action`` with ``kind``."""

    action: str
    """The action name the fault applies to."""
    kind: FaultKind
    """What the server does instead of answering normally."""
    count: int = 1
    """How many requests of that action it applies to, at least 1."""

    def __attrs_post_init__(self) -> None:
        if not self.action or any(c in self.action for c in "=,;: \t"):
            raise InvalidInputError(f"fault action must be an action name, got {self.action!r}")
        if self.kind not in FAULT_KINDS:
            raise InvalidInputError(
                f"fault kind must be one of {sorted(FAULT_KINDS)}, got {self.kind!r}"
            )
        check_int("fault count", self.count, 1)


def parse_fault_header(value: str) -> tuple[FaultSpec, ...]:
    """Parse a header value into fault specs; raise ``InvalidInputError`` naming what is wrong.

    The optional ``; nonce=...`` suffix (anything after the first ``;``) only
    makes a header value distinct and is otherwise ignored.
    """
    if len(value) > _MAX_HEADER_CHARS:
        raise InvalidInputError(f"{FAULT_HEADER} is longer than {_MAX_HEADER_CHARS} characters")
    specs_text = value.split(";", 1)[0]
    specs: list[FaultSpec] = []
    for raw in specs_text.split(","):
        item = raw.strip()
        if not item:
            continue
        action, sep, rest = item.partition("=")
        if not sep:
            raise InvalidInputError(f"{FAULT_HEADER} item must be <action>=<kind>[:<n>]: {item!r}")
        kind, colon, count_text = rest.strip().partition(":")
        count = 1
        if colon:
            if not count_text.strip().isdigit():
                raise InvalidInputError(f"{FAULT_HEADER} count must be an integer: {item!r}")
            count = int(count_text.strip())
        if kind not in FAULT_KINDS:
            raise InvalidInputError(
                f"{FAULT_HEADER} kind must be one of {sorted(FAULT_KINDS)}: {item!r}"
            )
        specs.append(FaultSpec(action.strip(), cast(FaultKind, kind), count))
    if not specs:
        raise InvalidInputError(f"{FAULT_HEADER} names no fault")
    return tuple(specs)


def format_fault_header(specs: Iterable[FaultSpec], *, nonce: str | None = None) -> str:
    """The header value that arms ``specs`` (and, with ``nonce``, arms them anew)."""
    text = ", ".join(f"{s.action}={s.kind}:{s.count}" for s in specs)
    if nonce is not None:
        text = f"{text}; nonce={nonce}"
    return text


@attrs.define(eq=False)
class _Armed:
    kind: FaultKind
    remaining: int


@attrs.define(eq=False)
class FaultSchedule:
    """The faults armed on one server: per action, a queue of kinds with remaining counts.

    Plain state driven by the server's request handler, in one trio thread.
    """

    _queues: dict[str, deque[_Armed]] = attrs.field(factory=dict)
    _armed_values: deque[str] = attrs.field(factory=deque)

    def arm(self, header_value: str) -> None:
        """Arm the specs of ``header_value`` unless this exact value was armed before.

        Raises ``InvalidInputError`` for a malformed value (nothing is armed).
        """
        if header_value in self._armed_values:
            return
        specs = parse_fault_header(header_value)
        self._armed_values.append(header_value)
        while len(self._armed_values) > _MAX_ARMED_VALUES:
            self._armed_values.popleft()
        for spec in specs:
            self._queues.setdefault(spec.action, deque()).append(_Armed(spec.kind, spec.count))

    def take(self, action: str) -> FaultKind | None:
        """The fault for this request of ``action``, consuming one count, or None."""
        queue = self._queues.get(action)
        if not queue:
            return None
        head = queue[0]
        head.remaining -= 1
        if head.remaining == 0:
            queue.popleft()
            if not queue:
                del self._queues[action]
        return head.kind

    def pending(self, action: str) -> int:
        """Faulted requests of ``action`` still armed."""
        return sum(armed.remaining for armed in self._queues.get(action, ()))


class FaultResponse(Response):
    """An ASGI response that renders one fault kind for one action."""

    def __init__(self, kind: FaultKind, action: str) -> None:
        super().__init__(status_code=200)
        self.kind = kind
        self.action = action

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = self.kind
        if kind in ("502", "503", "504"):
            status = int(kind)
            await _send_error(
                send, status, error_body(f"test fault: HTTP {status}", Code.TEST_FAULT)
            )
        elif kind == "backpressure":
            body = error_body(
                "test fault: Postgres admission is saturated",
                Code.BACKPRESSURE,
                retry_after_ms=POSTGRES_BACKPRESSURE_RETRY_AFTER_MS,
            )
            await _send_error(send, 503, body)
        elif kind == "413":
            observed = READ_BATCH_MAX_RESPONSE_BYTES + 1
            body = error_body(
                str(ReadBatchTooLargeError(observed)),
                ReadBatchTooLargeError.code,
                observed_bytes=observed,
            )
            await _send_error(send, 413, body)
        elif kind == "unsupported":
            body = error_body(f"{UNSUPPORTED_ACTION_TEXT}: {self.action}", Code.UNSUPPORTED_ACTION)
            await _send_error(send, 400, body)
        elif kind == "malformed":
            await _send_raw(send, 200, b'{"pages": [{"rows": [', content_length=None)
        elif kind == "truncated":
            whole = encode_body(error_body("test fault: this body is cut short", "x" * 64))
            half = whole[: len(whole) // 2]
            # Promise the whole body, send half, and return: the server then
            # closes the connection with the message unfinished.
            await _send_raw(send, 200, half, content_length=len(whole), more_body=True)
        elif kind in ("reset", "lost"):
            # An informational head is all that goes out; when the app returns
            # without a final response the server closes the connection, so the
            # client sees a disconnect with no answer. (ASGI gives an app no
            # handle on the socket itself, so this is the closest to a reset.)
            await send({"type": "http.response.start", "status": 103, "headers": []})
        elif kind == "hang":
            # Answer nothing until the client disconnects; a server shutdown
            # cancels this wait.
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
        else:  # pragma: no cover - FAULT_KINDS is closed
            raise AssertionError(kind)


async def _send_error(send: Send, status: int, body: dict[str, object]) -> None:
    """An error answer, written as the gateway writes its own (``ErrorBody``)."""
    await _send_raw(send, status, encode_body(body), content_length=None)


async def _send_raw(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_length: int | None,
    more_body: bool = False,
) -> None:
    length = len(body) if content_length is None else content_length
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(length).encode("ascii")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": more_body})
