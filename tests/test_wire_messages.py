"""The wire classes: structure and unstructure are inverse, the names on the wire are
the seed's camelCase ones, a bad field is named, and the OpenAPI document generated
from the classes is valid and is what the gateway serves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import attrs
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from sheetplane import protocol as m
from sheetplane._rowchecks import CheckedObject
from sheetplane._types import CompleteRow, FailRow
from sheetplane.crypto import generate_decryption_key
from sheetplane.gateway.server import running_gateway
from sheetplane.protocol import (
    ABSENT,
    ANSWERS,
    OPENAPI_PATH,
    REQUESTS,
    RUNTIME_PATH,
    WireError,
    openapi_document,
    structure,
    unstructure,
)
from sheetplane.testing.strategies import wire_json, wire_messages

CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")

#: Every wire class: each request and answer, their parts, the error body and the
#: operating routes' answers.
CLASSES = sorted(
    (
        cls
        for cls in vars(m).values()
        if isinstance(cls, type)
        and attrs.has(cls)
        and cls.__module__ == "sheetplane.protocol._messages"
    ),
    key=lambda c: c.__name__,
)


def test_the_round_trips_cover_every_request_and_answer() -> None:
    assert {*REQUESTS.values(), *ANSWERS.values(), *m.PROBE_ANSWERS} <= set(CLASSES)
    assert m.ErrorBody in CLASSES and m.ContractColumnWire in CLASSES


def _wire_keys(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [k for k in value] + [k for v in value.values() for k in _wire_keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in _wire_keys(v)]
    return []


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_structure_of_unstructure_is_the_identity(cls: type[Any], data: st.DataObject) -> None:
    raw = data.draw(wire_json(cls))
    value = structure(raw, cls)
    again = unstructure(value)
    assert structure(again, cls) == value
    assert unstructure(structure(again, cls)) == again
    # What goes out is what came in, under the same camelCase names; a request
    # leaves out a null it does not need, an answer writes it.
    writes_nulls = cls in m.WRITES_NULLS
    for key, item in raw.items():
        if item is None and not writes_nulls and key not in again:
            continue
        assert key in again
    # camelCase, but for a name a field declares (the JWE's and the seed's snake case).
    declared = {f.metadata["wire"] for f in attrs.fields(cls) if "wire" in f.metadata}
    assert all(CAMEL.match(key) or key in declared for key in again)


def test_seed_shaped_requests_read_and_write_back_unchanged() -> None:
    seeds: list[dict[str, Any]] = [
        {
            "action": "create_db_session",
            "playName": "enrich-leads",
            "target": {"tableNamespace": "leads", "logicalTable": "sheet_rows"},
            "operations": ["rows.read", "rows.upsert"],
            "limits": {"maxRows": 100},
            "ttlSeconds": 600.0,
        },
        {
            "action": "runtime_sheet_read_rows",
            "playName": "enrich-leads",
            "input": {"tableNamespace": "leads", "limit": 50, "offset": 0, "after": None},
        },
        {
            "action": "runtime_sheet_complete_map_rows",
            "playName": "p",
            "tableNamespace": "leads",
            "sheetContract": {"columns": [{"id": "a", "sqlName": "a", "source": "output"}]},
            "runId": "r",
            "writeVersion": 3,
            "rows": [{"key": "k", "data": {"a": 1}, "cellMetaPatch": {"a": {"x": 1}}}],
        },
    ]
    for seed in seeds:
        assert unstructure(structure(seed, REQUESTS[seed["action"]])) == seed


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {
                "input": {
                    "tableNamespace": "t",
                    "pages": [{"limit": 1, "offset": 0}, {"limit": 0, "offset": 0}],
                }
            },
            "input.pages[1].limit must be between 1 and 5000, got 0",
        ),
        (
            {"input": {"tableNamespace": " ", "pages": [{"limit": 1, "offset": 0}]}},
            "input.tableNamespace must be a non-empty string",
        ),
        (
            {"input": {"tableNamespace": "t", "pages": []}},
            "Runtime dataset read batch requires 1-4 pages.",
        ),
        (
            {"input": {"tableNamespace": "t", "pages": [{"limit": "1", "offset": 0}]}},
            "input.pages[0].limit must be an integer",
        ),
        (
            {"input": {"tableNamespace": "t", "pages": [{"limit": True, "offset": 0}]}},
            "input.pages[0].limit must be an integer",
        ),
        (
            {
                "input": {
                    "tableNamespace": "t",
                    "rowMode": "raw",
                    "pages": [{"limit": 1, "offset": 0}],
                }
            },
            "input.rowMode must be one of ['output', 'all'], got 'raw'",
        ),
        ({"input": "x"}, "input must be an object"),
        ({}, "input is required"),
    ],
)
def test_a_bad_field_is_named(body: dict[str, Any], message: str) -> None:
    request = {"action": "runtime_sheet_read_rows_batch", "playName": "p", **body}
    with pytest.raises(WireError) as excinfo:
        structure(request, REQUESTS["runtime_sheet_read_rows_batch"])
    assert str(excinfo.value) == message


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["a", "b", 3], "keys[2] must be a string"),
        (["a", None], "keys[1] must be a string"),
        ("ab", "keys must be an array"),
    ],
)
def test_a_list_of_strings_is_read_whole_and_a_bad_member_is_named(
    keys: object, message: str
) -> None:
    """A chunk's keys are checked in one pass; a bad one is still named by its index."""
    request = {
        "action": "stage_sheet_admission_chunk",
        "playName": "p",
        "tableNamespace": "t",
        "sheetContract": {"columns": []},
        "admissionId": "0" * 32,
        "seq": 0,
        "firstPosition": 0,
        "rows": [{}],
    }
    cls = REQUESTS["stage_sheet_admission_chunk"]
    read = structure({**request, "keys": ["k0", "k1"]}, cls)
    assert read.keys == ["k0", "k1"]
    with pytest.raises(WireError) as excinfo:
        structure({**request, "keys": keys}, cls)
    assert str(excinfo.value) == message


def test_absent_and_null_differ() -> None:
    cls = REQUESTS["runtime_sheet_read_rows"]
    base = {"action": "runtime_sheet_read_rows", "playName": "p"}
    by_offset = structure({**base, "input": {"tableNamespace": "t", "limit": 1, "offset": 0}}, cls)
    by_keyset = structure(
        {**base, "input": {"tableNamespace": "t", "limit": 1, "offset": 0, "after": None}}, cls
    )
    assert by_offset.input.after is ABSENT and by_keyset.input.after is None  # type: ignore[attr-defined]
    limits = REQUESTS["create_db_session"]
    with pytest.raises(WireError, match=r"limits\.maxRows must not be null"):
        structure(
            {
                "action": "create_db_session",
                "playName": "p",
                "target": {"tableNamespace": "t", "logicalTable": "sheet_rows"},
                "operations": ["rows.read"],
                "limits": {"maxRows": None},
            },
            limits,
        )


def test_every_action_the_gateway_answers_has_its_wire_classes() -> None:
    from sheetplane.gateway.server._actions import HANDLERS

    assert set(HANDLERS) == set(REQUESTS) == set(ANSWERS)


def test_the_document_is_valid_openapi_with_every_action() -> None:
    document = openapi_document()
    validate(document)
    body = document["paths"]["/api/v2/plays/internal/runtime"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert set(schema["discriminator"]["mapping"]) == set(REQUESTS)
    assert len(schema["oneOf"]) == len(REQUESTS)
    components = document["components"]["schemas"]
    for action, cls in REQUESTS.items():
        request = components[cls.__name__]
        assert request["properties"]["action"] == {"enum": [action]}
        assert request["x-answer"] == f"#/components/schemas/{ANSWERS[action].__name__}"
    # The wire names, not the Python ones.
    assert "sqlName" in components["ContractColumnWire"]["properties"]
    assert components["SessionLimitsWire"]["additionalProperties"] is False


def test_the_document_describes_the_operating_routes_from_their_classes() -> None:
    document = openapi_document()
    validate(document)
    paths = document["paths"]

    def schema(path: str, status: str) -> Any:
        return paths[path]["get"]["responses"][status]["content"]["application/json"]["schema"]

    ref = "#/components/schemas/"
    assert schema("/healthz", "200") == {"$ref": ref + "HealthAnswer"}
    assert schema("/readyz", "200") == {"$ref": ref + "ReadyAnswer"}
    assert schema("/readyz", "503")["anyOf"] == [
        {"$ref": ref + "UnreadyAnswer"},
        {"$ref": ref + "ErrorBody"},
    ]
    assert set(paths["/metrics"]["get"]["responses"]) == {"200", "401", "404", "503"}
    unready = document["components"]["schemas"]["UnreadyAnswer"]
    assert set(unready["properties"]) == {"status", "reason", "budget_ms"}


def test_sheetplane_openapi_prints_the_document() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sheetplane.cli", "openapi"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == json.loads(json.dumps(openapi_document()))


def test_openapi_into_a_closed_pipe_ends_quietly_without_a_traceback() -> None:
    # `sheetplane openapi | head`: the reader is gone before the document is written.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sheetplane.cli", "openapi"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
    assert done.returncode == 141


async def test_the_gateway_serves_the_document(sheetplane_database_url: str) -> None:
    async with (
        running_gateway(sheetplane_database_url, tokens={"t0ken": "org"}) as gateway,
        httpx.AsyncClient(base_url=gateway.base_url) as http,
    ):
        response = await http.get(OPENAPI_PATH)  # no token: the document is public
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == json.loads(json.dumps(openapi_document()))


@pytest.mark.parametrize("ttl", [1.4741525045319855e308, 10**300, 0.5])
async def test_a_ttl_outside_its_range_is_a_400_not_a_500(
    sheetplane_database_url: str, ttl: float
) -> None:
    # schemathesis found it: ttlSeconds 1.47e308 overflowed int(ttl * 1000) into a 500.
    key = generate_decryption_key()
    async with (
        running_gateway(sheetplane_database_url, tokens={"t0ken": "org"}) as gateway,
        httpx.AsyncClient(base_url=gateway.base_url) as http,
    ):
        response = await http.post(
            RUNTIME_PATH,
            headers={"authorization": "Bearer t0ken"},
            json={
                "action": "create_db_session",
                "playName": "p",
                "target": {"tableNamespace": "huge-ttl", "logicalTable": "sheet_rows"},
                "operations": ["rows.read"],
                "ttlSeconds": ttl,
                "postgresUrlEncryption": key.encryption_request(),
            },
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("ttlSeconds must be between 1 and ")


@pytest.mark.parametrize("action", sorted(REQUESTS))
@settings(max_examples=10, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_drawn_requests_are_written_under_their_action(action: str, data: st.DataObject) -> None:
    message = data.draw(wire_messages(REQUESTS[action]))
    written = unstructure(message)
    assert written["action"] == action
    assert structure(written, REQUESTS[action]) == message


def test_error_bodies_carry_the_seed_s_snake_case_members() -> None:
    # The gateway writes retry_after_ms and observed_bytes (the seed's names); the
    # class read them as retryAfterMs and observedBytes, and the document said so.
    properties = openapi_document()["components"]["schemas"]["ErrorBody"]["properties"]
    assert {"retry_after_ms", "observed_bytes"} <= set(properties)
    body = m.error_body("saturated", "runtime_postgres_admission_backpressure", retry_after_ms=250)
    assert body == {
        "error": "saturated",
        "code": "runtime_postgres_admission_backpressure",
        "retry_after_ms": 250,
    }
    read = structure({"error": "too big", "code": "x", "observed_bytes": 7}, m.ErrorBody)
    assert read.observed_bytes == 7 and read.retry_after_ms is ABSENT


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ([{"a": 1}, {"b": 2}, "row", {"c": 3}], "rows[2] must be an object"),
        ([[1, 2]], "rows[0] must be an object"),
        ({"a": 1}, "rows must be an array"),
    ],
)
def test_a_page_of_rows_names_the_member_that_is_not_an_object(rows: Any, problem: str) -> None:
    with pytest.raises(m.WireError, match=re.escape(problem)):
        m.structure({"rows": rows, "limit": 5, "offset": 0}, m.PageWire)


def test_a_page_of_rows_keeps_its_objects() -> None:
    class Row(dict[str, Any]):
        pass

    rows = [{"a": 1}, Row(b=2), {}]
    page = m.structure({"rows": rows, "limit": 5, "offset": 0}, m.PageWire)
    assert page.rows == rows


_OBJECTS = st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=6), max_size=3)


@settings(max_examples=60, deadline=None)
@given(
    complete=st.lists(
        st.builds(CompleteRow, st.text(min_size=1), _OBJECTS, st.none() | _OBJECTS), max_size=4
    ),
    fail=st.lists(
        st.builds(FailRow, st.text(min_size=1), st.text(), st.none() | _OBJECTS), max_size=4
    ),
)
def test_terminal_rows_written_in_one_pass_are_what_the_converter_writes(
    complete: list[Any], fail: list[Any]
) -> None:
    # The client writes a terminal write's rows straight to the body (complete_rows_json,
    # fail_rows_json); they must be what the wire classes write, refusal for refusal.
    for one_pass, typed, rows in (
        (m.complete_rows_json, m.complete_rows_wire, complete),
        (m.fail_rows_json, m.fail_rows_wire, fail),
    ):
        try:
            expected: Any = [unstructure(row) for row in typed(rows)]
        except WireError as exc:
            expected = str(exc)
        try:
            got: Any = one_pass(rows)
        except WireError as exc:
            got = str(exc)
        assert got == expected


_MEMBER = st.sampled_from(["key", "data", "cellMetaPatch", "error", "other"])
_VALUE = st.none() | st.text(max_size=4) | st.integers() | _OBJECTS | st.lists(st.integers())
_BODY_ROWS = st.lists(st.dictionaries(_MEMBER, _VALUE, max_size=4), max_size=4) | _VALUE


@settings(max_examples=150, deadline=None)
@given(rows=_BODY_ROWS)
def test_terminal_rows_read_from_the_body_are_what_the_wire_classes_read(rows: Any) -> None:
    # The gateway reads a terminal write's rows straight from the decoded body
    # (complete_rows_decoded, fail_rows_decoded), each data object checked once into
    # a CheckedObject; a body it does not take (None) goes the wire classes' way.
    for decoded, cls, of in (
        (m.complete_rows_decoded, m.CompleteRowWire, m.complete_rows_of),
        (m.fail_rows_decoded, m.FailRowWire, m.fail_rows_of),
    ):
        got = decoded(rows)
        if got is None:
            continue
        assert got == of(m.structure(row, cls) for row in rows)
        for row in got:
            assert row.data is None or type(row.data) is CheckedObject
            meta = getattr(row, "cell_meta_patch", None)
            assert meta is None or type(meta) is CheckedObject


@pytest.mark.parametrize(
    "rows",
    [
        [{"key": " ", "data": {}}],
        [{"key": "a", "data": None}],
        [{"key": "a", "data": {"x": float("nan")}}],
        [{"key": "a", "data": {}, "extra": 1}],
        [{"key": "a", "data": {}, "cellMetaPatch": []}],
        {"key": "a"},
    ],
)
def test_a_terminal_row_not_in_plain_form_goes_the_wire_classes_way(rows: Any) -> None:
    assert m.complete_rows_decoded(rows) is None


def test_plain_terminal_rows_are_read_from_the_body() -> None:
    complete = m.complete_rows_decoded(
        [{"key": "a", "data": {"x": 1}}, {"key": "b", "cellMetaPatch": {"x": {"s": 1}}}]
    )
    assert complete == [CompleteRow("a", {"x": 1}, None), CompleteRow("b", {}, {"x": {"s": 1}})]
    fail = m.fail_rows_decoded([{"key": "a", "error": "boom"}, {"key": "b", "error": ""}])
    assert fail == [FailRow("a", "boom", None), FailRow("b", "", None)]
    assert m.fail_rows_decoded([{"key": "a"}]) is None
