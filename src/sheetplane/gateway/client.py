"""The runtime gateway client: one budgeted ``post_action`` and a typed helper per action.

Every action goes through :meth:`GatewayClient.post_action`:
``POST {base_url}/api/v2/plays/internal/runtime`` with a JSON body holding
``action`` and ``playName`` and an ``authorization: Bearer`` header. One call
makes up to ``MAX_ATTEMPTS`` attempts under ``CALL_BUDGET_MS`` (see
``gateway/_retry.py`` for the ladder and ``gateway/_body.py`` for the bounded
body reader). What is retried:

* timeouts and bodies cut short, and an attempt that outlives
  ``REQUEST_TIMEOUT_MS``;
* an attempt that reaches no gateway (connect refused, reset, DNS: ``httpx``
  transport errors before any response) or a draining one (503
  ``gateway_draining``): the call moves to its next URL (``base_url`` may be a
  sequence, or more come as ``base_urls``) at once, and after a round of them
  all waits a capped, jittered back-off (``GATEWAY_RECONNECT_BASE_MS``
  doubling to ``GATEWAY_RECONNECT_CAP_MS``), within the whole call budget and
  without spending the ladder: a gateway restart of a few seconds is ridden
  through;
* 502, 503 and 504, and any error whose text matches the transient
  messages of docs/protocol.md (``TRANSIENT_MESSAGE``);
* 503 ``runtime_postgres_admission_backpressure``, after its ``retry_after_ms``;
* a 2xx answer whose body is not JSON (truncated by a proxy or a reset that
  still ended the message). Every action is safe to send again: writes carry
  write versions or idempotency keys, receipts are insert-or-return-winner,
  and an admission that is repeated takes a newer write version, which is
  what the caller then uses.

What is not retried: 401/403 (``GatewayAuthError``), "Unsupported runtime
data-plane action" (``UnsupportedActionError``), 413 on a batch read
(``ReadBatchTooLargeError``), 413 on an admission too large for one request
(``AdmissionTooLargeError``), an answer over its byte budget
(``ResponseTooLargeError``), any other error status (``GatewayError``) and a
well-formed answer of the wrong shape (``GatewayProtocolError``).

When the retries or the budget run out, the last attempt's error is raised:
``GatewayTimeoutError`` for a timeout, ``BackpressureError`` for
back-pressure, ``GatewayProtocolError`` for a body that was not JSON, and
``TransientGatewayError`` otherwise. No message ever contains the token.

A client none of whose URLs has ever answered fails fast: its connects time
out after ``GATEWAY_FIRST_CONNECT_TIMEOUT_MS``, and a call that has reached no
gateway by ``GATEWAY_FIRST_CONTACT_BUDGET_MS`` raises ``GatewayUnreachableError``
naming the URLs and what was tried (a wrong ``base_url``, most likely). Once a
gateway has answered, the rules above hold. The first retry of a call logs one
warning (logger ``sheetplane.gateway``) naming the action, the cause and how
long the call may still go on; further attempts log nothing.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from functools import cache, partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs
import httpx
import trio

from .. import _checks as checks
from .. import _tracing
from .. import protocol as m
from .._attempts import AttemptStatus, ShareClaim, ShareRenewal
from .._redact import Redactor
from .._types import (
    AdmissionCounts,
    AdmittedPart,
    CheckedPage,
    CompleteRow,
    FailRow,
    InlineAdmission,
    Page,
    PageRequest,
    ReceiptClaim,
    ReceiptCompletion,
    ResolvedPlay,
    RowMode,
    SheetContract,
    Summary,
    TerminalWriteResult,
    WriteResult,
    check_page_batch,
    check_page_request,
    new_lease_token,
)
from ..budgets import (
    ADMISSION_CHUNK_ENVELOPE_BYTES,
    ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS,
    ADMISSION_COMMIT_CALL_BUDGET_MS,
    CALL_BUDGET_MS,
    GATEWAY_CLIENT_MAX_CONNECTIONS,
    GATEWAY_FIRST_CONNECT_TIMEOUT_MS,
    GATEWAY_FIRST_CONTACT_BUDGET_MS,
    READ_BATCH_MAX_RESPONSE_BYTES,
    REQUEST_TIMEOUT_MS,
    RESOLVE_PLAY_CALL_BUDGET_MS,
    RESOLVE_PLAY_RETRY_DELAYS_MS,
    RETRY_DELAYS_MS,
    TRANSPORT_CEILING_BYTES,
)
from ..errors import (
    AdmissionTooLargeError,
    GatewayAuthError,
    GatewayError,
    GatewayTimeoutError,
    GatewayUnreachableError,
    InvalidInputError,
    ReadBatchTooLargeError,
    TransientGatewayError,
    UnsupportedActionError,
)
from ..names import normalize_play_name, normalize_table_namespace
from ..protocol import (
    PROTECTION_BYPASS_HEADER,
    RUNTIME_PATH,
    Answer,
    Code,
    Retry,
    chunk_body,
    encode_body,
    receive,
    token_digest,
)
from ..sizes import json_byte_length_up_to
from ._body import (
    ACCEPT_ENCODING,
    CorruptBodyError,
    TruncatedBodyError,
    UnsupportedEncodingError,
    read_bounded,
    response_byte_limit,
)
from ._retry import CallBudget, jitter

if TYPE_CHECKING:
    from ..protocol import EncodedChunk

__all__ = ["RUNTIME_PATH", "GatewayClient", "KeysetPage", "gateway_urls", "tls_context"]

_READ_ROWS: Final = m.action_of(m.ReadRowsRequest)
_READ_ROWS_BATCH: Final = m.action_of(m.ReadRowsBatchRequest)

log = logging.getLogger("sheetplane.gateway")

_R = TypeVar("_R", bound=m.Request)
_S = TypeVar("_S", bound=m.SheetRequest)
_T = TypeVar("_T")
#: Staged-admission actions, whose 400 ``invalid_input`` is a bad input row.
_STAGED: Final = frozenset(
    {m.action_of(m.StageAdmissionChunkRequest), m.action_of(m.CommitAdmissionRequest)}
)


#: Actions with a ladder of their own: (delays, whole call budget).
_LADDERS: Final[Mapping[str, tuple[tuple[int, ...], int]]] = {
    m.action_of(m.ResolvePlayRequest): (RESOLVE_PLAY_RETRY_DELAYS_MS, RESOLVE_PLAY_CALL_BUDGET_MS),
    m.action_of(m.CommitAdmissionRequest): (RETRY_DELAYS_MS, ADMISSION_COMMIT_CALL_BUDGET_MS),
    m.action_of(m.StartSheetDatasetRequest): (RETRY_DELAYS_MS, ADMISSION_COMMIT_CALL_BUDGET_MS),
}


def gateway_urls(base_url: str | Sequence[str], base_urls: Sequence[str] | None) -> tuple[str, ...]:
    """Every gateway URL a client was given: ``base_url`` (one URL or a sequence of
    them) followed by ``base_urls``, stripped of a trailing slash, duplicates
    dropped; ``InvalidInputError`` for an empty or non-string URL, one httpx cannot
    send to, or none at all.

    A mapping or a set is not a sequence of URLs (its keys in no stated order):
    refused like any other value that is neither a URL nor a sequence of them."""
    given: list[object] = [base_url] if isinstance(base_url, str) else _urls("base_url", base_url)
    if base_urls is not None:
        given += _urls("base_urls", base_urls)
    urls: list[str] = []
    for url in given:
        if not isinstance(url, str) or not url.strip():
            raise InvalidInputError("the gateway client needs non-empty base URLs")
        text = url.strip().rstrip("/")
        try:
            _url_attributes(text + RUNTIME_PATH)
        except httpx.InvalidURL:
            # httpx could never send to it. Its reason may quote a part of the URL (a
            # mistyped password can parse as a port), so it is not repeated.
            raise InvalidInputError(
                "base_url is not a URL httpx can send to: check its scheme, host, port "
                "and characters"
            ) from None
        if text not in urls:
            urls.append(text)
    if not urls:
        raise InvalidInputError("the gateway client needs a base URL")
    return tuple(urls)


def _shown(url: str) -> str:
    """``url`` without its user info (``user:password@``), for a message."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _urls(what: str, value: object) -> list[object]:
    """The URLs a sequence holds; never echoed (a URL may carry a password)."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidInputError(f"{what} must be a URL or a sequence of URLs")
    return list(value)


def _url_attributes(url: str) -> dict[str, str | int]:
    """An attempt span's ``url.full``, ``server.address`` and ``server.port`` for ``url``,
    without the user and password a URL may carry."""
    parsed = httpx.URL(url)
    return {
        "url.full": str(parsed.copy_with(username=None, password=None)),
        "server.address": parsed.host,
        "server.port": parsed.port or (443 if parsed.scheme == "https" else 80),
    }


def _trace_outcome(sent: _tracing.Span, outcome: Answer | Retry) -> None:
    """What an attempt's span says of a failed attempt worth another: the error's type,
    the gateway's code and the delay it asked for."""
    if isinstance(outcome, Answer) or not sent.is_recording():
        return
    error = outcome.error
    sent.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}")
    sent.set_status(_tracing.Status(_tracing.StatusCode.ERROR, type(error).__name__))
    if error.gateway_code is not None:
        sent.set_attribute("sheetplane.gateway.code", str(error.gateway_code))
    if outcome.retry_after_ms is not None:
        sent.set_attribute("sheetplane.retry_after_ms", outcome.retry_after_ms)


@attrs.frozen
class KeysetPage:
    """One keyset read's answer (``GatewayClient.read_rows_after``)."""

    rows: tuple[dict[str, Any], ...]
    """The rows, in read order, at most the limit asked for."""
    next_after: dict[str, Any] | None
    """The cursor to send as ``after`` next (``{inputIndex, createdAt, key}``); None once
    the sheet has no more rows."""
    keyset: bool
    """False when the gateway ignored ``after`` (it predates keyset reads): the
    rows are then the page at the offset sent, and ``next_after`` is None."""


def _normalised(fields: dict[str, Any]) -> dict[str, Any]:
    """A request's members with its table namespace normalised (``sheetplane.names``):
    every request names its sheet the way the sheet is identified. A namespace that
    normalises to nothing raises ``InvalidInputError`` before anything is sent."""
    if "table_namespace" in fields:
        fields["table_namespace"] = normalize_table_namespace(fields["table_namespace"])
    return fields


#: The check of a request body before it is written: the standard library's C encoder,
#: which refuses what ``json_byte_length_up_to`` refuses (a non-finite float, with
#: ``allow_nan=False``; a lone surrogate, which its text cannot encode to UTF-8; a value
#: or key JSON has no form for) at C speed. The walk of the measure cost a terminal
#: write of 500 rows about 5 ms before it was sent.
_STRICT: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dumps(value: Any) -> bytes:
    """The request body. A non-finite float, a lone surrogate and a non-string key are
    refused first (``InvalidInputError`` for each, nothing sent; a value of a type JSON
    has no form for raises ``TypeError``), since orjson would write NaN as null."""
    try:
        _STRICT.encode(value).encode("utf-8")
    except ValueError as exc:  # a UnicodeEncodeError too
        raise InvalidInputError(f"the request cannot be sent as JSON: {exc}") from None
    try:
        return encode_body(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"the request cannot be sent as JSON: {exc}") from None


def _count_row_bytes(answer: Answer) -> None:
    """Report a read answer's row bytes to the read span above the call, if one records
    (``_tracing.count_read_bytes``): the decoded body less its envelope (the answer
    written again with no rows) and the commas between rows. No work per row."""
    if not _tracing.counting_read_bytes():
        return
    body = answer.body
    if "pages" in body:  # a batch answer
        pages = body["pages"]
        envelope = {**body, "pages": [{**page, "rows": []} for page in pages]}
    else:
        pages = [body]
        envelope = {**body, "rows": []}
    commas = sum(max(0, len(page["rows"]) - 1) for page in pages)
    _tracing.count_read_bytes(answer.size - len(encode_body(envelope)) - commas)


@cache
def tls_context() -> ssl.SSLContext:
    """The TLS context every gateway client of the process verifies with: httpx's
    default (its CA bundle, and ``SSL_CERT_FILE``/``SSL_CERT_DIR`` as set when first
    made), made once. Loading the bundle took 22 ms, which each runtime paid on
    opening, whatever the gateway's scheme."""
    return httpx.create_ssl_context()


class GatewayClient:
    """A trio client of one runtime gateway, for one play, under one executor token.

    Use it as ``async with GatewayClient(...) as client:``; it owns its
    ``httpx.AsyncClient`` and closes it on exit. ``transport`` replaces the
    network (tests pass an ``httpx.MockTransport``); ``headers`` are sent with
    every request (tests use them to arm the reference gateway's faults).
    ``protection_bypass_token`` goes with every request as
    ``x-vercel-protection-bypass`` (``PROTECTION_BYPASS_HEADER``), as the runtime
    sends its ``vercelProtectionBypassToken``; like the executor token it is a
    secret, never in a repr, a log or an error message (an answer that echoes it
    is redacted).

    Cancellation: a call cancelled mid-attempt closes that attempt's
    connection and sends nothing more; whether the gateway applied the
    request is unknown, as with any cut connection.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        token: str,
        *,
        play_name: str,
        base_urls: Sequence[str] | None = None,
        org_id: str | None = None,
        user_email: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        protection_bypass_token: str | None = None,
    ) -> None:
        if not isinstance(token, str) or not token.strip():
            raise InvalidInputError("the gateway client needs a non-empty executor token")
        if any(ch in token for ch in "\x00\r\n"):
            # It could never be sent in an authorization header (never echoed: a secret).
            raise InvalidInputError("the executor token holds a NUL or line break")
        urls = gateway_urls(base_url, base_urls)
        self._token = token.strip()
        #: Every gateway URL, in the order given: a call that cannot reach one
        #: tries the next; the client stays on the last one that answered.
        self.base_urls: Final = urls
        #: The first URL: the deployment's name in session cache keys.
        self.base_url: Final = urls[0]
        self.url: Final = self.base_url + RUNTIME_PATH
        self._current = 0
        #: Each URL's attributes on an attempt's span.
        self._span_urls = {url: _url_attributes(url + RUNTIME_PATH) for url in urls}
        #: The play, normalised (``sheetplane.names``): it is the sheets' identity.
        self.play_name: Final = normalize_play_name(play_name)
        self.org_id: Final = org_id
        self.user_email: Final = (user_email or "").strip() or None
        #: SHA-256 hex digest of the token: for cache keys and authority scopes.
        self.token_digest: Final = token_digest(self._token)
        self._transport = transport
        if headers is not None and not (
            isinstance(headers, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise InvalidInputError("headers must be a mapping of strings to strings")
        extra = {name.lower(): value for name, value in (headers or {}).items()}
        if "authorization" in extra:
            raise InvalidInputError("pass the token as token, not as an authorization header")
        if PROTECTION_BYPASS_HEADER in extra:
            raise InvalidInputError(
                f"pass the bypass token as protection_bypass_token, not as a "
                f"{PROTECTION_BYPASS_HEADER} header"
            )
        #: What error texts pass through: the token, and the bypass token, redacted.
        self._redact = Redactor([self._token])
        if protection_bypass_token is not None:
            if (
                not isinstance(protection_bypass_token, str)
                or not protection_bypass_token.strip()
                or any(ch in protection_bypass_token for ch in "\x00\r\n")
            ):
                # Never echoed: a secret.
                raise InvalidInputError(
                    "protection_bypass_token must be a non-empty string without NUL or "
                    "line breaks, or None"
                )
            bypass = protection_bypass_token.strip()
            extra[PROTECTION_BYPASS_HEADER] = bypass
            self._redact.add([bypass])
        self._extra_headers = extra
        self._http: httpx.AsyncClient | None = None
        self._served: dict[str, bool] = {}
        #: Whether any URL has ever answered this client (then the reconnect rules
        #: hold; before, a call fails after ``GATEWAY_FIRST_CONTACT_BUDGET_MS``).
        self._contacted = False

    def __repr__(self) -> str:
        return f"<GatewayClient {self.url} play={self.play_name!r}>"

    # --- what the gateway serves, learned once ---------------------------------------------

    def serves(self, action: str) -> bool | None:
        """Whether the gateway serves ``action``, as far as this client has learned
        (None: not known yet). Learned by ``probe_action`` and by the staged begin."""
        return self._served.get(action)

    def _learn(self, action: str, served: bool) -> None:
        self._served[action] = served

    async def probe_action(self, action: str) -> bool:
        """Whether the gateway serves ``action``: asked once, then remembered.

        The probe is the bare action with no input, which a gateway that
        serves it refuses as malformed (400) without writing anything, and one
        that does not answers "Unsupported runtime data-plane action". Any
        other failure (auth, transport) propagates and teaches nothing.
        """
        known = self._served.get(action)
        if known is not None:
            return known
        try:
            await self._call_content(action, _dumps({"action": action, "playName": self.play_name}))
        except UnsupportedActionError:
            self._learn(action, False)
            return False
        except GatewayError as exc:
            if isinstance(exc, GatewayAuthError) or exc.status != 400:
                raise
        self._learn(action, True)
        return True

    async def __aenter__(self) -> GatewayClient:
        if self._http is not None:
            raise RuntimeError("GatewayClient is already open")
        self._http = httpx.AsyncClient(
            transport=self._transport,
            timeout=httpx.Timeout(REQUEST_TIMEOUT_MS / 1000),
            limits=httpx.Limits(
                max_connections=GATEWAY_CLIENT_MAX_CONNECTIONS,
                max_keepalive_connections=GATEWAY_CLIENT_MAX_CONNECTIONS,
            ),
            follow_redirects=False,
            verify=tls_context(),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    # --- the one path ----------------------------------------------------------

    async def post_action(self, action: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Send ``action`` with ``payload`` and return the answer's JSON object.

        ``action`` and ``playName`` are added at the top level. Retries,
        budget and errors as the module docstring says; the call ends, with
        an answer or a ``SheetplaneError``, within ``CALL_BUDGET_MS``.
        """
        return (await self._call(action, payload)).body

    async def _call(self, action: str, payload: Mapping[str, Any]) -> Answer:
        content = _dumps({**payload, "action": action, "playName": self.play_name})
        return await self._call_content(action, content)

    async def _call_content(
        self, action: str, content: bytes, *, attempt_ms: int = REQUEST_TIMEOUT_MS
    ) -> Answer:
        """Send a request body already encoded (it names ``action`` and ``playName``)."""
        http = self._http
        if http is None:
            raise RuntimeError("use GatewayClient inside 'async with'")
        headers = {
            **self._extra_headers,
            "authorization": f"Bearer {self._token}",
            "content-type": "application/json",
            "accept": "application/json",
            "accept-encoding": ACCEPT_ENCODING,
        }
        delays_ms, budget_ms = _LADDERS.get(action, (RETRY_DELAYS_MS, CALL_BUDGET_MS))
        budget = CallBudget(trio.current_time(), delays_ms, budget_ms, attempt_ms)
        with _tracing.span(f"gateway {action}", {"sheetplane.gateway.action": action}) as call:
            return await self._attempts(http, action, content, headers, budget, call)

    async def _attempts(
        self,
        http: httpx.AsyncClient,
        action: str,
        content: bytes,
        headers: Mapping[str, str],
        budget: CallBudget,
        call: _tracing.Span,
    ) -> Answer:
        """The call's attempts, each its own ``POST`` span (the call's span is ``call``),
        until an answer, or the error once the ladder or the budget runs out."""
        failures = 0
        unreached = 0  # attempts in a row that reached no (serving) gateway
        attempts = 0
        #: Set while no URL has ever answered: the call fails fast past it.
        first_contact: float | None = None
        if not self._contacted:
            first_contact = budget.start + GATEWAY_FIRST_CONTACT_BUDGET_MS / 1000
        tried: dict[str, str] = {}  # URL -> the last failure there, while never contacted
        while True:
            base = self.base_urls[self._current]
            outcome, reached = await self._traced_attempt(
                http, base, action, content, headers, budget, first_contact, attempts
            )
            attempts += 1
            call.set_attribute("sheetplane.gateway.attempts", attempts)
            if isinstance(outcome, Answer):
                return outcome
            now = trio.current_time()
            if not reached or outcome.error.gateway_code == Code.DRAINING:
                # Not the ladder's business: the next URL at once while one is
                # untried this round, then a jittered back-off, all within the budget.
                unreached += 1
                self._current = (self._current + 1) % len(self.base_urls)
                rounds, untried = divmod(unreached, len(self.base_urls))
                if untried:
                    wake: float | None = now if now < budget.deadline else None
                else:
                    wake = budget.reconnect_at(now, rounds, jitter())
                if first_contact is not None and not self._contacted:
                    tried[base] = str(outcome.error)
                    if wake is None or wake >= first_contact:
                        raise self._unreachable(attempts, now - budget.start, tried) from (
                            outcome.error
                        )
            elif outcome.error.gateway_code == Code.TENANT_CAP:
                # Refused before its body was read: not the ladder's business either.
                unreached = 0
                wake = budget.refused_at(now, outcome.retry_after_ms, jitter())
            else:
                unreached = 0
                failures += 1
                wake = budget.next_attempt_at(now, failures, outcome.retry_after_ms)
            if wake is None:
                raise outcome.error
            if attempts == 1:
                # One line for the call, whatever follows: what failed, and for how long
                # it may go on (a call that reaches no gateway at all ends sooner).
                ends = first_contact if first_contact is not None and not self._contacted else None
                log.warning(
                    "gateway call %s: %s; retrying for up to %.1f s",
                    action,
                    outcome.error,
                    ((ends if ends is not None else budget.deadline) - now),
                    extra={"event": "gateway_retry", "action": action},
                )
            call.add_event(
                "retry", {"sheetplane.retry.delay_ms": max(0, round((wake - now) * 1000))}
            )
            await trio.sleep_until(wake)

    async def _traced_attempt(
        self,
        http: httpx.AsyncClient,
        base: str,
        action: str,
        content: bytes,
        headers: Mapping[str, str],
        budget: CallBudget,
        first_contact: float | None,
        resends: int,
    ) -> tuple[Answer | Retry, bool]:
        """One attempt at ``base``, in its own ``POST`` span carrying the trace context."""
        with _tracing.span(
            "POST",
            {
                "http.request.method": "POST",
                **self._span_urls[base],
                "http.request.body.size": len(content),
                "sheetplane.gateway.action": action,
                **({"http.request.resend_count": resends} if resends else {}),
            },
            kind=_tracing.SpanKind.CLIENT,
        ) as sent:
            traced = dict(headers)
            _tracing.inject(traced)
            outcome, reached = await self._attempt(
                http, base + RUNTIME_PATH, action, content, traced, budget, first_contact
            )
            _trace_outcome(sent, outcome)
        return outcome, reached

    def _unreachable(
        self, attempts: int, elapsed: float, tried: Mapping[str, str]
    ) -> GatewayUnreachableError:
        """The error of a call that met no gateway at any URL, and none has ever answered
        this client (URLs shown without their user info: it may hold a password)."""
        where = "; ".join(f"{_shown(url)}: {failure}" for url, failure in tried.items())
        return GatewayUnreachableError(
            0,
            None,
            self._redact(
                f"no gateway answered at {', '.join(map(_shown, self.base_urls))} "
                f"({attempts} attempt(s) in {elapsed:.1f} s; {where}); "
                "check base_url, and that the gateway is running and reachable"
            ),
        )

    async def _attempt(
        self,
        http: httpx.AsyncClient,
        url: str,
        action: str,
        content: bytes,
        headers: Mapping[str, str],
        budget: CallBudget,
        first_contact: float | None = None,
    ) -> tuple[Answer | Retry, bool]:
        """One attempt's outcome, and whether it reached a gateway (a response head came).

        Before any URL has answered (``first_contact`` is the call's fail-fast
        deadline then), the connect times out after ``GATEWAY_FIRST_CONNECT_TIMEOUT_MS``.
        """
        now = trio.current_time()
        deadline = budget.attempt_deadline(now)
        limit = response_byte_limit(action)
        answered = False
        first_connect_s: float | None = None
        if first_contact is not None and not self._contacted:
            first_connect_s = min(
                GATEWAY_FIRST_CONNECT_TIMEOUT_MS / 1000, max(first_contact - now, 0)
            )
        try:
            with trio.fail_at(deadline):
                # httpx's own timeouts (per network operation) never cut an
                # attempt allowed longer than REQUEST_TIMEOUT_MS short; before any
                # gateway has answered, a connect has GATEWAY_FIRST_CONNECT_TIMEOUT_MS.
                http_timeout = httpx.Timeout(max(budget.attempt_ms, REQUEST_TIMEOUT_MS) / 1000)
                if first_connect_s is not None:
                    http_timeout = httpx.Timeout(
                        max(budget.attempt_ms, REQUEST_TIMEOUT_MS) / 1000, connect=first_connect_s
                    )
                async with http.stream(
                    "POST", url, content=content, headers=headers, timeout=http_timeout
                ) as resp:
                    answered = self._contacted = True
                    raw = await read_bounded(resp, action, limit)
                    status, response_headers = resp.status_code, resp.headers
            _tracing.annotate(
                {"http.response.status_code": status, "http.response.body.size": len(raw)}
            )
        except trio.TooSlowError:
            ms = round((deadline - now) * 1000)
            error = GatewayTimeoutError(0, None, f"{action} attempt did not finish within {ms} ms")
            self._contacted = True  # connected: a first connect times out well before this
            return Retry(error), True
        except httpx.TimeoutException as exc:
            timeout = Retry(self._transport_error(GatewayTimeoutError, action, exc))
            self._contacted |= not isinstance(exc, httpx.ConnectTimeout)
            return timeout, not isinstance(exc, httpx.ConnectTimeout)
        except (UnsupportedEncodingError, CorruptBodyError) as exc:
            raise m.protocol_error(action, str(exc)) from None
        except TruncatedBodyError as exc:
            return Retry(m.protocol_error(action, str(exc))), True
        except httpx.TransportError as exc:
            if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
                raise self._transport_error(GatewayError, action, exc) from exc
            # Refused, reset, DNS, a connection closed before any answer: no gateway
            # was reached (every action is safe to send again). A body cut short
            # after its head came is the ladder's. Only a failed connect (refused, DNS,
            # unreachable) leaves a never-contacted client uncontacted.
            self._contacted |= not isinstance(exc, httpx.ConnectError)
            return Retry(self._transport_error(TransientGatewayError, action, exc)), answered
        return receive(action, status, response_headers, raw, self._redact), True

    def _transport_error(
        self, cls: type[GatewayError], action: str, exc: Exception
    ) -> GatewayError:
        text = self._redact(f"{action} failed before a complete answer: {type(exc).__name__}")
        detail = self._redact(str(exc)) or None
        error = cls(0, None, text, detail)
        error.__cause__ = exc
        return error

    # --- typed helpers ---------------------------------------------------------

    @staticmethod
    def _check_sheet_args(table_namespace: object, contract: object) -> None:
        normalize_table_namespace(table_namespace)
        if not isinstance(contract, SheetContract):
            raise InvalidInputError(
                f"contract must be a SheetContract, got {type(contract).__name__}"
            )

    @staticmethod
    def _check_row_writes(rows: object, kind: type[CompleteRow] | type[FailRow]) -> None:
        if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
            raise InvalidInputError(f"rows must be a sequence of {kind.__name__}")
        for position, row in enumerate(rows):
            if not isinstance(row, kind):
                raise InvalidInputError(
                    f"row {position} must be a {kind.__name__}, got {type(row).__name__}"
                )

    def _request(self, cls: type[_R], **fields: Any) -> _R:
        """The request ``cls`` of this client's play (``InvalidInputError`` naming the
        member whose rule a value breaks, nothing sent)."""
        try:
            return m.build(cls, play_name=self.play_name, **_normalised(fields))
        except m.WireError as exc:
            raise InvalidInputError(f"{cls.__name__}: {exc}") from None

    def _sheet_request(
        self, cls: type[_S], table_namespace: str, contract: SheetContract, **fields: Any
    ) -> _S:
        """A request that writes the sheet ``table_namespace`` under ``contract``."""
        self._check_sheet_args(table_namespace, contract)
        return self._request(
            cls,
            table_namespace=table_namespace,
            sheet_contract=m.contract_wire(contract),
            **fields,
        )

    async def _send(self, request: m.Request, *, attempt_ms: int = REQUEST_TIMEOUT_MS) -> Answer:
        """Send one request, written by the wire converter."""
        content = _dumps(m.unstructure(request))
        return await self._call_content(request.action, content, attempt_ms=attempt_ms)

    async def ensure_sheet(self, table_namespace: str, contract: SheetContract) -> None:
        """Create the sheet's tables if missing (idempotent)."""
        self._check_sheet_args(table_namespace, contract)
        request = self._request(
            m.EnsureSheetRequest,
            table_namespace=table_namespace,
            sheet_contract=m.contract_wire(contract),
            user_email=self.user_email,
        )
        m.parse_ok((await self._send(request)).body, request.action)

    async def start_sheet_dataset(
        self,
        table_namespace: str,
        contract: SheetContract,
        rows: Sequence[Mapping[str, Any]],
        run_id: str,
    ) -> InlineAdmission:
        """Admit ``rows`` in one request under a new write version (dedupe, input
        order, pending vs completed rows inline).

        Raises ``AdmissionTooLargeError`` without sending when the request would
        pass ``TRANSPORT_CEILING_BYTES``, and when the gateway refuses (413)
        an admission whose answer would: in both cases nothing was written.
        ``RowWriter.start`` stages inputs of any size instead. Each attempt may
        take ``ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS``, as a staged commit may.
        """
        request = self._sheet_request(
            m.StartSheetDatasetRequest,
            table_namespace,
            contract,
            rows=[dict(row) for row in rows],
            run_id=run_id,
            user_email=self.user_email,
        )
        payload = m.unstructure(request)
        measured = json_byte_length_up_to(payload, TRANSPORT_CEILING_BYTES)
        if measured.exceeded:
            raise AdmissionTooLargeError(measured.bytes)
        # One transaction over the whole input, which may wait behind other
        # admissions of the sheet: the runtime keeps such a caller alive past
        # the ordinary 30 s request timeout, and so does this client.
        answer = await self._call_content(
            request.action, _dumps(payload), attempt_ms=ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS
        )
        return m.parse_admission(answer.body, request.action)

    # --- staged admission ----------------------------------------------------------------

    async def begin_admission(
        self, table_namespace: str, contract: SheetContract, admission_id: str, run_id: str
    ) -> None:
        """Register the staged admission ``admission_id`` (idempotent: safe to retry)."""
        request = self._sheet_request(
            m.BeginAdmissionRequest,
            table_namespace,
            contract,
            admission_id=admission_id,
            run_id=run_id,
            user_email=self.user_email,
        )
        try:
            sent = await self._send(request)
        except UnsupportedActionError:
            self._learn(request.action, False)  # a gateway that only admits whole
            raise
        self._learn(request.action, True)
        answer = m.read_as(sent.body, m.BeginAdmissionAnswer, request.action)
        if answer.admission_id != admission_id:
            raise m.protocol_error(request.action, "admissionId does not match")

    def admission_chunk_body(
        self,
        table_namespace: str,
        contract: SheetContract,
        admission_id: str,
        seq: int,
        first_position: int,
        chunk: EncodedChunk,
    ) -> bytes:
        """The request body of one staged chunk, around the chunk's keys and rows already
        encoded (``encode_row``): a row is encoded once, to check it, to measure it
        and to send it, and the gateway stages the arrays without decoding a row."""
        request = self._sheet_request(
            m.StageAdmissionChunkRequest,
            table_namespace,
            contract,
            admission_id=admission_id,
            seq=seq,
            first_position=first_position,
            rows=[{}],  # a stand-in: the encoded rows are spliced in below
        )
        fields = m.unstructure(request)
        del fields["rows"]  # spliced in below, already encoded
        fields.pop("keys", None)
        envelope = _dumps(fields)
        if len(envelope) > ADMISSION_CHUNK_ENVELOPE_BYTES:
            raise InvalidInputError(
                f"the chunk envelope (names and contract) takes {len(envelope)} bytes, "
                f"over {ADMISSION_CHUNK_ENVELOPE_BYTES}"
            )
        return chunk_body(envelope, chunk.keys, chunk.rows)

    async def stage_admission_chunk(self, body: bytes) -> bool:
        """Send one chunk built by ``admission_chunk_body``; False when the gateway had
        staged it before (a retry after a lost answer)."""
        action = m.action_of(m.StageAdmissionChunkRequest)
        answer = await self._call_content(action, body)
        return m.read_as(answer.body, m.StageAdmissionChunkAnswer, action).staged

    async def commit_admission(
        self,
        table_namespace: str,
        contract: SheetContract,
        admission_id: str,
        run_id: str,
        *,
        chunks: int,
        rows: int,
    ) -> AdmissionCounts:
        """Commit the staged admission whole, as one new write version (idempotent).

        Each attempt may take ``ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS``: a large
        commit is one transaction. A retried commit waits for the first one
        and answers its counts.
        """
        request = self._sheet_request(
            m.CommitAdmissionRequest,
            table_namespace,
            contract,
            admission_id=admission_id,
            run_id=run_id,
            chunks=chunks,
            rows=rows,
        )
        answer = await self._send(request, attempt_ms=ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS)
        read = m.read_as(answer.body, m.CommitAdmissionAnswer, request.action)
        return m.copy_fields(read, AdmissionCounts)

    async def abort_admission(self, table_namespace: str, admission_id: str) -> bool:
        """Drop an open staged admission's rows; False when it was not open."""
        request = self._request(
            m.AbortAdmissionRequest, table_namespace=table_namespace, admission_id=admission_id
        )
        answer = await self._send(request)
        return m.read_as(answer.body, m.AbortAdmissionAnswer, request.action).aborted

    async def create_db_session(
        self,
        *,
        table_namespace: str,
        logical_table: str,
        operations: Sequence[str],
        limits: Mapping[str, int] | None = None,
        contract: SheetContract | None = None,
        ttl_seconds: int | None = None,
        encryption: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Ask for a scoped Postgres session; the raw answer (``sheetplane.sessions`` parses it).

        ``limits`` are the wire's ``{maxRows?, maxBytes?, maxRequests?}`` and
        ``encryption`` its ``{alg, publicKeyJwk}``: each is read as its wire class
        before anything is sent (``InvalidInputError`` naming the member).
        """
        if contract is not None and not isinstance(contract, SheetContract):
            raise InvalidInputError(
                f"contract must be a SheetContract or None, got {type(contract).__name__}"
            )
        action = m.action_of(m.CreateDbSessionRequest)
        try:
            wire_limits = m.structure(dict(limits), m.SessionLimitsWire) if limits else None
            wire_encryption = (
                None if encryption is None else m.structure(encryption, m.UrlEncryptionWire)
            )
        except (m.WireError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"{action}: {exc}") from None
        request = self._request(
            m.CreateDbSessionRequest,
            target=self._request_part(
                m.SessionTargetWire, table_namespace=table_namespace, logical_table=logical_table
            ),
            operations=list(operations),
            limits=wire_limits,
            sheet_contract=None if contract is None else m.contract_wire(contract),
            ttl_seconds=ttl_seconds,
            user_email=self.user_email,
            postgres_url_encryption=wire_encryption,
        )
        return (await self._send(request)).body

    @staticmethod
    def _request_part(cls: type[_T], page: CheckedPage | None = None, **fields: Any) -> _T:
        """A part of a request (``InvalidInputError`` naming the member, nothing sent);
        a single read's ``page``, checked where it entered, is written as it is."""
        try:
            if page is None:
                return m.build(cls, **_normalised(fields))
            return m.page_input(cls, page, **_normalised(fields))
        except m.WireError as exc:
            raise InvalidInputError(f"{cls.__name__}: {exc}") from None

    def _read_input(
        self,
        cls: type[_T],
        table_namespace: str,
        run_id: str | None,
        admitted: AdmittedPart | None,
        page: CheckedPage | None = None,
        **fields: Any,
    ) -> _T:
        if admitted is not None and not isinstance(admitted, AdmittedPart):
            raise InvalidInputError(f"admitted must be an AdmittedPart, got {admitted!r}")
        return self._request_part(
            cls,
            page,
            table_namespace=table_namespace,
            run_id=run_id,
            admission=m.admitted_wire(admitted),
            **fields,
        )

    async def read_rows(
        self,
        table_namespace: str,
        request: PageRequest,
        *,
        run_id: str | None = None,
        row_mode: RowMode | None = None,
        admitted: AdmittedPart | None = None,
    ) -> Page:
        """One page with ``runtime_sheet_read_rows``, checked against its request."""
        page = check_page_request(request)
        read = self._read_input(
            m.ReadRowsInput, table_namespace, run_id, admitted, page, row_mode=row_mode
        )
        answer = await self._send(self._request(m.ReadRowsRequest, input=read))
        checked = m.check_page(answer.body, page, _READ_ROWS, "the page")
        _count_row_bytes(answer)
        return checked

    async def read_rows_batch(
        self,
        table_namespace: str,
        requests: Sequence[PageRequest],
        *,
        run_id: str | None = None,
        row_mode: RowMode | None = None,
        admitted: AdmittedPart | None = None,
    ) -> list[Page]:
        """1 to ``READ_BATCH_MAX_PAGES`` pages in one request, one page per request, in order.

        Each page must echo its request's ``limit`` and ``offset`` and hold at
        most ``limit`` rows, each an object; otherwise ``GatewayProtocolError``.
        Raises ``ReadBatchTooLargeError`` on the gateway's 413 and when the
        decoded pages exceed ``READ_BATCH_MAX_RESPONSE_BYTES``.

        A gateway that predates the batch action is read page by page with
        ``runtime_sheet_read_rows``. That is a fallback only: an accepted
        batch answer is never read again, whatever its validation says.
        """
        requests = check_page_batch(requests)
        read = self._read_input(
            m.ReadRowsBatchInput,
            table_namespace,
            run_id,
            admitted,
            row_mode=row_mode,
            pages=m.pages_wire(requests),
        )
        try:
            answer = await self._send(self._request(m.ReadRowsBatchRequest, input=read))
        except UnsupportedActionError:
            return [
                await self.read_rows(
                    table_namespace, request, run_id=run_id, row_mode=row_mode, admitted=admitted
                )
                for request in requests
            ]
        pages = m.parse_pages(answer.body, requests, _READ_ROWS_BATCH)
        if answer.size > READ_BATCH_MAX_RESPONSE_BYTES:
            # The body is large; measure the pages themselves, as the server should have.
            measured = json_byte_length_up_to(answer.body["pages"], READ_BATCH_MAX_RESPONSE_BYTES)
            if measured.exceeded:
                raise ReadBatchTooLargeError(measured.bytes)
        _count_row_bytes(answer)
        return pages

    async def read_rows_after(
        self,
        table_namespace: str,
        after: Mapping[str, Any] | None,
        limit: int,
        offset: int,
        *,
        run_id: str | None = None,
        row_mode: RowMode | None = None,
        admitted: AdmittedPart | None = None,
    ) -> KeysetPage:
        """Up to ``limit`` rows after the cursor ``after`` (None: from the start), by keyset.

        ``after`` is the ``next_after`` of the previous answer: the wire's cursor
        ``{inputIndex, createdAt, key}`` (``RowCursorWire``), read and written by
        its class (another shape is an ``InvalidInputError``). ``offset`` is how
        many rows came before: a gateway that predates keyset reads ignores
        ``after`` and answers the page at ``offset``
        (``keyset`` is then False), so the caller can go on by offsets
        without a wasted request. Raises ``ReadBatchTooLargeError`` on the
        gateway's 413.
        """
        page = CheckedPage(limit, offset)
        if after is not None and not isinstance(after, Mapping):
            raise InvalidInputError(f"after must be a cursor object or None, got {after!r}")
        try:
            cursor = None if after is None else m.structure(dict(after), m.RowCursorWire)
        except m.WireError as exc:
            raise InvalidInputError(f"after: {exc}") from None
        read = self._read_input(
            m.ReadRowsInput,
            table_namespace,
            run_id,
            admitted,
            page,
            row_mode=row_mode,
            after=cursor,
        )
        sent = await self._send(self._request(m.ReadRowsRequest, input=read))
        answer = sent.body
        rows = m.check_page(answer, page, _READ_ROWS, "the page").rows
        _count_row_bytes(sent)
        if "nextAfter" not in answer:
            return KeysetPage(rows, None, keyset=False)
        next_after = answer["nextAfter"]
        if next_after is not None:
            next_after = m.unstructure(
                m.read_as(next_after, m.RowCursorWire, _READ_ROWS, "nextAfter.")
            )
        return KeysetPage(rows, next_after, keyset=True)

    async def read_row_keys(
        self,
        table_namespace: str,
        request: PageRequest,
        *,
        run_id: str | None = None,
        admitted: AdmittedPart | None = None,
    ) -> list[str]:
        """The keys of one page, in read order (``runtime_sheet_read_row_keys``)."""
        page = check_page_request(request)
        read = self._read_input(m.ReadRowKeysInput, table_namespace, run_id, admitted, page)
        answer = await self._send(self._request(m.ReadRowKeysRequest, input=read))
        return m.parse_row_keys(answer.body, page, m.action_of(m.ReadRowKeysRequest))

    async def complete_map_rows(
        self,
        table_namespace: str,
        contract: SheetContract,
        rows: Sequence[CompleteRow],
        *,
        run_id: str,
        write_version: int | None,
    ) -> TerminalWriteResult:
        """Record map outputs under write-version fencing; stale rows come back with reasons."""
        self._check_row_writes(rows, CompleteRow)
        return await self._terminal_write(
            m.CompleteMapRowsRequest,
            partial(m.complete_rows_json, rows),
            table_namespace,
            contract,
            run_id,
            write_version,
        )

    async def fail_map_rows(
        self,
        table_namespace: str,
        contract: SheetContract,
        rows: Sequence[FailRow],
        *,
        run_id: str,
        write_version: int | None,
    ) -> TerminalWriteResult:
        """Record map failures under write-version fencing; stale rows come back with reasons."""
        self._check_row_writes(rows, FailRow)
        return await self._terminal_write(
            m.FailMapRowsRequest,
            partial(m.fail_rows_json, rows),
            table_namespace,
            contract,
            run_id,
            write_version,
        )

    async def _terminal_write(
        self,
        cls: type[m.TerminalWriteRequest],
        wire_rows: Callable[[], list[Any]],
        table_namespace: str,
        contract: SheetContract,
        run_id: str,
        write_version: int | None,
    ) -> TerminalWriteResult:
        """A complete or fail request under one fence: its rows as ``wire_rows()`` writes
        them (each row converted once, straight to what the body carries), in the
        envelope the converter writes."""
        try:
            rows = wire_rows()
        except m.WireError as exc:
            raise InvalidInputError(f"{cls.__name__}: {exc}") from None
        request = self._sheet_request(
            cls,
            table_namespace,
            contract,
            run_id=run_id,
            write_version=write_version,
            rows=[],
        )
        payload = m.unstructure(request)
        payload["rows"] = rows
        answer = await self._call_content(request.action, _dumps(payload))
        return m.parse_terminal_write(answer.body, request.action)

    async def append_rows(
        self,
        table_namespace: str,
        contract: SheetContract,
        rows: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        run_id: str,
    ) -> WriteResult:
        """Append ``rows`` as new pending rows, once per ``idempotency_key``."""
        return await self._keyed_write(
            m.AppendRowsRequest, table_namespace, contract, rows, idempotency_key, run_id
        )

    async def upsert_rows(
        self,
        table_namespace: str,
        contract: SheetContract,
        rows: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        key_field: str | None,
        run_id: str,
    ) -> WriteResult:
        """Insert new keys and merge the carried columns into existing rows, once per
        ``idempotency_key``."""
        return await self._keyed_write(
            m.UpsertRowsRequest,
            table_namespace,
            contract,
            rows,
            idempotency_key,
            run_id,
            key_field=key_field,
        )

    async def replace_rows(
        self,
        table_namespace: str,
        contract: SheetContract,
        rows: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        run_id: str,
    ) -> WriteResult:
        """Replace every row of the sheet with ``rows``, once per ``idempotency_key``."""
        return await self._keyed_write(
            m.ReplaceRowsRequest, table_namespace, contract, rows, idempotency_key, run_id
        )

    async def _keyed_write(
        self,
        cls: type[m.KeyedWriteRequest],
        table_namespace: str,
        contract: SheetContract,
        rows: Sequence[Mapping[str, Any]],
        idempotency_key: str,
        run_id: str,
        **fields: Any,
    ) -> WriteResult:
        """An append, upsert or replace request of ``rows`` (row mappings, checked)."""
        checked = checks.row_mappings("rows", rows)
        request = self._sheet_request(
            cls,
            table_namespace,
            contract,
            rows=[dict(row) for row in checked],
            idempotency_key=idempotency_key,
            run_id=run_id,
            **fields,
        )
        return m.parse_keyed_write((await self._send(request)).body, request.action)

    async def complete_work_receipt(
        self,
        key: str,
        result: Any,
        run_id: str,
        *,
        run_attempt: int | None = None,
        holder: str | None = None,
        lease_token: str | None = None,
    ) -> ReceiptCompletion:
        """Record a work receipt once; an earlier writer's receipt comes back as ``existing``.

        While a live lease owns the key only its ``holder`` with its
        ``lease_token`` (the claim's answer) completes; anyone else gets
        ``WorkReceiptFencedError`` and nothing is written.
        """
        request = self._request(
            m.CompleteWorkReceiptRequest,
            key=key,
            result=result,
            run_id=run_id,
            run_attempt=run_attempt,
            holder=holder,
            lease_token=lease_token,
        )
        answer = await self._send(request)
        return m.parse_receipt_completion(answer.body, request.action, run_id)

    async def claim_work_receipt(
        self, key: str, holder: str, *, lease_token: str | None = None
    ) -> ReceiptClaim:
        """Take, renew (same ``holder`` and ``lease_token``) or take over (expired) the
        lease on ``key``; acquired, the answer's ``lease_token`` is the lease's secret.

        Not acquired while another lease is live, or once the work is completed
        (the answer's ``receipt``). Without ``lease_token`` a new token is made
        here and sent, so a retried claim is harmless: its repeat only renews.
        """
        token = lease_token if lease_token is not None else new_lease_token()
        request = self._request(
            m.ClaimWorkReceiptRequest, key=key, holder=holder, lease_token=token
        )
        answer = await self._send(request)
        return m.parse_receipt_claim(answer.body, request.action, holder, token)

    async def release_work_receipt(self, key: str, holder: str, lease_token: str | None) -> bool:
        """Give up ``holder``'s lease on ``key``; True when it held one with ``lease_token``."""
        request = self._request(
            m.ReleaseWorkReceiptRequest, key=key, holder=holder, lease_token=lease_token
        )
        return m.parse_released((await self._send(request)).body, request.action)

    async def resolve_play(self, play_ref: str) -> ResolvedPlay | None:
        """The play ``play_ref`` names (its id, else its name) in the token's org, or None.

        Retried on the resolve-play ladder (``RESOLVE_PLAY_RETRY_DELAYS_MS``,
        within ``RESOLVE_PLAY_CALL_BUDGET_MS``): it is a run's first call.
        """
        request = self._request(m.ResolvePlayRequest, play_ref=checks.text("play_ref", play_ref))
        return m.parse_resolved_play((await self._send(request)).body, request.action)

    async def register_play(self, play: ResolvedPlay, *, name: str | None = None) -> None:
        """Register (or replace) ``play`` in the token's org, also under ``name``."""
        if not isinstance(play, ResolvedPlay):
            raise InvalidInputError(f"play must be a ResolvedPlay, got {play!r}")
        definition = self._request_part(
            m.PlayDefinitionWire,
            play_id=play.play_id,
            name=name,
            source_code=play.source_code,
            artifact=play.artifact,
            code_format=play.code_format,
            contract_snapshot=None
            if play.contract_snapshot is None
            else dict(play.contract_snapshot),
        )
        request = self._request(m.RegisterPlayRequest, play=definition)
        answer = m.read_as((await self._send(request)).body, m.RegisterPlayAnswer, request.action)
        if answer.play_id != play.play_id:
            raise m.protocol_error(request.action, "playId must echo the registered play")

    async def claim_share(
        self,
        table_namespace: str,
        write_version: int,
        holder: str,
        lease_token: str,
        *,
        ttl_ms: int,
        max_rows: int,
    ) -> ShareClaim:
        """Claim a share of the attempt at ``write_version`` (``claim_sheet_share``).

        A retried claim may have landed: the share it took is then held under
        ``lease_token`` until its lease ends (the caller releases it with that token).
        """
        request = self._request(
            m.ClaimShareRequest,
            table_namespace=table_namespace,
            write_version=write_version,
            holder=holder,
            lease_token=lease_token,
            ttl_ms=ttl_ms,
            max_rows=max_rows,
        )
        return m.parse_share_claim((await self._send(request)).body, request.action)

    async def renew_share(
        self, table_namespace: str, write_version: int, share: int, lease_token: str, *, ttl_ms: int
    ) -> ShareRenewal:
        """Push a held share's lease on (``renew_sheet_share``)."""
        request = self._request(
            m.RenewShareRequest,
            table_namespace=table_namespace,
            write_version=write_version,
            share=share,
            lease_token=lease_token,
            ttl_ms=ttl_ms,
        )
        return m.parse_share_lease((await self._send(request)).body, request.action)

    async def release_share(
        self,
        table_namespace: str,
        write_version: int,
        share: int,
        lease_token: str,
        *,
        finished: bool,
    ) -> ShareRenewal:
        """Give a held share up (``release_sheet_share``)."""
        request = self._request(
            m.ReleaseShareRequest,
            table_namespace=table_namespace,
            write_version=write_version,
            share=share,
            lease_token=lease_token,
            finished=finished,
        )
        return m.parse_share_lease((await self._send(request)).body, request.action)

    async def attempt_status(self, table_namespace: str, write_version: int) -> AttemptStatus:
        """Where the attempt at ``write_version`` stands (``sheet_attempt_status``)."""
        request = self._request(
            m.AttemptStatusRequest, table_namespace=table_namespace, write_version=write_version
        )
        return m.parse_attempt_status((await self._send(request)).body, request.action)

    async def summary(self, table_namespace: str) -> Summary:
        """The sheet's status counters."""
        request = self._request(m.SummaryRequest, table_namespace=table_namespace)
        return m.parse_summary((await self._send(request)).body, request.action)
