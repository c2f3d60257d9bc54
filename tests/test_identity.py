"""Row keys: explicit key fields, a carried ``_key``, derived identities stable across processes."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sheetplane.errors import InvalidInputError
from sheetplane.identity import (
    IDENTITY_HEX_CHARS,
    canonical_key_text,
    derive_row_identity,
    row_key,
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
rows = st.dictionaries(st.text().filter(lambda k: not k.startswith("_")), json_scalars, max_size=6)


def test_derived_identity_is_pinned() -> None:
    # A change to the canonical form would re-key every stored sheet: pin it.
    text = '{"a":1,"b":"é"}'
    expected = "r" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:IDENTITY_HEX_CHARS]
    assert derive_row_identity({"b": "é", "a": 1}) == expected


def test_derived_identity_is_the_same_in_another_process() -> None:
    row = {"company": "Ünïcode Ltd", "n": 3, "nested": {"z": [1, 2.5, None], "a": True}}
    script = (
        "import sys, json; from sheetplane.identity import derive_row_identity; "
        "print(derive_row_identity(json.loads(sys.argv[1])))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, json.dumps(row)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    assert child.stdout.strip() == derive_row_identity(row)


@given(rows)
def test_field_order_and_system_fields_do_not_change_the_identity(row: dict[str, object]) -> None:
    reordered = dict(reversed(list(row.items())))
    with_system = {**row, "_status": "enriched", "_input_index": 9}
    assert derive_row_identity(reordered) == derive_row_identity(row)
    assert derive_row_identity(with_system) == derive_row_identity(row)


def test_different_rows_get_different_identities() -> None:
    assert derive_row_identity({"a": 1}) != derive_row_identity({"a": 2})
    assert derive_row_identity({"a": 1}) != derive_row_identity({"a": "1"})


def test_explicit_key_field_is_stringified_canonically() -> None:
    assert row_key({"id": "abc"}, "id") == "abc"
    assert row_key({"id": 7}, "id") == "7"
    assert row_key({"id": 7.0}, "id") == "7"
    assert row_key({"id": 7.5}, "id") == "7.5"
    assert row_key({"id": True}, "id") == "true"
    assert row_key({"id": {"b": 1, "a": 2}}, "id") == '{"a":2,"b":1}'
    assert row_key({"id": '"; drop table x; --'}, "id") == '"; drop table x; --'


@pytest.mark.parametrize("value", [None, "", math.nan, math.inf])
def test_bad_explicit_keys_are_refused(value: object) -> None:
    with pytest.raises(InvalidInputError):
        row_key({"id": value}, "id")


def test_a_missing_key_field_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="key field 'id'"):
        row_key({"other": 1}, "id")


def test_a_carried_key_wins_over_the_derived_identity() -> None:
    assert row_key({"_key": "k-1", "a": 1}) == "k-1"
    assert row_key({"a": 1}) == derive_row_identity({"a": 1})
    with pytest.raises(InvalidInputError):
        row_key({"_key": 5, "a": 1})


def test_rows_without_a_json_form_have_no_identity() -> None:
    with pytest.raises(InvalidInputError):
        derive_row_identity({"a": math.nan})
    with pytest.raises(InvalidInputError):
        derive_row_identity({"a": object()})
    with pytest.raises(InvalidInputError):
        canonical_key_text([math.inf])
