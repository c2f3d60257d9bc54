"""The gateway client under arbitrary fault schedules, in virtual time.

A plain model of one call (``sheetplane.testing.models.predict_call``: the
ladder, the clamped Retry-After, the attempt timeout cut at the call
deadline) predicts when each request is sent, when
the call ends and how; the real ``GatewayClient`` runs the same schedule
against a fake transport under ``trio.testing.MockClock``. Invariants:

* every call ends, with an answer or a typed ``SheetplaneError``, no later
  than ``CALL_BUDGET_MS`` after it started;
* requests go out exactly when the model says (the ladder, or an honoured
  and clamped Retry-After), and none at or after the call's deadline;
* a batch read that was answered is never read again; a legacy gateway's
  answer leads to single-page reads only.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from sheetplane import (
    ReadBatchTooLargeError,
    SheetplaneError,
)
from sheetplane.budgets import (
    CALL_BUDGET_MS,
    MAX_ATTEMPTS,
    REQUEST_TIMEOUT_MS,
)
from sheetplane.gateway.client import GatewayClient
from sheetplane.pages import PageRequest
from sheetplane.testing.models import predict_call

from ._fault_transport import FaultTransport, faults

BATCH = "runtime_sheet_read_rows_batch"
#: Faults that reach no gateway (refused, reset before an answer).
UNREACHED = frozenset({"connect", "reset", "lost"})
#: The client's jitter draw in these tests (the model is told the same).
DRAW = 0.375
BUDGET = CALL_BUDGET_MS / 1000
TIMEOUT = REQUEST_TIMEOUT_MS / 1000


def run_virtual(fn: Any) -> Any:
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def make_client(transport: FaultTransport) -> GatewayClient:
    return GatewayClient(
        "http://gw.test",
        "token",
        play_name="play",
        transport=httpx.MockTransport(transport.handle),
    )


@settings(max_examples=200, deadline=None)
@given(
    schedule=st.lists(faults.filter(lambda f: f[0] != "413"), max_size=7),
    action=st.sampled_from(["ensure_sheet", "runtime_sheet_summary", "create_db_session"]),
    start=st.integers(0, 10**6).map(lambda ms: ms / 1000),
)
def test_every_call_ends_within_its_budget_as_the_model_says(
    schedule: list[tuple[Any, ...]], action: str, start: float
) -> None:
    transport = FaultTransport(schedule)
    predicted = predict_call(schedule, start, action, draw=DRAW)

    async def main() -> tuple[float, BaseException | None]:
        await trio.sleep_until(start)
        async with make_client(transport) as client:
            try:
                await client.post_action(action, {})
            except SheetplaneError as exc:
                return trio.current_time(), exc
        return trio.current_time(), None

    # The reconnect back-off's jitter, fixed to the model's draw.
    with mock.patch("sheetplane.gateway.client.jitter", lambda: DRAW):
        end, error = run_virtual(main)
    times = [t for t, _, _ in transport.seen]
    assert times == pytest.approx(predicted.request_times, abs=1e-6)
    assert end == pytest.approx(predicted.end, abs=1e-6)
    assert end <= start + BUDGET + 1e-9
    assert all(t < start + BUDGET for t in times)
    if predicted.outcome == "ok":
        assert error is None
    else:
        assert type(error).__name__ == predicted.outcome


@settings(max_examples=150, deadline=None)
@given(schedule=st.lists(faults, max_size=10), pages=st.integers(1, 4))
def test_an_accepted_batch_is_never_read_again(schedule: list[tuple[Any, ...]], pages: int) -> None:
    transport = FaultTransport(schedule)
    requests = [PageRequest(limit=10, offset=10 * i) for i in range(pages)]

    async def main() -> tuple[Any, BaseException | None]:
        async with make_client(transport) as client:
            try:
                return await client.read_rows_batch("leads", requests), None
            except SheetplaneError as exc:
                return None, exc

    result, error = run_virtual(main)
    actions = [action for _, action, _ in transport.seen]
    batch_calls = [i for i, a in enumerate(actions) if a == BATCH]
    # The batch action is tried first, and only as one call's attempts.
    assert actions[0] == BATCH and batch_calls == list(range(len(batch_calls)))
    # Attempts that reached no gateway do not spend the ladder.
    reached = [i for i in batch_calls if transport.seen[i][2][0] not in UNREACHED]
    assert len(reached) <= MAX_ATTEMPTS
    answered = [i for i in batch_calls if transport.seen[i][2][0] == "ok"]
    # At most one batch answer, and it is the last batch request.
    assert answered in ([], [batch_calls[-1]])
    last_batch_fault = transport.seen[batch_calls[-1]][2][0]
    singles = actions[len(batch_calls) :]
    if last_batch_fault == "unsupported":
        # The legacy fallback: single pages, one call each, and nothing else.
        assert set(singles) <= {"runtime_sheet_read_rows"}
    else:
        assert singles == []
    if result is not None:
        assert [(p.limit, p.offset) for p in result] == [(r.limit, r.offset) for r in requests]
        assert error is None
    else:
        assert isinstance(error, SheetplaneError)
        if last_batch_fault == "413":
            assert isinstance(error, ReadBatchTooLargeError)
