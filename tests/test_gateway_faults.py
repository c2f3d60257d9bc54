"""Test faults: the header grammar, the schedule, and every kind through the real server."""

from __future__ import annotations

import pytest

from sheetplane.errors import InvalidInputError
from sheetplane.gateway.faults import (
    FAULT_KINDS,
    FaultSchedule,
    FaultSpec,
    format_fault_header,
    parse_fault_header,
)

# --- the header grammar and the schedule (no I/O) ---------------------------------------


def test_parse_header_with_counts_defaults_and_nonce() -> None:
    specs = parse_fault_header("runtime_sheet_read_rows_batch=503:2, ensure_sheet=reset; nonce=abc")
    assert specs == (
        FaultSpec("runtime_sheet_read_rows_batch", "503", 2),
        FaultSpec("ensure_sheet", "reset", 1),
    )


@pytest.mark.parametrize(
    "value",
    ["", "ensure_sheet", "ensure_sheet=teapot", "ensure_sheet=503:x", "ensure_sheet=503:0", ";"],
)
def test_malformed_header_is_refused(value: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_fault_header(value)


def test_format_round_trips_every_kind() -> None:
    specs = tuple(
        FaultSpec(f"action_{i}", kind, i + 1) for i, kind in enumerate(sorted(FAULT_KINDS))
    )
    assert parse_fault_header(format_fault_header(specs, nonce="n1")) == specs


def test_schedule_counts_down_in_order_and_only_for_its_action() -> None:
    schedule = FaultSchedule()
    schedule.arm("read=503:2, read=reset, other=hang")
    assert schedule.pending("read") == 3
    assert [schedule.take("read") for _ in range(4)] == ["503", "503", "reset", None]
    assert schedule.take("unrelated") is None
    assert schedule.take("other") == "hang"
    assert schedule.take("other") is None


def test_same_header_value_arms_once_and_a_new_nonce_arms_again() -> None:
    schedule = FaultSchedule()
    schedule.arm("read=502")
    schedule.arm("read=502")  # a retry carrying the same header
    assert schedule.pending("read") == 1
    assert schedule.take("read") == "502"
    schedule.arm("read=502")
    assert schedule.take("read") is None
    schedule.arm("read=502; nonce=2")
    assert schedule.take("read") == "502"


def test_malformed_header_arms_nothing() -> None:
    schedule = FaultSchedule()
    with pytest.raises(InvalidInputError):
        schedule.arm("read=503, read=bogus")
    assert schedule.pending("read") == 0
