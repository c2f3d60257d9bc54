"""Budgets, not only shapes: checks that take real time, each within a stated limit.

A body over the 16 MiB transport ceiling and a body that stalls are sent
over a raw socket (an HTTP client would insist on sending the whole body
before it reads an answer, and would not send a body it cannot finish), so
the check sees exactly when the gateway answers or closes. These checks are
``slow`` and skipped under ``--quick``.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Final
from urllib.parse import urlsplit

from ..budgets import READ_BATCH_MAX_PAGES, TRANSPORT_CEILING_BYTES, KiB, MiB
from ._checks_seed import READ_BATCH_TOO_LARGE, too_large_ok
from ._context import Admitted, CheckFailed, Context, check, expect
from ._http import RUNTIME_PATH

__all__ = ["big_sheet", "raw_exchange"]

#: What the body checks send of a body before they wait for the answer.
SENT_PREFIX_BYTES: Final = 64 * KiB
#: Rows of the big sheet and the label size of each: four pages of all of them
#: hold 4 * 4 * (1 MiB + framing), past the 12 MiB response budget.
BIG_ROWS: Final = 4
BIG_LABEL_BYTES: Final = MiB


def big_sheet(ctx: Context) -> Admitted:
    """A sheet of four rows of 1 MiB each (admitted once per run)."""
    if ctx.big is None:
        rows = [{"n": n, "label": f"{n}:" + "x" * BIG_LABEL_BYTES} for n in range(BIG_ROWS)]
        ctx.big = ctx.admit(ctx.namespace("big"), rows, ctx.name("run"))
    return ctx.big


def raw_exchange(
    base_url: str, head: bytes, body_prefix: bytes, limit_ms: int
) -> tuple[bytes, float, bool]:
    """Send ``head`` and ``body_prefix`` to the gateway, then read until it answers or closes.

    Returns ``(what came back, seconds until then, closed)``; stops reading at
    ``limit_ms`` (what came back is then whatever arrived, maybe nothing).
    """
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    start = time.monotonic()
    deadline = start + limit_ms / 1000
    raw = socket.create_connection((host, port), timeout=limit_ms / 1000)
    sock: socket.socket = raw
    if parts.scheme == "https":
        sock = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
    received = b""
    closed = False
    try:
        try:
            sock.sendall(head + body_prefix)
        except OSError:
            closed = True
        while not closed and b"\r\n\r\n" not in received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    finally:
        sock.close()
    return received, time.monotonic() - start, closed


def _head(ctx: Context, content_length: int) -> bytes:
    parts = urlsplit(ctx.wire.base_url)
    path = parts.path.rstrip("/") + RUNTIME_PATH
    lines = [
        f"POST {path} HTTP/1.1",
        f"host: {parts.netloc}",
        f"authorization: Bearer {ctx.wire.token}",
        "content-type: application/json",
        f"content-length: {content_length}",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1")


def _status(received: bytes) -> int | None:
    line = received.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") else None


def _body_prefix(ctx: Context) -> bytes:
    namespace = ctx.namespace("ceiling")
    opening = (
        f'{{"action":"ensure_sheet","playName":"{ctx.wire.play_name}",'
        f'"tableNamespace":"{namespace}","pad":"'
    ).encode()
    return opening + b"x" * (SENT_PREFIX_BYTES - len(opening))


@check("SP-BUDGET-1")
def batch_budget(ctx: Context) -> None:
    sheet = big_sheet(ctx)
    start = time.monotonic()
    answer = ctx.read_batch(sheet.namespace, [(50, 0)] * READ_BATCH_MAX_PAGES)
    seconds = time.monotonic() - start
    expect(
        too_large_ok(answer),
        f"413 {READ_BATCH_TOO_LARGE} with observed_bytes for four pages of ~4 MiB each",
        answer,
    )
    expect(
        seconds * 1000 <= ctx.budget_limit_ms,
        f"the refusal within {ctx.budget_limit_ms} ms (took {seconds * 1000:.0f} ms)",
        answer,
    )


@check("SP-BUDGET-2")
def body_over_ceiling(ctx: Context) -> None:
    declared = TRANSPORT_CEILING_BYTES + 1
    received, seconds, closed = raw_exchange(
        ctx.wire.base_url, _head(ctx, declared), _body_prefix(ctx), ctx.budget_limit_ms
    )
    request = (
        f"request: POST {RUNTIME_PATH} content-length {declared}, {SENT_PREFIX_BYTES} bytes sent"
    )
    status = _status(received)
    if status == 413:
        return
    if status is None and not closed:
        raise CheckFailed(
            f"413 within {ctx.budget_limit_ms} ms, before the rest of the body was sent",
            detail=f"{request}; answer: nothing within {seconds * 1000:.0f} ms "
            "(the gateway waits for the whole body)",
        )
    shown = received[:200].decode("latin-1") if received else "the connection closed unanswered"
    raise CheckFailed(
        "413 for a body declared over 16 MiB",
        detail=f"{request}; answer after {seconds * 1000:.0f} ms: {shown!r}",
    )


@check("SP-BUDGET-3")
def stalled_body(ctx: Context) -> None:
    body = _body_prefix(ctx)[:16]
    # Wait past the limit by a margin, so a gateway that closes right at it passes.
    wait_ms = ctx.stall_limit_ms + ctx.stall_limit_ms // 10
    received, seconds, closed = raw_exchange(ctx.wire.base_url, _head(ctx, 1024), body, wait_ms)
    request = (
        f"request: POST {RUNTIME_PATH} content-length 1024, {len(body)} bytes sent, then silence"
    )
    if _status(received) is None and not closed:
        raise CheckFailed(
            f"the stalled request answered or closed within {ctx.stall_limit_ms} ms",
            detail=f"{request}; answer: still open after {seconds * 1000:.0f} ms",
        )
