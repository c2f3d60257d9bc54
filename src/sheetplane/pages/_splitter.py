"""The adaptive page splitter: read a batch of pages under a response budget.

``read_pages_adaptive`` tries the batch whole. When the road answers
``ReadBatchTooLargeError`` it reads each page alone, and a page that is still
too large is read as two halves, each of which may be halved again, down to a
single row. The split never changes what the caller sees: every page comes
back with the limit and offset it asked for and exactly the rows one
unbounded read would have returned, in order.

Halving is driven by an explicit stack of pending limits, so its depth is
``ceil(log2(limit))`` entries of memory and never Python recursion, and every
step either finishes a piece or replaces it by two strictly smaller ones: the
loop always ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

from .._types import CheckedPage, Page, PageRequest
from ..errors import BatchContractError, ReadBatchTooLargeError

__all__ = ["ReadBatch", "read_pages_adaptive"]

ReadBatch: TypeAlias = Callable[[Sequence[PageRequest]], Awaitable[Sequence[Page]]]
"""An async callable answering one page per request, positionally, or raising
``ReadBatchTooLargeError``."""


async def read_pages_adaptive(read_batch: ReadBatch, requests: Sequence[PageRequest]) -> list[Page]:
    """Read ``requests`` through ``read_batch``, splitting reads that are too large.

    1. The whole batch is read in one call.
    2. If that raises ``ReadBatchTooLargeError``, each request is read alone,
       in order (a batch of one request is not read again: it goes straight
       to step 3).
    3. A request still too large is read as ``ceil(limit/2)`` rows at its
       offset and, only if that half came back full, the rest at
       ``offset + len(first.rows)``; each half is halved again while too
       large. A half that comes back short means the data ended.
    4. A single row that is still too large re-raises ``ReadBatchTooLargeError``.

    Every page returned carries the requested ``limit`` and ``offset``.

    ``read_batch`` must answer a sequence of ``Page`` of the same length as its
    requests, each echoing its request's limit and offset with at most
    ``limit`` rows; any other answer raises ``BatchContractError`` (the same
    error ``BoundedBatchFunction`` uses when its ``execute`` breaks its
    contract, because that is what a road's ``read_batch`` is to the page
    reader). Other exceptions from ``read_batch`` propagate unchanged.

    An empty ``requests`` answers ``[]`` without calling ``read_batch``. If
    cancelled, the read in progress is cancelled and nothing is returned.
    """
    batch = tuple(requests)
    for request in batch:
        if not isinstance(request, PageRequest):
            raise TypeError(f"requests must be PageRequest values, got {request!r}")
    if not batch:
        return []
    try:
        return _checked(await read_batch(batch), batch)
    except ReadBatchTooLargeError as exc:
        too_large = exc
    if len(batch) == 1:
        return [await _read_split(read_batch, batch[0], too_large)]
    return [await _read_split(read_batch, request, None) for request in batch]


async def _read_split(
    read_batch: ReadBatch,
    request: PageRequest,
    known_too_large: ReadBatchTooLargeError | None,
) -> Page:
    """Read one request alone, halving while too large.

    ``known_too_large`` is the error of a read of exactly this request that
    already failed; the request is then not read whole again.
    """
    rows: list[dict[str, Any]] = []
    # Limits still to read, in order from the top; each starts where the rows
    # read so far end.
    pending = [request.limit]
    error = known_too_large
    while pending:
        limit = pending.pop()
        if error is None:
            piece = CheckedPage(limit, request.offset + len(rows))
            try:
                (page,) = _checked(await read_batch((piece,)), (piece,))
            except ReadBatchTooLargeError as exc:
                error = exc
            else:
                rows.extend(page.rows)
                if len(page.rows) < limit:
                    break  # the data ended inside this piece
                continue
        if limit == 1:
            raise error
        first = (limit + 1) // 2
        pending.append(limit - first)
        pending.append(first)
        error = None
    return Page(rows=tuple(rows), limit=request.limit, offset=request.offset)


def _checked(pages: object, requests: tuple[PageRequest, ...]) -> list[Page]:
    """``pages`` as a list, after checking it answers ``requests`` positionally."""
    if not isinstance(pages, Sequence) or isinstance(pages, str | bytes):
        raise BatchContractError(
            f"read_batch must return a sequence of pages, got {type(pages).__name__}"
        )
    if len(pages) != len(requests):
        raise BatchContractError(
            f"read_batch returned {len(pages)} page(s) for {len(requests)} request(s)"
        )
    for index, (page, request) in enumerate(zip(pages, requests, strict=True)):
        if not isinstance(page, Page):
            raise BatchContractError(
                f"read_batch returned {type(page).__name__} at position {index}, not a Page"
            )
        if page.limit != request.limit or page.offset != request.offset:
            raise BatchContractError(
                f"page {index} answers limit={page.limit} offset={page.offset}, "
                f"but limit={request.limit} offset={request.offset} was requested"
            )
        if len(page.rows) > request.limit:
            raise BatchContractError(
                f"page {index} holds {len(page.rows)} rows, more than its limit {request.limit}"
            )
    return list(pages)
