"""The error answer every handler raises, and compact JSON bodies."""

from __future__ import annotations

from typing import Any

import attrs
from starlette.responses import Response
from starlette.types import Send

from ...protocol import Code, encode_body, error_body


class ActionError(Exception):
    """An error answer: HTTP ``status`` with body ``{error, code, **extra}``.

    ``message`` is shown to the caller, so it never carries a secret, a
    stack trace or a database URL.
    """

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON body (an ``ErrorBody``)."""
        return error_body(self.message, self.code, **self.extra)


def bad_request(message: str, code: str = Code.INVALID_REQUEST) -> ActionError:
    """400 for a malformed request."""
    return ActionError(400, code, message)


@attrs.frozen
class EncodedAnswer:
    """A handler's answer already in its wire form (a read spliced from its rows' JSON)."""

    body: bytes


def encode_json(payload: Any) -> bytes:
    """The compact wire form (``_wire.encode_body``: orjson, the standard library
    for what orjson refuses, ASCII escapes for a lone surrogate)."""
    return encode_body(payload)


def json_bytes_response(status: int, body: bytes) -> Response:
    """A JSON response around an already encoded body."""
    return Response(body, status_code=status, media_type="application/json")


async def send_json(send: Send, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    """Answer ``status`` with the encoded JSON ``body`` straight on an ASGI ``send``
    (a middleware's own answer, before any app runs), with ``headers`` besides."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
