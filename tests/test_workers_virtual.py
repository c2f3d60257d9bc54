"""The claim and lease rules of ``map_attempt``'s workers under virtual time, against a
plain model of the store's shares (the rules of ``store/_shares.py``, on the trio clock):
shares divide the rows, a lease is kept by renewals, a worker that stops renewing is
stopped before its lease ends and its share is taken over after, a newer admission
stops every worker at its next renewal, and the last share waits for its holder."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from sheetplane._attempts import Attempt, AttemptStatus, ShareClaim, ShareLease, ShareRenewal
from sheetplane._types import CompleteRow, FailRow, StaleRow, TerminalWriteResult
from sheetplane._workers import AttemptTally, run_attempt
from sheetplane.errors import AttemptSupersededError, LeaseLostError

ATTEMPT = Attempt("play", "ns", "run-1", 1)
LEASE = ShareLease(ttl_ms=1_000, renewal_ms=200, guard_ms=400, poll_ms=100)


@attrs.define
class _Share:
    first: int
    last: int
    holder: str | None
    token: str | None
    expires: float
    done: bool = False
    claims: int = 1


@attrs.define
class ModelShares:
    """The store's share rules over plain state, on the trio clock."""

    rows: int
    version: int = 1
    row_status: dict[int, str] = attrs.Factory(dict)
    shares: list[_Share] = attrs.Factory(list)
    covered: int = -1
    writes: dict[int, int] = attrs.Factory(dict)
    """Terminal writes per row."""
    claims: list[tuple[float, str, int]] = attrs.Factory(list)
    """(when, holder, share) of every claim."""

    def __attrs_post_init__(self) -> None:
        self.row_status = dict.fromkeys(range(self.rows), "pending")

    def unsettled(self, first: int, last: int) -> list[int]:
        return [i for i in range(first, last + 1) if self.row_status.get(i) == "pending"]

    async def claim(
        self, write_version: int, holder: str, token: str, *, ttl_ms: int, max_rows: int
    ) -> ShareClaim:
        await trio.lowlevel.checkpoint()
        now = trio.current_time()
        if self.version > write_version:
            return ShareClaim("superseded")
        for number, share in enumerate(self.shares, 1):
            if not share.done and share.expires <= now:
                share.holder, share.token = holder, token
                share.expires = now + ttl_ms / 1000
                share.claims += 1
                self.claims.append((now, holder, number))
                return ShareClaim("claimed", number, share.first, share.last, taken_over=True)
        todo = [i for i in range(self.covered + 1, self.rows) if self.row_status[i] == "pending"]
        if todo:
            chunk = todo[:max_rows]
            self.covered = chunk[-1]
            self.shares.append(_Share(chunk[0], chunk[-1], holder, token, now + ttl_ms / 1000))
            number = len(self.shares)
            self.claims.append((now, holder, number))
            return ShareClaim("claimed", number, chunk[0], chunk[-1])
        live = [s for s in self.shares if not s.done]
        first = min((s.expires for s in live), default=None)
        retry = None if first is None else max(0, math.ceil((first - now) * 1000))
        return ShareClaim("none", live=len(live), retry_after_ms=retry)

    async def renew(
        self, write_version: int, share: int, token: str, *, ttl_ms: int
    ) -> ShareRenewal:
        await trio.lowlevel.checkpoint()
        if self.version > write_version:
            return ShareRenewal("superseded")
        held = self.shares[share - 1]
        if held.done or held.token != token:
            return ShareRenewal("lost")
        held.expires = trio.current_time() + ttl_ms / 1000
        return ShareRenewal("renewed")

    async def release(
        self, write_version: int, share: int, token: str, *, finished: bool
    ) -> ShareRenewal:
        await trio.lowlevel.checkpoint()
        held = self.shares[share - 1]
        if held.done or held.token != token:
            return ShareRenewal("lost")
        held.done = finished and not self.unsettled(held.first, held.last)
        held.token = None
        held.expires = min(held.expires, trio.current_time())
        return ShareRenewal("released")

    async def status(self, write_version: int) -> AttemptStatus:
        await trio.lowlevel.checkpoint()
        pending = sum(1 for s in self.row_status.values() if s == "pending")
        done = sum(1 for s in self.row_status.values() if s == "enriched")
        return AttemptStatus(pending, 0, done, 0, 0, superseded=self.version > write_version)

    async def rows_of(self, claim: ShareClaim) -> list[dict[str, Any]]:
        await trio.lowlevel.checkpoint()
        assert claim.first_index is not None and claim.last_index is not None
        return [
            {"_key": f"k{i}", "i": i} for i in self.unsettled(claim.first_index, claim.last_index)
        ]

    async def write(self, rows: Sequence[CompleteRow] | Sequence[FailRow]) -> TerminalWriteResult:
        await trio.lowlevel.checkpoint()
        stale = []
        for row in rows:
            i = int(row.key[1:])
            if self.version > 1:
                stale.append(row.key)
                continue
            if self.row_status[i] == "pending":
                self.row_status[i] = "enriched"
                self.writes[i] = self.writes.get(i, 0) + 1
        if stale:
            return TerminalWriteResult(
                (), tuple(StaleRow(k, "newer_write_version", self.version) for k in stale), 0
            )
        return TerminalWriteResult(tuple(r.key for r in rows), (), len(rows))


async def work(
    model: ModelShares,
    fn: Any,
    *,
    concurrency: int = 4,
    tally: AttemptTally | None = None,
    shares: Any = None,
) -> tuple[int, int, int, int]:
    return await run_attempt(
        ATTEMPT,
        model if shares is None else shares,
        model.rows_of,
        fn,
        complete=model.write,
        fail=model.write,
        concurrency=concurrency,
        batch_rows=8,
        flush_seconds=0.01,
        lease=LEASE,
        total=model.rows,
        tally=tally,
    )


def sleeper(seconds: float) -> Any:
    async def fn(row: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep(seconds)
        return {"i": row["i"]}

    return fn


def test_workers_divide_the_rows_and_each_is_written_once() -> None:
    model = ModelShares(rows=500)
    results: list[tuple[int, int, int, int]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(lambda: _append(results, work(model, sleeper(0.05))))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sum(r[1] for r in results) == 500
    assert all(r[0] > 0 for r in results)
    assert model.writes == dict.fromkeys(range(500), 1)
    assert all(s.done for s in model.shares)


async def _append(into: list[Any], awaitable: Any) -> None:
    into.append(await awaitable)


@pytest.mark.parametrize(
    ("seconds", "sizes"),
    [
        # 64 rows (16 rounds of 4 calls) handed out at once: each next share doubles.
        (0.0, [64, 128, 256, 512, 1_024, 2_016]),
        # 64 rows of 50 ms calls, 4 at a time, take 0.8 s: the next share doubles, and
        # its 128 rows take 1.6 s, past SHARE_GROW_BELOW_MS: the size holds there.
        (0.05, [64, 128, 128, 64]),
        # 64 rows of 70 ms calls take 1.12 s, past SHARE_GROW_BELOW_MS: the size holds.
        (0.07, [64] * 6),
    ],
)
def test_a_worker_whose_calls_are_fast_claims_larger_shares(
    seconds: float, sizes: list[int]
) -> None:
    model = ModelShares(rows=4_000 if seconds == 0.0 else 384)
    trio.run(work, model, sleeper(seconds), clock=trio.testing.MockClock(autojump_threshold=0))
    assert [s.last - s.first + 1 for s in model.shares] == sizes
    assert model.writes == dict.fromkeys(range(model.rows), 1)


def test_a_share_held_longer_than_its_ttl_is_renewed_and_never_taken_over() -> None:
    model = ModelShares(rows=4)
    tally = AttemptTally()

    async def main() -> None:
        # One call takes ten leases' time: the keeper renews all along.
        await work(model, sleeper(10.0), concurrency=4, tally=tally)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert model.writes == dict.fromkeys(range(4), 1)
    assert tally.renewals >= 10 / (LEASE.renewal_ms / 1000) - 1
    assert [s.claims for s in model.shares] == [1]


@attrs.define
class Cut:
    """A road to the model whose renewals stop answering at ``at`` (a worker cut off)."""

    model: ModelShares
    at: float

    async def claim(self, *args: Any, **kwargs: Any) -> ShareClaim:
        return await self.model.claim(*args, **kwargs)

    async def renew(self, *args: Any, **kwargs: Any) -> ShareRenewal:
        if trio.current_time() >= self.at:
            await trio.sleep_forever()
        return await self.model.renew(*args, **kwargs)

    async def release(self, *args: Any, **kwargs: Any) -> ShareRenewal:
        if trio.current_time() >= self.at:
            await trio.sleep_forever()
        return await self.model.release(*args, **kwargs)

    async def status(self, write_version: int) -> AttemptStatus:
        return await self.model.status(write_version)


def test_a_cut_off_worker_stops_before_its_lease_ends_and_another_takes_its_share_after() -> None:
    model = ModelShares(rows=8)
    calls: list[tuple[str, int, float, float]] = []
    outcome: dict[str, Any] = {}

    def recording(name: str) -> Any:
        async def fn(row: dict[str, Any]) -> dict[str, Any]:
            start = trio.current_time()
            try:
                await trio.sleep(3.0)
            finally:
                calls.append((name, row["i"], start, trio.current_time()))
            return {"i": row["i"]}

        return fn

    async def cut_worker() -> None:
        try:
            await work(model, recording("cut"), concurrency=8, shares=Cut(model, at=0.5))
        except LeaseLostError as exc:
            outcome["cut"] = (exc, trio.current_time())

    async def second_worker() -> None:
        await trio.sleep(0.1)  # after the first took the one share
        outcome["second"] = await work(model, recording("second"), concurrency=8)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_worker)
            nursery.start_soon(second_worker)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    error, _ = outcome["cut"]
    assert isinstance(error, LeaseLostError) and error.what == "share"
    # Its last renewal was sent at 0.4: its calls were cancelled at 0.4 + TTL - guard,
    # strictly before the expiry the store counts from a later instant.
    stopped = max(end for name, _, _, end in calls if name == "cut")
    assert stopped == pytest.approx(0.4 + (LEASE.ttl_ms - LEASE.guard_ms) / 1000)
    taken = [when for when, holder, share in model.claims if share == 1][1]
    assert taken >= 0.4 + LEASE.ttl_ms / 1000 > stopped
    # None of the taker's calls on its rows started before the share was taken.
    assert min(start for name, _, start, _ in calls if name == "second") >= taken
    assert outcome["second"][1] == 8
    assert model.writes == dict.fromkeys(range(8), 1)


def test_a_newer_admission_stops_every_worker_at_its_next_renewal() -> None:
    model = ModelShares(rows=200)  # a share of 64 rows for each worker
    errors: list[tuple[BaseException, float]] = []
    cancelled = 0

    async def slow(row: dict[str, Any]) -> dict[str, Any]:
        nonlocal cancelled
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled += 1
            raise
        return {}

    async def worker() -> None:
        try:
            await work(model, slow, concurrency=4)
        except AttemptSupersededError as exc:
            errors.append((exc, trio.current_time()))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker)
            nursery.start_soon(worker)
            await trio.sleep(1.05)
            model.version = 2  # a newer admission

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(errors) == 2
    assert all(when <= 1.05 + LEASE.renewal_ms / 1000 for _, when in errors)
    assert cancelled == 8
    assert model.writes == {}


def test_the_last_share_waits_for_its_holder_and_is_taken_when_it_dies() -> None:
    model = ModelShares(rows=4)
    outcome: dict[str, Any] = {}

    async def never_returns(row: dict[str, Any]) -> dict[str, Any]:
        await trio.sleep_forever()
        return {}

    async def dying() -> None:
        with trio.move_on_after(0.5):
            await work(model, never_returns, shares=Cut(model, at=0.0))

    async def waiting() -> None:
        await trio.sleep(0.1)
        outcome["waiting"] = (await work(model, sleeper(0.01)), trio.current_time())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dying)
            nursery.start_soon(waiting)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    (rows, completed, _, _), finished = outcome["waiting"]
    # It found nothing to claim, polled while the share was held, and took it once its
    # lease (never renewed, never released) ended.
    assert (rows, completed) == (4, 4)
    assert finished >= LEASE.ttl_ms / 1000
    assert model.writes == dict.fromkeys(range(4), 1)


def test_a_refused_renewal_stops_the_worker() -> None:
    model = ModelShares(rows=4)
    caught: list[BaseException] = []

    async def main() -> None:
        async def steal() -> None:
            await trio.sleep(0.3)
            model.shares[0].token = "another worker's token"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(steal)
            try:
                await work(model, sleeper(5.0))
            except LeaseLostError as exc:
                caught.append(exc)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(caught) == 1 and "refused" in str(caught[0])
    assert model.writes == {}


@attrs.define
class RefusesOnce:
    """A road to the model that refuses one renewal after ``at`` (a transient loss)."""

    model: ModelShares
    at: float
    refused: bool = False

    async def claim(self, *args: Any, **kwargs: Any) -> ShareClaim:
        return await self.model.claim(*args, **kwargs)

    async def renew(self, *args: Any, **kwargs: Any) -> ShareRenewal:
        if not self.refused and trio.current_time() >= self.at:
            self.refused = True
            return ShareRenewal("lost")
        return await self.model.renew(*args, **kwargs)

    async def release(self, *args: Any, **kwargs: Any) -> ShareRenewal:
        return await self.model.release(*args, **kwargs)

    async def status(self, write_version: int) -> AttemptStatus:
        return await self.model.status(write_version)


def test_a_worker_that_lost_a_lease_after_writing_starts_again_and_finishes() -> None:
    model = ModelShares(rows=200)
    tally = AttemptTally()
    result: list[tuple[int, int, int, int]] = []

    async def main() -> None:
        result.append(
            await work(model, sleeper(0.05), tally=tally, shares=RefusesOnce(model, at=0.5))
        )

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert tally.lost == 1
    assert result[0][1] == 200 == tally.completed
    assert model.writes == dict.fromkeys(range(200), 1)
    assert tally.taken_over >= 1  # its own shares, given back and claimed again


@attrs.define
class Slow:
    """A road to the model whose claims and reads take ``seconds`` each (a real store's
    round trips), so a worker claims and reads its next share ahead; it records the
    renewals that landed, ``(when, share)``."""

    model: ModelShares
    seconds: float = 0.05
    renewed: list[tuple[float, int]] = attrs.Factory(list)

    async def claim(self, *args: Any, **kwargs: Any) -> ShareClaim:
        await trio.sleep(self.seconds)
        return await self.model.claim(*args, **kwargs)

    async def renew(self, write_version: int, share: int, *args: Any, **kwargs: Any) -> Any:
        renewal = await self.model.renew(write_version, share, *args, **kwargs)
        if renewal.outcome == "renewed":
            self.renewed.append((trio.current_time(), share))
        return renewal

    async def release(self, *args: Any, **kwargs: Any) -> ShareRenewal:
        return await self.model.release(*args, **kwargs)

    async def status(self, write_version: int) -> AttemptStatus:
        return await self.model.status(write_version)

    async def rows_of(self, claim: ShareClaim) -> list[dict[str, Any]]:
        await trio.sleep(self.seconds)
        return await self.model.rows_of(claim)


async def slow_work(road: Slow, fn: Any, tally: AttemptTally) -> tuple[int, int, int, int]:
    return await run_attempt(
        ATTEMPT,
        road,
        road.rows_of,
        fn,
        complete=road.model.write,
        fail=road.model.write,
        concurrency=4,
        batch_rows=8,
        flush_seconds=0.01,
        lease=LEASE,
        total=road.model.rows,
        tally=tally,
    )


def test_a_share_claimed_ahead_is_given_back_when_its_worker_is_cancelled() -> None:
    model = ModelShares(rows=640)
    road = Slow(model)
    first, second = AttemptTally(), AttemptTally()
    held: list[list[int]] = []

    async def main() -> None:
        two_held = trio.Event()

        called: set[int] = set()

        async def hangs_once_two_are_held(row: dict[str, Any]) -> dict[str, Any]:
            called.add(row["i"])
            mine = [s for s in model.shares if s.token is not None and not s.done]
            ahead = mine[-1:] and called.isdisjoint(range(mine[-1].first, mine[-1].last + 1))
            if len(mine) == 2 and ahead and not two_held.is_set():
                held.append([model.shares.index(s) + 1 for s in mine])
                two_held.set()
            if two_held.is_set():
                await trio.sleep_forever()
            await trio.sleep(0.01)
            return {"i": row["i"]}

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_work, road, hangs_once_two_are_held, first)
            await two_held.wait()
            nursery.cancel_scope.cancel()
        # Both shares it held (the one its calls took rows from, and the next, claimed
        # ahead, none of whose rows a call had taken) were given back: neither is held,
        # neither is done.
        given_back = [model.shares[n - 1] for n in held[0]]
        assert all(s.token is None and not s.done for s in given_back)
        await slow_work(Slow(model), sleeper(0.01), second)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert first.shares == 2
    assert second.taken_over == 2
    assert model.writes == dict.fromkeys(range(640), 1)
    assert all(s.done for s in model.shares)


def test_a_share_claimed_ahead_is_renewed_while_it_waits() -> None:
    model = ModelShares(rows=128)  # two shares of 64 rows (16 rounds of 4 calls)
    road = Slow(model)
    tally = AttemptTally()
    started: dict[int, float] = {}

    async def slow_call(row: dict[str, Any]) -> dict[str, Any]:
        started.setdefault(row["i"], trio.current_time())
        await trio.sleep(0.5)
        return {"i": row["i"]}

    trio.run(slow_work, road, slow_call, tally, clock=trio.testing.MockClock(autojump_threshold=0))
    assert tally.ahead == 1
    second = model.shares[1]
    first_call = min(started[i] for i in range(second.first, second.last + 1))
    claimed = next(when for when, _, share in model.claims if share == 2)
    # Claimed ahead, it waited for the first share's rows to go out, and its lease was
    # renewed meanwhile, on the same schedule as the share its calls took rows from.
    assert claimed < first_call
    assert any(claimed < when < first_call for when, share in road.renewed if share == 2)
    assert [s.claims for s in model.shares] == [1, 1]
    assert model.writes == dict.fromkeys(range(128), 1)
