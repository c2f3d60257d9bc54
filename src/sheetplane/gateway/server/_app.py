"""The reference gateway as a Starlette app: ``POST /api/v2/plays/internal/runtime``,
plus ``GET /healthz``, ``/readyz`` and ``/metrics`` (``_probes``), all inside the
operations middleware (``_ops``: request ids, access log, metrics, drain).

Each runtime request goes through the same steps, in this order:

1. the bearer token names the org (401 when missing or unknown);
2. the body is read with a byte ceiling (413 ``request_too_large`` past
   ``TRANSPORT_CEILING_BYTES``, refused from ``Content-Length`` before reading
   when it declares more) and a time limit (408 ``request_timeout`` and the
   connection closes when the whole body has not arrived within
   ``body_read_timeout_ms``), then parsed (400 when it is not a JSON object
   with a string ``action``);
3. with ``allow_test_faults``, the ``x-sheetplane-test-fault`` header arms
   faults and an armed fault for this action answers instead (``lost``: after
   the handler has run);
4. an ``orgId`` other than the token's is refused 403;
5. the action's handler runs (400 ``Unsupported runtime data-plane action``
   for an unknown action, for the batch read on a ``legacy`` gateway, or for
   an action outside the config's ``actions``),
   within ``action_budget_ms`` (``GATEWAY_ACTION_BUDGET_MS``; a staged commit
   and ``start_sheet_dataset``: ``ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS``), else
   504 ``gateway_action_timeout``: the caller's attempt has timed out by then.

Errors become JSON bodies ``{error, code, ...}``: a saturated pool is 503
``runtime_postgres_admission_backpressure`` with ``retry_after_ms``, a batch
read over its budget 413 ``runtime_sheet_read_batch_too_large`` with
``observed_bytes``, a ``start_sheet_dataset`` whose answer would pass the
transport ceiling 413 ``runtime_sheet_admission_too_large`` (decided inside
the admission's transaction, which it rolls back: nothing is written),
anything unexpected 500 ``internal_error``. No body ever carries a stack
trace, a token or a database URL; every 500 writes its whole traceback to
the log, under the request's id (``x-request-id``, echoed on every answer).

The app's lifespan opens the store (its pool), hardens the database (see
``_hardening``: built-in functions a tenant could use against another are
revoked from ``PUBLIC``) and runs the session-role reaper in a nursery;
leaving the lifespan cancels the reaper and closes the pool.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any, Final, TypeVar

import attrs
import psycopg
import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ... import _tracing
from ..._redact import Redactor
from ...budgets import (
    ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS,
    TRANSPORT_CEILING_BYTES,
)
from ...errors import (
    AdmissionTooLargeError,
    InvalidInputError,
    PoolSaturatedError,
    ReadBatchTooLargeError,
    SheetplaneError,
    StoreError,
)
from ...protocol import (
    OPENAPI_PATH,
    RUNTIME_PATH,
    Code,
    CommitAdmissionRequest,
    StartSheetDatasetRequest,
    action_of,
    decode_body,
    error_body,
    openapi_document,
    rule_for_exception,
)
from ...store import SheetStore, TrioPool, open_store
from ..faults import FAULT_HEADER, FaultResponse, FaultSchedule
from ._actions import HANDLERS, LEGACY_UNSUPPORTED, Call, GatewayState, unsupported
from ._auth import TokenTable, check_org
from ._chunks import CHUNK_ACTION, parse_chunk_body
from ._config import GatewayConfig
from ._hardening import harden_database
from ._http import ActionError, EncodedAnswer, bad_request, encode_json, json_bytes_response
from ._logs import RequestInfo, internal_error_fields
from ._metrics import GatewayMetrics, action_label, pool_states
from ._ops import Operations, OperationsMiddleware
from ._probes import probe_routes
from ._shares import TenantSharesMiddleware
from ._watchdog import ReaperProgress, resolve_org_connection_budget, run_reaper, run_watchdog

__all__ = ["RUNTIME_PATH", "create_app", "gateway_state"]

log = logging.getLogger("sheetplane.gateway.server")

T = TypeVar("T")

#: Actions whose answers can be large: their JSON is encoded on a worker thread. (Page
#: reads answer an ``EncodedAnswer``, spliced from the rows' JSON that Postgres wrote.)
_LARGE_ANSWERS: Final = frozenset({action_of(StartSheetDatasetRequest)})


#: Actions whose caller waits longer than ``GATEWAY_ACTION_BUDGET_MS`` for them: a
#: staged commit and a one-request admission are each one transaction over the
#: whole input (which may queue behind other admissions of the sheet), and their
#: client's attempt timeout is ``ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS``.
_ACTION_BUDGETS_MS: Final[Mapping[str, int]] = {
    action_of(CommitAdmissionRequest): ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS,
    action_of(StartSheetDatasetRequest): ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS,
}


def startup_failure(app: Starlette) -> Exception | None:
    """The error that stopped the app's lifespan from starting, if one did.

    Hypercorn reports a failed lifespan startup as started (its startup event is
    set either way), so the server asks the app itself before it listens.
    """
    failure = getattr(app.state, "startup_failure", None)
    return failure if isinstance(failure, Exception) else None


@asynccontextmanager
async def _opened_store(
    app: Starlette, database_url: str, kwargs: dict[str, Any]
) -> AsyncIterator[Any]:
    """``open_store``, recording a failure to open as the app's startup failure (a
    database it cannot reach stops the server before it listens)."""
    async with AsyncExitStack() as stack:
        try:
            opened = await stack.enter_async_context(open_store(database_url, **kwargs))
        except Exception as exc:
            app.state.startup_failure = exc
            raise
        yield opened


def gateway_state(app: Starlette) -> GatewayState:
    """The running state of an app built by :func:`create_app` (inside its lifespan)."""
    state = getattr(app.state, "gateway", None)
    if not isinstance(state, GatewayState):
        raise RuntimeError("the gateway is not running (its lifespan has not started)")
    return state


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if (
        declared is not None
        and declared.strip().isdigit()
        and int(declared) > TRANSPORT_CEILING_BYTES
    ):
        raise _too_large_request(int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > TRANSPORT_CEILING_BYTES:
            raise _too_large_request(size)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large_request(observed: int) -> ActionError:
    return ActionError(
        413,
        Code.REQUEST_TOO_LARGE,
        f"request body exceeds the {TRANSPORT_CEILING_BYTES} byte transport ceiling",
        observed_bytes=observed,
    )


#: A ``\uD800``-``\uDFFF`` escape: the only way a lone surrogate gets into parsed JSON
#: (raw UTF-8 cannot carry one). Valid pairs match too; the walk tells them apart.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _holds_lone_surrogate(value: object) -> bool:
    """Whether any string in ``value`` (keys included) has no UTF-8 form."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _parse(raw: bytes) -> tuple[Mapping[str, Any], str, dict[str, bytes] | None]:
    chunk = parse_chunk_body(raw)
    if chunk is not None:
        # A staged chunk: its rows stay undecoded (the handler reads them only if it
        # must). msgspec refuses a lone surrogate escape anywhere in the body, and
        # such a body is parsed whole below.
        body, undecoded = chunk
        return body, CHUNK_ACTION, undecoded
    try:
        body = decode_body(raw)
    except (UnicodeDecodeError, ValueError):
        raise bad_request("request body must be JSON") from None
    except RecursionError:
        raise bad_request("request body nests too deeply to parse") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) and _holds_lone_surrogate(body):
        raise bad_request("request body holds a lone surrogate, which has no UTF-8 form")
    action = body.get("action")
    if not isinstance(action, str) or not action:
        raise bad_request("action must be a non-empty string")
    return body, action, None


def _error_answer(exc: SheetplaneError, action: str, state: GatewayState) -> ActionError | None:
    """The answer to ``exc`` by the error table (``protocol/_errors.py``): its status and
    code, and for a store failure a fixed text that names no SQL, value or URL. None
    for an error the table does not list (answered as an unexpected failure)."""
    if isinstance(exc, ReadBatchTooLargeError):
        state.metrics.read_batch_too_large.inc()
    if isinstance(exc, PoolSaturatedError):
        state.metrics.backpressure.inc()
    if isinstance(exc, StoreError) and isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
        return ActionError(
            404, Code.SHEET_NOT_FOUND, "the sheet does not exist (ensure_sheet first)"
        )
    rule = rule_for_exception(exc)
    if rule is None:
        return None
    if rule.code == StoreError.code:
        log.error(
            "store error answering %s: %s",
            action,
            type(exc).__name__,
            extra=internal_error_fields(exc, state.redact),
        )
    extra: dict[str, Any] = {}
    if rule.retry_after_ms is not None:
        extra["retry_after_ms"] = rule.retry_after_ms
    if isinstance(exc, ReadBatchTooLargeError | AdmissionTooLargeError):
        extra["observed_bytes"] = exc.observed_bytes
    return ActionError(rule.status, rule.code, rule.text or str(exc), **extra)


def _body_timeout(timeout_ms: int) -> ActionError:
    return ActionError(
        408, Code.REQUEST_TIMEOUT, f"the request body did not arrive within {timeout_ms} ms"
    )


async def _answer(state: GatewayState, request: Request, info: RequestInfo | None) -> Response:
    org_id, token_id = state.tokens.identify(request.headers.get("authorization"))
    if info is not None:
        info.org_id = org_id
    timeout_ms = state.config.body_read_timeout_ms
    raw = None
    with trio.move_on_after(timeout_ms / 1000):
        raw = await _read_body(request)
    if raw is None:
        raise _body_timeout(timeout_ms)
    body, action, undecoded = _parse(raw)
    if info is not None:
        info.action = action_label(action, HANDLERS)
    if state.config.allow_test_faults:
        header = request.headers.get(FAULT_HEADER)
        if header is not None:
            try:
                state.faults.arm(header)
            except InvalidInputError as exc:
                raise bad_request(str(exc), Code.INVALID_TEST_FAULT) from None
        fault = state.faults.take(action)
        if fault is not None and fault != "lost":
            return FaultResponse(fault, action)
    else:
        fault = None
    check_org(body, org_id)
    handler = HANDLERS.get(action)
    served = state.config.actions
    if (
        handler is None
        or (state.config.legacy and action in LEGACY_UNSUPPORTED)
        or (served is not None and action not in served)
    ):
        raise unsupported(action)
    payload = None
    action_budget_ms = _ACTION_BUDGETS_MS.get(action, state.config.action_budget_ms)
    try:
        with (
            _tracing.span(f"action {action}", {"sheetplane.gateway.action": action}),
            trio.move_on_after(action_budget_ms / 1000),
        ):
            payload = await handler(Call(state, org_id, body, token_id, undecoded))
    except SheetplaneError as exc:
        answer = _error_answer(exc, action, state)
        if answer is None:
            raise
        try:
            raise answer from None
        finally:
            # This frame (which holds the raw body) is in the answer's traceback:
            # keeping the answer here would make a cycle of both until the
            # cyclic collector ran.
            del answer
    if payload is None:
        raise ActionError(
            504,
            Code.ACTION_TIMEOUT,
            f"{action} did not finish within {action_budget_ms} ms",
        )
    if fault == "lost":
        # Applied; now lose the answer (test faults only).
        return FaultResponse(fault, action)
    if isinstance(payload, EncodedAnswer):
        encoded = payload.body
    elif action in _LARGE_ANSWERS:
        encoded = await trio.to_thread.run_sync(encode_json, payload)
    else:
        encoded = encode_json(payload)
    return json_bytes_response(200, encoded)


@attrs.define(eq=False)
class _MeteredProgress(ReaperProgress):
    """The reaper's and the watchdog's progress, also counted in
    ``sheetplane_session_roles_reaped_total`` and ``sheetplane_session_backends_ended_total``."""

    metrics: GatewayMetrics = attrs.field(kw_only=True)

    def record(self, dropped: int) -> None:
        super().record(dropped)
        self.metrics.session_roles_reaped.inc(dropped)

    def record_watchdog(self, ended: dict[str, int], seconds: float = 0.0) -> None:
        super().record_watchdog(ended, seconds)
        for reason, count in ended.items():
            self.metrics.session_backends_ended.labels(reason=reason).inc(count)


class _AdmissionPool:
    """The store's pool as the gateway uses it: every ``run`` waits at most
    ``acquire_timeout_ms`` for a connection, then raises ``PoolSaturatedError``
    (answered 503 back-pressure) instead of queueing without bound.

    ``SheetStore`` methods take no acquire timeout (the direct road has no one
    to push back to), so the gateway hands its store this view of the pool: a
    ``ConnectionRunner``, all the store calls on a pool.
    """

    def __init__(self, pool: TrioPool, acquire_timeout_ms: int) -> None:
        self._pool = pool
        self.acquire_timeout_ms = acquire_timeout_ms
        self.max_connections = pool.max_connections

    def __repr__(self) -> str:
        return f"<gateway admission {self._pool!r} acquire_timeout_ms={self.acquire_timeout_ms}>"

    async def run(
        self, fn: Callable[[psycopg.Connection[Any]], T], *, acquire_timeout_ms: int | None = None
    ) -> T:
        timeout = self.acquire_timeout_ms if acquire_timeout_ms is None else acquire_timeout_ms
        return await self._pool.run(fn, acquire_timeout_ms=timeout)

    def stats(self) -> dict[str, int]:
        return self._pool.stats()


def _runtime_endpoint(redact: Redactor) -> Callable[[Request], Awaitable[Response]]:
    """The ``POST`` runtime endpoint: every action's answer, or its error's (never a trace)."""

    async def runtime(request: Request) -> Response:
        state = gateway_state(request.app)
        info = request.scope.get("sheetplane.request")
        try:
            return await _answer(state, request, info)
        except ActionError as exc:
            response = json_bytes_response(exc.status, encode_json(exc.body()))
            if exc.status == 408:
                response.headers["connection"] = "close"
            return response
        except ClientDisconnect:
            # The caller left while sending its body: nobody reads an answer.
            return Response(status_code=400)
        except Exception as exc:
            log.error(
                "internal error: %s",
                type(exc).__name__,
                extra=internal_error_fields(exc, redact),
            )
            return json_bytes_response(
                500, encode_json(error_body("internal error", Code.INTERNAL_ERROR))
            )

    return runtime


async def _prepare(store: SheetStore, config: GatewayConfig) -> int:
    """Before serving: harden the database, register the configured plays, and resolve
    the per-org connection budget (returned)."""
    await harden_database(store)
    for definition in config.plays:
        await store.register_play(definition.org_id, definition.play, name=definition.name)
    return await resolve_org_connection_budget(store, config.session_max_connections_per_org)


async def _start_watch(
    nursery: trio.Nursery,
    store: SheetStore,
    config: GatewayConfig,
    progress: ReaperProgress,
    org_connections: int,
) -> None:
    """Start the reaper and the watchdog in ``nursery`` (``_watchdog``)."""
    await nursery.start(run_reaper, store, config.reaper_interval_ms, progress)
    await nursery.start(
        partial(
            run_watchdog,
            org_connections=org_connections,
            memory_bytes=config.session_max_backend_memory_bytes,
            org_memory_bytes=config.session_max_org_memory_bytes,
            login_timeout_ms=config.session_login_timeout_ms,
        ),
        store,
        config.session_bounds(),
        config.watchdog_interval_ms,
        progress,
    )


def create_app(config: GatewayConfig, ops: Operations | None = None) -> Starlette:
    """The reference gateway for ``config``.

    Serve it with any ASGI server on trio (``sheetplane.gateway.server.serve``
    uses Hypercorn). Its lifespan opens the store and starts the role reaper;
    requests are answered only inside the lifespan. ``ops`` (default: a new
    one) holds its metrics and drain state; the server that serves the app
    drives the drain through it.
    """
    tokens = TokenTable.from_mapping(config.tokens)
    ops = ops if ops is not None else Operations()
    ops.redactor.add_database_url(config.database_url)
    ops.redactor.add([*config.tokens, *([config.metrics_token] if config.metrics_token else [])])
    if config.tenant_caps is not None:
        ops.tenants.caps, ops.tenants.configured = config.tenant_caps, True
    metrics = ops.metrics
    runtime = _runtime_endpoint(ops.redactor)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store_kwargs: dict[str, Any] = {}
        if config.max_connections is not None:
            store_kwargs["max_connections"] = config.max_connections
        async with (
            _opened_store(app, config.database_url, store_kwargs) as opened,
            trio.open_nursery() as nursery,
        ):
            admission = _AdmissionPool(opened.pool, config.pool_acquire_timeout_ms)
            store = SheetStore(admission, quotas=config.quotas)
            try:
                org_connections = await _prepare(store, config)
            except Exception as exc:
                app.state.startup_failure = exc
                raise
            progress = _MeteredProgress(metrics=metrics)
            app.state.gateway = GatewayState(
                config=config,
                store=store,
                tokens=tokens,
                faults=FaultSchedule(),
                reaper=progress,
                metrics=metrics,
                redact=ops.redactor,
                caps=config.session_caps(org_connections),
            )
            metrics.pool_stats = partial(pool_states, opened.pool)
            await _start_watch(nursery, store, config, progress, org_connections)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()
                app.state.gateway = None
                metrics.pool_stats = None

    document = encode_json(openapi_document())

    async def openapi(request: Request) -> Response:
        return json_bytes_response(200, document)

    app = Starlette(
        routes=[
            Route(RUNTIME_PATH, runtime, methods=["POST"]),
            Route(OPENAPI_PATH, openapi, methods=["GET"]),
            *probe_routes(ops),
        ],
        middleware=[
            Middleware(OperationsMiddleware, ops=ops),
            # Inside the access log, before the body is read: a tenant past its
            # share is refused 429 while its body is still on the wire.
            Middleware(TenantSharesMiddleware, shares=ops.tenants, tokens=tokens),
        ],
        lifespan=lifespan,
    )
    app.state.ops = ops
    return app
