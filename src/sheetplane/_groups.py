"""Unwrapping the exception groups a library-owned nursery makes.

A caller who did not open a nursery should get the one error itself, not an
``ExceptionGroup`` around it (trio-websocket explains why). Several blocks
own a nursery (the runtime, the session manager, a lease, ``map``, an
admission, the batcher); they share this one walk and this one re-raise.
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["raise_single", "single_error"]


def single_error(exc: BaseException) -> BaseException:
    """The one exception inside ``exc`` (through any depth of groups), else ``exc`` itself.

    A nest of groups holds exactly one exception when each group in it holds
    one item, so the walk follows single items down and stops at the first
    group with several.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def raise_single(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Raise the one exception inside ``group`` in its place (its own cause kept),
    or ``group`` itself when it holds several.

    Called as the whole body of ``except BaseExceptionGroup as group:``.
    """
    single = single_error(group)
    if single is group:
        raise group
    raise single from single.__cause__
