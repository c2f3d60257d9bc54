"""The staged way encodes the next chunk while the chunk in flight is sent.

Sans-IO: a road that records, each time its request yields to the event loop,
how far the input has been read. A chunk's rows are encoded in the event loop's
thread, so unless the encoding yields now and then, the request in flight (its
body written, its answer read) waits until a whole next chunk is encoded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, overload

import trio
from trio.testing import MockClock

from sheetplane._types import AdmissionCounts, SheetContract, SheetRef
from sheetplane.admission import StagedAdmission
from sheetplane.budgets import ADMISSION_CHUNK_ROWS
from sheetplane.protocol import EncodedChunk


class _Rows(Sequence[dict[str, Any]]):
    """N rows made on demand, counting how many were read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.read = 0

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        raise AssertionError("read in order only")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            self.read += 1
            yield {"_key": f"k{i}", "v": i}


class _Road:
    """A road whose request yields to the loop a few times, noting the rows read."""

    road = "gateway"

    def __init__(self, rows: _Rows) -> None:
        self.rows = rows
        self.seen: list[tuple[int, int, int]] = []  # (seq, chunk end, read at each yield)

    async def admit_at_once(self, rows: object) -> None:
        return None

    async def stage_chunk(
        self,
        admission_id: str,
        seq: int,
        first_position: int,
        rows: EncodedChunk,
        begin: Callable[[], Awaitable[None]],
    ) -> None:
        await begin()
        for _ in range(3):  # the body written, the answer awaited, the answer read
            await trio.lowlevel.checkpoint()
            self.seen.append((seq, first_position + rows.row_count, self.rows.read))

    def staging_done(self) -> None:
        pass


class _Client:
    def __init__(self) -> None:
        self.begun = 0

    async def begin_admission(self, *args: object) -> None:
        self.begun += 1

    async def commit_admission(self, *args: object, chunks: int, rows: int) -> AdmissionCounts:
        return AdmissionCounts(
            write_version=1,
            inserted=rows,
            skipped=0,
            pending_count=rows,
            completed_count=0,
            table_namespace="t",
        )


def test_the_next_chunk_is_encoded_while_the_chunk_in_flight_is_sent() -> None:
    rows = _Rows(3 * ADMISSION_CHUNK_ROWS)
    road = _Road(rows)
    client = _Client()
    staged = StagedAdmission(
        client=client,  # type: ignore[arg-type]
        sheet=SheetRef("org", "play", "t"),
        contract=SheetContract(columns=()),
        run_id="run",
        road=road,  # type: ignore[arg-type]
    )
    counts = trio.run(staged.run, rows, clock=MockClock(autojump_threshold=0))
    assert counts.inserted == rows.n and client.begun == 1
    assert {seq for seq, _, _ in road.seen} == {0, 1, 2}
    for seq, end, read in road.seen:
        # Each time the request yields, the next chunk has been read only a little
        # further: never a whole chunk ahead of the one in flight.
        assert end <= read < end + ADMISSION_CHUNK_ROWS // 4, (seq, end, read)
    # ... and it did read on while the request was in flight.
    assert any(read > end for _, end, read in road.seen)
