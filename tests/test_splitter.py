"""read_pages_adaptive: whole batch first, then single pages, then halves, exactly per contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from sheetplane import BatchContractError, ReadBatchTooLargeError
from sheetplane.pages import Page, PageRequest, read_pages_adaptive


@attrs.define
class FakeSource:
    """Rows with a declared size; a read answering more than ``budget`` bytes is too large."""

    sizes: list[int]
    budget: int
    calls: list[tuple[tuple[int, int], ...]] = attrs.field(factory=list)
    failed: list[bool] = attrs.field(factory=list)

    def unbounded(self, request: PageRequest) -> tuple[dict[str, Any], ...]:
        return tuple(
            {"i": i, "size": self.sizes[i]}
            for i in range(request.offset, min(len(self.sizes), request.offset + request.limit))
        )

    async def read_batch(self, requests: Sequence[PageRequest]) -> list[Page]:
        self.calls.append(tuple((r.limit, r.offset) for r in requests))
        await trio.lowlevel.checkpoint()
        pages = [Page(rows=self.unbounded(r), limit=r.limit, offset=r.offset) for r in requests]
        observed = sum(row["size"] for page in pages for row in page.rows)
        self.failed.append(observed > self.budget)
        if observed > self.budget:
            raise ReadBatchTooLargeError(observed)
        return pages


async def test_batch_that_fits_is_read_once() -> None:
    source = FakeSource([1] * 10, budget=100)
    requests = [PageRequest(3, 0), PageRequest(3, 3), PageRequest(10, 6)]
    pages = await read_pages_adaptive(source.read_batch, requests)
    assert source.calls == [((3, 0), (3, 3), (10, 6))]
    assert [(p.limit, p.offset, len(p.rows)) for p in pages] == [(3, 0, 3), (3, 3, 3), (10, 6, 4)]


async def test_too_large_batch_reads_each_page_alone() -> None:
    source = FakeSource([1] * 8, budget=5)
    requests = [PageRequest(4, 0), PageRequest(4, 4)]
    pages = await read_pages_adaptive(source.read_batch, requests)
    assert source.calls == [((4, 0), (4, 4)), ((4, 0),), ((4, 4),)]
    assert [p.rows for p in pages] == [source.unbounded(r) for r in requests]


async def test_batch_of_one_goes_straight_to_halving() -> None:
    source = FakeSource([1] * 8, budget=4)
    pages = await read_pages_adaptive(source.read_batch, [PageRequest(8, 0)])
    assert source.calls == [((8, 0),), ((4, 0),), ((4, 4),)]
    assert pages == [Page(rows=source.unbounded(PageRequest(8, 0)), limit=8, offset=0)]


async def test_odd_limit_reads_ceil_half_first() -> None:
    source = FakeSource([1] * 7, budget=4)
    await read_pages_adaptive(source.read_batch, [PageRequest(7, 0)])
    assert source.calls == [((7, 0),), ((4, 0),), ((3, 4),)]


async def test_short_first_half_means_the_data_ended() -> None:
    source = FakeSource([3, 3, 3], budget=8)
    pages = await read_pages_adaptive(source.read_batch, [PageRequest(10, 0)])
    # 10 -> 5 (too large: 9 bytes) -> 3 (too large) -> 2 (fits, full) -> 1 at 2 (fits, full);
    # the rest of the 5 (2 rows at 3) comes back empty: the data ended, nothing more is read.
    assert source.calls == [((10, 0),), ((5, 0),), ((3, 0),), ((2, 0),), ((1, 2),), ((2, 3),)]
    assert pages[0].rows == source.unbounded(PageRequest(10, 0))
    assert (pages[0].limit, pages[0].offset) == (10, 0)


async def test_second_half_is_not_read_when_first_half_is_short() -> None:
    source = FakeSource([2, 2, 2], budget=4)
    await read_pages_adaptive(source.read_batch, [PageRequest(8, 0)])
    # 8 -> 4 at 0 (too large: 6 bytes) -> 2 at 0 (full) -> 2 at 2 (short: 1 row): done.
    assert source.calls == [((8, 0),), ((4, 0),), ((2, 0),), ((2, 2),)]


async def test_single_row_too_large_reraises_after_bounded_calls() -> None:
    source = FakeSource([1] * 15 + [100], budget=50)
    with pytest.raises(ReadBatchTooLargeError) as caught:
        await read_pages_adaptive(source.read_batch, [PageRequest(16, 0)])
    assert caught.value.observed_bytes == 100
    assert source.calls[-1] == ((1, 15),)
    assert len(source.calls) <= 2 * 4 + 1


async def test_batch_of_one_single_row_too_large_reraises_without_rereading() -> None:
    source = FakeSource([100], budget=50)
    with pytest.raises(ReadBatchTooLargeError):
        await read_pages_adaptive(source.read_batch, [PageRequest(1, 0)])
    assert source.calls == [((1, 0),)]


async def test_error_in_a_later_page_stops_the_batch() -> None:
    source = FakeSource([1, 1, 100, 1], budget=50)
    with pytest.raises(ReadBatchTooLargeError):
        await read_pages_adaptive(source.read_batch, [PageRequest(2, 0), PageRequest(2, 2)])
    assert source.calls == [((2, 0), (2, 2)), ((2, 0),), ((2, 2),), ((1, 2),)]


async def test_halving_cost_grows_with_log_of_limit_not_with_optimal_chunks() -> None:
    # Two chunks suffice ([0, 63) and [63]), yet halving reads the ever-smaller left
    # halves of the path to the large last row: log2(64) + 1 successful reads.
    source = FakeSource([1] * 63 + [100], budget=100)
    pages = await read_pages_adaptive(source.read_batch, [PageRequest(64, 0)])
    assert pages[0].rows == source.unbounded(PageRequest(64, 0))
    succeeded = [
        call for call, failed in zip(source.calls, source.failed, strict=True) if not failed
    ]
    assert succeeded == [
        ((32, 0),),
        ((16, 32),),
        ((8, 48),),
        ((4, 56),),
        ((2, 60),),
        ((1, 62),),
        ((1, 63),),
    ]


async def test_empty_requests_make_no_call() -> None:
    source = FakeSource([1], budget=1)
    assert await read_pages_adaptive(source.read_batch, []) == []
    assert source.calls == []


async def test_other_errors_propagate_unchanged() -> None:
    async def broken(requests: Sequence[PageRequest]) -> list[Page]:
        raise KeyError("road down")

    with pytest.raises(KeyError, match="road down"):
        await read_pages_adaptive(broken, [PageRequest(1, 0)])


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda reqs: [], "0 page"),
        (lambda reqs: "nope", "sequence of pages"),
        (lambda reqs: [{"rows": []}], "not a Page"),
        (lambda reqs: [Page(rows=(), limit=reqs[0].limit + 1, offset=reqs[0].offset)], "answers"),
        (lambda reqs: [Page(rows=({},) * 3, limit=2, offset=0)], "more than its limit"),
    ],
)
async def test_read_batch_breaking_its_contract_raises_batch_contract_error(
    answer: Any, message: str
) -> None:
    async def read_batch(requests: Sequence[PageRequest]) -> Any:
        return answer(requests)

    with pytest.raises(BatchContractError, match=message):
        await read_pages_adaptive(read_batch, [PageRequest(2, 0)])


async def test_contract_break_during_a_split_is_caught_too() -> None:
    async def read_batch(requests: Sequence[PageRequest]) -> list[Page]:
        if requests[0].limit == 4:
            raise ReadBatchTooLargeError(99)
        return [Page(rows=(), limit=requests[0].limit, offset=requests[0].offset + 1)]

    with pytest.raises(BatchContractError, match="answers"):
        await read_pages_adaptive(read_batch, [PageRequest(4, 0)])


async def test_non_request_values_are_refused() -> None:
    source = FakeSource([1], budget=1)
    with pytest.raises(TypeError, match="PageRequest"):
        await read_pages_adaptive(source.read_batch, [(1, 0)])  # type: ignore[list-item]
    assert source.calls == []


async def test_cancellation_during_a_split_stops_reading() -> None:
    source = FakeSource([1] * 8, budget=2)
    started = trio.Event()
    release = trio.Event()

    async def slow(requests: Sequence[PageRequest]) -> list[Page]:
        if len(source.calls) == 2:
            started.set()
            await release.wait()
        return await source.read_batch(requests)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_pages_adaptive, slow, [PageRequest(8, 0)])
        await started.wait()
        nursery.cancel_scope.cancel()
    assert len(source.calls) == 2
