"""A connection's slot is given back when its client has gone, not when the
server's keep-alive timer for it runs out (issue 32: the other tenant's first
request under slow sockets waited about 2 s for slots that closed keep-alive
connections of its own earlier requests still held)."""

from __future__ import annotations

import httpx
import trio

from sheetplane.gateway.server import running_gateway
from sheetplane.gateway.server._serve import ServeOptions

TOKEN, ORG = "tok-slots-7d41", "org-slots"
#: Long enough that a slot held for it cannot pass for one given back at once.
KEEP_ALIVE_MS = 60_000
#: A probe served within this was served from a slot given back, not timed out.
PROBE_DEADLINE_S = KEEP_ALIVE_MS / 1000 / 3


async def probe(port: int) -> bytes:
    """One ``GET /healthz`` on a new connection (``connection: close``): the answer."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    return answer


async def test_a_connection_its_client_closed_gives_its_slot_back_at_once(
    database_url: str,
) -> None:
    """One slot. A client opens a connection and closes it without a request, then
    another keeps a connection alive after its answer and closes it: each time the
    next connection is served at once. Before, Hypercorn's connection task waited
    out its keep-alive timer after a close that found it idle, holding the slot:
    the probe after the silent connection waited the whole 60 s."""
    options = ServeOptions(max_connections=1, keep_alive_timeout_ms=KEEP_ALIVE_MS)
    async with running_gateway(database_url, tokens={TOKEN: ORG}, serve_options=options) as gw:
        port = int(gw.base_url.rsplit(":", 1)[1])
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        await silent.aclose()
        with trio.fail_after(PROBE_DEADLINE_S):
            assert (await probe(port)).startswith(b"HTTP/1.1 200 ")
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as http:
            kept = await http.get("/healthz")  # a keep-alive connection, idle after this
        assert kept.status_code == 200
        assert kept.headers.get("connection") != "close"
        with trio.fail_after(PROBE_DEADLINE_S):
            assert (await probe(port)).startswith(b"HTTP/1.1 200 ")
