"""Argument checks at the public entry points: one rule each, one message each.

Every public call checks its arguments before anything is sent, and refuses
a bad one with ``InvalidInputError`` naming it (``what``) and its value. The
runtime, its writer and its recorder share these, so a rule (what a
"non-empty string" is, how big a JSON value may be) is stated here once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from ._ints import is_int
from ._types import CompleteRow, FailRow
from .budgets import TRANSPORT_CEILING_BYTES
from .errors import InvalidInputError
from .sizes import json_byte_length_up_to

__all__ = [
    "complete_rows",
    "fail_rows",
    "flag",
    "json_value",
    "optional_text",
    "row_mappings",
    "sequence",
    "text",
]


def text(what: str, value: object) -> str:
    """``value`` if it is a string with a non-blank character and no NUL."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidInputError(f"{what} must be a non-empty string without NUL, got {value!r}")
    return value


def optional_text(what: str, value: object) -> str | None:
    """None, or ``value`` checked by ``text``."""
    return None if value is None else text(what, value)


def flag(what: str, value: object) -> bool:
    """``value`` if it is a bool (not merely truthy)."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{what} must be a bool, got {value!r}")
    return value


def json_value(what: str, value: object) -> None:
    """Refuse what the wire cannot carry: not JSON, NaN/Infinity, or past the transport ceiling."""
    try:
        measured = json_byte_length_up_to(value, TRANSPORT_CEILING_BYTES)
    except TypeError as exc:
        raise InvalidInputError(f"{what} must be JSON-serialisable: {exc}") from None
    if measured.exceeded:
        raise InvalidInputError(f"{what} is larger than {TRANSPORT_CEILING_BYTES} bytes as JSON")


def sequence(what: str, value: object, items: str) -> Sequence[object]:
    """``value`` if it is a sequence (and not text or a single mapping) of ``items``."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidInputError(f"{what} must be a sequence of {items}, got {value!r}")
    return value


def row_mappings(what: str, rows: object) -> list[Mapping[str, Any]]:
    """``rows`` as a list if it is a sequence of mappings that is JSON within the ceiling."""
    checked: list[Mapping[str, Any]] = []
    for index, row in enumerate(sequence(what, rows, "row objects")):
        if not isinstance(row, Mapping):
            raise InvalidInputError(f"{what}[{index}] must be a mapping, got {row!r}")
        checked.append(row)
    json_value(what, [dict(row) for row in checked])
    return checked


def complete_rows(rows: object) -> list[CompleteRow]:
    """``rows`` as a list if it is a sequence of well-formed ``CompleteRow``."""
    return _terminal_rows(rows, CompleteRow, _complete_fields)


def fail_rows(rows: object) -> list[FailRow]:
    """``rows`` as a list if it is a sequence of well-formed ``FailRow``."""
    return _terminal_rows(rows, FailRow, _fail_fields)


def _complete_fields(where: str, row: CompleteRow) -> list[object]:
    if not isinstance(row.data, Mapping):
        raise InvalidInputError(f"{where}.data must be a mapping, got {row.data!r}")
    if row.cell_meta_patch is not None and not isinstance(row.cell_meta_patch, Mapping):
        raise InvalidInputError(f"{where}.cell_meta_patch must be a mapping or None")
    return [row.data, row.cell_meta_patch]


def _fail_fields(where: str, row: FailRow) -> list[object]:
    if not isinstance(row.error, str):
        raise InvalidInputError(f"{where}.error must be a string, got {row.error!r}")
    if row.data is not None and not isinstance(row.data, Mapping):
        raise InvalidInputError(f"{where}.data must be a mapping or None")
    return [row.error, row.data]


_R = TypeVar("_R", CompleteRow, FailRow)


def _terminal_rows(
    rows: object, cls: type[_R], fields: Callable[[str, _R], list[object]]
) -> list[_R]:
    """The rows of a terminal write, each a ``cls`` with a key and the fields ``fields``
    checks (and answers, to be measured as JSON together)."""
    checked: list[_R] = []
    payload = []
    for index, row in enumerate(sequence("rows", rows, cls.__name__)):
        if not isinstance(row, cls):
            raise InvalidInputError(f"rows[{index}] must be a {cls.__name__}, got {row!r}")
        text(f"rows[{index}].key", row.key)
        payload.append(fields(f"rows[{index}]", row))
        checked.append(row)
    json_value("rows", payload)
    return checked


def positive_field(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: the field is an ``int`` of at least 1 (a ``bool`` is not)."""
    if not is_int(value) or value < 1:
        raise InvalidInputError(f"{attribute.name} must be an integer >= 1, got {value!r}")
