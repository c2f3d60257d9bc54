"""Stable row keys.

A sheet row is addressed by its key (``_key``). A key is chosen in this order:

1. an explicit key field (``key_field``): the row's value in that field,
   stringified canonically (see ``canonical_key_text``);
2. a string ``__deeplineRowKey`` (``ROW_KEY_FIELD``), the runtime's way for an
   input row to name its own key. The field is never stored: it is stripped
   from the row's data (``strip_row_key``), and the rows an admission hands
   back (to the map fn, in ``completed()``) carry it again beside ``_key``.
   A ``__deeplineRowKey`` that is not a string is ignored, and stripped too;
3. a ``_key`` the row already carries (rows handed back by ``start_dataset``
   carry one, so admitting them again keeps their keys);
4. a derived identity (``derive_row_identity(row, table_namespace)``, the
   runtime's ``derivePlayRowIdentity``): ``"r" + SHA-256(canonical JSON of the
   row)``, cut to ``IDENTITY_HEX_CHARS`` hex digits (128 bits). The namespace
   is checked and normalised (``sheetplane.names``); the scheme in force,
   ``IDENTITY_SCHEME``, keys the row by its content alone, so one row has one
   key in every namespace of a play.

An appended row's key is its derived identity, ``:append:`` and
``APPEND_KEY_SUFFIX_LENGTH`` (12) hex digits of SHA-1 over
``f"{idempotency_key}:{ordinal}"`` (``append_row_key``), as the runtime builds
it: the same content appended twice under two keys makes two rows, and a
replay makes the same keys. SHA-1 is the runtime's choice, and here it is an
identity, not a secret.

**Migration rule.** A sheet records the identity scheme it was created with
(its metadata entry ``identity_scheme``, written once when the sheet's tables
are made and never rewritten); a sheet made before the record existed has
``content-sha256-128``, the only scheme so far. A new scheme would apply only
to sheets created under it: every existing sheet keeps deriving its keys as it
always did, so re-admitting an input never re-keys its rows. Keys already
stored are never rewritten by any scheme, and append keys depend only on the
idempotency key and the row's position, so a change of the append suffix
(this one replaced SHA-256 over a length-prefixed key) changes only the keys
of rows appended after it; a replayed append is found by its idempotency key,
not by its row keys, and writes nothing.

The canonical JSON of a row is ``json.dumps`` with sorted keys, compact
separators, ``ensure_ascii=False`` and no NaN/Infinity, over the row *without*
its system fields (names starting with ``_``), encoded as UTF-8. It depends on
nothing but the row's values, so the same row gets the same key in every
process, on every machine, in every run (no ``hash()``, no randomised seed).
Two rows that differ only in system fields get the same key, and so do two
rows that differ only in the order of their fields.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from .budgets import MAX_ROW_KEY_BYTES
from .errors import InvalidInputError
from .names import normalize_table_namespace

__all__ = [
    "APPEND_KEY_SUFFIX_LENGTH",
    "IDENTITY_HEX_CHARS",
    "IDENTITY_PREFIX",
    "IDENTITY_SCHEME",
    "ROW_KEY_FIELD",
    "append_row_key",
    "canonical_json",
    "canonical_key_text",
    "content_identity",
    "derive_row_identity",
    "row_key",
    "strip_row_key",
    "with_row_key",
]

#: The identity scheme new sheets record (see the migration rule above).
IDENTITY_SCHEME = "content-sha256-128"

#: Hex digits of SHA-1 in an appended row's key suffix (the runtime's constant).
APPEND_KEY_SUFFIX_LENGTH = 12

#: The field in which an input row names its own key (the runtime's ``__deeplineRowKey``).
ROW_KEY_FIELD = "__deeplineRowKey"

#: The first character of every derived identity, so a derived key is never
#: mistaken for (or collides with) a purely numeric explicit key.
IDENTITY_PREFIX = "r"

#: Hex digits of the SHA-256 digest kept in a derived identity: 128 bits, far
#: past any birthday bound a sheet can reach, and short enough to read in logs.
IDENTITY_HEX_CHARS = 32


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value``: sorted keys, compact, UTF-8 characters kept.

    Raises ``InvalidInputError`` for a value JSON cannot carry (NaN, Infinity,
    an unserialisable object, mixed-type mapping keys).
    """
    try:
        return _CANONICAL.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"value has no canonical JSON form: {exc}") from None


def canonical_key_text(value: Any) -> str:
    """An explicit key value as key text.

    A string is used as it is (it must not be empty). A number or boolean is
    written as JSON writes it, except that an integral float is written as an
    integer (``7.0`` and ``7`` name the same row, as they do in the runtime's
    JSON). Any other JSON value (object, array) is written as canonical JSON.
    ``None`` is refused: a row without a value in its key field has no key.
    """
    if isinstance(value, str):
        if not value:
            raise InvalidInputError("a row key must not be empty")
        return value
    if value is None:
        raise InvalidInputError("a row key must not be null")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"a row key must be finite, got {value!r}")
        if value.is_integer():
            return str(int(value))
    return canonical_json(value)


def derive_row_identity(row: Mapping[str, Any], table_namespace: str) -> str:
    """The derived identity of ``row`` in the sheet ``table_namespace`` (the runtime's
    ``derivePlayRowIdentity(row, tableNamespace)``): ``"r"`` + 32 hex digits of SHA-256
    of the row's canonical JSON.

    System fields (names starting with ``_``, ``__deeplineRowKey`` among them)
    are left out, so a row read back from the sheet with its ``_status`` and
    ``_key`` derives the same identity as the row that was first admitted.
    ``table_namespace`` is normalised and checked (``InvalidInputError`` for one
    that normalises to nothing); under ``IDENTITY_SCHEME`` it does not change the key.
    """
    normalize_table_namespace(table_namespace)
    return content_identity(row)


def content_identity(row: Mapping[str, Any]) -> str:
    """``derive_row_identity`` under ``IDENTITY_SCHEME``, for a namespace already checked."""
    content = row
    if any(name.startswith("_") for name in row):
        content = {name: value for name, value in row.items() if not name.startswith("_")}
    digest = hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()
    return IDENTITY_PREFIX + digest[:IDENTITY_HEX_CHARS]


def append_row_key(base: str, idempotency_key: str, ordinal: int) -> str:
    """The key of the ``ordinal``-th row of an append under ``idempotency_key``, whose
    derived identity is ``base``: ``base:append:`` + ``sha1(f"{idempotency_key}:{ordinal}")``
    cut to ``APPEND_KEY_SUFFIX_LENGTH`` hex digits."""
    text = f"{idempotency_key}:{ordinal}".encode("utf-8", "surrogatepass")
    suffix = hashlib.sha1(text, usedforsecurity=False).hexdigest()
    return f"{base}:append:{suffix[:APPEND_KEY_SUFFIX_LENGTH]}"


def row_key(row: Mapping[str, Any], key_field: str | None = None) -> str:
    """The key of ``row``: its ``key_field`` value, else its string ``__deeplineRowKey``,
    else its ``_key``, else its derived identity.

    An explicit key longer than ``MAX_ROW_KEY_BYTES`` (UTF-8) is refused: keys are indexed.
    """
    if key_field is not None:
        if key_field not in row:
            raise InvalidInputError(f"row has no key field {key_field!r}")
        return _bounded(canonical_key_text(row[key_field]))
    named = row.get(ROW_KEY_FIELD)
    if isinstance(named, str):
        if not named:
            raise InvalidInputError(f"a row's {ROW_KEY_FIELD} must not be empty")
        return _bounded(named)
    carried = row.get("_key")
    if carried is not None:
        if not isinstance(carried, str) or not carried:
            raise InvalidInputError(f"a row's _key must be a non-empty string, got {carried!r}")
        return _bounded(carried)
    return content_identity(row)


def strip_row_key(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row``'s data without ``__deeplineRowKey`` (a copy)."""
    data = dict(row)
    data.pop(ROW_KEY_FIELD, None)
    return data


def with_row_key(row: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``row``'s data as an admission hands it back: without the input's
    ``__deeplineRowKey``, then carrying ``_key`` and ``__deeplineRowKey`` = ``key``."""
    data = strip_row_key(row)
    data["_key"] = key
    data[ROW_KEY_FIELD] = key
    return data


def _bounded(key: str) -> str:
    # 4 bytes a character at most: only a long key needs encoding to be measured.
    if len(key) * 4 > MAX_ROW_KEY_BYTES and len(key.encode("utf-8", "surrogatepass")) > (
        MAX_ROW_KEY_BYTES
    ):
        raise InvalidInputError(
            f"a row key is longer than {MAX_ROW_KEY_BYTES} bytes (MAX_ROW_KEY_BYTES): "
            f"{key[:40]!r}..."
        )
    return key
