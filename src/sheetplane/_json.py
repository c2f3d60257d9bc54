"""JSON read and written the way the standard library would, at C speed.

The gateway's bodies on both sides (``protocol._wire`` re-exports these) and
the store's ``jsonb`` loader (``store._pool``) go through them. Nothing here
does I/O.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
import orjson

__all__ = ["decode_body", "encode_body"]

#: One decoder for every body: msgspec reads into the result's own objects, with
#: no intermediate document (orjson's parser holds about fifteen times the body
#: while it builds the result, which broke the iteration memory budget of
#: tests/test_runtime_bounds.py), reads integers of any length exactly, and was
#: the fastest of the three readers measured (``sheetplane bench wire``).
_DECODER: Final = msgspec.json.Decoder()


def decode_body(raw: bytes | bytearray | memoryview | str) -> Any:
    """The JSON value of a request or answer body.

    msgspec reads it when it can read it the way ``json.loads`` would; a body
    msgspec refuses (NaN literals, a number past a float's range, lone
    surrogate escapes, a byte-order mark, deep nesting, UTF-16, invalid JSON)
    is read by ``json.loads``, so every body means what it meant before, and
    the errors are ``json.loads``'s own (``ValueError``,
    ``UnicodeDecodeError``, ``RecursionError``).
    """
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw if isinstance(raw, str | bytes | bytearray) else bytes(raw))


def encode_body(value: Any) -> bytes:
    """The compact wire form of ``value``: no spaces, UTF-8, ``NaN`` never written.

    orjson writes it; what orjson refuses falls back to the standard library
    with the same compact separators: an integer past 64 bits is written
    exactly, and a string holding a lone surrogate (an error that echoes a
    request's bad text) with ASCII escapes, which JSON can carry. A non-string
    key raises ``TypeError``; a non-finite float raises ``ValueError`` in the
    fallback, and is written ``null`` by orjson, so callers refuse non-finite
    floats first (``json_byte_length_up_to``), or hold values that have none
    (rows decoded from ``jsonb``).

    The bytes are the ones ``json_byte_length_up_to`` measures, except for
    floats: orjson writes ``1e-7`` where ``repr`` writes ``1e-07`` (a byte
    shorter) and ``0.00001`` where ``repr`` writes ``1e-05`` (two longer), so
    for a value holding floats the measure is close, not exact. Page reads do
    not go through here: the gateway sends the rows' JSON the store measured
    byte for byte (``store.read_rows_batch_json``).
    """
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        if str(exc) == "Dict key must be str":
            raise TypeError("JSON object keys must be strings") from None
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
            "ascii"
        )
