"""Serving the reference gateway with Hypercorn's trio worker.

:func:`running_gateway` runs it inside the caller's trio run (tests, the
demo, benchmarks); :func:`serve` runs it until a shutdown trigger fires
(``sheetplane serve``). Both bind before they report the address, so the
port a caller sees is the port that is listening: Hypercorn's
``task_status.started`` hands back the bound addresses, read from the
listening socket itself, which is how port 0 resolves.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, cast

import attrs
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.typing import ASGIFramework
from starlette.applications import Starlette

from ..._types import SheetContract
from ._actions import GatewayState, mint_preloaded_session
from ._app import create_app, gateway_state
from ._config import GatewayConfig

__all__ = ["RunningGateway", "hypercorn_config", "running_gateway", "serve"]


def hypercorn_config(host: str, port: int) -> HypercornConfig:
    """Hypercorn settings for the gateway: one plain-HTTP bind, no access log."""
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


async def serve(
    config: GatewayConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway until ``shutdown_trigger`` returns (or the task is cancelled).

    ``task_status.started`` receives the base URL (``http://HOST:PORT``) once
    the socket listens and the lifespan (store, reaper) has started.
    """
    app = create_app(config)
    await _serve_app(app, host, port, shutdown_trigger, task_status)


async def _serve_app(
    app: Starlette,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    task_status: trio.TaskStatus[str],
) -> None:
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            partial(
                hypercorn.trio.serve,
                cast(ASGIFramework, app),
                hypercorn_config(host, port),
                shutdown_trigger=shutdown_trigger,
            )
        )
        task_status.started(binds[0])


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
        logical_table: str = "sheet_rows",
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
    **options: Any,
) -> AsyncIterator[RunningGateway]:
    """Run the reference gateway in this trio run while the block lasts.

    Binds ``host:port`` (default ``127.0.0.1`` and a free port) and yields a
    :class:`RunningGateway` once it accepts requests. ``options`` are further
    :class:`GatewayConfig` fields (``max_connections``, ``unwrap_key``,
    ``allow_plain_session_urls``...). Leaving the block shuts the server down
    gracefully (in-flight requests get Hypercorn's graceful timeout), stops
    the reaper and closes the pool. If the block is cancelled, so is the server.
    """
    config = GatewayConfig(
        database_url=database_url,
        tokens=dict(tokens),
        allow_test_faults=allow_test_faults,
        legacy=legacy,
        **options,
    )
    app = create_app(config)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        base_url: str = await nursery.start(_serve_app, app, host, port, stop.wait)
        try:
            yield RunningGateway(base_url=base_url, app=app, config=config)
        finally:
            stop.set()
