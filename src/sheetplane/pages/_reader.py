"""The page reader: coalesce concurrent page reads per authority scope, under budgets.

A *road* is whatever reads a sheet's rows for one authority: the direct road
(a scoped Postgres session) or the gateway road (HTTP). ``SheetRoad`` is what
the page reader and the dataset need from one. ``PageReader`` owns one
``BoundedBatchFunction`` whose lanes are keyed by the road's ``scope``, so only
pages that share every authority fact share a batch read; each batch goes
through ``read_pages_adaptive``, which splits a read the road finds too large.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import attrs

from .. import _tracing
from .._types import AdmittedPart, CheckedPage, Page, PageRequest, RowFilter, RowMode
from ..batching import Batch, BatcherStatistics, BoundedBatchFunction
from ..budgets import (
    MAX_QUEUE_WAIT_MS,
    READ_BATCH_FLUSH_MS,
    READ_BATCH_MAX_IN_FLIGHT,
    READ_BATCH_MAX_PAGES,
    READ_BATCH_MAX_REQUEST_BYTES,
    READ_BATCH_MAX_RETAINED_PAGES,
    READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
    READ_PAGE_MAX_ROWS,
)
from ..errors import InvalidInputError
from ..names import normalize_play_name, normalize_table_namespace
from ..protocol import token_digest
from ..sizes import json_byte_length_up_to
from ._splitter import read_pages_adaptive

__all__ = ["PageReader", "ReadScope", "SheetRoad", "normalize_page_request", "token_digest"]


@attrs.frozen
class ReadScope:
    """Every fact a read is authorised by; reads batch together only within one scope.

    It carries a digest of the executor token and never the token itself, so
    it is safe to log, hash and compare.
    """

    base_url: str
    """The gateway base URL (empty for a road that does not use the gateway)."""
    token_digest: str
    """``token_digest(token)`` of the executor token."""
    org_id: str
    """The organisation that owns the sheet."""
    play_name: str = attrs.field(converter=normalize_play_name)
    """The play whose sheet it is (normalised: ``sheetplane.names``)."""
    run_id: str | None
    """The run the reads are limited to, or None for every run."""
    table_namespace: str = attrs.field(converter=normalize_table_namespace)
    """The sheet's namespace within the play (normalised)."""
    row_mode: RowMode = "output"
    """``output`` (contract columns) or ``all`` (every system column too)."""
    admitted: AdmittedPart | None = None
    """One admission's pending or completed rows only, or None for every row."""

    @property
    def which(self) -> RowFilter:
        """The rows the scope reads, as the store takes them."""
        return RowFilter(self.run_id, self.row_mode, self.admitted)

    @classmethod
    def for_token(
        cls,
        *,
        base_url: str,
        token: str,
        org_id: str,
        play_name: str,
        run_id: str | None,
        table_namespace: str,
        row_mode: RowMode = "output",
        admitted: AdmittedPart | None = None,
    ) -> ReadScope:
        """The scope of reads made with ``token``, which is digested here and not kept."""
        return cls(
            base_url=base_url.strip().rstrip("/"),
            token_digest=token_digest(token),
            org_id=org_id.strip(),
            play_name=play_name,
            run_id=(run_id.strip() or None) if run_id is not None else None,
            table_namespace=table_namespace,
            row_mode=row_mode,
            admitted=admitted,
        )


@runtime_checkable
class SheetRoad(Protocol):
    """What the page reader and the dataset need from a road to one sheet.

    Rows come in the sheet's read order, ``_input_index ASC NULLS LAST,
    _created_at ASC, _key ASC``, each a JSON object.
    """

    @property
    def scope(self) -> Hashable:
        """The authority scope (a ``ReadScope``); roads with equal scopes are interchangeable."""
        ...

    async def read_batch(self, pages: Sequence[PageRequest]) -> list[Page]:
        """One page per request, positionally, each echoing its limit and offset.

        Raises ``ReadBatchTooLargeError`` when the answer would exceed the
        response budget.
        """
        ...

    async def read_after(
        self, cursor: object | None, limit: int
    ) -> tuple[list[dict[str, Any]], object | None]:
        """Up to ``limit`` rows after ``cursor`` (None: from the start), by keyset.

        Returns the rows and the cursor to continue from, None once the sheet
        has no more rows. May raise ``ReadBatchTooLargeError`` when ``limit``
        rows would exceed the response budget.
        """
        ...

    async def count(self) -> int:
        """How many rows the road can read."""
        ...


def _whole_number(name: str, value: object) -> int:
    """``value`` rounded down to an int; a non-finite or non-numeric value is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInputError(f"page {name} must be a number, got {value!r}")
    if isinstance(value, int):
        return value
    if not math.isfinite(value):
        raise InvalidInputError(f"page {name} must be finite, got {value!r}")
    return int(math.floor(value))  # noqa: RUF046 (Real.__floor__ is typed Integral, not int)


def normalize_page_request(limit: object, offset: object) -> CheckedPage:
    """The page a caller meant: ``limit`` clamped to 1..READ_PAGE_MAX_ROWS, ``offset`` >= 0.

    Fractions round down. A non-numeric or non-finite limit or offset raises
    ``InvalidInputError``, and so does an offset past a Postgres ``bigint``. The
    page is a ``CheckedPage``: the read's one check, which the roads take as it is.
    """
    whole_limit = _whole_number("limit", limit)
    whole_offset = _whole_number("offset", offset)
    return CheckedPage(
        limit=max(1, min(READ_PAGE_MAX_ROWS, whole_limit)),
        offset=max(0, whole_offset),
    )


def _request_bytes(request: PageRequest) -> int:
    """A page request's estimated size: its compact-JSON form."""
    return json_byte_length_up_to(
        {"limit": request.limit, "offset": request.offset}, READ_BATCH_MAX_REQUEST_BYTES
    ).bytes


def _scope_of(road: SheetRoad) -> Hashable:
    return road.scope


class PageReader:
    """Reads pages for any number of roads, coalescing concurrent reads into batches.

    Use as ``async with PageReader() as reader:``; the block owns the batcher's
    nursery, so every batch read runs inside it. Reads of roads whose
    ``scope`` is equal share lanes and batches (at most ``READ_BATCH_MAX_PAGES``
    pages and ``READ_BATCH_MAX_REQUEST_BYTES`` of requests a batch, lingering
    ``READ_BATCH_FLUSH_MS`` for company); across all scopes at most
    ``READ_BATCH_MAX_RETAINED_PAGES`` pages and
    ``READ_BATCH_MAX_RETAINED_REQUEST_BYTES`` of requests are queued or in flight, and
    ``READ_BATCH_MAX_IN_FLIGHT`` batch reads run at once. A page that cannot
    start its read within ``MAX_QUEUE_WAIT_MS`` fails with ``LaneWedgedError``.

    Leaving the block normally lets queued and running reads finish; leaving
    by an exception cancels them and their callers get ``BatcherClosedError``.
    """

    def __init__(self) -> None:
        self._batcher: BoundedBatchFunction[SheetRoad, PageRequest, Page] = BoundedBatchFunction(
            self._execute,
            key_id=_scope_of,
            estimate_bytes=_request_bytes,
            max_batch_items=READ_BATCH_MAX_PAGES,
            max_batch_bytes=READ_BATCH_MAX_REQUEST_BYTES,
            max_retained_items=READ_BATCH_MAX_RETAINED_PAGES,
            max_retained_bytes=READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
            max_in_flight_batches=READ_BATCH_MAX_IN_FLIGHT,
            flush_seconds=READ_BATCH_FLUSH_MS / 1000,
        )

    async def __aenter__(self) -> PageReader:
        await self._batcher.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return await self._batcher.__aexit__(exc_type, exc, tb)

    async def read_page(self, road: SheetRoad, limit: object, offset: object) -> Page:
        """Read ``limit`` rows at ``offset`` through ``road``, batched with concurrent reads.

        The inputs are normalised first (see ``normalize_page_request``); the
        page returned carries the normalised limit and offset. If cancelled
        while queued, the page is withdrawn and never read; if cancelled while
        its batch runs, the batch goes on for its other callers (and is
        cancelled once every caller has gone).
        """
        request = normalize_page_request(limit, offset)
        return await self._batcher.submit(road, request, max_wait=MAX_QUEUE_WAIT_MS / 1000)

    def stats(self) -> BatcherStatistics:
        """The batcher's statistics snapshot (batches, values, peak retention, peak in flight)."""
        return self._batcher.stats()

    @staticmethod
    async def _execute(batch: Batch[SheetRoad, PageRequest]) -> list[Page]:
        # Every road in a lane shares one scope, so the first one reads for all. The
        # batch is the page reader's owner's child, linked to each caller's span; the
        # road's reads count their bytes into it (``_tracing.read_span``).
        with _tracing.read_span(
            "sheetplane.read_batch",
            {"sheetplane.read.pages": len(batch.values)},
            links=_tracing.links_to(batch.waiting_contexts()),
        ) as span:
            pages = await read_pages_adaptive(batch.key.read_batch, batch.values)
            span.set_attribute("sheetplane.read.rows", sum(len(page.rows) for page in pages))
        return pages
