"""A staged chunk at the gateway: its rows go to the staging table as they arrived.

A runner sends a chunk as the two JSON arrays the staging table stores (its
keys and its rows, each row encoded once by ``encode_row``), so where the wire
form already is the stored form the gateway decodes neither: the body is read
into its members with the rows left as undecoded JSON (``parse_chunk_body``,
one scan in C, no Python object per row but the row's ``msgspec.Raw`` slice),
the keys are checked, and the arrays go to Postgres, whose jsonb parser reads
each row once and whose staging-table checks refuse anything but an array of
objects (``_schema._staging_ddl``).

The rows are read into Python objects only when the wire form may not be what
the store accepts (``chunk_of``): no keys (a client that leaves the keying to
the gateway), a ``\\u`` escape anywhere in the rows (NUL and lone surrogates,
which Postgres refuses, are spelt that way), a row over ``MAX_ROW_BYTES``, or
nesting that could reach ``MAX_JSON_DEPTH``; and when Postgres refuses the
arrays anyway (``staged_or_checked`` in the handler). Then every row goes
through ``encode_row``, which refuses a bad row naming its position in the
whole input, exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import msgspec
import orjson

from ... import protocol as m
from ..._json import decode_body
from ...budgets import MAX_JSON_DEPTH, MAX_ROW_BYTES, MAX_ROW_KEY_BYTES
from ...errors import InvalidInputError
from ...protocol import ChunkBuilder, EncodedChunk, encode_row
from ...store import check_key

__all__ = ["checked_chunk", "chunk_of", "parse_chunk_body"]

#: The chunk action's name as JSON.
CHUNK_ACTION: Final = m.action_of(m.StageAdmissionChunkRequest)
_CHUNK_ACTION: Final = orjson.dumps(CHUNK_ACTION)
_MEMBERS: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS: Final = msgspec.json.Decoder(list[msgspec.Raw])

#: Members of a chunk's body the handler reads in their wire form.
UNDECODED: Final = ("rows", "keys")


def parse_chunk_body(raw: bytes) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """A staged chunk's body as its members, every one decoded but ``rows`` (a list of
    each row's undecoded JSON), and the undecoded ``rows`` and ``keys`` arrays; None
    when ``raw`` is not a chunk whose rows are a JSON array (the caller parses it
    whole, as any other body)."""
    if _CHUNK_ACTION not in raw:
        return None
    try:
        members = _MEMBERS.decode(raw)
        action = members.get("action")
        rows = members.get("rows")
        if action is None or bytes(action) != _CHUNK_ACTION or rows is None:
            return None
        items = _ITEMS.decode(rows)
    except msgspec.DecodeError:
        return None
    body: dict[str, Any] = {
        name: decode_body(bytes(value)) for name, value in members.items() if name != "rows"
    }
    body["rows"] = items
    undecoded: dict[str, bytes] = {
        name: bytes(members[name]) for name in UNDECODED if name in members
    }
    return body, undecoded


def _fits_as_sent(rows: Sequence[Any], wire_rows: bytes) -> bool:
    """Whether the rows' wire form is, byte for byte, a form the store accepts."""
    if b"\\u" in wire_rows:
        return False
    if len(wire_rows) > MAX_ROW_BYTES and any(
        memoryview(row).nbytes > MAX_ROW_BYTES for row in rows
    ):
        return False
    # A row nests no deeper than the brackets it opens: counted over the whole chunk
    # first (each row opens one object), then, if that could reach the limit, by row.
    extra = wire_rows.count(b"{") + wire_rows.count(b"[") - 1 - len(rows)
    return extra < MAX_JSON_DEPTH - 2 or all(_opens(row) < MAX_JSON_DEPTH for row in rows)


def _opens(row: Any) -> int:
    text = bytes(row)
    return text.count(b"{") + text.count(b"[")


def _keys(keys: Sequence[object], count: int, first_position: int) -> list[str]:
    """``keys`` checked as ``check_key`` checks a key: one pass in C over keys that are
    plainly fine (strings, none empty, none long enough to need measuring, no NUL),
    else key by key, naming the first bad one by its row's position."""
    if len(keys) != count:
        raise InvalidInputError(f"keys must hold one key per row ({count}), got {len(keys)}")
    if all(map(str.__instancecheck__, keys)):
        texts = cast(list[str], keys)
        if (
            "" not in texts
            and max(map(len, texts)) * 4 <= MAX_ROW_KEY_BYTES
            and "\x00" not in "".join(texts)
        ):
            return texts
    for offset, key in enumerate(keys):
        check_key(key, f"the key of row {first_position + offset}")
    return [key for key in keys if isinstance(key, str)]


def chunk_of(
    rows: Sequence[Any],
    keys: Sequence[object] | None,
    undecoded: Mapping[str, bytes] | None,
    first_position: int,
) -> tuple[EncodedChunk, bool]:
    """The chunk to stage, and whether it is the rows as sent (False: checked and
    encoded again by ``checked_chunk``)."""
    if keys is not None:
        _keys(keys, len(rows), first_position)
    if (
        keys is not None
        and undecoded is not None
        and "keys" in undecoded
        and _fits_as_sent(rows, undecoded["rows"])
    ):
        return EncodedChunk(undecoded["keys"], undecoded["rows"], len(rows)), True
    return checked_chunk(rows, keys, first_position), False


def checked_chunk(
    rows: Sequence[Any], keys: Sequence[object] | None, first_position: int
) -> EncodedChunk:
    """Every row read, checked and encoded (``encode_row``), keyed by ``keys`` when the
    runner sent them, else by the row itself."""
    builder = ChunkBuilder()
    given = None if keys is None else _keys(keys, len(rows), first_position)
    for offset, row in enumerate(rows):
        position = first_position + offset
        if isinstance(row, msgspec.Raw):
            try:
                row = decode_body(bytes(row))
            except (ValueError, RecursionError):
                raise InvalidInputError(f"row {position} is not valid JSON") from None
        key, doc = encode_row(row, position)
        builder.add(key if given is None else orjson.dumps(given[offset]), doc)
    return builder.chunk()
