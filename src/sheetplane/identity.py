"""Stable row keys.

A sheet row is addressed by its key (``_key``). A key is chosen in this order:

1. an explicit key field (``key_field``): the row's value in that field,
   stringified canonically (see ``canonical_key_text``);
2. a ``_key`` the row already carries (rows handed back by ``start_dataset``
   carry one, so admitting them again keeps their keys);
3. a derived identity: ``"r" + SHA-256(canonical JSON of the row)``, cut to
   ``IDENTITY_HEX_CHARS`` hex digits (128 bits).

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

__all__ = [
    "IDENTITY_HEX_CHARS",
    "IDENTITY_PREFIX",
    "canonical_json",
    "canonical_key_text",
    "derive_row_identity",
    "row_key",
]

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


def derive_row_identity(row: Mapping[str, Any]) -> str:
    """The derived identity of ``row``: ``"r"`` + 32 hex digits of SHA-256 of its canonical JSON.

    System fields (names starting with ``_``) are left out, so a row read back
    from the sheet with its ``_status`` and ``_key`` derives the same identity
    as the row that was first admitted.
    """
    content = row
    if any(name.startswith("_") for name in row):
        content = {name: value for name, value in row.items() if not name.startswith("_")}
    digest = hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()
    return IDENTITY_PREFIX + digest[:IDENTITY_HEX_CHARS]


def row_key(row: Mapping[str, Any], key_field: str | None = None) -> str:
    """The key of ``row``: its ``key_field`` value, else its ``_key``, else its derived identity.

    An explicit key longer than ``MAX_ROW_KEY_BYTES`` (UTF-8) is refused: keys are indexed.
    """
    if key_field is not None:
        if key_field not in row:
            raise InvalidInputError(f"row has no key field {key_field!r}")
        return _bounded(canonical_key_text(row[key_field]))
    carried = row.get("_key")
    if carried is not None:
        if not isinstance(carried, str) or not carried:
            raise InvalidInputError(f"a row's _key must be a non-empty string, got {carried!r}")
        return _bounded(carried)
    return derive_row_identity(row)


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
