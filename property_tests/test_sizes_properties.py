"""(c) json_byte_length_up_to against json.dumps for arbitrary JSON values."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sheetplane import SizeMeasurement, json_byte_length_up_to

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
keys = st.text() | st.integers() | st.floats() | st.booleans() | st.none()
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(keys, children, max_size=6)
    ),
    max_leaves=40,
)


def wire_length(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


@settings(max_examples=300)
@given(json_values, st.integers(min_value=-3, max_value=3))
def test_limits_around_the_exact_length(value: Any, delta: int) -> None:
    exact = wire_length(value)
    limit = max(0, exact + delta)
    measured = json_byte_length_up_to(value, limit)
    if exact <= limit:
        assert measured == SizeMeasurement(exact, False)
    else:
        assert measured.exceeded
        assert limit < measured.bytes <= exact


@settings(max_examples=300)
@given(json_values, st.data())
def test_any_limit_is_exact_or_bounded(value: Any, data: st.DataObject) -> None:
    exact = wire_length(value)
    limit = data.draw(st.integers(min_value=0, max_value=exact + 10), label="limit")
    measured = json_byte_length_up_to(value, limit)
    assert measured.exceeded == (exact > limit)
    if measured.exceeded:
        assert limit < measured.bytes <= exact
    else:
        assert measured.bytes == exact
