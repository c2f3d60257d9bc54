"""Unwrapping the exception groups a library-owned nursery makes.

A caller who did not open a nursery should get the one error itself, not an
``ExceptionGroup`` around it (trio-websocket explains why). Several blocks
own a nursery (the runtime, the session manager, a lease, ``map``); they
share this one walk.
"""

from __future__ import annotations

__all__ = ["single_leaf"]


def single_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception in ``group`` (at any depth), or None if it holds several."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack and len(leaves) <= 1:
        item = stack.pop()
        if isinstance(item, BaseExceptionGroup):
            stack.extend(item.exceptions)
        else:
            leaves.append(item)
    return leaves[0] if len(leaves) == 1 and not stack else None
