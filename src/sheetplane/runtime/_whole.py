"""Admission on a gateway that admits only whole inputs: the runtime's own way.

A gateway built to the runtime this library re-creates has no staged
admission: ``begin_sheet_admission`` is answered "Unsupported runtime
data-plane action". ``RowWriter.start`` learns that once per client (the
client remembers it, as ``serves(BEGIN_ADMISSION) is False``) and from then on
admits the way the runtime does, with one ``start_sheet_dataset``, on both
roads (docs/seed-gateway.md says why the direct road does not write the rows
over its scoped session instead: a session role may not take or stamp a write
version, and only a version taken by the gateway keeps fencing exact).

The input is read until the staged road is known: ``Tape`` keeps the rows the
staged attempt consumed before its begin was refused and plays them again,
then the rest of the input, into the whole admission. Once a begin is
accepted the tape stops keeping rows, so a staged admission still holds only
a couple of chunks.

A whole admission is bounded by the request ceiling: its rows are encoded and
counted as they are read, and an input whose request would pass
``TRANSPORT_CEILING_BYTES`` raises ``AdmissionTooLargeError`` before anything
is sent (the gateway refuses, 413 and before writing, one whose answer would).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from .._types import AdmittedPart, InlineAdmission, SheetContract
from ..admission import Admission, AdmissionInput
from ..budgets import TRANSPORT_CEILING_BYTES
from ..dataset import Dataset, InMemoryDataset
from ..errors import AdmissionTooLargeError
from ..gateway.client import GatewayClient
from ..identity import with_row_key
from ..protocol import encode_row

__all__ = ["Tape", "admit_whole", "whole_admission"]


class Tape:
    """An admission input that can be read again from its start while ``keep()`` says so.

    ``play()`` reads the input, keeping every row it hands out while
    ``keep()`` is true; ``replay()`` hands out the kept rows, then the rest
    of the input from where ``play()`` stopped. The input itself is read once.
    """

    def __init__(self, rows: AdmissionInput, keep: Callable[[], bool]) -> None:
        self._sync: Iterator[Mapping[str, Any]] | None = None
        self._async: AsyncIterator[Mapping[str, Any]] | None = None
        if isinstance(rows, AsyncIterable):
            self._async = aiter(rows)
        else:
            self._sync = iter(rows)
        self._keep = keep
        self._kept: list[Mapping[str, Any]] | None = []

    async def _rest(self) -> AsyncIterator[Mapping[str, Any]]:
        if self._sync is not None:
            for row in self._sync:
                yield row
            return
        assert self._async is not None
        while True:
            try:
                row = await self._async.__anext__()
            except StopAsyncIteration:
                return
            yield row

    async def play(self) -> AsyncIterator[Mapping[str, Any]]:
        """The input, kept while ``keep()`` is true."""
        async for row in self._rest():
            if self._kept is not None:
                if self._keep():
                    self._kept.append(row)
                else:
                    self._kept = None  # nothing will be played again
            yield row

    async def replay(self) -> AsyncIterator[Mapping[str, Any]]:
        """The kept rows, then the rest of the input."""
        kept, self._kept = self._kept or [], None
        for row in kept:
            yield row
        async for row in self._rest():
            yield row


async def admit_whole(
    client: GatewayClient,
    table_namespace: str,
    contract: SheetContract,
    rows: AsyncIterator[Mapping[str, Any]],
    run_id: str,
) -> InlineAdmission:
    """Admit ``rows`` in one ``start_sheet_dataset``.

    Each row is checked as the staged road checks it (``InvalidInputError``
    naming its position) and counted at its encoded size; once the request
    would pass ``TRANSPORT_CEILING_BYTES`` this raises ``AdmissionTooLargeError``
    without reading further or sending anything.
    """
    held: list[Mapping[str, Any]] = []
    size = 0
    position = 0
    async for row in rows:
        _key, document = encode_row(row, position)
        size += len(document) + 1
        if size > TRANSPORT_CEILING_BYTES:
            raise AdmissionTooLargeError(size)
        held.append(row)
        position += 1
    return await client.start_sheet_dataset(table_namespace, contract, held, run_id)


def whole_admission(
    inline: InlineAdmission,
    whole_part: Callable[[AdmittedPart, tuple[dict[str, Any], ...]], Dataset | InMemoryDataset],
    *,
    play_name: str,
    run_id: str,
) -> Admission:
    """The ``Admission`` of a whole admission; its parts are the road's
    (``AdmissionRoad.whole_part``: read from the sheet by the admission's version
    on the direct road, the rows the answer holds on the gateway road).
    """
    parts = {
        "pending": tuple(with_row_key(row, str(row["_key"])) for row in inline.pending_rows),
        "completed": tuple(with_row_key(row, str(row["_key"])) for row in inline.completed_rows),
    }

    def open_part(part: AdmittedPart) -> Dataset | InMemoryDataset:
        return whole_part(part, parts[part.part])

    return Admission(
        write_version=inline.write_version,
        inserted=inline.inserted,
        skipped=inline.skipped,
        pending_count=len(inline.pending_rows),
        completed_count=len(inline.completed_rows),
        table_namespace=inline.table_namespace,
        play_name=play_name,
        run_id=run_id,
        open=open_part,
    )
