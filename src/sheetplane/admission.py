"""What ``RowWriter.start`` answers: an admission's counts, and its rows as lazy datasets.

An ``Admission`` holds a handful of integers whatever the size of the input:
the rows themselves stay on the sheet, and ``pending()`` / ``completed()``
read them back lazily, through the runtime's road (a scoped session on
``direct``, the gateway on ``gateway_only``), by keyset like every dataset.

* ``pending()``: the rows this admission admitted or re-admitted for mapping,
  in input order. The filter is the admission's write version
  (``(seq).admitted_version = v AND (seq).write_version = v``), not the rows' status,
  so the set does not shift while the runner completes or fails them: it is
  the attempt's work list. A later admission of the same rows takes them
  over (they leave this set).
* ``completed()``: the input rows that were already enriched, kept with their
  outputs and their older version, in input order.

Each row carries ``_key``, the contract's columns under their column ids,
``_status``, ``_error`` and ``_input_index`` (the sheet's ``output`` row mode),
and ``__deeplineRowKey`` (= ``_key``), as the runtime's admitted rows do
(``KeyedRoad``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from itertools import islice
from typing import Any, Final

import attrs
import trio

from . import _tracing
from ._attempts import Attempt
from ._groups import raise_single
from ._types import (
    AdmissionCounts,
    AdmittedPart,
    Page,
    PageRequest,
    SheetContract,
    SheetRef,
)
from .budgets import (
    ADMISSION_ABORT_TIMEOUT_MS,
    ADMISSION_CHUNK_BYTES,
    ADMISSION_CHUNK_ROWS,
)
from .dataset import Dataset, InMemoryDataset
from .errors import InvalidInputError, SheetplaneError
from .gateway.client import GatewayClient
from .identity import ROW_KEY_FIELD
from .pages import AdmissionRoad, SheetRoad
from .protocol import ChunkBuilder, EncodedChunk, encode_row

__all__ = ["Admission", "AdmissionInput", "KeyedRoad", "StagedAdmission", "check_input"]


class KeyedRoad:
    """A road whose rows also carry their key as ``__deeplineRowKey`` (an admission's
    ``pending()`` and ``completed()``: the rows a map fn is handed)."""

    def __init__(self, road: SheetRoad) -> None:
        self._road = road

    @property
    def scope(self) -> Hashable:
        """The inner road's scope (every admitted-part road is keyed, so equal scopes
        stay interchangeable)."""
        return self._road.scope

    async def read_batch(self, pages: Sequence[PageRequest]) -> list[Page]:
        """The inner road's pages, their rows keyed."""
        return [
            Page(tuple(map(_keyed, page.rows)), page.limit, page.offset)
            for page in await self._road.read_batch(pages)
        ]

    async def read_after(
        self, cursor: object | None, limit: int
    ) -> tuple[list[dict[str, Any]], object | None]:
        """The inner road's keyset page, its rows keyed."""
        rows, after = await self._road.read_after(cursor, limit)
        return [_keyed(row) for row in rows], after

    async def count(self) -> int:
        """The inner road's count."""
        return await self._road.count()


def _keyed(row: dict[str, Any]) -> dict[str, Any]:
    key = row.get("_key")
    return row if not isinstance(key, str) else {**row, ROW_KEY_FIELD: key}


@attrs.frozen(eq=False)
class Admission:
    """One admission: its write version, what it did, and its rows to read lazily."""

    write_version: int
    """The admission's write version; terminal writes carry it and are fenced by it."""
    inserted: int
    """Input rows inserted as new ``pending`` rows."""
    skipped: int
    """Input rows not to map: duplicates within the input and already-enriched rows."""
    pending_count: int
    """Rows to map (new and re-admitted): what ``pending()`` holds."""
    completed_count: int
    """Already-enriched input rows: what ``completed()`` holds."""
    table_namespace: str
    """The sheet's namespace."""
    play_name: str = attrs.field(kw_only=True)
    """The play whose sheet it is."""
    run_id: str = attrs.field(kw_only=True)
    """The run that admitted it."""
    _open: Callable[[AdmittedPart], Dataset | InMemoryDataset] = attrs.field(
        repr=False, alias="open", kw_only=True
    )
    """Opens a dataset over one part of this admission (the runtime's road, or the rows
    a whole admission's answer holds)."""

    @classmethod
    def from_counts(
        cls,
        counts: AdmissionCounts,
        open: Callable[[AdmittedPart], Dataset],
        *,
        play_name: str,
        run_id: str,
    ) -> Admission:
        """An admission over ``counts``, reading its rows through ``open``."""
        return cls(
            write_version=counts.write_version,
            inserted=counts.inserted,
            skipped=counts.skipped,
            pending_count=counts.pending_count,
            completed_count=counts.completed_count,
            table_namespace=counts.table_namespace,
            play_name=play_name,
            run_id=run_id,
            open=open,
        )

    @property
    def attempt(self) -> Attempt:
        """This admission as an attempt any process may map (``Runtime.map_attempt``)."""
        return Attempt(self.play_name, self.table_namespace, self.run_id, self.write_version)

    def pending(self) -> Dataset | InMemoryDataset:
        """The rows to map, in input order, each carrying ``_key`` (read lazily)."""
        return self._open(AdmittedPart(self.write_version, "pending"))

    def completed(self) -> Dataset | InMemoryDataset:
        """The already-enriched input rows with their outputs, in input order (read lazily)."""
        return self._open(AdmittedPart(self.write_version, "completed"))


# --- the staged path, on the runner's side --------------------------------------------------

AdmissionInput = Iterable[Mapping[str, Any]] | AsyncIterable[Mapping[str, Any]]
"""What ``RowWriter.start`` takes: a sequence, any iterable or any async iterable of rows."""


def check_input(rows: object) -> AdmissionInput:
    """``rows`` if it is an iterable or async iterable of rows (not text or one mapping)."""
    if isinstance(rows, str | bytes | bytearray | Mapping) or not isinstance(
        rows, Iterable | AsyncIterable
    ):
        raise InvalidInputError(
            "rows must be a sequence, an iterable or an async iterable of row objects, "
            f"got {type(rows).__name__}"
        )
    return rows


async def _batches(rows: AdmissionInput) -> AsyncIterator[Sequence[Mapping[str, Any]]]:
    """The input in runs of rows: ``_YIELD_ROWS`` at a time from a plain iterable (no
    step of an async generator per row), one at a time from an async one (each row
    handed on as it arrives)."""
    if isinstance(rows, AsyncIterable):
        async for row in rows:
            yield (row,)
    else:
        source = iter(rows)
        while batch := list(islice(source, _YIELD_ROWS)):
            yield batch


#: Rows encoded between two yields to the event loop (``_chunks``): often enough that
#: the chunk in flight is sent while the next is encoded, not after it.
_YIELD_ROWS: Final = 500


@attrs.frozen
class _Chunk:
    seq: int
    first_position: int
    rows: EncodedChunk


async def _chunks(rows: AdmissionInput, send: trio.MemorySendChannel[_Chunk]) -> tuple[int, int]:
    """Check, key and encode ``rows`` (``encode_row``), cut them into chunks (at most
    ``ADMISSION_CHUNK_ROWS`` rows and ``ADMISSION_CHUNK_BYTES`` of keys and documents)
    and hand each to ``send``; returns (chunks, rows).

    Each row is encoded once, into the form both roads stage it in: the chunk's
    arrays go to Postgres as they are (direct) or inside the request (gateway).
    """
    seq = position = first = yielded = 0
    held = ChunkBuilder()
    async with send:
        async for batch in _batches(rows):
            if position - yielded >= _YIELD_ROWS:
                # Let the chunk in flight go out and its answer come in while this
                # one is encoded (a sequence never yields to the loop by itself).
                yielded = position
                await trio.lowlevel.checkpoint()
            for row in batch:
                key, doc = encode_row(row, position)
                if held.row_count and (
                    held.row_count >= ADMISSION_CHUNK_ROWS
                    or held.size + len(key) + len(doc) + 2 > ADMISSION_CHUNK_BYTES
                ):
                    await send.send(_Chunk(seq, first, held.chunk()))
                    seq, first, held = seq + 1, position, ChunkBuilder()
                held.add(key, doc)
                position += 1
        if held.row_count:
            await send.send(_Chunk(seq, first, held.chunk()))
            seq += 1
    return seq, position


@attrs.frozen
class StagedAdmission:
    """One staged admission of one runner: where it goes and by which road."""

    client: GatewayClient
    sheet: SheetRef
    contract: SheetContract
    run_id: str
    road: AdmissionRoad
    """Where each chunk is staged (``pages.AdmissionRoad``: a scoped session's one
    ``INSERT`` a chunk, or the gateway's request)."""

    async def run(self, rows: AdmissionInput) -> AdmissionCounts:
        """Begin, stage every chunk, commit; the counts of the committed admission.

        A chunk goes out while the next one is checked, keyed and encoded, so
        the runner holds at most two chunks and the gateway one per admission.
        Bad input (a row that is not an object, not JSON, or over ``MAX_ROW_BYTES``) raises
        ``InvalidInputError`` naming its position in the input; then, or on any
        other failure or a cancellation before the commit, nothing is committed
        and the admission is aborted (its staging rows dropped) on a best-effort
        call bounded by ``ADMISSION_ABORT_TIMEOUT_MS``; an admission that could
        not be aborted expires after ``ADMISSION_IDLE_MS``.
        """
        check_input(rows)
        admission_id = uuid.uuid4().hex
        ns = self.sheet.table_namespace
        begun: list[bool] = []
        try:
            send, receive = trio.open_memory_channel[_Chunk](0)
            counted: list[tuple[int, int]] = []

            async def cut() -> None:
                counted.append(await _chunks(rows, send))

            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cut)
                    async with receive:
                        async for chunk in receive:
                            await self._stage(admission_id, chunk, begun)
            except BaseExceptionGroup as group:
                raise_single(group)
            chunks, total = counted[0]
            await self._begin(admission_id, begun)  # an empty input still takes a version
            return await self.client.commit_admission(
                ns, self.contract, admission_id, self.run_id, chunks=chunks, rows=total
            )
        except BaseException:
            if not begun:
                raise
            # An admission that cannot be aborted expires after ADMISSION_IDLE_MS instead.
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(ADMISSION_ABORT_TIMEOUT_MS / 1000),
                contextlib.suppress(SheetplaneError),
            ):
                await self.client.abort_admission(ns, admission_id)
            raise

    async def _begin(self, admission_id: str, begun: list[bool]) -> None:
        """Register the admission before its first chunk: an input whose first chunk is
        bad is refused without a request (and without creating the sheet)."""
        if not begun:
            await self.client.begin_admission(
                self.sheet.table_namespace, self.contract, admission_id, self.run_id
            )
            begun.append(True)

    async def _stage(self, admission_id: str, chunk: _Chunk, begun: list[bool]) -> None:
        encoded = chunk.rows
        with _tracing.span(
            "sheetplane.admission.chunk",
            {
                "sheetplane.admission.chunk": chunk.seq,
                "sheetplane.admission.chunk.rows": encoded.row_count,
                "sheetplane.admission.chunk.bytes": len(encoded.keys) + len(encoded.rows),
            },
        ):
            await self._stage_chunk(admission_id, chunk, begun)

    async def _stage_chunk(self, admission_id: str, chunk: _Chunk, begun: list[bool]) -> None:
        async def begin() -> None:
            await self._begin(admission_id, begun)

        await self.road.stage_chunk(
            admission_id, chunk.seq, chunk.first_position, chunk.rows, begin
        )
