"""json_byte_length_up_to: exact compact-JSON lengths, early stops, refused inputs."""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from typing import Any

import pytest

from sheetplane import InvalidInputError, SizeMeasurement, json_byte_length_up_to
from sheetplane.budgets import JSON_SIZE_SLICE_CHARS, KiB, MiB


def wire_length(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


class IntSubclass(int):
    def __repr__(self) -> str:
        return "not-a-number"


class FloatSubclass(float):
    def __repr__(self) -> str:
        return "nope"


CASES: list[Any] = [
    None,
    True,
    False,
    0,
    -17,
    10**40,
    1.5,
    -0.0,
    1e300,
    5e-324,
    "",
    "plain",
    'quote " and backslash \\',
    "\b\f\n\r\t",
    "\x00\x01\x1f\x7f",
    "é中😀",
    "\u2028\u2029",
    [],
    {},
    (),
    [1, [2, [3, []]]],
    (1, "two", (3.0,)),
    {"a": 1, "b": [True, None], "é": {"x": "y"}},
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    {True: "bool key", -3: "negative int key"},
    {float("nan"): 1, float("inf"): 2, float("-inf"): 3},
    {"\n": "escaped key", "😀": "non-ascii key"},
    IntSubclass(42),
    FloatSubclass(2.25),
    [IntSubclass(7), {IntSubclass(3): FloatSubclass(0.5)}],
]


@pytest.mark.parametrize("value", CASES, ids=repr)
def test_exact_length_matches_json_dumps(value: Any) -> None:
    exact = wire_length(value)
    assert json_byte_length_up_to(value, exact) == SizeMeasurement(exact, False)
    assert json_byte_length_up_to(value, exact + 100) == SizeMeasurement(exact, False)


@pytest.mark.parametrize("value", CASES, ids=repr)
def test_one_byte_short_reports_exceeded_within_bounds(value: Any) -> None:
    exact = wire_length(value)
    for limit in range(0, exact):
        measured = json_byte_length_up_to(value, limit)
        assert measured.exceeded
        assert limit < measured.bytes <= exact


def mixed_rows(n: int) -> list[Any]:
    rows: list[Any] = []
    for i in range(n):
        row: dict[str, Any] = {"_key": f"k{i}", "i": i, "x": i / 7, "ok": i % 2 == 0, "none": None}
        row["_cell_meta"] = {"city": {"source": "csv", "confidence": 0.5, "tags": ["a", "é\n"]}}
        if i % 97 == 0:
            row["deep"] = [[[[[i]]]]]  # deeper than a flat run goes
        if i % 89 == 0:
            row["sub"] = IntSubclass(i)  # a type json writes but a flat run does not take
        if i % 83 == 0:
            row["keys"] = {1: "int key", None: "none key"}
        rows.append(row)
    return rows


@pytest.mark.parametrize(
    "value",
    [
        mixed_rows(500),
        [f"s{i}\t" for i in range(50_000)],  # runs longer than one slice
        list(range(30_000)),
        [10**4000, -(10**4000), 1],
        ({"a": [1, 2, (3, 4)]}, [], {}, "", [[]]),
    ],
    ids=["mixed rows", "many strings", "many ints", "long ints", "small containers"],
)
def test_long_values_are_exact_and_stop_close_to_any_limit(value: Any) -> None:
    exact = wire_length(value)
    assert json_byte_length_up_to(value, exact) == SizeMeasurement(exact, False)
    largest_member = max(wire_length(member) for member in value)
    for limit in (0, 1, exact // 3, exact // 2, exact - 2, exact - 1):
        measured = json_byte_length_up_to(value, limit)
        assert measured.exceeded
        # Runs are cut by an estimate of what is left under the limit, which
        # escapes and quotes can exceed by a fraction.
        assert limit < measured.bytes <= min(exact, 2 * limit + largest_member + 2)


def test_an_int_too_long_to_write_is_refused_like_json() -> None:
    value = [1, 10**5000]
    with pytest.raises(ValueError):
        json.dumps(value)
    with pytest.raises(ValueError):
        json_byte_length_up_to(value, 10**9)


def test_every_control_character_is_sized_like_json_dumps() -> None:
    for code in range(0x80):
        text = chr(code) * 3
        assert json_byte_length_up_to(text, 10**6).bytes == wire_length(text), hex(code)


def test_long_string_is_measured_across_slices_exactly() -> None:
    text = ("a\n😀é\x01" * JSON_SIZE_SLICE_CHARS)[: 3 * JSON_SIZE_SLICE_CHARS + 7]
    exact = wire_length(text)
    assert json_byte_length_up_to(text, exact) == SizeMeasurement(exact, False)
    over = json_byte_length_up_to(text, exact - 1)
    assert over.exceeded and exact - 1 < over.bytes <= exact


def test_long_string_stops_within_one_slice_of_the_limit() -> None:
    text = "x" * (4 * JSON_SIZE_SLICE_CHARS)
    measured = json_byte_length_up_to(text, 10)
    assert measured.exceeded
    assert 10 < measured.bytes <= 12


def test_deep_nesting_does_not_hit_the_recursion_limit() -> None:
    depth = sys.getrecursionlimit() * 5
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    exact = 2 * depth + len('"leaf"')
    assert json_byte_length_up_to(value, exact) == SizeMeasurement(exact, False)
    with pytest.raises(RecursionError):
        json.dumps(value)  # the reference itself cannot go this deep


def test_the_same_object_twice_is_not_circular() -> None:
    shared = [1, 2]
    value = [shared, shared, {"a": shared}]
    assert json_byte_length_up_to(value, 1000).bytes == wire_length(value)


def test_circular_reference_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(InvalidInputError, match="Circular reference"):
        json_byte_length_up_to(loop, 10**6)
    with pytest.raises(ValueError, match="Circular reference"):
        json.dumps(loop)


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_float_is_refused(number: float) -> None:
    with pytest.raises(InvalidInputError, match="finite"):
        json_byte_length_up_to(number, 100)
    with pytest.raises(InvalidInputError):
        json_byte_length_up_to({"a": [number]}, 100)


def test_lone_surrogate_is_refused_where_json_dumps_output_cannot_be_encoded() -> None:
    for value in ("a\ud800b", {"k": "\udfff"}, {"\ud83d": 1}):
        with pytest.raises(UnicodeEncodeError):
            json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        with pytest.raises(InvalidInputError, match="surrogate"):
            json_byte_length_up_to(value, 100)


def test_lone_surrogate_in_a_long_string_is_refused() -> None:
    text = "x" * (2 * JSON_SIZE_SLICE_CHARS) + "\udc00"
    with pytest.raises(InvalidInputError, match="surrogate"):
        json_byte_length_up_to(text, 10 * JSON_SIZE_SLICE_CHARS)


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", [1, object()], {"a": {1j}}])
def test_non_json_value_raises_type_error_like_json(value: Any) -> None:
    with pytest.raises(TypeError) as ours:
        json_byte_length_up_to(value, 10**6)
    with pytest.raises(TypeError) as theirs:
        json.dumps(value)
    assert str(ours.value) == str(theirs.value)


def test_non_json_key_raises_type_error_like_json() -> None:
    value = {(1, 2): "tuple key"}
    with pytest.raises(TypeError) as ours:
        json_byte_length_up_to(value, 10**6)
    with pytest.raises(TypeError) as theirs:
        json.dumps(value)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("limit", [-1, 1.5, "10", None, True])
def test_bad_limit_is_refused(limit: Any) -> None:
    with pytest.raises(InvalidInputError, match="limit"):
        json_byte_length_up_to([1], limit)


def test_hundred_mebibyte_value_against_one_kibibyte_stops_early_without_building_it() -> None:
    piece = "x" * 98  # 100 bytes once quoted
    value = [piece] * MiB  # about 100 MiB on the wire; the list itself is ~8 MiB of references
    tracemalloc.start()
    try:
        # CPU time, not wall time: the work the measure did, not how long a loaded
        # machine kept this process off a core meanwhile.
        started = time.process_time()
        measured = json_byte_length_up_to(value, KiB)
        elapsed = time.process_time() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert measured.exceeded
    assert KiB < measured.bytes <= KiB + 101
    assert peak < 64 * KiB
    assert elapsed < 0.05


def test_hundred_mebibyte_string_is_measured_a_slice_at_a_time() -> None:
    text = "é" * (50 * MiB)  # 100 MiB of UTF-8
    tracemalloc.start()
    try:
        measured = json_byte_length_up_to({"payload": text}, KiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One slice of at most limit + 1 characters, two bytes each.
    assert measured.exceeded and KiB < measured.bytes <= 2 * (KiB + 1)
    assert peak < 16 * KiB
