"""The one integer check: what counts as an integer argument, and its bounds.

Python counts ``True`` as the integer 1; no count, limit, index or version
here is ever a bool, so :func:`is_int` says no to one. :func:`check_int` is the
check every argument goes through, with one wording of its refusal.
"""

from __future__ import annotations

import math
from typing import TypeGuard

from .errors import InvalidInputError

__all__ = ["check_int", "is_int"]


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(what: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` when it is an ``int`` (not a bool) within bounds, else ``InvalidInputError``."""
    if not is_int(value):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(f"{what} must be a finite integer, got {value!r}")
        raise InvalidInputError(f"{what} must be an integer, got {value!r}")
    if maximum is None:
        if value < minimum:
            raise InvalidInputError(f"{what} must be >= {minimum}, got {value!r}")
    elif not minimum <= value <= maximum:
        raise InvalidInputError(f"{what} must be between {minimum} and {maximum}, got {value!r}")
    return value
