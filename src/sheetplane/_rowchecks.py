"""The checks of a JSON value a row is written with, shared by ``map`` and the store.

A value Postgres cannot store (a NUL), Python cannot write (a non-finite
float, a lone surrogate, an int past its digit limit) or that passes the row
budget (``MAX_ROW_BYTES``, ``MAX_JSON_DEPTH``) is refused with
``InvalidInputError``. Pure functions over plain values: ``map`` checks each
output here before it writes it (so one bad row fails alone), and the store
(``store._rowdata``) checks what it is given with the same functions. Importing
this module loads no database driver.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from .budgets import MAX_JSON_DEPTH, MAX_ROW_BYTES
from .errors import InvalidInputError
from .sizes import json_byte_length_up_to

__all__ = [
    "NUL_MESSAGE",
    "CheckedObject",
    "check_json_value",
    "check_nested",
    "check_row",
    "checked_json_object",
    "checked_outputs",
    "encodable",
    "flat_row_bound",
]


def flat_row_bound(row: Mapping[str, Any]) -> int | None:
    """An upper bound on a flat row's compact-JSON bytes, or None to measure it exactly.

    Checks what ``json_byte_length_up_to`` would refuse (non-finite floats,
    strings with a lone surrogate) on the way. Every character of a JSON
    string costs at most 6 bytes (``\\u00XX``; UTF-8 needs at most 4), an int
    at most ``bit_length() // 3 + 2`` characters, a float at most 24. A value
    that is not a plain scalar, a name that is not a ``str``, or a bound past
    ``MAX_ROW_BYTES`` answers None, and the row is measured with
    ``json_byte_length_up_to`` (which stops early).
    """
    total = 2
    for name, value in row.items():
        if type(name) is not str:
            return None
        total += 6 * len(name) + 4  # quotes, colon, comma
        if not name.isascii():
            encodable(name)
        if "\x00" in name:
            raise InvalidInputError(NUL_MESSAGE)
        kind = type(value)
        if kind is str:
            total += 6 * len(value) + 2
            if total > MAX_ROW_BYTES:
                return None
            if not value.isascii():
                encodable(value)
            if "\x00" in value:
                raise InvalidInputError(NUL_MESSAGE)
        elif kind is int:
            if value.bit_length() > _LONG_INT_BITS:
                return None  # measured: Python may refuse to write it as text
            total += value.bit_length() // 3 + 2
        elif kind is float:
            if not math.isfinite(value):
                raise InvalidInputError(f"{value!r} has no JSON form (JSON numbers are finite)")
            total += 24
        elif value is None or kind is bool:
            total += 5
        else:
            return None
    return total if total <= MAX_ROW_BYTES else None


NUL_MESSAGE = "a string holds a NUL character, which Postgres cannot store in text or jsonb"

#: An int longer than this many bits is measured rather than bounded: Python refuses to
#: write an int of more than ``sys.get_int_max_str_digits()`` digits (4,300 by default)
#: as text, and 10,000 bits is about 3,011 digits.
_LONG_INT_BITS = 10_000


class CheckedObject(dict[str, Any]):
    """A JSON object as its one check made it (``checked_outputs``): a new dict the
    store takes as it is, without checking it again. ``map`` makes one of each row's
    outputs, so a row is checked once between ``fn`` and the store's statement on the
    direct road; the gateway road decodes plain dicts, which the store checks."""

    __slots__ = ()


def checked_outputs(value: object, what: Callable[[], str]) -> tuple[CheckedObject, int]:
    """``checked_json_object`` of ``value``, as a ``CheckedObject``."""
    checked, size = checked_json_object(value, what, into=CheckedObject)
    assert type(checked) is CheckedObject
    return checked, size


def checked_json_object(
    value: object, what: Callable[[], str], *, into: type[dict[str, Any]] = dict
) -> tuple[dict[str, Any], int]:
    """``value`` as a new dict if it is a JSON object with string keys that
    ``check_json_value`` passes, and its compact-JSON bytes or a bound on them;
    ``what()`` names it in the error.

    A flat object (plain scalar values) whose size bound is within
    ``MAX_ROW_BYTES`` passes on the bound, checked on the way (as ``check_row``
    checks an input row); any other is measured, nested checks included, by
    ``check_json_value``, which also words the error of a flat one that fails.
    ``map`` checks each output so (a row the store would refuse fails alone) and
    takes the bytes as its batch estimate; the store checks what it is given so.
    """
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{what()} must be a JSON object")
    checked = into(value)
    try:
        bound = flat_row_bound(checked)  # None for a name that is not a str
    except InvalidInputError:
        bound = None
    if bound is not None:
        return checked, bound
    if not all(isinstance(k, str) for k in checked):
        raise InvalidInputError(f"{what()} must be a JSON object")
    return checked, check_json_value(checked, what())


def check_nested(value: object) -> None:
    """Raise ``InvalidInputError`` when any string in ``value`` (a key or a value, at any
    depth) holds NUL, or when it nests deeper than ``MAX_JSON_DEPTH``.

    Postgres refuses NUL in ``text`` and ``jsonb``, and Python's json encoder
    fails past the recursion limit: either way a write that got that far
    would fail as a store error, not as the bad input it is. Walks with an
    explicit stack, so depth costs memory, not recursion.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise InvalidInputError(NUL_MESSAGE)
        elif isinstance(item, Mapping | list | tuple):
            if depth >= MAX_JSON_DEPTH:
                raise InvalidInputError(
                    f"a value nests deeper than {MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH)"
                )
            if isinstance(item, Mapping):
                stack.extend((name, depth) for name in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)


def encodable(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"string holds a lone surrogate {text[exc.start : exc.end]!r}; it has no UTF-8 form"
        ) from None


def check_json_value(value: object, what: str) -> int:
    """Check that ``value`` is JSON with finite numbers and fits the row budget; its
    compact-JSON bytes."""
    try:
        size = json_byte_length_up_to(value, MAX_ROW_BYTES)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not valid JSON: {exc}") from None
    if size.exceeded:
        raise InvalidInputError(f"{what} is larger than the {MAX_ROW_BYTES} byte row budget")
    try:
        check_nested(value)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{what}: {exc}") from None
    return size.bytes


def check_row(row: object, position: int) -> Mapping[str, Any]:
    """Check one input row: a JSON object with string keys, finite numbers, within budget.

    A flat row (plain scalar values) whose size bound is under ``MAX_ROW_BYTES``
    passes on the bound; any other row is measured with
    ``json_byte_length_up_to``, which stops counting past the budget, so an
    oversized row is refused without being serialised. Raises
    ``InvalidInputError`` naming the row's position. A caller commits nothing
    before every row has passed: it checks them all first, or (admission)
    checks each as it writes it, inside a transaction the error rolls back.
    """
    if not isinstance(row, Mapping):
        raise InvalidInputError(f"row {position} must be a JSON object, got {type(row).__name__}")
    for name in row:
        if not isinstance(name, str):
            raise InvalidInputError(f"row {position} has a non-string field name {name!r}")
    try:
        if flat_row_bound(row) is not None:
            return row
        size = json_byte_length_up_to(dict(row), MAX_ROW_BYTES)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"row {position} is not valid JSON: {exc}") from None
    if size.exceeded:
        raise InvalidInputError(
            f"row {position} is larger than the {MAX_ROW_BYTES} byte row budget "
            f"(at least {size.bytes} bytes): a row must fit in one page read"
        )
    try:
        check_nested(row)
    except InvalidInputError as exc:
        raise InvalidInputError(f"row {position}: {exc}") from None
    return row
