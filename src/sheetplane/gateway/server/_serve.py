"""Serving the reference gateway with Hypercorn's HTTP protocol on trio.

:func:`running_gateway` runs it inside the caller's trio run (tests, the
demo, benchmarks); :func:`serve` runs it until a shutdown trigger fires
(``sheetplane serve``). Both bind before they report the address, so the
port a caller sees is the port that is listening (port 0 resolves from the
bound socket).

The accept loop is the gateway's own (Hypercorn's ``TCPServer`` serves each
connection), because Hypercorn has no connection cap and no drain that
answers requests: at most ``ServeOptions.max_connections`` connections are
served at once, further ones wait in the listen backlog; an idle keep-alive
connection (or one that never completes its request head) closes after
``keep_alive_timeout_ms``, and one that sends nothing at all for
``read_timeout_ms``. A connection gives its slot back as soon as its client
has gone (end of stream, a reset) or the server closed it, and no request of it
still runs: each connection has its own Hypercorn worker context, whose
``terminated`` event that end sets (``_ConnectionStream``); without it a client
that closed an idle connection left the slot held for the rest of the
keep-alive timer. When the shutdown trigger fires the gateway drains:

1. new requests on open connections are answered 503 ``gateway_draining``
   with ``retry_after_ms`` and ``connection: close`` (``Operations``);
2. the listener closes: no new connection is accepted (connections still in
   the backlog are reset; their clients retry, on another worker);
3. requests in flight get ``drain_budget_ms`` to finish;
4. then every connection closes, what is still running is cancelled
   (``Operations.cancelled`` counts it: the command exits non-zero), and the
   lifespan ends (reaper, pool).
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import attrs
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState
from hypercorn.utils import LifespanFailureError, repr_socket_addr
from starlette.applications import Starlette

from ..._checks import positive_field as _positive
from ..._types import LogicalTable, SheetContract
from ...budgets import (
    GATEWAY_DRAIN_BUDGET_MS,
    GATEWAY_KEEP_ALIVE_TIMEOUT_MS,
    GATEWAY_LISTEN_BACKLOG,
    GATEWAY_MAX_CONNECTIONS,
    GATEWAY_READ_TIMEOUT_MS,
)
from ._actions import GatewayState, mint_preloaded_session
from ._app import create_app, gateway_state, startup_failure
from ._config import GatewayConfig
from ._logs import ClosedConnectionFilter, is_closed_connection
from ._ops import Operations
from ._shares import TenantCaps, connection_of

__all__ = [
    "RunningGateway",
    "ServeOptions",
    "bind_socket",
    "hypercorn_config",
    "running_gateway",
    "serve",
]

log = logging.getLogger("sheetplane.gateway.server")


@attrs.frozen
class ServeOptions:
    """How one gateway process serves HTTP (every default from ``budgets``)."""

    max_connections: int = attrs.field(default=GATEWAY_MAX_CONNECTIONS, validator=_positive)
    """Connections served at once; further ones wait in the listen backlog."""
    backlog: int = attrs.field(default=GATEWAY_LISTEN_BACKLOG, validator=_positive)
    """The listen backlog."""
    keep_alive_timeout_ms: int = attrs.field(
        default=GATEWAY_KEEP_ALIVE_TIMEOUT_MS, validator=_positive
    )
    """An idle connection (no request, or an incomplete request head) closes after this."""
    read_timeout_ms: int = attrs.field(default=GATEWAY_READ_TIMEOUT_MS, validator=_positive)
    """A connection that sends nothing for this long closes."""
    drain_budget_ms: int = attrs.field(default=GATEWAY_DRAIN_BUDGET_MS, validator=_positive)
    """After the shutdown trigger, in-flight requests get this long to finish."""
    reuse_port: bool = False
    """Bind with ``SO_REUSEPORT``: a second gateway may listen on the same port
    (a rolling restart starts the new process before draining the old)."""


def hypercorn_config(host: str, port: int, options: ServeOptions | None = None) -> HypercornConfig:
    """Hypercorn settings for the gateway: one plain-HTTP bind, no access log (the
    gateway writes its own), the keep-alive and read timeouts of ``options``."""
    options = options or ServeOptions()
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    errors = logging.getLogger("hypercorn.error")
    if not any(isinstance(f, ClosedConnectionFilter) for f in errors.filters):
        errors.addFilter(ClosedConnectionFilter())
    config.errorlog = errors
    config.keep_alive_timeout = options.keep_alive_timeout_ms / 1000
    config.read_timeout = math.ceil(options.read_timeout_ms / 1000)
    config.backlog = options.backlog
    config.graceful_timeout = options.drain_budget_ms / 1000
    return config


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound (not yet listening) TCP socket: ``SO_REUSEADDR``, ``TCP_NODELAY``, and
    ``SO_REUSEPORT`` when asked."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host.strip("[]"), port))
    except BaseException:
        sock.close()
        raise
    return sock


async def serve(
    config: GatewayConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    options: ServeOptions | None = None,
    ops: Operations | None = None,
    sock: socket.socket | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until ``shutdown_trigger`` returns (or the task is cancelled),
    then drain (module docstring).

    ``task_status.started`` receives the base URL (``http://HOST:PORT``) once
    the socket listens and the lifespan (store, reaper) has started. ``sock``
    is an already bound socket to serve instead of binding ``host:port`` (the
    workers of ``sheetplane serve --workers`` share one). ``ops`` receives the
    drain's outcome (``ops.cancelled``).
    """
    ops = ops if ops is not None else Operations()
    app = create_app(config, ops)
    await _serve_app(
        app, ops, host, port, shutdown_trigger, options or ServeOptions(), sock, task_status
    )


def _raise_startup_failure(app: Starlette, group: BaseExceptionGroup[BaseException]) -> None:
    """Raise the app's startup failure alone when ``group`` holds nothing else.

    The lifespan task's ``LifespanFailureError`` beside it says the same thing,
    so a caller who opened no nursery gets the one typed error (a refused
    database, say); any other group is left to propagate.
    """
    failure = startup_failure(app)
    if failure is None:
        return
    _, rest = group.split(lambda e: e is failure or isinstance(e, LifespanFailureError))
    if rest is None:
        raise failure from None


class _ConnectionStream:
    """One connection's stream as Hypercorn's ``TCPServer`` sees it, with a worker
    context of its own (``context``). When the client has gone (end of stream, a
    reset) or the server closes the connection:

    * it tells the tenant shares: Hypercorn's connection task may go on after
      that while a request of it still runs, and the connection would go on
      counting against its tenant;
    * it sets its context's ``terminated`` event. ``TCPServer`` stops reading at
      the end of the stream, then waits for its tasks before it closes the
      socket; its idle task (started when the connection opens and after each
      answer on a keep-alive connection) waits for ``keep_alive_timeout`` or for
      ``terminated``. Without the event a client that closed an idle connection
      left that task waiting out the rest of its timer, the connection's slot
      held for a socket nobody would use again. A request still running ends as
      it would, and no further request starts on the connection.
    """

    def __init__(self, stream: trio.SocketStream, ops: Operations, peer: Any) -> None:
        self._stream = stream
        self._ops = ops
        self._peer = peer
        self.context = WorkerContext(None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def _gone(self) -> None:
        if self._peer is not None:
            self._ops.tenants.closed(self._peer)
            self._peer = None
        await self.context.terminated.set()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self._gone()
            raise
        if not data:
            await self._gone()
        return data

    async def aclose(self) -> None:
        await self._gone()
        await self._stream.aclose()

    async def __aenter__(self) -> _ConnectionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@attrs.define(eq=False)
class _HypercornConnections:
    """Serves each accepted connection with Hypercorn's ``TCPServer`` under the
    connection's own worker context (``_ConnectionStream``); a drain sets every
    open one's ``terminated``, as Hypercorn's one shared context would be."""

    app: ASGIWrapper
    config: HypercornConfig
    state: ConnectionState
    ops: Operations
    open: set[_ConnectionStream] = attrs.Factory(set)

    async def __call__(self, stream: trio.SocketStream, peer: Any) -> None:
        connection = _ConnectionStream(stream, self.ops, peer)
        self.open.add(connection)
        try:
            # TCPServer is annotated for an SSLStream; it serves any trio stream
            # (one without ``do_handshake`` as plain HTTP).
            served = cast(Any, connection)
            await TCPServer(self.app, self.config, connection.context, self.state, served)
        finally:
            self.open.discard(connection)

    async def terminate(self) -> None:
        """The server drains: no open connection waits for, or starts, another request."""
        for connection in list(self.open):
            await connection.context.terminated.set()


#: Serves one accepted connection (its stream and its peer's connection id) to its end.
ConnectionServer = Callable[[trio.SocketStream, Any], Awaitable[None]]


async def _serve_connection(
    server: ConnectionServer,
    stream: trio.SocketStream,
    ops: Operations,
    slot: trio.CapacityLimiter,
    borrower: object,
) -> None:
    ops.metrics.connections_open.inc()
    try:
        peer = connection_of(stream.socket.getpeername())
    except OSError:
        peer = None  # reset before it was served: it never names a tenant
    try:
        await server(stream, peer)
    except Exception as exc:
        # One connection's failure ends that connection, never the server: when a
        # client keeps sending while Hypercorn closes the connection (a 408, say),
        # Hypercorn's own send of an error answer races its close and raises
        # trio.BusyResourceError out of its connection task.
        log.log(
            logging.INFO if is_closed_connection(exc) else logging.WARNING,
            "connection ended by %s",
            type(exc).__name__,
            extra={"event": "connection_error", "error": type(exc).__name__},
        )
    finally:
        if peer is not None:
            ops.tenants.closed(peer)  # idempotent: the stream may have said so first
        ops.metrics.connections_open.dec()
        slot.release_on_behalf_of(borrower)


async def _accept(
    listener: trio.SocketListener,
    server: ConnectionServer,
    ops: Operations,
    slots: trio.CapacityLimiter,
    connections: trio.Nursery,
) -> None:
    """Accept while a connection slot is free; the rest wait in the kernel's backlog."""
    while True:
        borrower = object()
        await slots.acquire_on_behalf_of(borrower)
        try:
            stream = await listener.accept()
        except BaseException:
            slots.release_on_behalf_of(borrower)
            raise
        connections.start_soon(_serve_connection, server, stream, ops, slots, borrower)


async def _serve_app(
    app: Starlette,
    ops: Operations,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    options: ServeOptions,
    sock: socket.socket | None,
    task_status: trio.TaskStatus[str],
) -> None:
    config = hypercorn_config(host, port, options)
    wrapped = ASGIWrapper(cast(ASGIFramework, app))
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    own_socket = sock is None
    if sock is None:
        sock = bind_socket(host, port, reuse_port=options.reuse_port)
    try:
        async with trio.open_nursery() as lifespan_nursery:
            await lifespan_nursery.start(lifespan.handle_lifespan)
            await lifespan.wait_for_startup()
            failure = startup_failure(app)
            if failure is not None:
                # Never listen for an app that did not start (a database the
                # gateway refuses, say): raise its own error, typed.
                raise failure
            sock.listen(options.backlog)
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            server = _HypercornConnections(wrapped, config, ConnectionState(lifespan_state), ops)
            slots = trio.CapacityLimiter(options.max_connections)
            if not ops.tenants.configured:
                ops.tenants.caps = TenantCaps.for_server(options.max_connections)
            async with trio.open_nursery() as connections:
                accepting = trio.CancelScope()
                accepted_all = trio.Event()

                async def accept_loop() -> None:
                    try:
                        with accepting:
                            await _accept(listener, server, ops, slots, connections)
                    finally:
                        accepted_all.set()

                connections.start_soon(accept_loop)
                bound = repr_socket_addr(sock.family, sock.getsockname())
                task_status.started(f"http://{bound}")
                if shutdown_trigger is None:
                    await trio.sleep_forever()
                else:
                    await shutdown_trigger()
                ops.begin_drain()
                accepting.cancel()
                await accepted_all.wait()
                await listener.aclose()
                log.info("draining", extra={"event": "drain", "in_flight": ops.in_flight})
                # Open connections stay open meanwhile: a request on one is
                # answered 503 with connection: close, which tells its client
                # to retry, where a closed connection would leave it guessing.
                with trio.move_on_after(options.drain_budget_ms / 1000):
                    await ops.wait_idle()
                await server.terminate()
                connections.cancel_scope.cancel()
            if ops.cancelled:
                log.error(
                    "drain budget of %d ms ran out: %d request(s) cancelled",
                    options.drain_budget_ms,
                    ops.cancelled,
                    extra={"event": "drain_incomplete", "cancelled": ops.cancelled},
                )
            else:
                log.info("drained", extra={"event": "drained"})
            await lifespan.wait_for_shutdown()
            lifespan_nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        _raise_startup_failure(app, group)
        raise
    finally:
        if own_socket:
            sock.close()


@attrs.frozen
class RunningGateway:
    """A gateway serving on loopback inside the current trio run."""

    base_url: str
    """``http://127.0.0.1:PORT``; the runtime route is ``base_url + RUNTIME_PATH``."""
    app: Starlette = attrs.field(repr=False)
    """The ASGI app."""
    config: GatewayConfig
    """Its configuration (secrets are not in the repr)."""

    @property
    def state(self) -> GatewayState:
        """The running state: store, fault schedule, reaper progress."""
        return gateway_state(self.app)

    async def mint_preloaded_session(
        self,
        *,
        org_id: str,
        play_name: str,
        table_namespace: str,
        operations: Sequence[str],
        logical_table: LogicalTable = "sheet_rows",
        limits: Mapping[str, int] | None = None,
        contract: SheetContract | None = None,
        ttl_ms: int | None = None,
    ) -> dict[str, Any]:
        """A session answer sealed under the gateway's unwrap key (see
        :func:`~sheetplane.gateway.server.mint_preloaded_session`)."""
        return await mint_preloaded_session(
            self.state,
            org_id=org_id,
            play_name=play_name,
            table_namespace=table_namespace,
            operations=operations,
            logical_table=logical_table,
            limits=limits,
            contract=contract,
            ttl_ms=ttl_ms,
        )


@asynccontextmanager
async def running_gateway(
    database_url: str,
    *,
    tokens: Mapping[str, str],
    allow_test_faults: bool = False,
    legacy: bool = False,
    host: str = "127.0.0.1",
    port: int = 0,
    serve_options: ServeOptions | None = None,
    **options: Any,
) -> AsyncIterator[RunningGateway]:
    """Run the reference gateway in this trio run while the block lasts.

    Binds ``host:port`` (default ``127.0.0.1`` and a free port) and yields a
    :class:`RunningGateway` once it accepts requests. ``options`` are further
    :class:`GatewayConfig` fields (``max_connections``, ``unwrap_key``,
    ``allow_plain_session_urls``...); ``serve_options`` the HTTP side. Leaving
    the block drains the server (in-flight requests get the drain budget),
    stops the reaper and closes the pool. If the block is cancelled, so is the server.
    """
    config = GatewayConfig(
        database_url=database_url,
        tokens=dict(tokens),
        allow_test_faults=allow_test_faults,
        legacy=legacy,
        **options,
    )
    ops = Operations()
    app = create_app(config, ops)
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            base_url: str = await nursery.start(
                _serve_app, app, ops, host, port, stop.wait, serve_options or ServeOptions(), None
            )
            try:
                yield RunningGateway(base_url=base_url, app=app, config=config)
            finally:
                stop.set()
    except BaseExceptionGroup as group:
        _raise_startup_failure(app, group)
        raise
