"""A fake gateway transport that plays a fault schedule, one fault per request.

Shared by the client-fault and budget-relation property suites. Each request
takes the next fault of the schedule (``ok`` once it runs out) and records
the virtual time it arrived at and its action.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import trio

from sheetplane.testing.strategies import transport_faults

#: The per-request faults, shared with ``sheetplane.testing`` (one copy).
faults = transport_faults()


def ok_body(body: dict[str, Any]) -> dict[str, Any]:
    """A well-formed answer to ``body``'s action."""
    if body["action"] == "runtime_sheet_read_rows_batch":
        return {
            "pages": [
                {"rows": [{"_key": f"k{p['offset']}"}], "limit": p["limit"], "offset": p["offset"]}
                for p in body["input"]["pages"]
            ]
        }
    if body["action"] == "runtime_sheet_read_rows":
        read = body["input"]
        return {
            "rows": [{"_key": f"k{read['offset']}"}],
            "limit": read["limit"],
            "offset": read["offset"],
        }
    return {"ok": True}


@attrs.define
class FaultTransport:
    """Plays ``schedule``; records ``(time, action, fault)`` per request."""

    schedule: list[tuple[Any, ...]]
    seen: list[tuple[float, str, tuple[Any, ...]]] = attrs.field(factory=list)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        fault = self.schedule[len(self.seen)] if len(self.seen) < len(self.schedule) else ("ok",)
        self.seen.append((trio.current_time(), body["action"], fault))
        kind = fault[0]
        if kind == "ok":
            return httpx.Response(200, json=ok_body(body))
        if kind == "status":
            return httpx.Response(fault[1], text="upstream unavailable")
        if kind == "backpressure":
            answer: dict[str, Any] = {
                "error": "database pool saturated",
                "code": "runtime_postgres_admission_backpressure",
            }
            if fault[1] is not None:
                answer["retry_after_ms"] = fault[1]
            return httpx.Response(503, json=answer)
        if kind == "connect":
            raise httpx.ConnectError("connect ECONNREFUSED", request=request)
        if kind == "reset":
            raise httpx.ReadError("read ECONNRESET", request=request)
        if kind == "hang":
            await trio.sleep_forever()
        if kind == "drip":

            async def drip() -> AsyncIterator[bytes]:
                yield b"{"
                while True:
                    await trio.sleep(1)
                    yield b" "

            return httpx.Response(200, content=drip())
        if kind == "truncated":

            async def cut() -> AsyncIterator[bytes]:
                yield b'{"ok":'
                raise httpx.RemoteProtocolError("peer closed connection", request=request)

            return httpx.Response(200, content=cut())
        if kind == "malformed":
            return httpx.Response(200, content=b'{"ok": tru')
        if kind == "slow":
            await trio.sleep(fault[1])
            return httpx.Response(503, json={"error": "Runtime scheduler DB pool is saturated"})
        if kind == "413":
            return httpx.Response(
                413,
                json={
                    "error": "too large",
                    "code": "runtime_sheet_read_batch_too_large",
                    "observed_bytes": 13_000_000,
                },
            )
        if kind == "unsupported":
            return httpx.Response(400, json={"error": "Unsupported runtime data-plane action"})
        raise AssertionError(f"unknown fault {fault}")
