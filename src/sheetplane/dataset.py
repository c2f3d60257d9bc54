"""Lazy datasets: a runner's handle on a sheet's rows, read only when asked.

``Dataset`` reads through a road: random access (``peek``, ``at``) goes
through a ``PageReader`` so concurrent calls coalesce into batch reads, and
sequential iteration (``async for``, ``materialize``) pages by keyset with the
road's ``read_after``, so reading n rows costs O(n) rather than the O(n^2) of
ever-growing offsets, in the same row order. ``InMemoryDataset`` offers the
same interface over rows already at hand, such as a small CSV input.

Both carry the runtime's dataset descriptors (``DatasetDescriptor``):
``dataset_kind`` (``csv`` or ``map``), ``dataset_id`` (``runtime_dataset_id``
of the play and the namespace, the role of the runtime's
``createRuntimeDatasetId``), ``preview_rows`` (at most the first
``DATASET_PREVIEW_ROWS``), ``source_label`` and ``backing`` (``storage`` and
``sheet: {play_name, table_namespace}`` for a dataset read from a sheet).

``peek(n)`` clamps as the runtime does: ``n <= 0`` answers ``[]`` and ``n``
above ``READ_PAGE_MAX_ROWS`` answers at most that many rows (one page).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Final, Literal
from urllib.parse import quote

import attrs
import trio

from . import _tracing
from ._ints import check_int, is_int
from .budgets import DATASET_PREVIEW_ROWS, READ_PAGE_MAX_ROWS
from .errors import BatchContractError, InvalidInputError, ReadBatchTooLargeError
from .pages import PageReader, SheetRoad

__all__ = [
    "SHEET_STORAGE",
    "Dataset",
    "DatasetBacking",
    "DatasetDescriptor",
    "DatasetIterator",
    "DatasetKind",
    "InMemoryDataset",
    "PageSizer",
    "SheetBacking",
    "runtime_dataset_id",
]

Row = dict[str, Any]

#: ``csv``: rows a runner was handed (``persist_csv_dataset``); ``map``: a sheet a map writes.
DatasetKind = Literal["csv", "map"]

#: The ``storage`` a sheet-backed dataset's ``backing`` names: the runtime's own value,
#: kept so that code which switches on it reads sheetplane's sheets the same way.
SHEET_STORAGE: Final = "neon_sheet"


def runtime_dataset_id(play_name: str, table_namespace: str) -> str:
    """The id of the dataset a play's sheet ``table_namespace`` holds:
    ``sheet:<play>:<namespace>``, each name percent-encoded (so a ``:`` inside a
    name cannot make two sheets share an id). Pass normalised names
    (``sheetplane.names``); the runtime's ``createRuntimeDatasetId`` plays this role."""
    return f"sheet:{quote(play_name, safe='')}:{quote(table_namespace, safe='')}"


@attrs.frozen
class SheetBacking:
    """The sheet a dataset is read from."""

    play_name: str
    """Its play (normalised)."""
    table_namespace: str
    """Its namespace (normalised)."""


@attrs.frozen
class DatasetBacking:
    """Where a dataset's rows are kept."""

    storage: str
    """``SHEET_STORAGE`` for a sheet."""
    sheet: SheetBacking
    """Which sheet."""


@attrs.frozen
class DatasetDescriptor:
    """What a dataset is, apart from its rows (the runtime's dataset descriptors)."""

    dataset_kind: DatasetKind
    """``csv`` or ``map``."""
    dataset_id: str | None = None
    """``runtime_dataset_id`` of its sheet, or None for rows that belong to no sheet."""
    preview_rows: tuple[Row, ...] = ()
    """At most the first ``DATASET_PREVIEW_ROWS`` rows, when they were at hand."""
    source_label: str | None = None
    """Where the rows came from (a file name, say), as the runner labelled them."""
    backing: DatasetBacking | None = None
    """The sheet the rows are read from, or None for rows held in memory."""

    @classmethod
    def of_sheet(
        cls,
        kind: DatasetKind,
        play_name: str,
        table_namespace: str,
        *,
        preview_rows: Iterable[Mapping[str, Any]] = (),
        source_label: str | None = None,
        backed: bool = True,
    ) -> DatasetDescriptor:
        """The descriptor of a dataset of the sheet ``table_namespace`` of ``play_name``
        (``backed=False``: the rows are held in memory, as a small CSV's are)."""
        return cls(
            dataset_kind=kind,
            dataset_id=runtime_dataset_id(play_name, table_namespace),
            preview_rows=_preview(preview_rows),
            source_label=source_label,
            backing=DatasetBacking(SHEET_STORAGE, SheetBacking(play_name, table_namespace))
            if backed
            else None,
        )


def _preview(rows: Iterable[Mapping[str, Any]]) -> tuple[Row, ...]:
    preview: list[Row] = []
    for row in rows:
        if len(preview) == DATASET_PREVIEW_ROWS:
            break
        preview.append(dict(row))
    return tuple(preview)


class _Described:
    """The descriptor properties both dataset classes share."""

    _descriptor: DatasetDescriptor

    @property
    def descriptor(self) -> DatasetDescriptor:
        """Everything below at once."""
        return self._descriptor

    @property
    def dataset_kind(self) -> DatasetKind:
        """``csv`` (rows a runner was handed) or ``map`` (a sheet a map writes)."""
        return self._descriptor.dataset_kind

    @property
    def dataset_id(self) -> str | None:
        """The id of the sheet's dataset (``runtime_dataset_id``), or None."""
        return self._descriptor.dataset_id

    @property
    def preview_rows(self) -> list[Row]:
        """At most the first ``DATASET_PREVIEW_ROWS`` rows, as they were at hand (copies)."""
        return [dict(row) for row in self._descriptor.preview_rows]

    @property
    def source_label(self) -> str | None:
        """Where the rows came from, as labelled, or None."""
        return self._descriptor.source_label

    @property
    def backing(self) -> DatasetBacking | None:
        """The sheet the rows are read from, or None for rows held in memory."""
        return self._descriptor.backing


def _peek_limit(value: object) -> int:
    """``peek``'s ``n`` as the runtime clamps it: at most ``READ_PAGE_MAX_ROWS``, and
    0 for anything below 1 (an integer is still required)."""
    if not is_int(value):
        raise InvalidInputError(f"n must be an integer, got {value!r}")
    return max(0, min(value, READ_PAGE_MAX_ROWS))


def _count_arg(name: str, value: object) -> int:
    return check_int(name, value, 0)


class PageSizer:
    """Chooses how many rows each keyset read asks for, learning from too-large answers.

    Plain state, no I/O. It starts at ``page_rows``. A read answered
    ``ReadBatchTooLargeError`` marks its size too large; the next size is then
    the midpoint between the largest size that fit and the smallest that did
    not (half the latter while none fit), so a sheet of even rows settles on
    the largest size that fits after about ``log2(page_rows)`` failures.

    Rows may shrink later, so once settled it probes a larger size after
    ``patience`` reads that fit. A probe that fails costs one read and
    doubles ``patience`` (probes get rare while rows stay the same size); a
    probe that fits starts doubling the size on every read that fits, until
    one fails or ``page_rows`` is reached.
    """

    def __init__(self, page_rows: int) -> None:
        self.page_rows = page_rows
        self.good = 0
        """The largest size known to fit, 0 if none."""
        self.bad: int | None = None
        """The smallest size known too large, None if none."""
        self.patience = 4
        """Reads that must fit, once settled, before probing a larger size."""
        self._streak = 0
        self._probe_bad: int | None = None
        self._growing = False

    def next_limit(self) -> int:
        """Rows the next read asks for."""
        if self._growing:
            return min(self.page_rows, 2 * self.good)
        if self.bad is None:
            return self.page_rows
        if self.good == 0:
            return (self.bad + 1) // 2
        return max(self.good, (self.good + self.bad) // 2)

    def too_large(self, limit: int) -> None:
        """A read of ``limit`` rows (at least 2) was too large."""
        if self._probe_bad is not None:
            self.bad = min(limit, self._probe_bad)
            self.patience *= 2
        else:
            self.bad = limit if self.bad is None else min(self.bad, limit)
        if self.good >= self.bad:
            self.good = 0  # rows grew: what fit before says nothing now
        self._probe_bad = None
        self._growing = False
        self._streak = 0

    def fitted(self, limit: int) -> None:
        """A read of ``limit`` rows fit."""
        self.good = max(self.good, limit)
        if self._probe_bad is not None:
            # Rows shrank: forget the old bound and grow while reads fit.
            self._probe_bad = None
            self._growing = True
            self.bad = None
        if self._growing or self.bad is None or self.good + 1 < self.bad:
            return
        self._streak += 1
        if self._streak >= self.patience:
            self._streak = 0
            self._probe_bad = self.bad
            self.bad = 2 * self.bad if 2 * self.bad <= self.page_rows else None


class DatasetIterator:
    """Iterates a road's rows by keyset, one page of rows held at a time.

    Each read asks ``read_after`` for the rows after the last one seen. If the
    road answers ``ReadBatchTooLargeError``, the same position is read again
    with fewer rows (see ``PageSizer``); a single row too large re-raises.
    A road may also answer fewer rows than asked, with a cursor to go on
    from. ``read_after`` answering more rows than asked raises
    ``BatchContractError``; an empty answer ends the iteration. If cancelled
    while reading a page, the iterator's position is unchanged: the next
    ``__anext__`` reads the same page again.

    ``read_ahead`` (one task at a time) reads the next page while the rows of
    the current one are still being taken, so a consumer that takes rows as
    fast as it can use them does not stop at every page: at most two pages are
    then held, the current one and the next.
    """

    def __init__(self, road: SheetRoad, page_rows: int, limit: int | None) -> None:
        self._road = road
        self.sizer = PageSizer(page_rows)
        self._remaining = limit
        self._cursor: object | None = None
        self._buffer: list[Row] = []
        self._position = 0
        self._exhausted = False
        """Whether no page follows the cursor (the last page read was the last)."""
        self._ahead: list[Row] | None = None
        """The page after the current one, once read and until it is the current one."""
        self._reading: trio.Event | None = None
        """Set when the read in progress ends (read ahead, or by ``__anext__``)."""
        self._turned = trio.lowlevel.ParkingLot()
        """Where ``read_ahead`` waits for the page it read to become the current one."""

    def __aiter__(self) -> DatasetIterator:
        return self

    async def __anext__(self) -> Row:
        if self._remaining is not None and self._remaining <= 0:
            raise StopAsyncIteration
        while self._position >= len(self._buffer):
            if self._ahead is not None:
                self._buffer, self._ahead, self._position = self._ahead, None, 0
                self._turned.unpark_all()
            elif self._exhausted:
                raise StopAsyncIteration
            elif self._reading is not None:
                await self._reading.wait()  # the page read ahead; looked at again after
            else:
                await self._read_next_page()
        row = self._buffer[self._position]
        self._position += 1
        if self._remaining is not None:
            self._remaining -= 1
        return row

    async def read_ahead(self) -> bool:
        """Read the page after the current one, once the one read before is current.

        Returns False once no page is left to read (or the iteration has a
        ``limit``: it reads only what it returns). Meant for one task that calls
        it in a loop beside the consumers; cancelling it leaves the position
        unchanged, and an error of the read is raised here as ``__anext__``
        would raise it.
        """
        while self._ahead is not None:
            await self._turned.park()
        while self._ahead is None and not self._exhausted and self._remaining is None:
            if self._reading is not None:
                await self._reading.wait()
            else:
                await self._read_next_page()
        return self._ahead is not None

    async def _read_next_page(self) -> None:
        """Read the page after the cursor into ``_ahead`` (nothing when it was too large:
        the sizer asks for fewer rows next time)."""
        limit = self.sizer.next_limit()
        if self._remaining is not None:
            limit = max(1, min(limit, self._remaining))
        done = self._reading = trio.Event()
        try:
            # The road's read counts its bytes into the span (``_tracing.read_span``).
            with _tracing.read_span("sheetplane.read", {"sheetplane.read.limit": limit}) as span:
                rows, cursor = await self._road.read_after(self._cursor, limit)
                span.set_attribute("sheetplane.read.rows", len(rows))
        except ReadBatchTooLargeError:
            if limit == 1:
                raise
            self.sizer.too_large(limit)
            return
        finally:
            self._reading = None
            done.set()
        if len(rows) > limit:
            raise BatchContractError(f"read_after returned {len(rows)} rows for a limit of {limit}")
        self.sizer.fitted(limit)
        self._ahead = list(rows)
        self._cursor = cursor
        # An empty page ends the iteration even if the road offers a cursor,
        # so a road that stops advancing cannot make it loop.
        self._exhausted = cursor is None or not rows


class Dataset(_Described):
    """A sheet's rows, read lazily through ``road`` and ``reader``.

    ``reader`` must be open (inside its ``async with``) while the dataset is
    used. Rows come in the sheet's read order. ``descriptor`` says what it is
    (by default a ``map`` dataset with no id, preview or backing).
    """

    def __init__(
        self,
        reader: PageReader,
        road: SheetRoad,
        *,
        page_rows: int = READ_PAGE_MAX_ROWS,
        descriptor: DatasetDescriptor | None = None,
    ) -> None:
        if not 1 <= _count_arg("page_rows", page_rows) <= READ_PAGE_MAX_ROWS:
            raise InvalidInputError(
                f"page_rows must be between 1 and {READ_PAGE_MAX_ROWS}, got {page_rows!r}"
            )
        self._reader = reader
        self._road = road
        self._page_rows = page_rows
        self._descriptor = descriptor or DatasetDescriptor("map")

    @property
    def road(self) -> SheetRoad:
        """The road rows are read through."""
        return self._road

    async def count(self) -> int:
        """How many rows the sheet holds (for this road's run and row mode)."""
        return await self._road.count()

    async def peek(self, n: int) -> list[Row]:
        """The first ``n`` rows (fewer if the sheet is shorter), one page read through
        the reader; ``n <= 0`` answers ``[]`` without reading, and ``n`` is clamped
        to ``READ_PAGE_MAX_ROWS`` (read more with ``materialize(limit=n)``).
        """
        n = _peek_limit(n)
        if n == 0:
            await trio.lowlevel.checkpoint()
            return []
        return list((await self._reader.read_page(self._road, n, 0)).rows)

    async def at(self, index: int) -> Row | None:
        """The row at ``index`` in read order, or None past the end.

        Concurrent calls are coalesced by the page reader into batch reads.
        """
        index = _count_arg("index", index)
        rows = (await self._reader.read_page(self._road, 1, index)).rows
        return rows[0] if rows else None

    async def materialize(self, limit: int | None = None) -> list[Row]:
        """The rows in read order as one list, at most ``limit`` of them.

        Memory: the list holds every row returned, so ``limit=None`` holds the
        whole sheet; pass a ``limit`` (or iterate with ``async for``, which
        holds one page) for large sheets. Rows are read by keyset, one page
        of up to ``page_rows`` rows at a time.
        """
        if limit is not None:
            limit = _count_arg("limit", limit)
        return [row async for row in DatasetIterator(self._road, self._page_rows, limit)]

    def __aiter__(self) -> DatasetIterator:
        """Iterate every row in read order, holding one page at a time."""
        return DatasetIterator(self._road, self._page_rows, None)


class _RowsIterator:
    """Iterates rows at hand; a cancel point every row, a schedule point every page."""

    def __init__(self, rows: tuple[Row, ...]) -> None:
        self._rows = rows
        self._position = 0

    def __aiter__(self) -> _RowsIterator:
        return self

    async def __anext__(self) -> Row:
        if self._position % READ_PAGE_MAX_ROWS == 0:
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        if self._position >= len(self._rows):
            raise StopAsyncIteration
        row = self._rows[self._position]
        self._position += 1
        return row


class InMemoryDataset(_Described):
    """A dataset over rows already at hand, with the same interface as ``Dataset``.

    The rows are copied (each into a new ``dict``) when the dataset is made
    and held for its lifetime, so it suits inputs small enough to keep in
    memory, such as a CSV a runner was handed. ``descriptor`` says what it is
    (by default a ``csv`` dataset of no sheet, previewing its first rows).
    """

    def __init__(
        self, rows: Iterable[Mapping[str, Any]], *, descriptor: DatasetDescriptor | None = None
    ) -> None:
        self._rows: tuple[Row, ...] = tuple(dict(row) for row in rows)
        self._descriptor = descriptor or DatasetDescriptor("csv", preview_rows=_preview(self._rows))

    @classmethod
    def from_csv(cls, source: str | os.PathLike[str]) -> InMemoryDataset:
        """Rows of a CSV with a header line, each a ``dict`` of strings.

        ``source`` is a path when it is a path object (``pathlib.Path``) and
        the CSV text itself when it is a ``str``. The file is read
        synchronously and whole: this is for small inputs.
        """
        if isinstance(source, os.PathLike):
            with open(source, newline="", encoding="utf-8-sig") as handle:
                return cls(csv.DictReader(handle))
        if isinstance(source, str):
            return cls(csv.DictReader(io.StringIO(source, newline="")))
        raise TypeError(f"source must be a path or CSV text, got {type(source).__name__}")

    async def count(self) -> int:
        """How many rows there are."""
        await trio.lowlevel.checkpoint()
        return len(self._rows)

    async def peek(self, n: int) -> list[Row]:
        """The first ``n`` rows, ``n`` clamped as ``Dataset.peek`` clamps it."""
        n = _peek_limit(n)
        await trio.lowlevel.checkpoint()
        return list(self._rows[:n])

    async def at(self, index: int) -> Row | None:
        """The row at ``index``, or None past the end."""
        index = _count_arg("index", index)
        await trio.lowlevel.checkpoint()
        return self._rows[index] if index < len(self._rows) else None

    async def materialize(self, limit: int | None = None) -> list[Row]:
        """The rows as a new list, at most ``limit`` of them."""
        if limit is not None:
            limit = _count_arg("limit", limit)
        await trio.lowlevel.checkpoint()
        return list(self._rows if limit is None else self._rows[:limit])

    def __aiter__(self) -> AsyncIterator[Row]:
        """Iterate the rows in order."""
        return _RowsIterator(self._rows)
