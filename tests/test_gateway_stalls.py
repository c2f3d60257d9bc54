"""Hostile clients that stall, against a real ``sheetplane serve`` on real sockets:
a stalled body is answered 408 and its connection closed, idle and silent
connections close, and connections past the cap wait until one closes."""

from __future__ import annotations

from pathlib import Path

import trio

from _serve_helpers import secret_file_options, serving
from sheetplane.gateway.server import RUNTIME_PATH

TOKEN = "tok-stall-1c2d3e4f"
#: How long a test waits for the server to act on a stalled connection.
DEADLINE_S = 30


def _secrets(tmp_path: Path, database_url: str) -> list[str]:
    return secret_file_options(tmp_path, database_url, {TOKEN: "org-stall"})


def stalled_post(declared: int = 100, sent: int = 10) -> bytes:
    """A request head promising ``declared`` body bytes, and only ``sent`` of them."""
    head = (
        f"POST {RUNTIME_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\n"
        f"content-length: {declared}\r\n\r\n"
    )
    return head.encode() + b"{" * sent


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while True:
        try:
            chunk = await stream.receive_some()
        except trio.BrokenResourceError:
            return data  # reset by the server: closed all the same
        if not chunk:
            return data
        data += chunk


async def test_a_stalled_body_is_answered_408_and_its_connection_closed(
    database_url: str, tmp_path: Path
) -> None:
    async with serving(
        *_secrets(tmp_path, database_url), "--body-read-timeout-ms", "1000", tmp_path=tmp_path
    ) as served:
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        async with stream:
            await stream.send_all(stalled_post())
            with trio.fail_after(DEADLINE_S):
                answer = await read_to_eof(stream)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b'"code":"request_timeout"' in answer
        assert b"connection: close" in answer.lower()
    assert any(r.get("event") == "request" and r["status"] == 408 for r in served.log_records())


async def test_idle_silent_and_half_sent_connections_are_closed(
    database_url: str, tmp_path: Path
) -> None:
    async with serving(
        *_secrets(tmp_path, database_url), "--keep-alive-timeout-ms", "500", tmp_path=tmp_path
    ) as served:

        async def closed_by_server(first: bytes) -> bytes:
            stream = await trio.open_tcp_stream("127.0.0.1", served.port)
            async with stream:
                if first:
                    await stream.send_all(first)
                with trio.fail_after(DEADLINE_S):
                    return await read_to_eof(stream)

        # Silent: never sends a byte.
        assert await closed_by_server(b"") == b""
        # A request head that never ends.
        assert await closed_by_server(b"GET /healthz HTTP/1.1\r\nhost: x\r\n") == b""
        # A keep-alive connection, idle after its one answer.
        answered = await closed_by_server(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert answered.startswith(b"HTTP/1.1 200 ")


async def test_connections_past_the_cap_wait_until_stalled_ones_are_closed(
    database_url: str, tmp_path: Path
) -> None:
    cap, stalled_count = 4, 12
    async with serving(
        *_secrets(tmp_path, database_url),
        "--max-http-connections",
        str(cap),
        "--body-read-timeout-ms",
        "1000",
        "--keep-alive-timeout-ms",
        "60000",
        tmp_path=tmp_path,
    ) as served:
        answers: list[bytes] = []
        all_sent = trio.Event()
        sent = 0

        async def stall() -> None:
            nonlocal sent
            stream = await trio.open_tcp_stream("127.0.0.1", served.port)
            async with stream:
                await stream.send_all(stalled_post())
                sent += 1
                if sent == stalled_count:
                    all_sent.set()
                answers.append(await read_to_eof(stream))

        with trio.fail_after(DEADLINE_S):
            async with trio.open_nursery() as nursery:
                for _ in range(stalled_count):
                    nursery.start_soon(stall)
                await all_sent.wait()
                stream = await trio.open_tcp_stream("127.0.0.1", served.port)
                async with stream:
                    await stream.send_all(
                        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                    )
                    probe = await read_to_eof(stream)
        assert len(answers) == stalled_count
        assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers)
        assert probe.startswith(b"HTTP/1.1 200 ")
    # The server wrote its access lines in order: the probe was served only
    # after stalled connections had been answered 408 and closed.
    statuses = [r["status"] for r in served.log_records() if r.get("event") == "request"]
    assert statuses.index(200) >= cap
    assert statuses.count(408) == stalled_count
