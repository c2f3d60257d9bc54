"""``GET /healthz``, ``GET /readyz`` and ``GET /metrics``.

- ``/healthz``: 200 ``{"status": "ok"}`` while the process serves (also while
  it drains: it is alive). No token.
- ``/readyz``: 200 ``{"status": "ready"}`` when the store answers ``SELECT 1``
  within ``GATEWAY_READINESS_BUDGET_MS`` (at most half of it waiting for a
  pooled connection); else 503 ``{"status": "unready", "reason": ...}`` with ``reason``
  ``pool_saturated`` (no connection freed within the budget),
  ``store_unavailable`` (Postgres refused or lost the connection),
  ``store_timeout`` (no answer within the budget) or ``store_error``. While
  the gateway drains, the drain gate answers it 503 like every route but
  ``/healthz`` and ``/metrics``. No token; neither body says anything about
  tenants.
- ``/metrics``: the Prometheus text format, only with ``authorization: Bearer
  <metrics token>`` (401 otherwise); 404 when no metrics token is configured.
  Before rendering, ``sheetplane_session_roles_live`` is read from Postgres
  within the readiness budget (left as it was if the store cannot answer).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any, Final

import psycopg
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...budgets import GATEWAY_READINESS_BUDGET_MS
from ...errors import PoolSaturatedError, StoreError, StoreUnavailableError
from ...protocol import (
    HEALTHZ_PATH,
    METRICS_PATH,
    READYZ_PATH,
    Code,
    HealthAnswer,
    ReadyAnswer,
    UnreadyAnswer,
    UnreadyReason,
    error_body,
    unstructure,
)
from ._actions import GatewayState
from ._http import encode_json, json_bytes_response
from ._logs import RequestInfo
from ._metrics import CONTENT_TYPE
from ._ops import Operations
from ._roles import ROLE_PREFIX

__all__ = ["probe_routes"]

_BUDGET_S: Final = GATEWAY_READINESS_BUDGET_MS / 1000
#: A probe waits half its budget for a pooled connection (then: ``pool_saturated``),
#: leaving the other half for the query itself.
_ACQUIRE_MS: Final = GATEWAY_READINESS_BUDGET_MS // 2


def _label(request: Request, name: str) -> None:
    info = request.scope.get("sheetplane.request")
    if isinstance(info, RequestInfo):
        info.action = name


def _state(request: Request) -> GatewayState | None:
    state = getattr(request.app.state, "gateway", None)
    return state if isinstance(state, GatewayState) else None


def _select_one(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT 1").fetchone()


def _live_roles(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_roles WHERE starts_with(rolname, %s)"
        " AND (rolvaliduntil IS NULL OR rolvaliduntil > now())",
        (ROLE_PREFIX,),
    ).fetchone()
    return int(row[0]) if row else 0


async def _readiness(state: GatewayState) -> UnreadyReason | None:
    """None when ready, else the reason it is not."""
    reason: UnreadyReason = "store_timeout"
    with trio.move_on_after(_BUDGET_S):
        try:
            await state.store.pool.run(_select_one, acquire_timeout_ms=_ACQUIRE_MS)
        except PoolSaturatedError:
            reason = "pool_saturated"
        except StoreUnavailableError:
            reason = "store_unavailable"
        except StoreError:
            reason = "store_error"
        else:
            return None
    return reason


def probe_routes(ops: Operations) -> list[BaseRoute]:
    """The three routes, bound to one gateway's operations state."""
    worker = os.getpid()

    async def healthz(request: Request) -> Response:
        _label(request, "healthz")
        return json_bytes_response(200, encode_json(unstructure(HealthAnswer(worker=worker))))

    async def readyz(request: Request) -> Response:
        _label(request, "readyz")
        state = _state(request)
        reason: UnreadyReason | None = (
            "store_unavailable" if state is None else await _readiness(state)
        )
        if reason is None:
            return json_bytes_response(200, encode_json(unstructure(ReadyAnswer())))
        unready = UnreadyAnswer(reason=reason, budget_ms=GATEWAY_READINESS_BUDGET_MS)
        return json_bytes_response(503, encode_json(unstructure(unready)))

    async def metrics(request: Request) -> Response:
        _label(request, "metrics")
        state = _state(request)
        expected = state.config.metrics_token if state is not None else None
        if state is None or expected is None:
            return json_bytes_response(
                404, encode_json(error_body("metrics are not enabled", Code.NOT_FOUND))
            )
        scheme, _, presented = (request.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            hashlib.sha256(presented.strip().encode()).digest(),
            hashlib.sha256(expected.encode()).digest(),
        ):
            return json_bytes_response(
                401,
                encode_json(error_body("missing or invalid metrics token", Code.UNAUTHORIZED)),
            )
        with trio.move_on_after(_BUDGET_S):
            try:
                live = await state.store.pool.run(_live_roles, acquire_timeout_ms=_ACQUIRE_MS)
            except StoreError:
                pass
            else:
                ops.metrics.session_roles_live.set(live)
        return Response(ops.metrics.exposition(), media_type=CONTENT_TYPE)

    return [
        Route(HEALTHZ_PATH, healthz, methods=["GET"]),
        Route(READYZ_PATH, readyz, methods=["GET"]),
        Route(METRICS_PATH, metrics, methods=["GET"]),
    ]
