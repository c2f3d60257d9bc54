"""Page request and page values, shared by the store, the gateway and the page reader.

They live below every road so that ``store`` and ``gateway`` can return pages
without importing ``pages`` (which sits above both). ``sheetplane.pages``
re-exports them.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from .errors import InvalidInputError


def _non_negative_int(name: str, minimum: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidInputError(f"{name} must be a finite integer, got {value!r}")
            raise InvalidInputError(f"{name} must be an integer, got {value!r}")
        if value < minimum:
            raise InvalidInputError(f"{name} must be >= {minimum}, got {value!r}")

    return check


@attrs.frozen
class PageRequest:
    """One page to read: ``limit`` rows starting at ``offset`` in the sheet's read order."""

    limit: int = attrs.field(validator=_non_negative_int("limit", 1))
    """Rows to read, at least 1."""
    offset: int = attrs.field(validator=_non_negative_int("offset", 0))
    """Rows to skip, at least 0."""


@attrs.frozen
class Page:
    """The rows of one page, with the ``limit`` and ``offset`` that were requested."""

    rows: tuple[dict[str, Any], ...]
    """At most ``limit`` rows, each a JSON object, in the sheet's read order."""
    limit: int
    """The requested limit."""
    offset: int
    """The requested offset."""
