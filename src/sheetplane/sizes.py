"""Compact-JSON byte length of a value, counted only as far as a limit.

The wire form sheetplane budgets against is
``json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")``.
``json_byte_length_up_to`` computes its length without building it: the value
is walked with an explicit stack (deep nesting cannot hit the recursion
limit), each scalar adds the bytes ``json.dumps`` would write for it, and the
walk stops as soon as the running count passes the limit. Strings are encoded
a slice of ``JSON_SIZE_SLICE_CHARS`` characters at a time, so a huge string
costs at most one slice of memory and one slice of work past the limit.

Two inputs that ``json.dumps`` accepts are refused, because what it would
produce is not valid JSON on the wire: a non-finite float (``NaN``,
``Infinity``) as a value, and a string holding a lone surrogate (which
``json.dumps`` emits raw and UTF-8 cannot encode). Both raise
``InvalidInputError``. A float dictionary key is different: ``json.dumps``
turns it into a string (``{"NaN": ...}``), which is valid JSON, and so does
this function.

Validation covers only what is measured: once the count passes the limit the
rest of the value is not visited, so a bad value after that point is not
reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import attrs

from .budgets import JSON_SIZE_SLICE_CHARS
from .errors import InvalidInputError

__all__ = ["SizeMeasurement", "json_byte_length_up_to"]


@attrs.frozen
class SizeMeasurement:
    """The result of ``json_byte_length_up_to``."""

    bytes: int
    """The exact length if not exceeded, else a count with ``limit < bytes <= exact``."""
    exceeded: bool
    """Whether the compact-JSON length is greater than the limit."""


# Bytes that json.dumps escapes inside a string: the C0 controls, '"' and '\'.
# All are ASCII, so they appear as themselves in the UTF-8 encoding.
_ESCAPED = bytes(range(0x20)) + b'"\\'
# Escapes written as two characters (\" \\ \b \f \n \r \t); every other
# escaped byte becomes a six-character \u00XX.
_SHORT_ESCAPES = b'"\\\b\f\n\r\t'
_NOT_ESCAPED = bytes(b for b in range(256) if b not in _ESCAPED)

_NULL_TRUE_FALSE = {None: 4, True: 4, False: 5}

_DONE = object()


def _utf8_escaped_size(text: str) -> int:
    """Bytes of ``text`` inside a compact-JSON string, without the quotes."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"string holds a lone surrogate {text[exc.start : exc.end]!r}; it has no UTF-8 form"
        ) from None
    escaped = data.translate(None, _NOT_ESCAPED)
    if not escaped:
        return len(data)
    long_escapes = len(escaped.translate(None, _SHORT_ESCAPES))
    # A short escape adds one byte (the backslash); a \u00XX escape adds five.
    return len(data) + len(escaped) + 4 * long_escapes


def _float_text(value: float) -> str:
    """The text ``json.dumps`` writes for a float dictionary key."""
    if value != value:
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    return float.__repr__(value)


def _key_size(key: object) -> int:
    """Bytes of a dictionary key as ``json.dumps`` writes it, quotes included."""
    if isinstance(key, str):
        return 2 + _utf8_escaped_size(key)
    if isinstance(key, float):
        return 2 + len(_float_text(key))
    if key is True or key is False or key is None:
        return 2 + _NULL_TRUE_FALSE[key]
    if isinstance(key, int):
        return 2 + len(int.__repr__(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def json_byte_length_up_to(value: object, limit: int) -> SizeMeasurement:
    """Measure the compact-JSON UTF-8 length of ``value``, stopping past ``limit``.

    Returns ``SizeMeasurement(exact, False)`` when the length is at most
    ``limit``; otherwise ``SizeMeasurement(n, True)`` with
    ``limit < n <= exact``, having visited only as much of ``value`` as it
    took to pass ``limit``. Nothing proportional to the value's size is
    built: memory is bounded by the nesting depth and one string slice.

    Raises ``TypeError`` for a value or key ``json.dumps`` cannot serialise
    (with its message), and ``InvalidInputError`` for a non-finite float, a
    string with a lone surrogate, a circular reference, or a ``limit`` that
    is not an integer >= 0.
    """
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError(f"limit must be an integer, got {limit!r}")
    if limit < 0:
        raise InvalidInputError(f"limit must be >= 0, got {limit!r}")

    total = 0
    # One frame per open container: [items iterator, is a dict, wrote an item, id].
    stack: list[list[Any]] = []
    open_ids: set[int] = set()
    item: object = value
    while True:
        # Measure `item`: a scalar adds its bytes, a container adds its two
        # brackets and opens a frame whose items are measured next.
        if isinstance(item, str):
            if 2 + len(item) <= JSON_SIZE_SLICE_CHARS:
                total += 2 + _utf8_escaped_size(item)
            else:
                total += 2
                if total > limit:
                    return SizeMeasurement(total, True)
                start = 0
                while start < len(item):
                    # A slice of (limit - total + 1) characters is enough to pass
                    # the limit, since every character is at least one byte.
                    stop = start + max(1, min(JSON_SIZE_SLICE_CHARS, limit - total + 1))
                    total += _utf8_escaped_size(item[start:stop])
                    if total > limit:
                        return SizeMeasurement(total, True)
                    start = stop
        elif item is None or item is True or item is False:
            total += _NULL_TRUE_FALSE[item]
        elif isinstance(item, int):
            total += len(int.__repr__(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidInputError(f"{item!r} has no JSON form (JSON numbers are finite)")
            total += len(float.__repr__(item))
        elif isinstance(item, list | tuple | dict):
            marker = id(item)
            if marker in open_ids:
                raise InvalidInputError("Circular reference detected")
            open_ids.add(marker)
            is_dict = isinstance(item, dict)
            members: Iterator[Any] = iter(item.items()) if isinstance(item, dict) else iter(item)
            stack.append([members, is_dict, False, marker])
            total += 2
        else:
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        if total > limit:
            return SizeMeasurement(total, True)

        # Find the next item: the next member of the innermost open container.
        while stack:
            frame = stack[-1]
            entry: Any = next(frame[0], _DONE)
            if entry is _DONE:
                stack.pop()
                open_ids.discard(frame[3])
                continue
            if frame[2]:
                total += 1  # the comma
            frame[2] = True
            if frame[1]:
                key, item = entry
                total += _key_size(key) + 1  # the key and its colon
                if total > limit:
                    return SizeMeasurement(total, True)
            else:
                item = entry
            break
        else:
            return SizeMeasurement(total, False)
