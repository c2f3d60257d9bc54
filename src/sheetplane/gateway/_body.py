"""Reading a gateway answer without letting it exceed its action's budget.

Two checks, both before the bytes are kept:

* a declared ``Content-Length`` over the budget is refused before the body
  is read;
* the decoded bytes are counted while they stream in, so a compression bomb
  stops at the budget instead of filling memory.

The client decodes the body itself rather than through
``response.aiter_bytes()``: httpx's decoders inflate each network chunk
whole, so one 64 KiB gzip chunk may become 64 MiB before anyone counts it.
Here every ``decompress`` call is capped (``max_length``) at what the budget
still allows, so no more than the budget plus one byte is ever inflated. The
client asks only for ``gzip`` and ``deflate`` (``ACCEPT_ENCODING``); an answer
in any other content coding is refused.

The budget of an action is ``ACTION_MAX_RESPONSE_BYTES`` (the transport
ceiling). The batch read gets ``READ_BATCH_MAX_RESPONSE_BYTES +
RESPONSE_ENVELOPE_HEADROOM_BYTES``, the same ceiling, because the server's
12 MiB budget counts the pages and the envelope around them needs its
headroom; the client then measures the decoded pages against
``READ_BATCH_MAX_RESPONSE_BYTES`` itself (see ``client.read_rows_batch``), so
a gateway that does not enforce its side still gets a batch split instead of
an answer held whole.
"""

from __future__ import annotations

import zlib
from typing import Final

import httpx

from ..budgets import (
    ACTION_MAX_RESPONSE_BYTES,
    READ_BATCH_MAX_RESPONSE_BYTES,
    RESPONSE_ENVELOPE_HEADROOM_BYTES,
)
from ..errors import ResponseTooLargeError
from ..protocol import ReadRowsBatchRequest, action_of

#: The decoded-body budget of a batch read, envelope included.
READ_BATCH_BODY_BYTES: Final = READ_BATCH_MAX_RESPONSE_BYTES + RESPONSE_ENVELOPE_HEADROOM_BYTES

#: The content codings the client accepts and decodes under its budget.
ACCEPT_ENCODING: Final = "gzip, deflate"

# zlib window bits: 15-bit window, and +32 detects a gzip or zlib header.
_AUTO_HEADER_WBITS: Final = 32 + zlib.MAX_WBITS


class UnsupportedEncodingError(Exception):
    """The answer used a content coding the client did not ask for."""


class TruncatedBodyError(Exception):
    """A compressed body ended before its compressed stream did."""


class CorruptBodyError(Exception):
    """A compressed body that does not decompress."""


def response_byte_limit(action: str) -> int:
    """Decoded bytes an answer to ``action`` may carry."""
    return (
        READ_BATCH_BODY_BYTES
        if action == action_of(ReadRowsBatchRequest)
        else ACTION_MAX_RESPONSE_BYTES
    )


def declared_length(response: httpx.Response) -> int | None:
    """The ``Content-Length`` the server declared, if it is a plain integer."""
    value = response.headers.get("content-length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value.strip())


def _codings(response: httpx.Response) -> list[str]:
    value = response.headers.get("content-encoding", "")
    codings = [c.strip().lower() for c in value.split(",") if c.strip()]
    return [c for c in codings if c != "identity"]


async def read_bounded(response: httpx.Response, action: str, limit: int) -> bytes:
    """Read and decode ``response``'s body, refusing more than ``limit`` decoded bytes.

    Raises ``ResponseTooLargeError(action, limit, observed)``, whose
    ``observed_bytes`` is the declared length or the count reached when reading
    stopped; ``UnsupportedEncodingError``, ``CorruptBodyError`` or
    ``TruncatedBodyError`` for a body that cannot be decoded. Transport
    errors (a reset, a body cut short) propagate as the ``httpx`` exceptions
    they are. If cancelled, reading stops; the caller's
    ``async with client.stream(...)`` closes the connection.
    """
    declared = declared_length(response)
    if declared is not None and declared > limit:
        raise ResponseTooLargeError(action, limit, declared)
    if response.is_stream_consumed:
        # A transport that handed back a response already read in full (and
        # decoded), as ``httpx.MockTransport`` does with byte content.
        content = response.content
        if len(content) > limit:
            raise ResponseTooLargeError(action, limit, len(content))
        return content
    codings = _codings(response)
    if len(codings) > 1 or (codings and codings[0] not in ("gzip", "deflate")):
        raise UnsupportedEncodingError(f"content coding {', '.join(codings)!r} was not requested")
    inflater = zlib.decompressobj(_AUTO_HEADER_WBITS) if codings else None

    chunks: list[bytes] = []
    received = 0
    saw_bytes = False

    def keep(data: bytes) -> None:
        nonlocal received
        received += len(data)
        if received > limit:
            raise ResponseTooLargeError(action, limit, received)
        chunks.append(data)

    async for raw in response.aiter_raw():
        saw_bytes = saw_bytes or bool(raw)
        if inflater is None:
            keep(raw)
            continue
        data = raw
        while data and not inflater.eof:
            try:
                # At most one byte past the budget is ever inflated.
                out = inflater.decompress(data, limit - received + 1)
            except zlib.error:
                raise CorruptBodyError("the compressed body does not decompress") from None
            keep(out)
            data = inflater.unconsumed_tail
    if inflater is not None and saw_bytes and not inflater.eof:
        raise TruncatedBodyError("the compressed body ended early")
    return b"".join(chunks)
