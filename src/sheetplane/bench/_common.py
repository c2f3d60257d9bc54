"""What the store and gateway benchmarks read and write: one company sheet."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

from .._types import ContractColumn, SheetContract
from ..gateway.server import RUNTIME_PATH
from ..store.embedded import EmbeddedPostgres, database_url_from_env

CONTRACT = SheetContract(
    (
        ContractColumn("id", "id", "input"),
        ContractColumn("name", "name", "input"),
        ContractColumn("domain", "domain", "input"),
        ContractColumn("employees", "employees", "input"),
        ContractColumn("score", "score", "output"),
    )
)


def make_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    """N distinct company rows, keyed by ``id`` (the rows ``start`` to ``start + n - 1``)."""
    return [
        {
            "id": f"c{i:07d}",
            "name": f"Company {i}",
            "domain": f"company-{i}.example",
            "employees": (i * 7919) % 10_000,
        }
        for i in range(start, start + n)
    ]


def on_postgres(run: Callable[[str], None]) -> int:
    """``run(url)`` on ``SHEETPLANE_DATABASE_URL``, else on a throwaway embedded server; 0."""
    url = database_url_from_env()
    if url is not None:
        run(url)
        return 0
    with EmbeddedPostgres() as server:
        run(server.url)
    return 0


async def post_over_socket(base_url: str, token: str, fields: dict[str, Any]) -> int:
    """POST ``fields`` to the runtime route over a bare socket; the answer's status.

    No client object outlives the answer (httpx keeps each request, its body
    too, in a reference cycle, which would hide the gateway's own), and the
    body goes as soon as it is sent."""
    body = json.dumps(fields).encode()
    host, _, port = base_url.removeprefix("http://").partition(":")
    head = (
        f"POST {RUNTIME_PATH} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {token}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(head.encode() + body)
        del body
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    return int(answer.split(b" ", 2)[1])
