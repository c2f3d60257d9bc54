"""An in-memory SheetRoad for page-reader and dataset tests: no database, every call recorded."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from sheetplane import ReadBatchTooLargeError, json_byte_length_up_to
from sheetplane.pages import Page, PageRequest, ReadScope


def make_rows(n: int, *, pad: int = 0) -> list[dict[str, Any]]:
    """``n`` rows in read order, each ``pad`` characters of payload bigger than the last."""
    return [
        {"_key": f"k{i:07d}", "_input_index": i, "_status": "pending", "pad": "x" * pad}
        for i in range(n)
    ]


def scope(namespace: str = "sheet", token: str = "executor-token") -> ReadScope:
    return ReadScope.for_token(
        base_url="http://gateway.test",
        token=token,
        org_id="org",
        play_name="play",
        run_id="run",
        table_namespace=namespace,
    )


@attrs.define(eq=False)
class FakeRoad:
    """Rows in read order; reads answering more than ``budget`` bytes are too large.

    ``delay`` is virtual time each read takes; ``hang`` makes ``read_batch``
    wait until ``release`` is set.
    """

    rows: list[dict[str, Any]]
    scope: ReadScope = attrs.field(factory=scope)
    budget: int | None = None
    delay: float = 0.0
    hang: bool = False
    release: trio.Event = attrs.field(factory=trio.Event)
    batch_calls: list[tuple[PageRequest, ...]] = attrs.field(factory=list)
    after_calls: list[tuple[object, int]] = attrs.field(factory=list)
    count_calls: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    keys: list[tuple[int, str]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.keys = [(row["_input_index"], row["_key"]) for row in self.rows]

    def _check_budget(self, rows: Sequence[dict[str, Any]]) -> None:
        if self.budget is None:
            return
        measured = json_byte_length_up_to(list(rows), self.budget)
        if measured.exceeded:
            raise ReadBatchTooLargeError(measured.bytes)

    async def read_batch(self, pages: Sequence[PageRequest]) -> list[Page]:
        self.batch_calls.append(tuple(pages))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.hang:
                await self.release.wait()
            await trio.sleep(self.delay)
            answer = [
                Page(
                    rows=tuple(self.rows[p.offset : p.offset + p.limit]),
                    limit=p.limit,
                    offset=p.offset,
                )
                for p in pages
            ]
            self._check_budget([row for page in answer for row in page.rows])
            return answer
        finally:
            self.in_flight -= 1

    async def read_after(
        self, cursor: object | None, limit: int
    ) -> tuple[list[dict[str, Any]], object | None]:
        self.after_calls.append((cursor, limit))
        await trio.sleep(self.delay)
        start = 0 if cursor is None else bisect.bisect_right(self.keys, cursor)
        rows = self.rows[start : start + limit]
        self._check_budget(rows)
        more = start + len(rows) < len(self.rows)
        return list(rows), (self.keys[start + len(rows) - 1] if rows and more else None)

    async def count(self) -> int:
        self.count_calls += 1
        await trio.lowlevel.checkpoint()
        return len(self.rows)
