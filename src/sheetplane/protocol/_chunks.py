"""The staged chunk codec: input rows checked, keyed and encoded once, into the two
JSON arrays a chunk travels and is stored as.

Both roads use it: the runner encodes each chunk here, the gateway passes a
chunk's arrays on as they arrived (``gateway/server/_chunks.py``), and the
store writes them into its staging table (``store/_staging.py``). No database
driver is imported, so a runner on the gateway road loads no psycopg.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Final, NamedTuple

import orjson

from .._rowchecks import check_row
from ..budgets import MAX_ROW_BYTES
from ..errors import InvalidInputError
from ..identity import row_key

__all__ = [
    "ENCODE_OPTIONS",
    "ChunkBuilder",
    "EncodedChunk",
    "encode_row",
    "keyed_document",
    "prepare_chunk",
]


class EncodedChunk(NamedTuple):
    """One chunk of checked, keyed rows in the form the staging table stores them: the
    rows' keys and their documents, each as one JSON array (the wire form of a chunk
    too, so neither road re-encodes a row between the runner and Postgres)."""

    keys: bytes
    """A JSON array of the rows' keys (strings), in input order."""
    rows: bytes
    """A JSON array of the rows' documents (objects), in input order."""
    row_count: int
    """How many rows."""


class ChunkBuilder:
    """A chunk's two arrays, written as its rows are encoded (``encode_row``).

    Each row's key and document are appended at once and dropped: orjson hands
    back every document in a buffer of at least 4 KiB, so holding a chunk's rows
    as separate ``bytes`` took forty times their size.
    """

    __slots__ = ("_keys", "_rows", "row_count")

    def __init__(self) -> None:
        self._keys = bytearray(b"[")
        self._rows = bytearray(b"[")
        self.row_count = 0

    @property
    def size(self) -> int:
        """The bytes of both arrays so far."""
        return len(self._keys) + len(self._rows)

    def add(self, key: bytes, doc: bytes) -> None:
        """Append one row's key and document (compact JSON)."""
        if self.row_count:
            self._keys += b","
            self._rows += b","
        self._keys += key
        self._rows += doc
        self.row_count += 1

    def chunk(self) -> EncodedChunk:
        """The chunk of the rows added."""
        return EncodedChunk(bytes(self._keys + b"]"), bytes(self._rows + b"]"), self.row_count)


#: orjson's options for an admitted row (datetimes and dataclasses go through the checks).
ENCODE_OPTIONS: Final = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_STDLIB_ENCODE: Final = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def encode_row(row: object, position: int) -> tuple[bytes, bytes]:
    """One input row's key and document, each as compact JSON (UTF-8), checked where
    they are encoded (``keyed_document``, the key written as a JSON string)."""
    key, doc = keyed_document(row, position)
    return orjson.dumps(key), doc


def keyed_document(row: object, position: int) -> tuple[str, bytes]:
    """One input row's key, and its document as compact JSON (UTF-8), checked where
    it is encoded.

    orjson writes the document once; the checks read what it wrote: its length
    against ``MAX_ROW_BYTES``, and a ``null`` or ``\\u0000`` in it (orjson writes
    NaN and infinities as ``null``, and a NUL as ``\\u0000``, which Postgres
    refuses in jsonb) sends the row through ``check_row``, as does anything
    orjson refuses (a non-string field name, an integer past 64 bits, a lone
    surrogate, a type JSON has not, nesting past orjson's limit). So a row is
    refused when ``check_row`` refuses it, with its message and the row's
    position in the whole input, and a plain row is looked at once (orjson
    writes a ``uuid.UUID`` as its text, which the standard library's encoder
    refused). The key is ``row_key``'s: a ``_key`` the row carries, else its
    derived identity.
    """
    if type(row) is not dict:
        if not isinstance(row, Mapping):
            raise InvalidInputError(
                f"row {position} must be a JSON object, got {type(row).__name__}"
            )
        row = dict(row)
    try:
        doc: bytes | None = orjson.dumps(row, option=ENCODE_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        doc = None
    if doc is None or b"null" in doc or b"\\u0000" in doc:
        checked = check_row(row, position)
        if doc is None:
            try:
                doc = _STDLIB_ENCODE(checked).encode("utf-8")
            except (TypeError, ValueError, RecursionError) as exc:
                raise InvalidInputError(f"row {position} is not valid JSON: {exc}") from None
    if len(doc) > MAX_ROW_BYTES:
        raise InvalidInputError(
            f"row {position} is larger than the {MAX_ROW_BYTES} byte row budget "
            f"({len(doc)} bytes): a row must fit in one page read"
        )
    try:
        key = row_key(row, None)
        key.encode("utf-8")
    except InvalidInputError as exc:
        raise InvalidInputError(f"row {position}: {exc}") from None
    except UnicodeEncodeError:  # a carried _key with a lone surrogate
        raise InvalidInputError(
            f"row {position}: a row's _key must be text with a UTF-8 form"
        ) from None
    return key, doc


def prepare_chunk(rows: Iterable[object], first_position: int) -> EncodedChunk:
    """Check, key and encode a chunk's rows (``encode_row``; ``InvalidInputError``
    names the row's position in the whole input: ``first_position`` + its index)."""
    builder = ChunkBuilder()
    for offset, raw in enumerate(rows):
        builder.add(*encode_row(raw, first_position + offset))
    return builder.chunk()
