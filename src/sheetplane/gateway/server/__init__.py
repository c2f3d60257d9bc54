"""The reference runtime gateway: an ASGI app (Starlette) served by Hypercorn's trio worker.

``create_app(config)`` builds the app; ``running_gateway(...)`` runs it
in-process on loopback (tests, the demo, benchmarks); ``serve(...)`` runs it
until shut down (``sheetplane serve``). ``docs/gateway.md`` lists every
action, its input, its answer and its errors.
"""

from __future__ import annotations

from ._actions import GatewayState as GatewayState
from ._actions import mint_preloaded_session as mint_preloaded_session
from ._app import RUNTIME_PATH as RUNTIME_PATH
from ._app import create_app as create_app
from ._auth import TokenTable as TokenTable
from ._auth import parse_token_pairs as parse_token_pairs
from ._command import add_serve_parser as add_serve_parser
from ._config import GatewayConfig as GatewayConfig
from ._hardening import hardening_statements as hardening_statements
from ._logs import JsonFormatter as JsonFormatter
from ._roles import ROLE_PREFIX as ROLE_PREFIX
from ._roles import org_session_backends as org_session_backends
from ._serve import RunningGateway as RunningGateway
from ._serve import running_gateway as running_gateway
from ._serve import serve as serve
from ._watchdog import reap_expired_roles as reap_expired_roles

__all__ = [
    "ROLE_PREFIX",
    "RUNTIME_PATH",
    "GatewayConfig",
    "GatewayState",
    "JsonFormatter",
    "RunningGateway",
    "TokenTable",
    "add_serve_parser",
    "create_app",
    "hardening_statements",
    "mint_preloaded_session",
    "org_session_backends",
    "parse_token_pairs",
    "reap_expired_roles",
    "running_gateway",
    "serve",
]
