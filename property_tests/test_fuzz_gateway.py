"""Every gateway action with Hypothesis-generated bad input, through the real server and Postgres.

Each example takes a valid request of one action and breaks exactly one part
of it (a wrong type, an out-of-range or non-finite number, a huge value, an
empty or NUL-bearing string, text past its cap, an unknown enum, a missing
field, nesting past ``MAX_JSON_DEPTH``, a Postgres system column as a
``sqlName``, more contract columns than ``MAX_CONTRACT_COLUMNS``, a
``ttlSeconds`` past bigint milliseconds, a JWK modulus no RSA key has or a JWK
carrying private members), or sends a body that is not a JSON object at all
(malformed, truncated, invalid UTF-8, NaN literals, nesting that would blow
the decoder's stack). Invariants, for every example:

* the answer is a 4xx with a JSON body ``{error, code}``: never a 5xx, never a
  stack trace, the token or a database secret;
* nothing was written: the schemas, relations, session roles and every
  sheetplane table's rows (count and a digest of their contents) are what
  they were before the request;
* the server is still up: it answers the next valid request.

A group sends hostile but *valid* strings (SQL-looking, quotes, unicode,
huge) where the gateway takes free text: they may write, but never answer 5xx.

The last group sends bodies slowly: in pieces with pauses around the
body-read timeout, finished, stalled for good, or abandoned by the client.
A body whole in time gets its ordinary answer; one that is not is answered
408 with ``connection: close`` (at exactly the timeout under trio's MockClock,
where the app runs in process); never a 5xx, never a connection held. A
bounded slice sends them to a real server on real sockets; ``--campaign``
sends 300.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any, cast
from urllib.parse import urlsplit

import attrs
import httpx
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sheetplane.budgets import (
    GATEWAY_BODY_READ_TIMEOUT_MS,
    MAX_CONTRACT_COLUMNS,
    MAX_ERROR_TEXT_BYTES,
    MAX_JSON_DEPTH,
    READ_PAGE_MAX_ROWS,
    TRANSPORT_CEILING_BYTES,
)
from sheetplane.crypto import generate_decryption_key
from sheetplane.gateway.faults import FaultSchedule
from sheetplane.gateway.server import RUNTIME_PATH, GatewayConfig, create_app
from sheetplane.gateway.server._actions import GatewayState
from sheetplane.gateway.server._auth import TokenTable
from sheetplane.gateway.server._serve import ServeOptions
from sheetplane.gateway.server._watchdog import ReaperProgress
from sheetplane.store import SheetStore
from sheetplane.store._schema import POSTGRES_SYSTEM_COLUMNS, RESERVED_SQL_NAMES
from sheetplane.testing.strategies import ACTIONS as SEED_RUNTIME_ACTIONS
from sheetplane.testing.strategies import bad_json_bodies, hostile_text, json_values

from ._threaded_gateway import ThreadedGateway, own_database, snapshot

TOKEN = "tok-fuzz-6b1d0e9a42c7"
OTHER_TOKEN = "tok-fuzz-other-0c55a1"
ORG = "fuzz-org"
OTHER_ORG = "fuzz-other-org"
PLAY = "fuzz-play"
NS = "fuzz-sheet"
#: The keyed writes' sheet: their valid requests write rows, which NS's count must not see.
KEYED_NS = "fuzz-keyed"
#: Every action fuzzed: the seed's runtime actions and the keyed writes.
KEYED_ACTIONS = (
    "runtime_sheet_append_rows",
    "runtime_sheet_upsert_rows",
    "runtime_sheet_replace_rows",
)
ACTIONS = (*SEED_RUNTIME_ACTIONS, *KEYED_ACTIONS)
CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}
EXAMPLES = int(os.environ.get("SHEETPLANE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Bad inputs tried, by test, for docs/reliability.md.
TRIED: Counter[str] = Counter()


@attrs.define
class Fuzzed:
    gateway: ThreadedGateway
    http: httpx.Client
    database_url: str = attrs.field(repr=False)  # a superuser URL: kept out of failure reports
    write_version: int
    valid: dict[str, dict[str, Any]]
    secrets: tuple[str, ...] = attrs.field(repr=False)


@pytest.fixture(scope="module")
def fuzzed(sheetplane_database_url: str) -> Iterator[Fuzzed]:
    parts = urlsplit(sheetplane_database_url)
    with (
        # Its own database: each snapshot reads only what the fuzzed requests made.
        own_database(sheetplane_database_url, "fuzz_gateway") as database_url,
        ThreadedGateway(database_url, tokens={TOKEN: ORG, OTHER_TOKEN: OTHER_ORG}) as gw,
        httpx.Client(base_url=gw.base_url, timeout=120) as http,
    ):
        secrets = tuple(s for s in (TOKEN, OTHER_TOKEN, database_url, parts.password) if s)
        fuzz = Fuzzed(gw, http, database_url, 0, {}, secrets)
        seed = [{"_key": f"k{i}", "email": f"user{i}@example.com"} for i in range(10)]
        admitted = _ok(
            fuzz,
            "start_sheet_dataset",
            {"tableNamespace": NS, "sheetContract": CONTRACT, "rows": seed, "runId": "run-1"},
        )
        fuzz.write_version = admitted["writeVersion"]
        fuzz.valid = _valid_bodies(fuzz.write_version)
        yield fuzz
        report = os.environ.get("SHEETPLANE_RELIABILITY_LOG")
        if report:
            with open(report, "a", encoding="utf-8") as out:
                out.write(json.dumps({"suite": "fuzz_gateway", "tried": dict(TRIED)}) + "\n")


def _valid_bodies(version: int) -> dict[str, dict[str, Any]]:
    jwk = generate_decryption_key().encryption_request()
    return {
        "ensure_sheet": {"tableNamespace": NS, "sheetContract": CONTRACT, "userEmail": "a@b.c"},
        "start_sheet_dataset": {
            "tableNamespace": NS,
            "sheetContract": CONTRACT,
            "rows": [{"_key": "k1", "email": "user1@example.com"}],
            "runId": "run-1",
        },
        "create_db_session": {
            "target": {"tableNamespace": NS, "logicalTable": "sheet_rows"},
            "operations": ["rows.read"],
            "limits": {"maxRows": 10},
            "ttlSeconds": 60,
            "postgresUrlEncryption": jwk,
        },
        "runtime_sheet_read_rows": {"input": {"tableNamespace": NS, "limit": 5, "offset": 0}},
        "runtime_sheet_read_rows_batch": {
            "input": {"tableNamespace": NS, "rowMode": "all", "pages": [{"limit": 5, "offset": 0}]}
        },
        "runtime_sheet_read_row_keys": {"input": {"tableNamespace": NS, "limit": 5, "offset": 0}},
        "runtime_sheet_complete_map_rows": {
            "tableNamespace": NS,
            "sheetContract": CONTRACT,
            "runId": "run-1",
            "writeVersion": version,
            "rows": [{"key": "k1", "data": {"score": 1}, "cellMetaPatch": {"score": {"v": 1}}}],
        },
        "runtime_sheet_fail_map_rows": {
            "tableNamespace": NS,
            "sheetContract": CONTRACT,
            "runId": "run-1",
            "writeVersion": version,
            "rows": [{"key": "k2", "error": "boom", "data": {"score": 0}}],
        },
        "complete_work_receipt": {"key": "receipt-1", "result": {"ok": True}, "runId": "run-1"},
        "runtime_sheet_summary": {"tableNamespace": NS},
        **{
            action: {
                "tableNamespace": KEYED_NS,
                "sheetContract": CONTRACT,
                "rows": [{"_key": "k1", "email": "user1@example.com"}],
                "idempotencyKey": f"{action}-1",
                "runId": "run-1",
            }
            for action in KEYED_ACTIONS
        },
    }


def _post(
    fuzz: Fuzzed,
    content: bytes,
    *,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    sent = {"content-type": "application/json", **(headers or {})}
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    return fuzz.http.post(RUNTIME_PATH, content=content, headers=sent)


def _encode(body: Any) -> bytes:
    """JSON with NaN and Infinity literals allowed (exactly the bad input to send); a body
    with a lone surrogate goes out with ASCII escapes, the one way JSON carries it."""
    text = json.dumps(body, allow_nan=True, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(body, allow_nan=True, ensure_ascii=True).encode("ascii")


def _ok(fuzz: Fuzzed, action: str, body: dict[str, Any]) -> dict[str, Any]:
    response = _post(fuzz, _encode({"action": action, "playName": PLAY, **body}))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _check_refused(fuzz: Fuzzed, response: httpx.Response, before: dict[str, Any]) -> None:
    text = response.text
    assert 400 <= response.status_code < 500, (response.status_code, text[:500])
    body = response.json()
    assert isinstance(body, dict)
    assert isinstance(body.get("error"), str) and isinstance(body.get("code"), str)
    assert "Traceback" not in text and 'File "' not in text
    for secret in fuzz.secrets:
        assert secret not in text
    assert_unchanged(before, snapshot(fuzz.database_url))


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Nothing was written. The reaper may drop session roles other tests minted and
    that expired meanwhile (the suite shares one database for longer than a session
    lives), so roles may only go, never come."""
    assert set(after["roles"]) <= set(before["roles"]), "a refused request minted a role"
    assert {k: v for k, v in after.items() if k != "roles"} == {
        k: v for k, v in before.items() if k != "roles"
    }, "a refused request wrote something"


def _check_alive(fuzz: Fuzzed) -> None:
    assert fuzz.gateway.alive()
    summary = _ok(fuzz, "runtime_sheet_summary", {"tableNamespace": NS})
    assert summary["total"] == 10


# --- what is wrong with a field -----------------------------------------------------------

_NON_STRINGS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_NUL_TEXT = st.one_of(
    st.tuples(st.text(max_size=8), st.text(max_size=8)).map(lambda p: f"{p[0]}\x00{p[1]}"),
    st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"]),  # lone surrogates
)


#: Text past every cap a request field has (the largest is the error text's), in
#: one-byte and in four-byte characters.
_OVER_CAP = st.sampled_from(
    ["x" * (MAX_ERROR_TEXT_BYTES + 1), "\U0001f600" * (MAX_ERROR_TEXT_BYTES // 4 + 1)]
)


def _b64_int(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


#: A JWK ``n`` no RSA key has: past OpenSSL's 16,384 bits, even, or with small factors.
_BAD_MODULI = st.one_of(
    st.integers(16_385, 70_000).map(lambda bits: _b64_int((1 << (bits - 1)) | 1)),
    st.integers(2048, 4096).map(lambda bits: _b64_int(1 << bits)),
    st.sampled_from([3, 5, 7, 997]).map(lambda p: _b64_int(p ** (2048 // p.bit_length() + 1))),
)


def _wide_contract(columns: int) -> list[dict[str, str]]:
    return [{"id": f"c{i}", "sqlName": f"c{i}", "source": "input"} for i in range(columns)]


def _deep(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"d": value}
    return value


def _bad_number(minimum: int, maximum: int | None) -> st.SearchStrategy[Any]:
    out = [
        st.integers(max_value=minimum - 1, min_value=minimum - 10**20),
        st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.5, minimum + 0.25]),
        st.sampled_from(["1", "", True, False, None, [1], {"n": 1}]),
        st.integers(min_value=10**300, max_value=10**4000),
    ]
    if maximum is not None:
        out.append(st.integers(min_value=maximum + 1, max_value=maximum + 10**30))
        out.append(st.sampled_from([float(maximum) * 4, 1e308]))
    return st.one_of(*out)


def _bad(kind: str) -> st.SearchStrategy[Any]:
    """A value that is wrong for a field of ``kind``."""
    name, _, arg = kind.partition(":")
    if name == "text":  # required, non-empty, no NUL, capped
        return st.one_of(_NON_STRINGS, st.sampled_from(["", "   ", "\t"]), _NUL_TEXT, _OVER_CAP)
    if name == "str":  # required, non-empty (whitespace allowed), no NUL, capped
        return st.one_of(_NON_STRINGS, st.just(""), _NUL_TEXT, _OVER_CAP)
    if name == "opt_type":  # optional string the gateway does not store: type and cap
        return st.one_of(_NON_STRINGS.filter(lambda v: v is not None), _OVER_CAP)
    if name == "opt_text":  # optional string
        return st.one_of(_NON_STRINGS.filter(lambda v: v is not None), _NUL_TEXT, _OVER_CAP)
    if name == "number":  # any finite number in range (fractions allowed)
        low, _, high = arg.partition("..")
        return st.one_of(
            _bad_number(int(low), int(high)).filter(
                lambda v: (
                    v is not None and not (isinstance(v, float) and int(low) <= v <= int(high))
                )
            ),
        )
    if name == "present":  # a member whose presence alone is refused
        return st.one_of(st.just("AQAB"), _NON_STRINGS)
    if name == "modulus":
        return _BAD_MODULI
    if name == "wide":  # more contract columns than the cap
        return st.integers(MAX_CONTRACT_COLUMNS + 1, 1_700).map(_wide_contract)
    if name == "object":
        return st.one_of(_NON_STRINGS.filter(lambda v: not isinstance(v, dict)), hostile_text())
    if name == "opt_object":
        return st.one_of(
            _NON_STRINGS.filter(lambda v: v is not None and not isinstance(v, dict)),
            hostile_text(),
        )
    if name == "array":
        return st.one_of(_NON_STRINGS.filter(lambda v: not isinstance(v, list)), hostile_text())
    if name == "int":
        low, _, high = arg.partition("..")
        return _bad_number(int(low), int(high) if high else None)
    if name == "enum":
        allowed = set(arg.split("|"))
        return st.one_of(
            _NON_STRINGS.filter(lambda v: v is not None),
            hostile_text(max_size=12).filter(lambda v: v not in allowed),
        )
    if name == "sqlname":
        return st.one_of(
            _NON_STRINGS,
            st.sampled_from(["", "a" * 64, "é" * 32, "_key\x00", "x\x00y"]),
            st.sampled_from(sorted(POSTGRES_SYSTEM_COLUMNS)),
            st.sampled_from(sorted(RESERVED_SQL_NAMES)),
        )
    if name == "json":  # a value no store may keep
        return st.one_of(
            _NUL_TEXT,
            st.dictionaries(_NUL_TEXT, st.integers(), min_size=1, max_size=1),
            st.sampled_from([float("nan"), float("inf"), [float("-inf")]]),
            st.integers(min_value=MAX_JSON_DEPTH + 1, max_value=MAX_JSON_DEPTH + 400).map(_deep),
        )
    raise AssertionError(kind)


#: Per action: ``(path, kind, required)``; a path is keys and list indexes into the body.
FIELDS: dict[str, list[tuple[tuple[Any, ...], str, bool]]] = {
    "ensure_sheet": [
        (("tableNamespace",), "text", True),
        (("sheetContract",), "opt_object", False),
        (("sheetContract", "columns"), "array", False),
        (("sheetContract", "columns", 0), "object", True),
        (("sheetContract", "columns", 0, "id"), "str", True),
        (("sheetContract", "columns", 1, "sqlName"), "sqlname", True),
        (("sheetContract", "columns", 1, "source"), "enum:input|mapField|output", True),
        (("sheetContract", "columns"), "wide", False),
        (("userEmail",), "opt_type", False),
    ],
    "start_sheet_dataset": [
        (("tableNamespace",), "text", True),
        (("sheetContract",), "object", True),
        (("sheetContract", "columns", 0, "source"), "enum:input|mapField|output", True),
        (("rows",), "array", True),
        (("rows", 0), "object", True),
        (("rows", 0, "email"), "json", True),
        (("rows", 0, "_key"), "json", True),
        (("runId",), "text", True),
    ],
    "create_db_session": [
        (("target",), "object", True),
        (("target", "tableNamespace"), "text", True),
        (("target", "logicalTable"), "enum:sheet_rows", True),
        (("operations",), "array", True),
        (("operations", 0), "enum:rows.read|rows.upsert|rows.append|rows.replace", True),
        (("limits",), "opt_object", False),
        (("limits", "maxRows"), "int:1..9223372036854775807", False),
        (("ttlSeconds",), "number:1..9223372036854775", False),
        (("postgresUrlEncryption",), "opt_object", False),
        (("postgresUrlEncryption", "alg"), "enum:RSA-OAEP-256+A256GCM", True),
        (("postgresUrlEncryption", "publicKeyJwk"), "object", True),
        (("postgresUrlEncryption", "publicKeyJwk", "n"), "text", True),
        (("postgresUrlEncryption", "publicKeyJwk", "kty"), "enum:RSA", True),
        (("postgresUrlEncryption", "publicKeyJwk", "n"), "modulus", True),
        *(
            (("postgresUrlEncryption", "publicKeyJwk", member), "present", False)
            for member in ("d", "p", "q", "dp", "dq", "qi")
        ),
    ],
    "runtime_sheet_read_rows": [
        (("input",), "object", True),
        (("input", "tableNamespace"), "text", True),
        (("input", "limit"), f"int:1..{READ_PAGE_MAX_ROWS}", True),
        (("input", "offset"), "int:0..9223372036854775807", True),
        (("input", "runId"), "opt_text", False),
        (("input", "rowMode"), "enum:output|all", False),
    ],
    "runtime_sheet_read_rows_batch": [
        (("input",), "object", True),
        (("input", "pages"), "array", True),
        (("input", "pages", 0), "object", True),
        (("input", "pages", 0, "limit"), f"int:1..{READ_PAGE_MAX_ROWS}", True),
        (("input", "pages", 0, "offset"), "int:0..9223372036854775807", True),
        (("input", "rowMode"), "enum:output|all", False),
    ],
    "runtime_sheet_read_row_keys": [
        (("input", "tableNamespace"), "text", True),
        (("input", "limit"), f"int:1..{READ_PAGE_MAX_ROWS}", True),
        (("input", "offset"), "int:0..9223372036854775807", True),
    ],
    "runtime_sheet_complete_map_rows": [
        (("tableNamespace",), "text", True),
        (("sheetContract",), "object", True),
        (("runId",), "text", True),
        (("writeVersion",), "int:0..9223372036854775807", False),
        (("rows",), "array", True),
        (("rows", 0), "object", True),
        (("rows", 0, "key"), "text", True),
        (("rows", 0, "data"), "opt_object", False),
        (("rows", 0, "data", "score"), "json", True),
        (("rows", 0, "cellMetaPatch"), "opt_object", False),
        (("rows", 0, "cellMetaPatch", "score"), "json", True),
    ],
    "runtime_sheet_fail_map_rows": [
        (("runId",), "text", True),
        (("writeVersion",), "int:0..9223372036854775807", False),
        (("rows", 0), "object", True),
        (("rows", 0, "key"), "text", True),
        (("rows", 0, "error"), "str", True),
        (("rows", 0, "data"), "opt_object", False),
        (("rows", 0, "data", "score"), "json", True),
    ],
    "complete_work_receipt": [
        (("key",), "text", True),
        (("runId",), "text", True),
        (("result",), "json", True),
        (("runAttempt",), "int:0..2147483647", False),
    ],
    "runtime_sheet_summary": [
        (("tableNamespace",), "text", True),
    ],
    **{
        action: [
            (("tableNamespace",), "text", True),
            (("sheetContract",), "object", True),
            (("rows",), "array", True),
            (("rows", 0), "object", True),
            (("rows", 0, "email"), "json", True),
            (("idempotencyKey",), "text", True),
            (("runId",), "text", True),
        ]
        for action in KEYED_ACTIONS
    },
}
FIELDS["runtime_sheet_upsert_rows"].append((("keyField",), "opt_text", False))
#: Every action also carries ``playName``.
for _fields in FIELDS.values():
    _fields.append((("playName",), "text", True))


def _set(body: Any, path: tuple[Any, ...], value: Any, *, delete: bool = False) -> None:
    for part in path[:-1]:
        body = body[part]
    if delete:
        del body[path[-1]]
    else:
        body[path[-1]] = value


@st.composite
def broken_requests(draw: st.DrawFn, fuzz_valid: dict[str, dict[str, Any]]) -> tuple[str, Any]:
    action = draw(st.sampled_from(ACTIONS))
    body = copy.deepcopy({"action": action, "playName": PLAY, **fuzz_valid[action]})
    path, kind, required = draw(st.sampled_from(FIELDS[action]))
    if required and isinstance(path[-1], str) and kind != "json" and draw(st.booleans()):
        _set(body, path, None, delete=True)
        return f"{action}:{'.'.join(map(str, path))}:missing", body
    _set(body, path, draw(_bad(kind)))
    return f"{action}:{'.'.join(map(str, path))}:{kind}", body


def _header_safe(text: str) -> bool:
    """Whether a header value can carry ``text`` at all (no control characters)."""
    return all(ch == "\t" or 0x20 <= ord(ch) != 0x7F for ch in text)


# --- the properties -------------------------------------------------------------------------


def test_the_valid_request_of_every_action_is_answered(fuzzed: Fuzzed) -> None:
    # The fuzz starts from these: each must be a request the gateway accepts.
    for action in ACTIONS:
        _ok(fuzzed, action, copy.deepcopy(fuzzed.valid[action]))


@FUZZ
@given(data=st.data())
def test_a_broken_field_is_refused_4xx_and_writes_nothing(
    fuzzed: Fuzzed, data: st.DataObject
) -> None:
    label, body = data.draw(broken_requests(fuzzed.valid), label="request")
    TRIED[label.split(":")[0]] += 1
    before = snapshot(fuzzed.database_url)
    response = _post(fuzzed, _encode(body))
    _check_refused(fuzzed, response, before)
    _check_alive(fuzzed)


@FUZZ
@given(content=bad_json_bodies())
def test_a_body_that_is_not_a_request_is_refused(fuzzed: Fuzzed, content: bytes) -> None:
    TRIED["not_json"] += 1
    before = snapshot(fuzzed.database_url)
    _check_refused(fuzzed, _post(fuzzed, content), before)
    _check_alive(fuzzed)


@FUZZ
@given(
    action=st.one_of(st.sampled_from(ACTIONS), hostile_text(max_size=30)),
    extra=st.dictionaries(hostile_text(max_size=12), json_values(max_leaves=4), max_size=4),
)
def test_a_random_object_is_never_a_5xx(fuzzed: Fuzzed, action: str, extra: dict[str, Any]) -> None:
    TRIED["random_object"] += 1
    body = {**extra, "action": action}
    response = _post(fuzzed, _encode(body))
    assert response.status_code < 500, response.text[:500]
    assert "Traceback" not in response.text
    for secret in fuzzed.secrets:
        assert secret not in response.text
    _check_alive(fuzzed)


@FUZZ
@given(
    token=st.one_of(
        st.none(),
        hostile_text(max_size=30).filter(lambda t: len(t) < 1_000 and _header_safe(t)),
        st.just(OTHER_TOKEN),
        st.just(TOKEN + "x"),
    ),
    scheme=st.sampled_from(["Bearer", "bearer", "Basic", "", "Bearer  "]),
    action=st.sampled_from(ACTIONS),
)
def test_a_wrong_token_or_org_is_refused_and_writes_nothing(
    fuzzed: Fuzzed, token: str | None, scheme: str, action: str
) -> None:
    TRIED["auth"] += 1
    body = {"action": action, "playName": PLAY, **copy.deepcopy(fuzzed.valid[action])}
    headers: dict[str, Any] = {}
    if token is not None:
        # Sent as UTF-8 bytes: a header carries any octets but control characters.
        headers["authorization"] = f"{scheme} {token}".strip().encode()
    if token == OTHER_TOKEN:
        body["orgId"] = ORG  # another org's token naming this org: 403
    before = snapshot(fuzzed.database_url)
    response = _post(fuzzed, _encode(body), token=None, headers=headers)
    _check_refused(fuzzed, response, before)
    assert response.status_code in (401, 403)


def test_a_header_past_the_server_limit_is_refused_before_the_app(fuzzed: Fuzzed) -> None:
    TRIED["auth"] += 1
    before = snapshot(fuzzed.database_url)
    body = {
        "action": "ensure_sheet",
        "playName": PLAY,
        **copy.deepcopy(fuzzed.valid["ensure_sheet"]),
    }
    huge = {"authorization": ("Bearer " + "é" * 40_000).encode()}
    response = _post(fuzzed, _encode(body), token=None, headers=huge)
    # Hypercorn (h11) refuses a head past its size limit itself, in plain text.
    assert 400 <= response.status_code < 500
    assert_unchanged(before, snapshot(fuzzed.database_url))
    _check_alive(fuzzed)


def test_a_body_past_the_transport_ceiling_is_refused_413(fuzzed: Fuzzed) -> None:
    TRIED["too_large"] += 1
    before = snapshot(fuzzed.database_url)
    huge = b'{"action": "runtime_sheet_summary", "pad": "' + b"x" * TRANSPORT_CEILING_BYTES + b'"}'
    response = _post(fuzzed, huge)
    _check_refused(fuzzed, response, before)
    assert response.status_code == 413
    _check_alive(fuzzed)


@FUZZ
@given(
    namespace=hostile_text(min_size=1, max_size=40).filter(lambda s: s.strip()),
    run_id=hostile_text(min_size=1, max_size=40).filter(lambda s: s.strip()),
    email=json_values(max_leaves=6),
)
def test_hostile_but_valid_strings_never_cause_a_5xx(
    fuzzed: Fuzzed, namespace: str, run_id: str, email: Any
) -> None:
    TRIED["hostile_valid"] += 1
    body = {
        "action": "start_sheet_dataset",
        "playName": PLAY,
        "tableNamespace": namespace,
        "sheetContract": CONTRACT,
        "rows": [{"_key": run_id, "email": email}],
        "runId": run_id,
    }
    response = _post(fuzzed, _encode(body))
    assert response.status_code < 500, response.text[:500]
    if response.status_code == 200:
        answer = response.json()
        admitted = answer["pendingRows"] + answer["completedRows"]
        assert [row["_key"] for row in admitted] == [run_id]
        keys = _ok(
            fuzzed,
            "runtime_sheet_read_row_keys",
            {"input": {"tableNamespace": namespace, "limit": 10, "offset": 0}},
        )
        assert run_id in keys["keys"]
    _check_alive(fuzzed)


# --- stalled and slow bodies ----------------------------------------------------------------
#
# A body sent in pieces with pauses, finished, left unfinished, or abandoned by its
# client. Against the body-read timeout the answer is always a 4xx: a body that
# arrives whole in time gets its ordinary answer (never 408), one that does not is
# answered 408 with ``connection: close`` exactly at the timeout; never a 5xx, never
# a hang. The gateway app itself runs under trio's MockClock (its timeout is a
# trio deadline), on bodies answered before the store (bad JSON, an unknown action,
# another org); a bounded slice then sends slow bodies to a real server on real sockets.

#: The body-read timeout of the real-socket slice: short, so pauses around it stay cheap.
REAL_BODY_TIMEOUT_MS = 400
#: A request that does not end within this on the real socket counts as a hang.
REAL_HANG_S = 30
#: Bodies answered before any store call: which answer a whole one gets.
_BEFORE_THE_STORE = st.one_of(
    bad_json_bodies().filter(lambda b: len(b) <= 4096).map(lambda b: (b, 400)),
    st.just((_encode({"action": "no_such_action", "playName": PLAY}), 400)),
    st.just(
        (
            _encode({"action": "runtime_sheet_summary", "playName": PLAY, "orgId": OTHER_ORG}),
            403,
        )
    ),
)


@attrs.frozen
class SlowBody:
    """A body in pieces: ``pauses_ms[i]`` before piece ``i``; then ``ending``."""

    body: bytes
    pieces: tuple[bytes, ...]
    pauses_ms: tuple[int, ...]
    ending: str
    """``whole``: every piece sent; ``stall``: the last piece never comes and the
    client waits; ``disconnect``: the client leaves instead of sending it."""
    whole_status: int
    """The answer the whole body gets when it arrives in time."""

    def ends_ms(self) -> int | None:
        """When the client has sent its whole body or left; None: it stalls for good."""
        return None if self.ending == "stall" else sum(self.pauses_ms)


@st.composite
def slow_bodies(draw: st.DrawFn, timeout_ms: int) -> SlowBody:
    body, whole_status = draw(_BEFORE_THE_STORE)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=5)))
    bounds = [0, *[c for c in cuts if c < len(body)], len(body)]
    pieces = tuple(body[a:b] for a, b in pairwise(bounds) if b > a) or (b"",)
    if len(pieces) == 1 and draw(st.booleans()):
        pieces = (b"", *pieces)  # the head alone first, then the whole body
    # Pauses around the timeout: well inside, just inside, just past, far past.
    pause = st.one_of(
        st.integers(0, timeout_ms // (2 * len(pieces)) or 1),
        st.integers(0, 2 * timeout_ms),
        st.sampled_from([timeout_ms - 1, timeout_ms, timeout_ms + 1]),
    )
    pauses = tuple(draw(pause) for _ in pieces)
    ending = draw(st.sampled_from(["whole", "stall", "disconnect"]))
    if not pieces[-1]:
        ending = "whole"  # nothing left to hold back: the body is whole once the head is
    return SlowBody(body, pieces, pauses, ending, whole_status)


class _NoStore:
    """The store of the virtual-time app: no request of these examples reaches it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a request answered before the store reached it ({name})")


def _virtual_app(timeout_ms: int) -> Any:
    """The real gateway app with its state in place and no store behind it."""
    config = GatewayConfig(
        database_url="postgresql://fuzz@127.0.0.1:1/none",
        tokens={TOKEN: ORG},
        body_read_timeout_ms=timeout_ms,
    )
    app = create_app(config)
    app.state.gateway = GatewayState(
        config=config,
        store=cast(SheetStore, _NoStore()),
        tokens=TokenTable.from_mapping(config.tokens),
        faults=FaultSchedule(),
        reaper=ReaperProgress(),
    )
    return app


async def _drive(app: Any, slow: SlowBody) -> tuple[float, int, dict[bytes, bytes], bytes]:
    """Send ``slow`` to the ASGI app in virtual time: (when the answer began, status,
    headers, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": RUNTIME_PATH,
        "raw_path": RUNTIME_PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(slow.body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    to_send = list(zip(slow.pauses_ms, slow.pieces, strict=True))
    last = len(to_send) - 1
    answered = trio.Event()

    async def receive() -> dict[str, Any]:
        if not to_send:
            await answered.wait()  # the client has nothing more to say
            return {"type": "http.disconnect"}
        index = last - len(to_send) + 1
        pause_ms, piece = to_send.pop(0)
        if index == last and slow.ending == "stall":
            await trio.sleep_forever()
        await trio.sleep(pause_ms / 1000)
        if index == last and slow.ending == "disconnect":
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": piece, "more_body": index < last}

    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message, at=trio.current_time())
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    began = trio.current_time()
    await app(scope, receive, send)
    assert start, "the app returned without answering"
    headers = {k.lower(): v for k, v in start.get("headers", [])}
    return start["at"] - began, start["status"], headers, b"".join(chunks)


@FUZZ
@given(data=st.data())
def test_a_slow_or_stalled_body_is_answered_in_time_or_408_never_5xx_virtual(
    data: st.DataObject,
) -> None:
    TRIED["slow_body_virtual"] += 1
    timeout_ms = GATEWAY_BODY_READ_TIMEOUT_MS
    slow = data.draw(slow_bodies(timeout_ms))
    app = _virtual_app(timeout_ms)

    async def main() -> tuple[float, int, dict[bytes, bytes], bytes]:
        with trio.fail_after(2 * timeout_ms / 1000 * len(slow.pieces) + 60):  # a hang, virtual
            return await _drive(app, slow)

    at, status, headers, body = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert status < 500, (status, body[:300])
    timeout_s = timeout_ms / 1000
    ends = slow.ends_ms()
    if ends is not None and ends < timeout_ms and slow.ending == "disconnect":
        assert status == 400  # nobody reads it: the client left
    elif ends is not None and ends < timeout_ms:
        assert status == slow.whole_status, (status, body[:300])
        assert json.loads(body)["code"] != "request_timeout"
    elif ends is None or ends > timeout_ms:
        assert status == 408, (status, body[:300])
        assert at == pytest.approx(timeout_s)  # exactly the timeout, in virtual time
        assert json.loads(body)["code"] == "request_timeout"
        assert headers.get(b"connection") == b"close"
    else:  # the last piece lands on the deadline itself: either is right
        assert status in (slow.whole_status, 408, 400)


@pytest.fixture(scope="module")
def slow_gateway(sheetplane_database_url: str) -> Iterator[ThreadedGateway]:
    with ThreadedGateway(
        sheetplane_database_url,
        tokens={TOKEN: ORG},
        body_read_timeout_ms=REAL_BODY_TIMEOUT_MS,
    ) as gw:
        yield gw


def _slow_exchange(
    base_url: str, slow: SlowBody, token: str = TOKEN, head_pause_ms: int | None = None
) -> bytes:
    """Send ``slow`` on a real socket (pausing between pieces, as a slow client
    does; with ``head_pause_ms``, the head too, in two halves); everything the
    server sends until it closes or answers whole."""
    host, port = urlsplit(base_url).hostname, urlsplit(base_url).port
    assert host is not None and port is not None
    head = (
        f"POST {RUNTIME_PATH} HTTP/1.1\r\nhost: {host}\r\n"
        f"authorization: Bearer {token}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(slow.body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=REAL_HANG_S) as sock:
        if head_pause_ms is not None:
            sock.sendall(head[: len(head) // 2])
            time.sleep(head_pause_ms / 1000)  # a slow head: the input under test
            head = head[len(head) // 2 :]
        sock.sendall(head)
        last = len(slow.pieces) - 1
        try:
            for index, (pause_ms, piece) in enumerate(
                zip(slow.pauses_ms, slow.pieces, strict=True)
            ):
                if index == last and slow.ending == "stall":
                    break  # and wait for the server's word
                time.sleep(pause_ms / 1000)  # the client's pacing: the input under test
                if index == last and slow.ending == "disconnect":
                    sock.shutdown(socket.SHUT_WR)
                else:
                    sock.sendall(piece)
        except OSError:
            pass  # the server closed first: what it sent is still readable
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk


def _check_slow_exchange(gateway: ThreadedGateway, slow: SlowBody) -> None:
    started = time.monotonic()
    try:
        received = _slow_exchange(gateway.base_url, slow)
    except OSError as exc:  # refused, or held past REAL_HANG_S
        raise AssertionError(f"{exc!r}; the gateway's run: {gateway.failure()!r}") from exc
    took = time.monotonic() - started
    assert took < REAL_HANG_S, "the server held the connection"
    if received:
        status = int(received.split(b" ", 2)[1])
        assert status < 500, received[:300]
        if slow.ending == "stall":
            assert status == 408, received[:300]
        if status == 408:
            assert b"connection: close" in received.lower()
        # Well inside the timeout, a whole body gets its ordinary answer.
        ends = slow.ends_ms()
        if slow.ending == "whole" and ends is not None and ends < REAL_BODY_TIMEOUT_MS // 4:
            assert status == slow.whole_status, received[:300]
    else:  # closed without an answer: only for a client that left
        assert slow.ending == "disconnect", slow
    assert gateway.alive()


#: Real-socket examples in CI: each may take up to a few body timeouts of real time.
REAL_SLICE_EXAMPLES = min(EXAMPLES, 12)


@settings(FUZZ, max_examples=REAL_SLICE_EXAMPLES)
@given(data=st.data())
def test_a_slow_or_stalled_body_on_a_real_socket_is_answered_or_408_never_5xx_never_held(
    slow_gateway: ThreadedGateway, data: st.DataObject
) -> None:
    TRIED["slow_body_real"] += 1
    _check_slow_exchange(slow_gateway, data.draw(slow_bodies(REAL_BODY_TIMEOUT_MS)))


#: Tokens of one org that send slow heads and bodies at once; the other org's token
#: (``OTHER_TOKEN``) measures its latency meanwhile.
SLOW_TOKENS = {f"tok-fuzz-slow-{n}-5e0c2d": ORG for n in range(3)}
#: A small server, so a handful of slow sockets would fill it without the shares.
SLOW_SERVER_CONNECTIONS = 16
#: The other tenant's p100 latency while they run.
OTHER_TENANT_P100_S = 2.0


@pytest.fixture(scope="module")
def shared_gateway(sheetplane_database_url: str) -> Iterator[ThreadedGateway]:
    with ThreadedGateway(
        sheetplane_database_url,
        tokens={**SLOW_TOKENS, OTHER_TOKEN: OTHER_ORG},
        body_read_timeout_ms=REAL_BODY_TIMEOUT_MS,
        serve_options=ServeOptions(max_connections=SLOW_SERVER_CONNECTIONS),
    ) as gw:
        yield gw


def _other_tenant_latencies(base_url: str, requests: int) -> list[float]:
    latencies = []
    for _ in range(requests):
        started = time.monotonic()
        answer = httpx.post(
            base_url + RUNTIME_PATH,
            json={"action": "resolve_play", "playName": PLAY, "playRef": "none"},
            headers={"authorization": f"Bearer {OTHER_TOKEN}"},
            timeout=REAL_HANG_S,
        )
        latencies.append(time.monotonic() - started)
        assert answer.status_code == 200, answer.text
    return latencies


@settings(FUZZ, max_examples=min(EXAMPLES, 4))
@given(
    slow=st.lists(
        st.tuples(
            slow_bodies(REAL_BODY_TIMEOUT_MS),
            st.sampled_from(sorted(SLOW_TOKENS)),
            st.none() | st.integers(0, 2 * REAL_BODY_TIMEOUT_MS),
        ),
        min_size=SLOW_SERVER_CONNECTIONS,
        max_size=2 * SLOW_SERVER_CONNECTIONS,
    )
)
def test_slow_heads_and_bodies_from_several_tokens_leave_the_other_tenant_its_latency(
    shared_gateway: ThreadedGateway, slow: list[tuple[SlowBody, str, int | None]]
) -> None:
    """One to two times the server's connections of slow heads and bodies, from three
    tokens of one org at once: each is answered (408, 429 past its tenant's share, or its
    own answer) or closed, never 5xx; the other org's requests meanwhile all answer
    within ``OTHER_TENANT_P100_S``.

    Each of the other org's requests opens a keep-alive connection and closes it.
    Until issue 32's fix such a closed connection held its server slot for the rest
    of its keep-alive timer (5 s), so an example's first request could wait for the
    slots of the example before: 2.00-2.01 s in three CI runs."""
    TRIED["slow_body_tenants"] += 1
    received: list[bytes] = []
    with ThreadPoolExecutor(max_workers=len(slow) + 1) as pool:
        exchanges = [
            pool.submit(_slow_exchange, shared_gateway.base_url, body, token, head_pause)
            for body, token, head_pause in slow
        ]
        latencies = _other_tenant_latencies(shared_gateway.base_url, 5)
        received = [exchange.result(timeout=REAL_HANG_S) for exchange in exchanges]
    assert max(latencies) < OTHER_TENANT_P100_S, latencies
    for answer in received:
        if answer:
            assert int(answer.split(b" ", 2)[1]) < 500, answer[:300]
    assert shared_gateway.alive()


@pytest.mark.slow
@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_slow_and_stalled_bodies_on_a_real_socket_campaign(
    slow_gateway: ThreadedGateway, data: st.DataObject
) -> None:
    """The same property at length (``--campaign``): a few minutes of real time."""
    TRIED["slow_body_real"] += 1
    _check_slow_exchange(slow_gateway, data.draw(slow_bodies(REAL_BODY_TIMEOUT_MS)))
