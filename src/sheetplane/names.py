"""Play names and table namespaces as identities: one normalisation, used on both sides.

A play name and a table namespace choose a sheet, the scoped sessions minted
for it, the cache entries that hold those sessions and the tables that keep
its rows. The runtime this library re-creates normalises both before each of
those uses (its ``normalizePlayNameForSheet`` and ``normalizeTableNamespace``);
sheetplane does the same, with one rule for both names, applied by the
runtime, the session manager, the gateway client, the reference gateway and
the store (a ``SheetRef`` holds normalised names):

1. strip leading and trailing whitespace (``str.strip``);
2. lower-case (``str.lower``, the mapping of JavaScript's ``toLowerCase``);
3. compose to Unicode NFC, so one name typed two ways is one name.

Every other character is kept and is significant (inner spaces, punctuation,
non-ASCII letters: ``a-b`` and ``a_b`` stay two sheets); the physical table
names hash the normalised name (``store._names``), so any text is safe. A
name that normalises to nothing, or holds a NUL or a lone surrogate, or is
longer than ``MAX_LOGICAL_NAME_CHARS`` after normalising, raises
``InvalidInputError`` (the gateway answers it 400 ``invalid_input``).

Normalising is idempotent: a normalised name normalises to itself.
"""

from __future__ import annotations

import unicodedata

from .budgets import MAX_LOGICAL_NAME_CHARS
from .errors import InvalidInputError

__all__ = [
    "check_name",
    "normalize_name",
    "normalize_play_name",
    "normalize_table_namespace",
]


def check_name(what: str, value: object, *, allow_empty: bool = False) -> str:
    """``value`` itself if it is a usable logical name (a string without NUL or lone
    surrogates, at most ``MAX_LOGICAL_NAME_CHARS`` long, not empty unless allowed);
    ``InvalidInputError`` naming ``what`` otherwise. Nothing is normalised."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidInputError(f"{what} must not be empty")
    if "\x00" in value:
        raise InvalidInputError(f"{what} must not contain NUL characters")
    if len(value) > MAX_LOGICAL_NAME_CHARS:
        raise InvalidInputError(
            f"{what} is {len(value)} characters long; at most {MAX_LOGICAL_NAME_CHARS} are allowed"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"{what} is not valid unicode (lone surrogate)") from None
    return value


def normalize_name(what: str, value: object) -> str:
    """``value`` normalised (stripped, NFC, lower-cased) and checked; ``InvalidInputError``
    naming ``what`` for a name that is not a string or normalises to nothing."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    stripped = value.strip()
    if stripped.isascii():
        normalised = stripped.lower()  # ASCII is NFC already
    else:
        normalised = unicodedata.normalize("NFC", stripped.lower())
    if not normalised:
        raise InvalidInputError(f"{what} must not be empty once trimmed, got {value!r}")
    return check_name(what, normalised)


def normalize_table_namespace(value: object) -> str:
    """A table namespace as an identity (the runtime's ``normalizeTableNamespace``)."""
    return normalize_name("table_namespace", value)


def normalize_play_name(value: object) -> str:
    """A play name as an identity (the runtime's ``normalizePlayNameForSheet``)."""
    return normalize_name("play_name", value)
