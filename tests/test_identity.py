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

import sheetplane
from sheetplane.errors import InvalidInputError
from sheetplane.identity import (
    APPEND_KEY_SUFFIX_LENGTH,
    IDENTITY_HEX_CHARS,
    append_row_key,
    canonical_key_text,
    derive_row_identity,
    row_key,
)
from sheetplane.store._writes import appended_row_key

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
    assert derive_row_identity({"b": "é", "a": 1}, "leads") == expected


def test_derived_identity_is_the_same_in_another_process() -> None:
    row = {"company": "Ünïcode Ltd", "n": 3, "nested": {"z": [1, 2.5, None], "a": True}}
    script = (
        "import sys, json; from sheetplane.identity import derive_row_identity; "
        "print(derive_row_identity(json.loads(sys.argv[1]), 'leads'))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, json.dumps(row)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    assert child.stdout.strip() == derive_row_identity(row, "leads")


@given(rows)
def test_field_order_and_system_fields_do_not_change_the_identity(row: dict[str, object]) -> None:
    reordered = dict(reversed(list(row.items())))
    with_system = {**row, "_status": "enriched", "_input_index": 9}
    assert derive_row_identity(reordered, "leads") == derive_row_identity(row, "leads")
    assert derive_row_identity(with_system, "leads") == derive_row_identity(row, "leads")


def test_different_rows_get_different_identities() -> None:
    assert derive_row_identity({"a": 1}, "leads") != derive_row_identity({"a": 2}, "leads")
    assert derive_row_identity({"a": 1}, "leads") != derive_row_identity({"a": "1"}, "leads")


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
    assert row_key({"a": 1}) == derive_row_identity({"a": 1}, "leads")
    with pytest.raises(InvalidInputError):
        row_key({"_key": 5, "a": 1})


def test_rows_without_a_json_form_have_no_identity() -> None:
    with pytest.raises(InvalidInputError):
        derive_row_identity({"a": math.nan}, "leads")
    with pytest.raises(InvalidInputError):
        derive_row_identity({"a": object()}, "leads")
    with pytest.raises(InvalidInputError):
        canonical_key_text([math.inf])


# --- the runtime's derivePlayRowIdentity and appended keys, as fixed vectors -----------------

#: (row, table namespace, identity): "r" + the first 32 hex digits of SHA-256 over the
#: row's canonical JSON without its system fields; namespaces are normalised first.
IDENTITY_VECTORS = [
    ({"b": "é", "a": 1}, "leads", "r09ad9fd2fb648cb2f62141215828ea00"),
    (
        {"a": 1, "b": "é", "_status": "enriched", "__deeplineRowKey": "k"},
        " Leads ",
        ("r09ad9fd2fb648cb2f62141215828ea00"),
    ),
    (
        {"company": "Acme", "n": 3, "_status": "enriched"},
        "Other",
        ("rc9cc61bcdf8338f0493e2bed83e64af1"),
    ),
]

#: (idempotency key, ordinal, suffix): SHA-1 of f"{idempotency_key}:{ordinal}", 12 hex digits.
APPEND_VECTORS = [
    ("k1", 0, "ce710b9c0f02"),
    ("k1", 1, "3050538ee440"),
    ("import-2026-12-01", 41, "4ad6ad073cc4"),
    ("é:x", 7, "7834e7c5289b"),
]


@pytest.mark.parametrize(("row", "namespace", "identity"), IDENTITY_VECTORS)
def test_derive_row_identity_vectors(row: dict[str, object], namespace: str, identity: str) -> None:
    assert sheetplane.derive_row_identity(row, namespace) == identity


def test_derive_row_identity_takes_the_namespace_and_refuses_an_empty_one() -> None:
    with pytest.raises(InvalidInputError, match="table_namespace"):
        sheetplane.derive_row_identity({"a": 1}, "   ")
    with pytest.raises(TypeError):
        sheetplane.derive_row_identity({"a": 1})  # type: ignore[call-arg]


@pytest.mark.parametrize(("idempotency_key", "ordinal", "suffix"), APPEND_VECTORS)
def test_append_key_vectors(idempotency_key: str, ordinal: int, suffix: str) -> None:
    base = sheetplane.derive_row_identity({"company": "b"}, "leads")
    key = append_row_key(base, idempotency_key, ordinal)
    assert key == f"{base}:append:{suffix}"
    assert APPEND_KEY_SUFFIX_LENGTH == 12 == len(suffix)
    assert appended_row_key({"company": "b"}, idempotency_key, ordinal) == key


def test_an_empty_deepline_row_key_is_refused() -> None:
    # The runtime drops such a row (its key is falsy); sheetplane refuses it, typed.
    with pytest.raises(InvalidInputError, match="__deeplineRowKey"):
        row_key({"__deeplineRowKey": "", "email": "a@example.com"})
