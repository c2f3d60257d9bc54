"""Connections that name no tenant get one share, and a 401 closes its connection
(third tenancy pass, finding 3)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.gateway.server._serve import ServeOptions
from sheetplane.gateway.server._shares import TenantCaps

TOKEN_B, ORG_B = "tok-anon-b-51c7", "org-anon-b"
#: A gateway of four connection slots: an org's (and the anonymous) share is two.
SLOTS = 4


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(
        database_url,
        tokens={TOKEN_B: ORG_B},
        serve_options=ServeOptions(max_connections=SLOTS),
    ) as gw:
        yield gw


async def keep_alive_request(port: int, head: str) -> tuple[trio.SocketStream, bytes]:
    """A connection that sent ``head`` (keep-alive) and read the answer's first bytes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(head.encode())
    return stream, await stream.receive_some()


async def closed_by_server(stream: trio.SocketStream) -> bool:
    """Whether the server closes ``stream`` (within a few seconds) rather than keeping it."""
    with trio.move_on_after(3):
        try:
            while await stream.receive_some():
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


def port_of(gw: RunningGateway) -> int:
    return int(gw.base_url.rsplit(":", 1)[1])


async def test_keep_alive_sockets_naming_no_tenant_cannot_hold_every_slot(
    gateway: RunningGateway,
) -> None:
    """Keep-alive sockets asking only ``GET /healthz`` (each request restarting the
    server's idle timer) were never counted: as many as the gateway has slots held
    org-b's request until they stopped. They share one anonymous tenant with an
    org's share now: past it they are answered 429 and closed, and org-b is served."""
    caps = TenantCaps.for_server(SLOTS)
    assert caps.connections_per_org == 2
    head = "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    answers: list[bytes] = []
    streams: list[trio.SocketStream] = []
    try:
        for _ in range(SLOTS):
            stream, answer = await keep_alive_request(port_of(gateway), head)
            streams.append(stream)
            answers.append(answer)
        statuses = [answer.split(b" ", 2)[1] for answer in answers]
        assert statuses == [b"200", b"200", b"429", b"429"], answers
        assert b"connection: close" in answers[2].lower()
        with trio.fail_after(5):  # before, held until the sockets stopped asking
            async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as http:
                response = await http.post(
                    RUNTIME_PATH,
                    json={"action": "resolve_play", "playRef": "no-such-play"},
                    headers={"authorization": f"Bearer {TOKEN_B}"},
                )
        assert response.status_code == 200, response.text
    finally:
        for stream in streams:
            await stream.aclose()


async def test_a_request_answered_401_has_its_connection_closed(
    gateway: RunningGateway,
) -> None:
    """A keep-alive runtime request with an unknown token was answered 401 and its
    connection kept, so it could ask again and again; now it is closed."""
    body = b'{"action":"resolve_play","playRef":"x"}'
    head = (
        f"POST {RUNTIME_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer no-such\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    stream, answer = await keep_alive_request(port_of(gateway), head + body.decode())
    try:
        assert answer.startswith(b"HTTP/1.1 401 "), answer
        assert b"connection: close" in answer.lower()
        assert await closed_by_server(stream)
    finally:
        await stream.aclose()
