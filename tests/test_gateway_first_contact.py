"""A wrong gateway URL fails fast; a gateway that has answered is waited for.

Before, ``open_runtime(base_url="http://127.0.0.1:8799")`` with nothing listening
was silent for the whole call budget (154 s), then raised ``TransientGatewayError``.
Now a client none of whose URLs has ever answered gives up after
``GATEWAY_FIRST_CONTACT_BUDGET_MS`` with ``GatewayUnreachableError`` naming the URL
and what was tried, and the first retry of any call logs one warning line.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import httpx
import pytest
import trio

import sheetplane
from sheetplane.budgets import CALL_BUDGET_MS, GATEWAY_FIRST_CONTACT_BUDGET_MS
from sheetplane.gateway.client import GatewayClient

TOKEN = "exec-token-first-contact-0123"
CONTRACT = sheetplane.SheetContract(
    (
        sheetplane.ContractColumn("company", "company", "input"),
        sheetplane.ContractColumn("size", "size", "output"),
    )
)


def refused_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sheetplane.gateway" and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("strategy", ["direct", "gateway_only"])
async def test_a_wrong_gateway_url_fails_within_the_first_contact_budget(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture, strategy: str
) -> None:
    url = f"http://127.0.0.1:{refused_port()}"
    start = trio.current_time()

    async def size(row: dict[str, Any]) -> dict[str, Any]:
        return {"size": len(row["company"])}

    with (
        caplog.at_level(logging.WARNING, logger="sheetplane.gateway"),
        pytest.raises(sheetplane.GatewayUnreachableError) as excinfo,
    ):
        async with sheetplane.open_runtime(
            base_url=url, token=TOKEN, org_id="o", play_name="p", run_id="r", strategy=strategy
        ) as rt:
            await rt.map("leads", CONTRACT, [{"company": "acme"}], size)
    elapsed = trio.current_time() - start
    assert elapsed <= GATEWAY_FIRST_CONTACT_BUDGET_MS / 1000
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"no gateway answered at {url} (")
    assert "ConnectError" in message and "check base_url" in message
    assert TOKEN not in message
    assert isinstance(excinfo.value, sheetplane.TransientGatewayError)
    # One line when the first call first retried, none per attempt after it.
    (warning,) = warnings_of(caplog)
    assert "ConnectError" in warning and "retrying for up to" in warning


async def test_the_url_is_named_without_its_user_info(autojump_clock: Any) -> None:
    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    client = GatewayClient(
        "http://user:sekret-pw@gateway.test",
        TOKEN,
        play_name="p",
        transport=httpx.MockTransport(refuse),
    )
    async with client:
        with pytest.raises(sheetplane.GatewayUnreachableError) as excinfo:
            await client.post_action("runtime_sheet_summary", {"tableNamespace": "n"})
    assert "http://gateway.test" in str(excinfo.value)
    assert "sekret-pw" not in str(excinfo.value)


async def test_once_a_gateway_has_answered_its_outage_is_waited_out_with_one_warning(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    answered: list[float] = []

    async def answer_once(request: httpx.Request) -> httpx.Response:
        if not answered:
            answered.append(trio.current_time())
            return httpx.Response(200, json={"ok": True})
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    client = GatewayClient(
        "http://gateway.test", TOKEN, play_name="p", transport=httpx.MockTransport(answer_once)
    )
    async with client:
        await client.post_action("ensure_sheet", {})
        start = trio.current_time()
        with (
            caplog.at_level(logging.WARNING, logger="sheetplane.gateway"),
            pytest.raises(sheetplane.TransientGatewayError) as excinfo,
        ):
            await client.post_action("ensure_sheet", {})
    assert not isinstance(excinfo.value, sheetplane.GatewayUnreachableError)
    elapsed = trio.current_time() - start
    assert GATEWAY_FIRST_CONTACT_BUDGET_MS / 1000 < elapsed < CALL_BUDGET_MS / 1000
    (warning,) = warnings_of(caplog)
    assert warning.startswith("gateway call ensure_sheet: ")
    assert "ConnectError" in warning
    seconds = float(warning.rsplit("retrying for up to ", 1)[1].removesuffix(" s"))
    assert CALL_BUDGET_MS / 1000 - 5 < seconds <= round(CALL_BUDGET_MS / 1000, 1)


async def test_a_gateway_that_starts_a_little_after_its_runner_is_met(autojump_clock: Any) -> None:
    refusals: list[float] = []

    async def starting(request: httpx.Request) -> httpx.Response:
        if trio.current_time() < 3.0:  # the gateway is up 3 s after the runner's first call
            refusals.append(trio.current_time())
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, json={"ok": True})

    client = GatewayClient(
        "http://gateway.test", TOKEN, play_name="p", transport=httpx.MockTransport(starting)
    )
    async with client:
        assert await client.post_action("ensure_sheet", {}) == {"ok": True}
    assert len(refusals) >= 3
