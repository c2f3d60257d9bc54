"""Each tenant's share of one gateway process: requests in flight and connections,
per token and per org, decided as soon as a request's head is read.

A connection slot is the gateway's scarcest resource (``ServeOptions.max_connections``):
a request whose body stalls holds one until the body timeout. Without a
share, one org's stalled sockets (a valid token is all it takes) held every
slot and another org's requests waited in the listen backlog for tens of
seconds. :class:`TenantSharesMiddleware` runs before the app reads the body:
it names the request's token and org from its ``authorization`` header
(a runtime request with an unknown or missing token is answered 401 there,
with ``connection: close``), and when the token or the org already holds its
cap of requests in flight, or of connections,
it answers 429 ``gateway_tenant_cap`` with ``retry_after_ms`` and
``connection: close`` without reading the body, so the refused connection's
slot is free at once. A connection counts for the tenant of its first request
until it closes (the accept loop tells :meth:`TenantShares.closed`).

Every other request (``/healthz``, ``/metrics``, any other path) names no
tenant: all of them share one anonymous tenant with one org's caps, so
keep-alive sockets that only ask for health (each request restarting the
server's idle timer) cannot hold every slot either. A request head that is
never completed names no tenant: it is bounded by the head timeout
(``keep_alive_timeout_ms``) and the connection cap alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

import attrs
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ..._checks import positive_field as _positive
from ...budgets import (
    GATEWAY_MAX_CONNECTIONS_PER_ORG,
    GATEWAY_MAX_CONNECTIONS_PER_TOKEN,
    GATEWAY_MAX_REQUESTS_PER_ORG,
    GATEWAY_MAX_REQUESTS_PER_TOKEN,
    GATEWAY_TENANT_RETRY_AFTER_MS,
)
from ...protocol import RUNTIME_PATH, Code, error_body
from ._auth import TokenTable
from ._http import ActionError, encode_json, send_json

__all__ = ["TenantCaps", "TenantShares", "TenantSharesMiddleware", "connection_of"]

#: A connection: the peer's address as the socket reports it (host, port).
ConnectionId = tuple[Any, ...]


@attrs.frozen
class TenantCaps:
    """What one token and one org may hold of one gateway process (from ``budgets``)."""

    requests_per_token: int = attrs.field(
        default=GATEWAY_MAX_REQUESTS_PER_TOKEN, validator=_positive
    )
    requests_per_org: int = attrs.field(default=GATEWAY_MAX_REQUESTS_PER_ORG, validator=_positive)
    connections_per_token: int = attrs.field(
        default=GATEWAY_MAX_CONNECTIONS_PER_TOKEN, validator=_positive
    )
    connections_per_org: int = attrs.field(
        default=GATEWAY_MAX_CONNECTIONS_PER_ORG, validator=_positive
    )

    @classmethod
    def for_server(cls, max_connections: int) -> TenantCaps:
        """The shares of a process serving ``max_connections`` at once, by the same
        arithmetic as the budgets' (which are these for ``GATEWAY_MAX_CONNECTIONS``)."""
        requests_per_org = max(1, max_connections // 4)
        connections_per_org = max(1, max_connections // 2)
        return cls(
            requests_per_token=max(1, requests_per_org // 2),
            requests_per_org=requests_per_org,
            connections_per_token=max(1, connections_per_org // 2),
            connections_per_org=connections_per_org,
        )


_ORG: Final = "org"
_TOKEN: Final = "token"
#: The one tenant of every request that names none (no runtime token, or an
#: unknown one, or another path such as ``/healthz``): it gets one org's share.
_ANONYMOUS: Final = ("anonymous", "")

#: A tenant's counter keys: (kind, name) per share it draws on.
Keys = tuple[tuple[str, str], ...]


@attrs.define(eq=False)
class TenantShares:
    """Counts of requests in flight and open connections, by org and by token id
    (and one anonymous tenant for requests that name none)."""

    caps: TenantCaps = attrs.Factory(TenantCaps)
    configured: bool = False
    """Whether ``caps`` were configured; else the server derives them from its
    connection cap (``TenantCaps.for_server``)."""
    requests: Counter[tuple[str, str]] = attrs.Factory(Counter)
    connections: Counter[tuple[str, str]] = attrs.Factory(Counter)
    _owners: dict[ConnectionId, Keys] = attrs.Factory(dict)
    refused: int = 0
    """Requests refused 429 so far."""

    def admit(self, connection: ConnectionId | None, org: str, token: str) -> str | None:
        """Count one request of ``token`` (of ``org``) on ``connection`` in flight; or,
        past a cap, count nothing and return what is full."""
        caps = self.caps
        return self._admit(
            connection,
            ((_ORG, org), (_TOKEN, token)),
            (caps.connections_per_org, caps.connections_per_token),
            (caps.requests_per_org, caps.requests_per_token),
        )

    def admit_anonymous(self, connection: ConnectionId | None) -> str | None:
        """As :meth:`admit`, for a request that names no tenant: all such requests
        share one org's caps."""
        caps = self.caps
        return self._admit(
            connection, (_ANONYMOUS,), (caps.connections_per_org,), (caps.requests_per_org,)
        )

    def _admit(
        self,
        connection: ConnectionId | None,
        keys: Keys,
        connection_caps: tuple[int, ...],
        request_caps: tuple[int, ...],
    ) -> str | None:
        new_connection = connection is not None and connection not in self._owners
        if new_connection:
            for (kind, name), cap in zip(keys, connection_caps, strict=True):
                if self.connections[(kind, name)] >= cap:
                    self.refused += 1
                    return f"this {kind} already holds {cap} connections (its share)"
        for (kind, name), cap in zip(keys, request_caps, strict=True):
            if self.requests[(kind, name)] >= cap:
                self.refused += 1
                return f"this {kind} already has {cap} requests in flight (its share)"
        if new_connection:
            assert connection is not None
            self._owners[connection] = keys
            for key in keys:
                self.connections[key] += 1
        for key in keys:
            self.requests[key] += 1
        return None

    def done(self, org: str, token: str) -> None:
        """One admitted request of ``token`` was answered (or ended)."""
        self._done(((_ORG, org), (_TOKEN, token)))

    def done_anonymous(self) -> None:
        """One admitted request that named no tenant was answered (or ended)."""
        self._done((_ANONYMOUS,))

    def _done(self, keys: Keys) -> None:
        for key in keys:
            self.requests[key] -= 1
            if self.requests[key] <= 0:
                del self.requests[key]

    def closed(self, connection: ConnectionId) -> None:
        """``connection`` closed: its tenant holds one connection fewer."""
        for key in self._owners.pop(connection, ()):
            self.connections[key] -= 1
            if self.connections[key] <= 0:
                del self.connections[key]


_CLOSE: Final = (b"connection", b"close")


def _refusal(message: str) -> bytes:
    return encode_json(
        error_body(message, Code.TENANT_CAP, retry_after_ms=GATEWAY_TENANT_RETRY_AFTER_MS)
    )


class TenantSharesMiddleware:
    """Refuses a runtime request past its tenant's share before its body is read."""

    def __init__(self, app: ASGIApp, shares: TenantShares, tokens: TokenTable) -> None:
        self.app = app
        self.shares = shares
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        connection = connection_of(scope.get("client"))
        identified: tuple[str, str] | None = None
        if scope.get("path") == RUNTIME_PATH:
            try:
                identified = self.tokens.identify(Headers(scope=scope).get("authorization"))
            except ActionError as exc:
                # 401, and the connection closes: a socket that names no tenant
                # cannot keep its slot by asking again.
                await send_json(send, exc.status, encode_json(exc.body()), _CLOSE)
                return
        if identified is None:
            refused = self.shares.admit_anonymous(connection)
        else:
            refused = self.shares.admit(connection, *identified)
        if refused is not None:
            await send_json(send, 429, _refusal(refused), _CLOSE)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            if identified is None:
                self.shares.done_anonymous()
            else:
                self.shares.done(*identified)


def connection_of(peer: object) -> ConnectionId | None:
    """The connection id the middleware keys on, from a socket's peer name or an ASGI
    scope's ``client``: its host and port (an IPv6 name's flow info and scope id dropped)."""
    if isinstance(peer, tuple | list) and len(peer) >= 2:
        return (peer[0], peer[1])
    return None
