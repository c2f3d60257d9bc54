"""The wire's JSON (``gateway._wire.encode_body``/``decode_body``: orjson writes,
msgspec reads, each with a standard-library fallback) against the measure budgets
use (``json_byte_length_up_to``) and against ``json.loads``."""

from __future__ import annotations

import json
import math
import tracemalloc
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sheetplane import json_byte_length_up_to
from sheetplane.gateway._wire import decode_body, encode_body

# Text without lone surrogates (the measure refuses those; the wire never sends them raw).
text = st.text(st.characters(blacklist_categories=("Cs",)))
scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: past 64 bits is the standard library's part
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(text, children, max_size=6),
    max_leaves=40,
)


def _floats(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, list):
        return [f for item in value for f in _floats(item)]
    if isinstance(value, dict):
        return [f for item in value.values() for f in _floats(item)]
    return []


def _exponent_savings(value: Any) -> int:
    """Bytes orjson saves over ``repr`` on floats: ``1e-07`` is written ``1e-7``;
    none when an integer past 64 bits sends the whole body to the standard library."""
    if any(isinstance(leaf, int) and not -(2**63) <= leaf < 2**64 for leaf in _leaves(value)):
        return 0
    return sum(len(repr(f)) - len(orjson.dumps(f)) for f in _floats(value))


@settings(max_examples=400)
@given(values)
def test_encoded_length_is_the_measured_length(value: Any) -> None:
    encoded = encode_body(value)
    measured = json_byte_length_up_to(value, 1 << 30)
    assert not measured.exceeded
    assert len(encoded) == measured.bytes - _exponent_savings(value)
    # Compact: exactly the standard library's compact form, but for float exponents.
    stdlib = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert len(encoded) == len(stdlib) - _exponent_savings(value)
    assert decode_body(encoded) == value


@settings(max_examples=300)
@given(values)
def test_decoding_agrees_with_json_loads(value: Any) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode("utf-8")  # spaced, as other producers write
    decoded = decode_body(raw)
    assert decoded == json.loads(raw)
    # Integers stay integers, however long (orjson would read 2**70 as a float).
    assert [type(v) for v in _leaves(decoded)] == [type(v) for v in _leaves(value)]


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


@pytest.mark.parametrize(
    "raw",
    [
        b"NaN",
        b'{"a":Infinity}',
        b"1e400",
        b'"\\ud800"',
        b"[" * 5000 + b"]" * 5000,
        b"\xef\xbb\xbf{}",
    ],
)
def test_what_msgspec_refuses_reads_as_json_loads_reads_it(raw: bytes) -> None:
    try:
        expected: Any = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            decode_body(raw)
        return
    got = decode_body(raw)
    assert repr(got) == repr(expected)  # NaN != NaN; compare the spelling


def test_non_string_keys_and_non_finite_floats_are_not_written() -> None:
    with pytest.raises(TypeError, match="keys must be strings"):
        encode_body({"row": {1: "x"}})
    # The fallback refuses them; orjson would write null, so callers measure first
    # (the client does: see test_gateway_client's non-finite test).
    with pytest.raises(ValueError):
        encode_body({"n": 2**70, "x": math.nan})


def test_a_lone_surrogate_goes_out_escaped() -> None:
    assert encode_body({"error": "bad \ud800"}) == b'{"error":"bad \\ud800"}'
    assert encode_body({"big": 2**70}) == b'{"big":1180591620717411303424}'


def test_decoding_a_page_holds_little_more_than_its_result() -> None:
    """A page answer decoded in the client is the runner's largest allocation; the
    reader must not hold a parse document beside the result (orjson's held about
    about its body again, up to
    fifteen times it for pages of short strings)."""
    rows = [
        {"_key": f"r{i:032x}", "company": f"Company {i}", "employees": i, "_error": None}
        for i in range(20_000)
    ]
    raw = encode_body({"pages": [{"rows": rows, "limit": 20_000, "offset": 0}]})
    tracemalloc.start()
    try:
        decoded = decode_body(raw)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded["pages"][0]["rows"] == rows
    assert peak - held <= len(raw) // 8
