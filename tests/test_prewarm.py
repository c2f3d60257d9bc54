"""Prewarming preloaded sessions against a real Postgres behind a tiny TCP proxy that
resets the first connections: retried on the prewarm ladder with the pool dropped
between tries, and a failure that names the session, never its URL."""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import attrs
import psycopg
import pytest
import trio

from _session_helpers import aad_of
from sheetplane import SessionPrewarmError, crypto
from sheetplane.budgets import POSTGRES_PREWARM_MAX_ATTEMPTS, POSTGRES_PREWARM_RETRY_DELAYS_MS
from sheetplane.gateway.server import RunningGateway, running_gateway
from sheetplane.runtime import open_runtime
from sheetplane.sessions import PreloadedSession

UNWRAP_KEY = os.urandom(32)
TOKEN = "tok-prewarm-5d6e7f80"
ORG, PLAY, NAMESPACE = "org-prewarm", "play-prewarm", "ns-prewarm"


@attrs.define
class RefusingProxy:
    """Forwards TCP to Postgres, but resets the first ``refusals`` connections."""

    upstream: tuple[str, int]
    refusals: int
    port: int = 0
    attempts: list[float] = attrs.Factory(list)

    async def handle(self, stream: trio.SocketStream) -> None:
        self.attempts.append(time.monotonic())
        if self.refusals > 0:
            self.refusals -= 1
            # SO_LINGER 0: close with a reset, the way a restarting server drops you.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await stream.aclose()
            return
        async with stream, await trio.open_tcp_stream(*self.upstream) as upstream:

            async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
                try:
                    while data := await source.receive_some(65536):
                        await sink.send_all(data)
                except trio.BrokenResourceError:
                    pass
                await sink.send_eof()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, stream, upstream)
                nursery.start_soon(pump, upstream, stream)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}, unwrap_key=UNWRAP_KEY) as gw:
        yield gw


async def proxied_session(
    gateway: RunningGateway, nursery: trio.Nursery, proxy: RefusingProxy, *, password: str = ""
) -> PreloadedSession:
    """A preloaded session whose URL goes through ``proxy`` (resealed under the unwrap key)."""
    answer = await gateway.mint_preloaded_session(
        org_id=ORG, play_name=PLAY, table_namespace=NAMESPACE, operations=["rows.read"]
    )
    aad = aad_of(answer)
    url = crypto.decrypt_with_unwrap_key(answer["encryptedPostgresUrl"], UNWRAP_KEY, aad)
    params = psycopg.conninfo.conninfo_to_dict(url)
    proxy.upstream = (str(params["host"]), int(str(params["port"])))
    listeners = await nursery.start(partial(trio.serve_tcp, proxy.handle, 0, host="127.0.0.1"))
    proxy.port = listeners[0].socket.getsockname()[1]
    params.update(host="127.0.0.1", port=proxy.port, **({"password": password} if password else {}))
    proxied = psycopg.conninfo.make_conninfo(**params)
    sealed = {
        **answer,
        "encryptedPostgresUrl": crypto.encrypt_with_unwrap_key(proxied, UNWRAP_KEY, aad),
    }
    return PreloadedSession(table_namespace=NAMESPACE, operations=("rows.read",), session=sealed)


def runtime_on(gateway: RunningGateway, session: PreloadedSession, **options: Any) -> Any:
    return open_runtime(
        base_url=gateway.base_url,
        token=TOKEN,
        org_id=ORG,
        play_name=PLAY,
        run_id="run-1",
        preloaded_sessions=[session],
        unwrap_key=UNWRAP_KEY,
        **options,
    )


def ladder_gaps(attempts: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(attempts)]


async def test_two_refused_connections_are_retried_on_the_prewarm_ladder(
    gateway: RunningGateway,
) -> None:
    proxy = RefusingProxy(("", 0), refusals=2)
    async with trio.open_nursery() as nursery:
        session = await proxied_session(gateway, nursery, proxy)
        async with runtime_on(gateway, session) as rt:
            # Two resets, then the try that got through (its probe and its pool's connection).
            assert proxy.refusals == 0 and len(proxy.attempts) >= 3
            minted_before = rt.stats().sessions_minted
            assert await rt.dataset(NAMESPACE).count() == 0  # served by the preloaded session
            assert rt.stats().sessions_minted == minted_before == 0
        gaps = ladder_gaps(proxy.attempts[:3])
        for gap, rung in zip(gaps, POSTGRES_PREWARM_RETRY_DELAYS_MS, strict=False):
            assert gap >= rung / 1000
        nursery.cancel_scope.cancel()


async def test_a_postgres_that_keeps_refusing_fails_naming_the_session_not_its_url(
    gateway: RunningGateway,
) -> None:
    proxy = RefusingProxy(("", 0), refusals=100)
    async with trio.open_nursery() as nursery:
        session = await proxied_session(gateway, nursery, proxy)
        with pytest.raises(SessionPrewarmError) as caught:
            async with runtime_on(gateway, session):
                raise AssertionError("the block must not start")
        nursery.cancel_scope.cancel()
    assert len(proxy.attempts) == POSTGRES_PREWARM_MAX_ATTEMPTS
    text = f"{caught.value} {caught.value.__cause__}"
    assert f"namespace={NAMESPACE!r}" in text and f"org={ORG!r}" in text
    assert f"after {POSTGRES_PREWARM_MAX_ATTEMPTS} attempt(s)" in text
    assert "postgresql://" not in text and "password" not in text


async def test_a_non_transient_error_is_not_retried(gateway: RunningGateway) -> None:
    proxy = RefusingProxy(("", 0), refusals=0)
    async with trio.open_nursery() as nursery:
        session = await proxied_session(gateway, nursery, proxy, password="wrong-password-123")
        with pytest.raises(SessionPrewarmError, match=r"after 1 attempt\(s\)") as caught:
            async with runtime_on(gateway, session):
                raise AssertionError("the block must not start")
        nursery.cancel_scope.cancel()
    assert len(proxy.attempts) == 1
    assert "wrong-password-123" not in f"{caught.value} {caught.value.__cause__}"


async def test_prewarm_false_opens_nothing_before_the_block(gateway: RunningGateway) -> None:
    proxy = RefusingProxy(("", 0), refusals=0)
    async with trio.open_nursery() as nursery:
        session = await proxied_session(gateway, nursery, proxy)
        async with runtime_on(gateway, session, prewarm=False):
            assert proxy.attempts == []
        nursery.cancel_scope.cancel()


async def test_prewarm_leaves_no_pool_open_for_the_run(gateway: RunningGateway) -> None:
    """A stated difference (docs/parity.md): the runtime keeps the pool it prewarmed
    for the session's first use; sheetplane checks the session and closes the pool,
    and the first use opens its own, so prewarming holds none of the org's
    connection budget between the check and that use."""
    proxy = RefusingProxy(("", 0), refusals=0)
    async with trio.open_nursery() as nursery:
        session = await proxied_session(gateway, nursery, proxy)
        async with runtime_on(gateway, session) as rt:
            checked = len(proxy.attempts)
            assert checked >= 1
            assert await rt.dataset(NAMESPACE).count() == 0  # on the preloaded session
            assert rt.stats().sessions_minted == 0
            assert len(proxy.attempts) > checked  # a new connection: none was kept
        nursery.cancel_scope.cancel()
