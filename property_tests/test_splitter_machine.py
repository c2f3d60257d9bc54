"""(b) The adaptive splitter against a fake source with random row sizes and budgets.

The model is the plain list of row sizes; the real thing is ``read_pages_adaptive``
over a fake road that answers ``ReadBatchTooLargeError`` when a read's rows add
up to more than the budget. Every read is compared with one unbounded read of
each request, and the calls it took are held to bounds:

* successful calls: at most ``OPT * (2 * ceil(log2 limit) + 1)`` per request
  that returned rows, plus one empty tail per request. OPT is the fewest
  contiguous chunks of the request's rows that each fit the budget. (Halving
  cannot promise ``2 * OPT``: a request whose last row alone fills the budget
  has OPT 2 but costs ``log2 limit + 1`` successful halves; see
  ``tests/test_splitter.py::test_halving_cost_grows_with_log_of_limit_not_with_optimal_chunks``.)
* a single row over budget, all others fitting together: it raises after at
  most ``2 * ceil(log2 limit) + 1`` calls.
* every call reads a distinct node of the halving tree, so no read ever
  loops: at most ``2 * limit`` calls per request and one for the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from sheetplane import ReadBatchTooLargeError
from sheetplane.pages import Page, PageRequest, read_pages_adaptive
from sheetplane.testing.models import fewest_chunks
from sheetplane.testing.models import halving_depth as depth

MAX_ROWS = 80


class FakeRoad:
    def __init__(self, sizes: list[int], budget: int) -> None:
        self.sizes = sizes
        self.budget = budget
        self.calls: list[tuple[PageRequest, ...]] = []
        self.succeeded: list[tuple[Page, ...]] = []

    def unbounded(self, request: PageRequest) -> tuple[dict[str, Any], ...]:
        stop = min(len(self.sizes), request.offset + request.limit)
        return tuple({"i": i, "size": self.sizes[i]} for i in range(request.offset, stop))

    async def read_batch(self, requests: Sequence[PageRequest]) -> list[Page]:
        self.calls.append(tuple(requests))
        assert len(self.calls) <= 10_000, "the splitter loops"
        await trio.lowlevel.checkpoint()
        pages = [Page(rows=self.unbounded(r), limit=r.limit, offset=r.offset) for r in requests]
        observed = sum(row["size"] for page in pages for row in page.rows)
        if observed > self.budget:
            raise ReadBatchTooLargeError(observed)
        self.succeeded.append(tuple(pages))
        return pages


def run(road: FakeRoad, requests: list[PageRequest]) -> list[Page]:
    async def main() -> list[Page]:
        return await read_pages_adaptive(road.read_batch, requests)

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


requests_strategy = st.lists(
    st.builds(
        PageRequest,
        limit=st.integers(min_value=1, max_value=MAX_ROWS + 8),
        offset=st.integers(min_value=0, max_value=MAX_ROWS + 4),
    ),
    min_size=1,
    max_size=4,
)


class SplitterMachine(RuleBasedStateMachine):
    """Rows and a budget change between reads; every read is exact and bounded."""

    @initialize(
        count=st.integers(min_value=0, max_value=MAX_ROWS),
        light=st.sampled_from([0, 1, 3]),
        budget=st.integers(min_value=1, max_value=200),
    )
    def start(self, count: int, light: int, budget: int) -> None:
        self.sizes = [light] * count
        self.budget = budget

    @rule(data=st.data())
    @precondition(lambda self: len(self.sizes) > 0)
    def resize_rows(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(min_value=0, max_value=len(self.sizes) - 1), label="index")
        sizes = data.draw(
            st.lists(st.integers(min_value=0, max_value=60), max_size=10), label="sizes"
        )
        self.sizes[index : index + len(sizes)] = sizes
        del self.sizes[MAX_ROWS:]

    @rule(sizes=st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=20))
    @precondition(lambda self: len(self.sizes) < MAX_ROWS)
    def append_rows(self, sizes: list[int]) -> None:
        self.sizes = (self.sizes + sizes)[:MAX_ROWS]

    @rule(budget=st.integers(min_value=1, max_value=200))
    def set_budget(self, budget: int) -> None:
        self.budget = budget

    @rule(data=st.data())
    @precondition(lambda self: len(self.sizes) > 0)
    def make_row_fill_the_budget(self, data: st.DataObject) -> None:
        # A row that alone fills the budget among light rows is halving's worst case.
        index = data.draw(st.integers(min_value=0, max_value=len(self.sizes) - 1), label="index")
        self.sizes = [*self.sizes[:index], self.budget, *self.sizes[index + 1 :]]

    @rule()
    def make_rows_light(self) -> None:
        self.sizes = [min(size, 1) for size in self.sizes]

    @rule(requests=requests_strategy)
    def read(self, requests: list[PageRequest]) -> None:
        self.check_read(requests)

    @rule(extra=st.integers(min_value=0, max_value=8))
    def read_whole_sheet(self, extra: int) -> None:
        self.check_read([PageRequest(limit=len(self.sizes) + 1 + extra, offset=0)])

    def check_read(self, requests: list[PageRequest]) -> None:
        road = FakeRoad(list(self.sizes), self.budget)
        spans = [self.sizes[r.offset : r.offset + r.limit] for r in requests]
        oversized = [any(size > self.budget for size in span) for span in spans]
        try:
            pages = run(road, requests)
        except ReadBatchTooLargeError:
            assert any(oversized), "raised although every row fits alone"
        else:
            assert not any(oversized), "a row over budget was returned"
            assert [(p.limit, p.offset) for p in pages] == [(r.limit, r.offset) for r in requests]
            assert [p.rows for p in pages] == [road.unbounded(r) for r in requests]
            # Inside one fitting chunk, the successful halves are the chunk's
            # canonical cover in the halving tree: at most two per level; at
            # most one more straddles each boundary between chunks; one empty tail.
            allowed = sum(
                fewest_chunks(span, self.budget) * (2 * depth(r.limit) + 1) + 1
                for r, span in zip(requests, spans, strict=True)
            )
            assert len(road.succeeded) <= allowed
        assert len(road.calls) <= 1 + sum(2 * r.limit for r in requests)

    @rule(
        before=st.lists(st.integers(min_value=0, max_value=5), max_size=40),
        after=st.lists(st.integers(min_value=0, max_value=5), max_size=40),
        extra=st.integers(min_value=0, max_value=8),
        excess=st.integers(min_value=1, max_value=50),
    )
    def read_single_row_over_budget(
        self, before: list[int], after: list[int], extra: int, excess: int
    ) -> None:
        budget = max(1, sum(before) + sum(after))
        sizes = [*before, budget + excess, *after]
        request = PageRequest(limit=len(sizes) + extra, offset=0)
        road = FakeRoad(sizes, budget)
        try:
            run(road, [request])
        except ReadBatchTooLargeError as exc:
            assert exc.observed_bytes == budget + excess
        else:
            raise AssertionError("a row over budget was returned")
        assert len(road.calls) <= 2 * depth(request.limit) + 1
        assert road.calls[-1] == (PageRequest(limit=1, offset=len(before)),)


SplitterMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=12, deadline=None
)
TestSplitterMachine = SplitterMachine.TestCase
