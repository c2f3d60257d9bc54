"""Wrong arguments the entry-point fuzzer found escaping as untyped errors (AttributeError,
an ExceptionGroup): each is now a typed error, and nothing is sent."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sheetplane import InvalidInputError
from sheetplane._types import CompleteRow, FailRow, SheetContract
from sheetplane.crypto import (
    decrypt_postgres_url,
    encrypt_postgres_url,
    generate_decryption_key,
    session_aad,
)
from sheetplane.gateway.client import GatewayClient
from sheetplane.sessions import AccessShape, PreloadedSession, SessionManager


class Refusing(httpx.AsyncBaseTransport):
    """Counts requests; none should be sent."""

    def __init__(self) -> None:
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return httpx.Response(400, json={"error": "bad"})


async def test_session_manager_block_error_is_not_wrapped_in_an_exception_group() -> None:
    async with GatewayClient("http://gw.test", "tok", play_name="p") as client:
        with pytest.raises(InvalidInputError, match="boom"):
            async with SessionManager(client):
                raise InvalidInputError("boom")
        with pytest.raises(KeyError):
            async with SessionManager(client):
                raise KeyError("the caller's own error comes out as itself")


async def test_session_manager_session_refuses_a_non_shape() -> None:
    async with (
        GatewayClient("http://gw.test", "tok", play_name="p") as client,
        SessionManager(client) as manager,
    ):
        for shape in (None, {"table_namespace": "ns"}, "ns"):
            with pytest.raises(InvalidInputError, match="AccessShape"):
                await manager.session(shape)  # type: ignore[arg-type]


def test_access_shape_and_preloaded_session_check_their_fields() -> None:
    with pytest.raises(InvalidInputError, match="table_namespace"):
        AccessShape(3, ("rows.read",))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="table_namespace"):
        AccessShape("", ("rows.read",))
    with pytest.raises(InvalidInputError, match="preloaded session"):
        PreloadedSession("ns", ("rows.read",), session=None)  # type: ignore[arg-type]


def test_decrypt_with_a_non_key_is_invalid_input() -> None:
    key = generate_decryption_key()
    aad = session_aad(
        org_id="o",
        play_name="p",
        table_namespace="n",
        logical_table="sheet_rows",
        operations=("rows.read",),
        expires_at="2030-01-01T00:00:00+00:00",
    )
    envelope = encrypt_postgres_url("postgresql://u:p@h/db", key.public_jwk(), aad)
    for bad in (None, "key", key.public_jwk()):
        with pytest.raises(InvalidInputError, match="DecryptionKey"):
            decrypt_postgres_url(envelope, bad, aad)  # type: ignore[arg-type]


def test_gateway_client_refuses_headers_that_are_not_a_string_mapping() -> None:
    for headers in ([("a", "b")], {"a": 3}, "a: b"):
        with pytest.raises(InvalidInputError, match="headers"):
            GatewayClient("http://gw.test", "tok", play_name="p", headers=headers)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        ("ensure_sheet", ("ns", {"columns": []}), {}),
        ("ensure_sheet", (3, SheetContract()), {}),
        ("start_sheet_dataset", ("ns", None, [], "r"), {}),
        (
            "complete_map_rows",
            ("ns", SheetContract(), [{"key": "a"}]),
            {"run_id": "r", "write_version": 1},
        ),
        (
            "complete_map_rows",
            ("ns", SheetContract(), [FailRow("a", "e")]),
            {"run_id": "r", "write_version": 1},
        ),
        ("complete_map_rows", ("ns", SheetContract(), None), {"run_id": "r", "write_version": 1}),
        (
            "fail_map_rows",
            ("ns", SheetContract(), [CompleteRow("a", {})]),
            {"run_id": "r", "write_version": 1},
        ),
        (
            "create_db_session",
            (),
            {
                "table_namespace": "ns",
                "logical_table": "sheet_rows",
                "operations": ["rows.read"],
                "contract": {},
            },
        ),
    ],
)
async def test_gateway_client_helpers_refuse_wrong_argument_types_before_sending(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    transport = Refusing()
    async with GatewayClient("http://gw.test", "tok", play_name="p", transport=transport) as client:
        with pytest.raises(InvalidInputError):
            await getattr(client, method)(*args, **kwargs)
    assert transport.sent == 0


@pytest.mark.parametrize("token", ["s3cr\x00et", "s3cr\r\nX-Evil: 1", "s3cret\n"])
def test_an_executor_token_that_no_header_can_carry_is_refused_without_echo(token: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        GatewayClient("http://gw.test", token, play_name="p")
    assert "s3cr" not in str(caught.value)


@pytest.mark.parametrize("base_url", ["http://", "https:///x", "http://[::1", "gw.test", "ftp://h"])
async def test_open_runtime_refuses_a_base_url_without_a_host(base_url: str) -> None:
    from sheetplane import open_runtime

    with pytest.raises(InvalidInputError, match="base_url"):
        async with open_runtime(
            base_url=base_url, token="tok", org_id="o", play_name="p", run_id="r"
        ):
            raise AssertionError("entered")


async def test_a_runtime_writer_refuses_a_write_version_past_bigint() -> None:
    from sheetplane import open_runtime
    from sheetplane._types import SheetContract as Contract

    async with open_runtime(
        base_url="http://gw.test", token="tok", org_id="o", play_name="p", run_id="r"
    ) as rt:
        with pytest.raises(InvalidInputError, match="write_version"):
            rt.writer("ns", Contract(), write_version=2**63)
        assert rt.writer("ns", Contract(), write_version=2**63 - 1).write_version == 2**63 - 1
