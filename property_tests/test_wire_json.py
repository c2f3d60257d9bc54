"""The wire's JSON (``sheetplane._json.encode_body``/``decode_body``, which also
load the store's jsonb values: orjson writes, msgspec reads, each with a
standard-library fallback) against the measure budgets use
(``json_byte_length_up_to``) and against ``json.loads``."""

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
from sheetplane.protocol import decode_body, encode_body

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
    # As psycopg hands the store's loader a jsonb value: a memoryview, or text.
    assert decode_body(memoryview(raw)) == decoded == decode_body(raw.decode("utf-8"))
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
    assert repr(decode_body(memoryview(raw))) == repr(expected)


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


# --- the rows Postgres writes as JSON, against the rows the store decodes -------------------

#: Column ids a contract may carry: quotes, backslashes, controls, SQL, non-ASCII.
_COLUMN_IDS = ("plain", 'quo"te', "back\\slash", "ctl\x01\x1f\n", "ünï ☃ 😀", "'; drop --")
# What jsonb stores: no NUL in text, and no lone surrogate.
_stored_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
_stored_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _stored_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(_stored_text, children, max_size=4)
    ),
    max_leaves=12,
)
_stored_rows = st.lists(
    st.tuples(
        st.lists(_stored_values, min_size=len(_COLUMN_IDS), max_size=len(_COLUMN_IDS)),
        st.none() | _stored_text,  # _error
        st.dictionaries(_stored_text, _stored_values, max_size=3),  # _cell_meta
    ),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def stored_sheet(sheetplane_database_url: str) -> Any:
    import trio

    from sheetplane._types import ContractColumn, SheetContract, SheetRef
    from sheetplane.store import open_store, sheet_names

    sheet = SheetRef("wire-json-org", "wire-json", "pg-json")
    contract = SheetContract(
        tuple(ContractColumn(cid, f"col_{n}", "input") for n, cid in enumerate(_COLUMN_IDS))
    )

    async def ensure() -> None:
        async with open_store(sheetplane_database_url, max_connections=1) as store:
            await store.ensure_sheet(sheet, contract)

    trio.run(ensure)
    return sheetplane_database_url, sheet_names(sheet)


@settings(max_examples=60, deadline=None)
@given(rows=_stored_rows)
def test_rows_postgres_writes_are_the_compact_json_of_the_rows_the_store_reads(
    stored_sheet: Any, rows: list[tuple[list[Any], str | None, dict[str, Any]]]
) -> None:
    """Each row Postgres writes (``_Json``) is byte for byte the compact JSON of
    the dict row the store decodes (``_Dicts``), so its length is what
    ``json_byte_length_up_to`` measures, in both row modes."""
    import psycopg
    from psycopg import sql
    from psycopg.types.json import Jsonb

    from sheetplane._types import PageRequest, RowFilter
    from sheetplane.store._reads import _Dicts, _filter, _Json, _projection, _read_batch
    from sheetplane.store._schema import column_ids

    url, names = stored_sheet
    table = names.ident("sheet_table")
    columns = sql.SQL(", ").join(sql.Identifier(f"col_{n}") for n in range(len(_COLUMN_IDS)))
    with psycopg.connect(url) as conn:
        conn.execute(sql.SQL("DELETE FROM {}").format(table))
        for index, (cells, error, meta) in enumerate(rows):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (_key, _input_index, _error, _cell_meta, {}) VALUES ({})"
                ).format(table, columns, sql.SQL(", ").join(sql.Placeholder() * (4 + len(cells)))),
                [f'k{index}\n"é', index, error, Jsonb(meta), *map(Jsonb, cells)],
            )
        physical = column_ids(conn, names)
        assert physical is not None
        request = [PageRequest(len(rows), 0)]
        for mode in ("output", "all"):
            (dicts,) = _read_batch(
                conn,
                names,
                request,
                _filter(RowFilter(row_mode=mode)),
                _Dicts(_projection(physical, mode)),
            )
            (encoded,) = _read_batch(
                conn, names, request, _filter(RowFilter(row_mode=mode)), _Json(physical, mode)
            )
            assert len(encoded) == len(dicts) == len(rows)
            for row, as_json in zip(dicts, encoded, strict=True):
                compact = json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()
                assert as_json == compact
                assert json_byte_length_up_to(row, 1 << 30).bytes == len(as_json)
                assert decode_body(as_json) == row
        conn.rollback()


# Any JSON value, NaN, infinities and NUL included, so the checks have something to refuse.
risky_values = st.recursive(
    scalars | st.floats() | st.just("nul \x00 inside"),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(row=st.dictionaries(text | st.just("_key"), risky_values, max_size=6))
def test_encode_row_refuses_what_check_row_refuses_and_writes_the_row_it_accepts(
    row: dict[str, Any],
) -> None:
    """``encode_row`` looks at the document orjson wrote (not at every cell) and sends a
    row through ``check_row`` only when the document could hide what it refuses; it
    must refuse exactly those rows, and key and write the others as they are."""
    from sheetplane._rowchecks import check_row
    from sheetplane.errors import InvalidInputError
    from sheetplane.identity import row_key
    from sheetplane.protocol import encode_row

    try:
        check_row(row, 3)
        expected_key: str | None = row_key(row)
    except InvalidInputError:
        expected_key = None
    if expected_key is None:
        with pytest.raises(InvalidInputError, match="row 3"):
            encode_row(row, 3)
        return
    key, doc = encode_row(row, 3)
    assert json.loads(key) == expected_key
    assert json.loads(doc) == row
