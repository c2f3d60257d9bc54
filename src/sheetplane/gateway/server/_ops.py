"""The operations layer around the gateway app: request ids, the access log,
request metrics and the drain gate.

:class:`OperationsMiddleware` is a pure ASGI middleware outside every route.
For each HTTP request it takes the caller's ``x-request-id`` (or makes one),
echoes it on the answer, makes it the current request for every log record,
and when the answer ends writes one access line and counts the request in
``sheetplane_requests_total`` / ``sheetplane_request_seconds``.

Once :meth:`Operations.begin_drain` is called (SIGTERM), a new request is
answered at once with 503 ``gateway_draining``, ``retry_after_ms`` and
``connection: close`` (``/healthz`` and ``/metrics`` still answer), while the
requests already running go on; :meth:`Operations.wait_idle` returns when the
last of them has finished. A request cancelled during the drain (the budget
ran out) is counted in :attr:`Operations.cancelled`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import attrs
import trio
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ... import _tracing
from ..._redact import Redactor
from ...budgets import GATEWAY_DRAIN_RETRY_AFTER_MS
from ...protocol import (
    HEALTHZ_PATH,
    METRICS_PATH,
    OPENAPI_PATH,
    READYZ_PATH,
    RUNTIME_PATH,
    Code,
    error_body,
)
from ._http import encode_json, send_json
from ._logs import (
    REQUEST_ID_HEADER,
    RequestInfo,
    request_id_from,
    reset_current_request,
    set_current_request,
)
from ._metrics import NO_ACTION, GatewayMetrics
from ._shares import TenantShares

__all__ = ["Operations", "OperationsMiddleware"]


#: Paths a draining gateway still answers normally: liveness and its metrics.
_DRAIN_EXEMPT: Final = frozenset({HEALTHZ_PATH, METRICS_PATH})

#: The paths a server span names (``http.route``): any other is named by its method
#: alone, so a scan of made-up paths cannot make a span name per path.
_ROUTES: Final = frozenset({RUNTIME_PATH, OPENAPI_PATH, HEALTHZ_PATH, READYZ_PATH, METRICS_PATH})

access_log = logging.getLogger("sheetplane.gateway.access")


@attrs.define(eq=False)
class Operations:
    """One gateway's operational state: its metrics, the drain, the requests in flight."""

    metrics: GatewayMetrics = attrs.field(factory=GatewayMetrics)
    redactor: Redactor = attrs.field(factory=Redactor)
    """What the gateway's log texts pass through: ``create_app`` adds its secrets (its
    database URL, its tokens). ``sheetplane serve`` passes its log formatter's."""
    draining: bool = False
    """True from :meth:`begin_drain` on."""
    tenants: TenantShares = attrs.Factory(TenantShares)
    """Each token's and org's requests in flight and connections (``_shares``)."""
    in_flight: int = 0
    """Requests inside the app now (answers of the drain gate excluded)."""
    cancelled: int = 0
    """Requests cancelled while the gateway drained (their drain budget ran out)."""
    _idle: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self._idle.set()

    def begin_drain(self) -> None:
        """Answer every new request 503 from now on; running ones go on."""
        self.draining = True
        self.metrics.draining.set(1)

    async def wait_idle(self) -> None:
        """Return once no request is in flight."""
        while self.in_flight:
            await self._idle.wait()

    @asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        """Count one request in flight for its duration."""
        if self.in_flight == 0:
            self._idle = trio.Event()
        self.in_flight += 1
        self.metrics.requests_in_flight.inc()
        try:
            yield
        except trio.Cancelled:
            if self.draining:
                self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
            self.metrics.requests_in_flight.dec()
            if self.in_flight == 0:
                self._idle.set()


def _draining_body() -> bytes:
    return encode_json(
        error_body(
            "the gateway is draining (shutting down); retry the request",
            Code.DRAINING,
            retry_after_ms=GATEWAY_DRAIN_RETRY_AFTER_MS,
        )
    )


class OperationsMiddleware:
    """Request ids, access log, request metrics and the drain gate (module docstring)."""

    def __init__(self, app: ASGIApp, ops: Operations) -> None:
        self.app = app
        self.ops = ops

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        info = RequestInfo(
            request_id=request_id_from(headers.get(REQUEST_ID_HEADER)),
            method=str(scope["method"]),
            path=str(scope["path"]),
        )
        scope["sheetplane.request"] = info
        route = info.path if info.path in _ROUTES else None
        with _tracing.server_span(
            info.method if route is None else f"{info.method} {route}",
            headers,
            {
                "http.request.method": info.method,
                "url.path": info.path,
                **({"http.route": route} if route is not None else {}),
            },
        ) as span:
            info.trace_id = _tracing.current_trace_id()
            try:
                await self._serve(scope, receive, send, info)
            finally:
                if info.action is not None:
                    span.set_attribute("sheetplane.gateway.action", info.action)
                if info.status is not None:
                    span.set_attribute("http.response.status_code", info.status)
                    if info.status >= 500:
                        span.set_status(_tracing.Status(_tracing.StatusCode.ERROR))

    async def _serve(self, scope: Scope, receive: Receive, send: Send, info: RequestInfo) -> None:
        token = set_current_request(info)
        start = time.perf_counter()
        ops = self.ops
        close = ops.draining

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                info.status = int(message["status"])
                extra = [(REQUEST_ID_HEADER.encode(), info.request_id.encode("ascii"))]
                if close:
                    extra.append((b"connection", b"close"))
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        try:
            if ops.draining and info.path not in _DRAIN_EXEMPT:
                await send_json(send_with_id, 503, _draining_body())
            else:
                async with ops.request():
                    await self.app(scope, receive, send_with_id)
        finally:
            reset_current_request(token)
            self._finish(info, time.perf_counter() - start)

    def _finish(self, info: RequestInfo, seconds: float) -> None:
        action = info.action or NO_ACTION
        status = info.status if info.status is not None else 0
        self.ops.metrics.observe(action, status, seconds)
        self.ops.metrics.refresh()
        fields = {
            "event": "request",
            "request_id": info.request_id,
            "method": info.method,
            "path": info.path,
            "action": action,
            "status": info.status,
            "duration_ms": round(seconds * 1000, 3),
            "org_id": info.org_id,
            "trace_id": info.trace_id,
        }
        access_log.info("request", extra=fields)
