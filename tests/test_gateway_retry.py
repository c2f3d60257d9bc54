"""The retry decisions of one gateway call, tested without I/O."""

from __future__ import annotations

import re

import pytest

from _seed_transient import ALTERNATIVES, EXAMPLES, NOT_TRANSIENT, SEED_TRANSIENT_PATTERN
from sheetplane.budgets import (
    CALL_BUDGET_MS,
    MAX_ATTEMPTS,
    MAX_RETRY_AFTER_MS,
    REQUEST_TIMEOUT_MS,
    RETRY_DELAYS_MS,
)
from sheetplane.gateway._retry import CallBudget, retry_delay_ms
from sheetplane.protocol import (
    TRANSIENT_MESSAGE,
    is_transient_message,
    retry_after_from_body,
    retry_after_from_header,
)


def test_ladder_then_stop() -> None:
    assert [retry_delay_ms(n, None) for n in range(1, MAX_ATTEMPTS)] == list(RETRY_DELAYS_MS)
    assert retry_delay_ms(MAX_ATTEMPTS, None) is None
    assert retry_delay_ms(MAX_ATTEMPTS, 10) is None
    with pytest.raises(ValueError):
        retry_delay_ms(0, None)


def test_retry_after_replaces_the_rung_and_is_clamped() -> None:
    assert retry_delay_ms(1, 1_234) == 1_234
    assert retry_delay_ms(1, 0) == 0
    assert retry_delay_ms(2, MAX_RETRY_AFTER_MS * 10) == MAX_RETRY_AFTER_MS


def test_attempt_deadline_is_cut_at_the_call_deadline() -> None:
    budget = CallBudget(100.0)
    assert budget.deadline == 100.0 + CALL_BUDGET_MS / 1000
    assert budget.attempt_deadline(100.0) == 100.0 + REQUEST_TIMEOUT_MS / 1000
    late = budget.deadline - 1.0
    assert budget.attempt_deadline(late) == budget.deadline


def test_a_wait_that_would_reach_the_deadline_is_not_taken() -> None:
    budget = CallBudget(0.0)
    assert budget.next_attempt_at(10.0, 1, None) == 10.0 + RETRY_DELAYS_MS[0] / 1000
    just_in_time = budget.deadline - RETRY_DELAYS_MS[0] / 1000
    assert budget.next_attempt_at(just_in_time, 1, None) is None
    assert budget.next_attempt_at(just_in_time - 0.001, 1, None) is not None
    assert budget.next_attempt_at(budget.deadline - 1.0, 1, MAX_RETRY_AFTER_MS) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (250, 250),
        (0, 0),
        (1.2, 2),
        (10**12, MAX_RETRY_AFTER_MS),
        (-1, None),
        (float("nan"), None),
        (float("inf"), None),
        (True, None),
        ("100", None),
        (None, None),
    ],
)
def test_retry_after_from_body(value: object, expected: int | None) -> None:
    assert retry_after_from_body(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2", 2_000),
        (" 3 ", 3_000),
        ("0", 0),
        ("9" * 1000, MAX_RETRY_AFTER_MS),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        ("-1", None),
        ("1.5", None),
        ("١", None),
        (None, None),
    ],
)
def test_retry_after_from_header(value: str | None, expected: int | None) -> None:
    assert retry_after_from_header(value) == expected


def test_transient_pattern_is_the_runtimes_list() -> None:
    # The runtime's list gained "requested endpoint could not be found, or
    # you don't have access"; a copy that dropped it retried that answer never.
    assert TRANSIENT_MESSAGE.pattern == SEED_TRANSIENT_PATTERN
    assert TRANSIENT_MESSAGE.flags & re.IGNORECASE


def test_every_alternative_has_examples() -> None:
    assert list(EXAMPLES) == ALTERNATIVES


@pytest.mark.parametrize("text", [text for examples in EXAMPLES.values() for text in examples])
def test_transient_messages(text: str) -> None:
    assert is_transient_message(text)


def test_requested_endpoint_not_found_is_transient() -> None:
    assert is_transient_message(
        "The requested endpoint could not be found, or you don't have access to it."
    )


@pytest.mark.parametrize("text", NOT_TRANSIENT)
def test_other_messages_are_not_transient(text: str) -> None:
    assert not is_transient_message(text)
