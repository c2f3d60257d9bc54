"""Compact-JSON byte length of a value, counted only as far as a limit.

The wire form sheetplane budgets against is
``json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")``.
``json_byte_length_up_to`` computes its length without building it: the value
is walked with an explicit stack (deep nesting cannot hit the recursion
limit), each scalar adds the bytes ``json.dumps`` would write for it, and the
walk stops as soon as the running count passes the limit. Strings are encoded
a slice of ``JSON_SIZE_SLICE_CHARS`` characters at a time, so a huge string
costs at most one slice of memory and one slice of work past the limit.
Runs of small flat members (rows of scalars, shallow cell metadata) are
written by ``json``'s C encoder a run at a time, each run's text bounded by
a few slices, which keeps measuring rows within about 1.5x of ``json.dumps``.

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

import json
import math
from typing import Any

import attrs

from ._ints import check_int
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


_NUMBER_TYPES = (float, bool, type(None))
# How deep a flat value may nest: a row, its cell metadata, and two levels inside.
_FLAT_DEPTH = 4
_FLAT_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _flat_weight(value: Any, depth: int = _FLAT_DEPTH) -> int | None:
    """About how many characters ``value`` writes, if it is flat enough; else None.

    Flat means a plain scalar, or a list, tuple or ``str``-keyed dict nested at
    most ``depth`` deep whose leaves are plain scalars (a row with its cell
    metadata). The weight counts a string's characters, an int's digits (from
    its bit length, without writing it) and one per member; what ``json``
    writes for a value is at most about six times its weight (a control
    character's ``\\u00XX``) plus 24 per float. None as soon as the weight passes
    ``JSON_SIZE_SLICE_CHARS``, so a flat value's text stays a few slices long.
    """
    kind = type(value)
    if kind is str:
        return len(value) + 1
    if kind is int:
        digits: int = value.bit_length() // 3 + 1  # at least the decimal digits
        return digits + 1
    if kind in _NUMBER_TYPES:
        return 1
    if depth == 0:
        return None
    weight = 1
    if kind is dict:
        members = value.values()
        for key in value:
            if type(key) is not str:
                return None
            weight += len(key) + 1
            if weight > JSON_SIZE_SLICE_CHARS:
                return None
    elif kind is list or kind is tuple:
        members = value
    else:
        return None
    for member in members:
        member_kind = type(member)
        if member_kind is str:
            weight += len(member) + 1
        elif member_kind in _NUMBER_TYPES:
            weight += 1
        else:
            member_weight = _flat_weight(member, depth - 1)
            if member_weight is None:
                return None
            weight += member_weight
        if weight > JSON_SIZE_SLICE_CHARS:
            return None
    return weight


def _encoded_size(value: object) -> int:
    """The exact compact-JSON size of a flat ``value``, written by ``json`` in C."""
    try:
        text = _FLAT_ENCODER.encode(value)
    except ValueError as exc:
        # allow_nan=False: a non-finite float (or an int too long to write).
        raise InvalidInputError(f"no JSON form (JSON numbers are finite): {exc}") from None
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInputError("string holds a lone surrogate; it has no UTF-8 form") from None


def json_byte_length_up_to(value: object, limit: int) -> SizeMeasurement:
    """Measure the compact-JSON UTF-8 length of ``value``, stopping past ``limit``.

    Returns ``SizeMeasurement(exact, False)`` when the length is at most
    ``limit``; otherwise ``SizeMeasurement(n, True)`` with
    ``limit < n <= exact``, having visited only as much of ``value`` as it
    took to pass ``limit``. Nothing proportional to the value's size is
    built: memory is bounded by the nesting depth and a few string slices.

    Runs of flat members (scalars, rows of scalars) whose strings add up to
    at most ``JSON_SIZE_SLICE_CHARS`` characters are written by ``json``'s C
    encoder and measured whole, so a list of ordinary rows costs little more
    than ``json.dumps``; anything else is walked member by member.

    Raises ``TypeError`` for a value or key ``json.dumps`` cannot serialise
    (with its message), and ``InvalidInputError`` for a non-finite float, a
    string with a lone surrogate, a circular reference, or a ``limit`` that
    is not an integer >= 0.
    """
    check_int("limit", limit, 0)
    total = 0
    # One frame per open container: [container, is a dict, next index or items
    # iterator, wrote a member, id]. Lists are walked by index so that runs of
    # flat members can be measured together.
    stack: list[list[Any]] = []
    open_ids: set[int] = set()
    item: object = value
    while True:
        # Measure `item`: a scalar adds its bytes, a container adds its two
        # brackets and opens a frame whose members are measured next.
        if isinstance(item, str):
            if 2 + len(item) <= JSON_SIZE_SLICE_CHARS:
                total += 2 + _utf8_escaped_size(item)
            else:
                total = _long_string_total(item, total, limit)
        elif item is None or item is True or item is False:
            total += _NULL_TRUE_FALSE[item]
        elif isinstance(item, int):
            total += len(int.__repr__(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidInputError(f"{item!r} has no JSON form (JSON numbers are finite)")
            total += len(float.__repr__(item))
        elif isinstance(item, list | tuple | dict):
            total = _container_total(item, total, limit, stack, open_ids)
        else:
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        if total > limit:
            return SizeMeasurement(total, True)
        # The next item: the next member of the innermost open container.
        while stack:
            frame = stack[-1]
            container, is_dict, position, wrote, marker = frame
            if is_dict:
                entry: Any = next(position, _DONE)
                if entry is not _DONE:
                    frame[3] = True
                    key, item = entry
                    # The comma, the key and its colon.
                    total += (1 if wrote else 0) + _key_size(key) + 1
                    if total > limit:
                        return SizeMeasurement(total, True)
                    break
            elif position < len(container):
                stop = _flat_run_end(container, position, limit - total + 1)
                if stop - position < 2:
                    frame[2], frame[3] = position + 1, True
                    total += 1 if wrote else 0  # the comma
                    item = container[position]
                    break
                # The run written as a list, less its brackets, plus the comma before it.
                total += _encoded_size(container[position:stop]) - 2 + (1 if wrote else 0)
                frame[2], frame[3] = stop, True
                if total > limit:
                    return SizeMeasurement(total, True)
                continue
            stack.pop()
            open_ids.discard(marker)
        else:
            return SizeMeasurement(total, False)


def _long_string_total(item: str, total: int, limit: int) -> int:
    """``total`` plus a string too long to encode at once, a slice at a time, stopping
    as soon as the count passes ``limit``."""
    total += 2
    start = 0
    while start < len(item) and total <= limit:
        # A slice of (limit - total + 1) characters is enough to pass the limit,
        # since every character is at least one byte.
        stop = start + max(1, min(JSON_SIZE_SLICE_CHARS, limit - total + 1))
        total += _utf8_escaped_size(item[start:stop])
        start = stop
    return total


def _container_total(
    item: list[Any] | tuple[Any, ...] | dict[Any, Any],
    total: int,
    limit: int,
    stack: list[list[Any]],
    open_ids: set[int],
) -> int:
    """``total`` plus a flat container written whole, or plus its brackets with a frame
    opened on ``stack`` for its members to be measured next."""
    weight = _flat_weight(item)
    if weight is not None and weight <= limit - total + 1:
        return total + _encoded_size(item)
    marker = id(item)
    if marker in open_ids:
        raise InvalidInputError("Circular reference detected")
    open_ids.add(marker)
    if isinstance(item, dict):
        stack.append([item, True, iter(item.items()), False, marker])
    else:
        stack.append([item, False, 0, False, marker])
    return total + 2


def _flat_run_end(container: list[Any] | tuple[Any, ...], position: int, room: int) -> int:
    """Where the run of flat members from ``position`` ends: at most a slice's weight and
    about ``room`` (what is left under the limit), so a run overshoots it by little."""
    cap = min(JSON_SIZE_SLICE_CHARS, room)
    stop, weight = position, 0
    while stop < len(container):
        member_weight = _flat_weight(container[stop])
        if member_weight is None or weight + member_weight > cap:
            break
        weight += member_weight
        stop += 1
    return stop
