"""Every public entry point with Hypothesis-generated bad input: only typed errors.

A typed error is a ``SheetplaneError`` subclass, ``ValueError`` or
``TypeError``; anything else (``AttributeError``, ``KeyError``,
``RecursionError``, an ``ExceptionGroup``, a psycopg error) is a bug. Where a
call reaches Postgres, nothing may be written (schemas, relations, session
roles and every sheetplane table's rows are compared before and after), and
where a call would reach the gateway, a refused argument sends nothing.

Covered: ``BoundedBatchFunction`` (constructor, ``submit`` and
``submit_nowait``, ``estimate_bytes`` answers), ``json_byte_length_up_to``, ``PageRequest``,
``read_pages_adaptive``, every ``SheetStore`` method, the ``GatewayClient``
constructor and helpers, ``AccessShape``/``SessionLimits``/``PreloadedSession``/
``SessionManager``, the crypto functions, ``open_runtime``, and the secret
options of ``sheetplane serve`` (``--database-url``, ``--database-url-file``,
``--token``, ``--tokens-file`` and their variables, good and bad, mixed): it
starts with exactly the secrets the sources give, in their precedence, warns
for each secret on the command line, or refuses naming the source; no secret
in any message, warning or repr.
"""

from __future__ import annotations

import base64
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sheetplane import (
    BoundedBatchFunction,
    GatewayError,
    SheetplaneError,
    json_byte_length_up_to,
)
from sheetplane._types import (
    BIGINT_MAX,
    CompleteRow,
    ContractColumn,
    FailRow,
    SheetContract,
    SheetRef,
)
from sheetplane.cli import build_parser
from sheetplane.crypto import (
    decrypt_postgres_url,
    decrypt_with_unwrap_key,
    encrypt_postgres_url,
    encrypt_with_unwrap_key,
    generate_decryption_key,
    session_aad,
)
from sheetplane.errors import InvalidInputError
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server._command import (
    METRICS_TOKEN_ENV,
    TOKENS_ENV,
    ConfigurationError,
    serve_settings,
)
from sheetplane.names import normalize_play_name
from sheetplane.pages import Page, PageRequest, read_pages_adaptive
from sheetplane.protocol import RUNTIME_PATH
from sheetplane.sessions import AccessShape, PreloadedSession, SessionLimits, SessionManager
from sheetplane.store import RowFilter, SheetStore, open_store
from sheetplane.store.embedded import DATABASE_URL_ENV
from sheetplane.testing.strategies import bad_numbers, hostile_text, json_values, wrong_types

from ._threaded_gateway import TrioThread, own_database, snapshot

TYPED = (SheetplaneError, ValueError, TypeError)
EXAMPLES = int(os.environ.get("SHEETPLANE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: Bad inputs tried, by entry point, for docs/reliability.md.
TRIED: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    path = os.environ.get("SHEETPLANE_RELIABILITY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"suite": "fuzz_entry_points", "tried": dict(TRIED)}) + "\n")


def typed_or_value(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)`` or ``("error", exc)`` for a typed error; anything else fails."""
    try:
        return "ok", fn()
    except TYPED as exc:
        return "error", exc


def must_refuse(fn: Callable[[], Any]) -> BaseException:
    outcome, value = typed_or_value(fn)
    assert outcome == "error", f"accepted bad input: {value!r}"
    assert isinstance(value, BaseException)
    return value


def run_virtual(fn: Callable[[], Any]) -> Any:
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


# --- BoundedBatchFunction ---

LIMITS: dict[str, Any] = {
    "max_batch_items": 4,
    "max_batch_bytes": 64,
    "max_retained_items": 8,
    "max_retained_bytes": 256,
    "max_in_flight_batches": 2,
    "flush_seconds": 0.005,
}


def _valid_limit(name: str, value: Any) -> bool | None:
    """True/False when the contract decides; None when either answer is acceptable."""
    if name == "flush_seconds":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if math.isnan(value) or value < 0:
            return False
        return None if math.isinf(value) else True
    return type(value) is int and value >= 1


@FUZZ
@given(
    name=st.sampled_from(sorted(LIMITS)),
    value=st.one_of(bad_numbers(), wrong_types(), st.integers(-5, 5)),
)
def test_batcher_limits_are_checked_at_construction(name: str, value: Any) -> None:
    TRIED["BoundedBatchFunction()"] += 1

    async def execute(batch: Any) -> list[Any]:
        return list(batch.values)

    valid = _valid_limit(name, value)
    outcome, result = typed_or_value(
        lambda: BoundedBatchFunction(execute, **{**LIMITS, name: value})
    )
    if valid is True:
        assert outcome == "ok", result
    elif valid is False:
        assert outcome == "error", f"{name}={value!r} was accepted"


@FUZZ
@given(
    max_wait=st.one_of(bad_numbers(), wrong_types()).filter(
        lambda v: v is not None and not (type(v) in (int, float) and v >= 0)
    ),
)
def test_submit_refuses_a_bad_max_wait_and_executes_nothing(max_wait: Any) -> None:
    TRIED["BoundedBatchFunction.submit(max_wait)"] += 1
    TRIED["BoundedBatchFunction.submit_nowait(max_wait)"] += 1
    executed: list[Any] = []

    async def execute(batch: Any) -> list[Any]:
        executed.extend(batch.values)
        return list(batch.values)

    async def main() -> tuple[BaseException, BaseException]:
        async with BoundedBatchFunction(execute, **LIMITS) as batcher:
            waiting = must_refuse_async(await _capture(batcher.submit("k", 1, max_wait=max_wait)))
            nowait = must_refuse_async(_capture_now(batcher.submit_nowait, "k", 1, max_wait))
            return waiting, nowait

    waiting, nowait = run_virtual(main)
    assert isinstance(waiting, TYPED) and type(nowait) is type(waiting)
    assert executed == []


@FUZZ
@given(size=st.one_of(bad_numbers(), wrong_types(), st.integers(min_value=257, max_value=10**30)))
def test_a_bad_size_estimate_fails_only_its_own_submit(size: Any) -> None:
    TRIED["BoundedBatchFunction.submit(estimate)"] += 1
    executed: list[Any] = []

    async def execute(batch: Any) -> list[Any]:
        executed.extend(batch.values)
        return list(batch.values)

    async def main() -> tuple[Any, Any]:
        async with BoundedBatchFunction(
            execute, estimate_bytes=lambda v: size if v == "bad" else 1, **LIMITS
        ) as batcher:
            bad = await _capture(batcher.submit("k", "bad"))
            good = await batcher.submit("k", "good")
            return bad, good

    bad, good = run_virtual(main)
    if isinstance(bad, BaseException):
        assert isinstance(bad, TYPED)
        assert executed == ["good"]
    else:
        # An int estimate within the caps is a valid one.
        assert type(size) is int and 0 <= size <= LIMITS["max_retained_bytes"]
    assert good == "good"


def _capture_now(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except BaseException as exc:  # checked by the caller
        return exc


async def _capture(awaitable: Any) -> Any:
    try:
        return await awaitable
    except BaseException as exc:  # checked by the caller
        return exc


def must_refuse_async(result: Any) -> BaseException:
    assert isinstance(result, BaseException), f"accepted bad input: {result!r}"
    assert isinstance(result, TYPED), repr(result)
    return result


# --- sizes, pages, the splitter ---


@FUZZ
@given(
    value=st.one_of(json_values(max_leaves=8), wrong_types()),
    limit=st.one_of(st.integers(0, 10**6), bad_numbers(), wrong_types()),
)
def test_json_byte_length_answers_or_refuses_typed(value: Any, limit: Any) -> None:
    TRIED["json_byte_length_up_to"] += 1
    outcome, result = typed_or_value(lambda: json_byte_length_up_to(value, limit))
    limit_ok = type(limit) is int and limit >= 0
    if not limit_ok:
        assert outcome == "error"
    if outcome == "ok":
        exact = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if result.exceeded:
            assert limit < result.bytes <= exact
        else:
            assert result.bytes == exact <= limit


def test_json_byte_length_refuses_cycles_and_surrogates() -> None:
    TRIED["json_byte_length_up_to"] += 3
    cycle: list[Any] = []
    cycle.append(cycle)
    for value in (cycle, {"a": cycle}, "\ud800"):
        must_refuse(lambda value=value: json_byte_length_up_to(value, 10**6))


@FUZZ
@given(
    limit=st.one_of(bad_numbers(), wrong_types()),
    offset=st.one_of(st.integers(0, 9), bad_numbers()),
)
def test_page_request_refuses_bad_numbers(limit: Any, offset: Any) -> None:
    TRIED["PageRequest"] += 1
    valid = type(limit) is int and limit >= 1 and type(offset) is int and offset >= 0
    outcome, _ = typed_or_value(lambda: PageRequest(limit, offset))
    assert outcome == ("ok" if valid else "error")


@FUZZ
@given(
    requests=st.one_of(
        st.lists(
            st.one_of(wrong_types(), st.builds(PageRequest, st.integers(1, 5), st.integers(0, 5))),
            max_size=4,
        ),
        wrong_types(),
    ),
    answer=st.one_of(
        wrong_types(),
        st.lists(wrong_types(), max_size=4),
        st.lists(
            st.builds(
                Page,
                rows=st.one_of(st.none(), st.tuples(st.just({"a": 1})), st.just(({"a": 1},) * 9)),
                limit=st.integers(-1, 6),
                offset=st.integers(-1, 6),
            ),
            max_size=4,
        ),
    ),
)
def test_read_pages_adaptive_refuses_bad_requests_and_bad_answers(
    requests: Any, answer: Any
) -> None:
    TRIED["read_pages_adaptive"] += 1

    async def read_batch(batch: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return answer

    async def main() -> Any:
        return await _capture(read_pages_adaptive(read_batch, requests))

    result = run_virtual(main)
    if isinstance(result, BaseException):
        assert isinstance(result, TYPED), repr(result)
    else:
        assert isinstance(result, list)
        assert all(isinstance(page, Page) for page in result)


# --- crypto, sessions ---

KEY = generate_decryption_key()
AAD = session_aad(
    org_id="o",
    play_name="p",
    table_namespace="n",
    logical_table="sheet_rows",
    operations=("rows.read",),
    expires_at="2030-01-01T00:00:00+00:00",
)
ENVELOPE = encrypt_postgres_url("postgresql://u:secret@h/db", KEY.public_jwk(), AAD)


@st.composite
def broken_envelopes(draw: st.DrawFn) -> Any:
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return draw(wrong_types())
    envelope = dict(ENVELOPE)
    member = draw(st.sampled_from(sorted(envelope)))
    if choice == 1:
        envelope[member] = draw(st.one_of(wrong_types(), hostile_text(max_size=40)))
    else:
        text = envelope[member]
        cut = draw(st.integers(0, max(0, len(text) - 1)))
        envelope[member] = text[:cut] + draw(st.sampled_from(["", "A", "_", "=", "\x00"]))
    return envelope


@FUZZ
@given(
    envelope=broken_envelopes(), aad=st.one_of(st.just(AAD), wrong_types(), st.binary(max_size=8))
)
def test_a_broken_envelope_never_opens_and_fails_typed(envelope: Any, aad: Any) -> None:
    TRIED["decrypt_postgres_url"] += 1
    if envelope == ENVELOPE and aad == AAD:
        return
    error = must_refuse(lambda: decrypt_postgres_url(envelope, KEY, aad))
    assert "secret" not in str(error)
    TRIED["decrypt_with_unwrap_key"] += 1
    must_refuse(lambda: decrypt_with_unwrap_key(envelope, b"k" * 32, aad))


def _b64_int(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


#: Public JWKs no RSA key has: a modulus past OpenSSL's 16,384 bits, an even one,
#: one with small factors, or a real public key carrying a private member.
_BAD_RSA_JWKS = st.one_of(
    st.builds(
        lambda n: {"kty": "RSA", "e": "AQAB", "n": _b64_int(n)},
        st.one_of(
            st.integers(16_385, 70_000).map(lambda bits: (1 << (bits - 1)) | 1),
            st.integers(2048, 4096).map(lambda bits: 1 << bits),
            st.sampled_from([3, 5, 7, 997]).map(lambda p: p ** (2048 // p.bit_length() + 1)),
        ),
    ),
    st.sampled_from(["d", "p", "q", "dp", "dq", "qi", "oth"]).map(
        lambda member: {**KEY.public_jwk(), member: "AQAB"}
    ),
)


@FUZZ
@given(
    jwk=st.one_of(
        wrong_types(),
        st.fixed_dictionaries(
            {
                "kty": st.sampled_from(["RSA", "EC", ""]),
                "n": hostile_text(max_size=30),
                "e": wrong_types(),
            }
        ),
        _BAD_RSA_JWKS,
    ),
    url=st.one_of(st.just("postgresql://u:p@h/db"), wrong_types()),
    unwrap=st.one_of(st.binary(max_size=40), wrong_types()),
)
def test_encryption_refuses_bad_keys_and_urls(jwk: Any, url: Any, unwrap: Any) -> None:
    TRIED["encrypt_postgres_url"] += 1
    must_refuse(lambda: encrypt_postgres_url(url, jwk, AAD))
    TRIED["encrypt_with_unwrap_key"] += 1
    if isinstance(url, str) and isinstance(unwrap, bytes) and len(unwrap) == 32:
        return
    must_refuse(lambda: encrypt_with_unwrap_key(url, unwrap, AAD))


@FUZZ
@given(
    namespace=st.one_of(wrong_types(), st.just("ns")),
    operations=st.one_of(wrong_types(), st.lists(hostile_text(max_size=12), max_size=3)),
    logical=st.one_of(wrong_types(), st.sampled_from(["sheet_rows", "nope"])),
    # The edges of the rule: a limit is a positive ``bigint``, as the wire carries it.
    limit=st.one_of(
        bad_numbers(),
        wrong_types(),
        st.integers(1, 9),
        st.sampled_from([BIGINT_MAX, BIGINT_MAX + 1]),
    ),
    session=st.one_of(wrong_types(), st.just({"expiresAt": "x"})),
)
def test_session_values_refuse_bad_fields(
    namespace: Any, operations: Any, logical: Any, limit: Any, session: Any
) -> None:
    TRIED["AccessShape/SessionLimits/PreloadedSession"] += 1
    outcome, shape = typed_or_value(lambda: AccessShape(namespace, operations, logical))
    valid_shape = (
        isinstance(namespace, str)
        and namespace
        and isinstance(operations, list | tuple | set | frozenset)
        and operations
        and set(operations) <= {"rows.read", "rows.upsert", "rows.append", "rows.replace"}
        and logical in ("sheet_rows", "dataset_rows", "play_output")
    )
    assert outcome == ("ok" if valid_shape else "error"), shape
    outcome, _ = typed_or_value(lambda: SessionLimits(max_rows=limit))
    positive_bigint = type(limit) is int and 1 <= limit <= BIGINT_MAX
    assert outcome == ("ok" if limit is None or positive_bigint else "error"), limit
    outcome, preloaded = typed_or_value(
        lambda: PreloadedSession("ns", ("rows.read",), session=session)
    )
    assert outcome == ("ok" if isinstance(session, dict) else "error")
    if outcome == "ok":
        # A malformed preloaded answer never matches; it is skipped, not raised.
        async def main() -> Any:
            async with (
                GatewayClient("http://gw.test", "tok", play_name="p", transport=_refusing()) as c,
                SessionManager(c, preloaded=[preloaded], decryption_key=KEY) as manager,
            ):
                return await _capture(manager.session(AccessShape("ns", ("rows.read",))))

        result = run_virtual(main)
        assert isinstance(result, TYPED), repr(result)


def _refusing() -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(400, json={"error": "refused"}))


# --- the gateway client ---

CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)


@FUZZ
def _sendable(base_url: str) -> bool:
    """Whether httpx can build the runtime route's URL on ``base_url``."""
    try:
        url = httpx.URL(base_url.strip().rstrip("/") + RUNTIME_PATH)
        url.copy_with(username=None, password=None)
    except httpx.InvalidURL:
        return False
    return True


@given(
    base_url=st.one_of(st.just("http://gw.test"), wrong_types()),
    token=st.one_of(st.just("tok"), wrong_types()),
    play=st.one_of(st.just("p"), wrong_types()),
    headers=st.one_of(
        st.none(),
        wrong_types(),
        st.dictionaries(
            st.one_of(st.integers(), hostile_text(max_size=8)), wrong_types(), max_size=2
        ),
    ),
)
# A mapping's keys were taken for URLs (the constructor listed any iterable).
@example(base_url={"http://gw.test": 1}, token="tok", play="p", headers=None)
@example(base_url={"http://gw.test"}, token="tok", play="p", headers=None)
# A play name is the names rule's to refuse (too long once normalised; blank).
@example(base_url="http://gw.test", token="tok", play="\u00e9" * 10_000, headers=None)
@example(base_url="http://gw.test", token="tok", play=" ", headers=None)
# A URL httpx cannot send to (a control character; a path past httpx's length limit).
@example(base_url="\x08", token="tok", play="p", headers=None)
@example(base_url="http://gw.test/" + "a" * 70_000, token="tok", play="p", headers=None)
def test_gateway_client_constructor_refuses_bad_arguments(
    base_url: Any, token: Any, play: Any, headers: Any
) -> None:
    TRIED["GatewayClient()"] += 1
    outcome, _ = typed_or_value(
        lambda: GatewayClient(base_url, token, play_name=play, headers=headers)
    )
    valid = (
        isinstance(base_url, str)
        and base_url.strip()
        and _sendable(base_url)
        and isinstance(token, str)
        and token.strip()
        and not any(ch in token for ch in "\x00\r\n")
        and typed_or_value(lambda: normalize_play_name(play))[0] == "ok"
        and (
            headers is None
            or (
                isinstance(headers, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
                and "authorization" not in {k.lower() for k in headers}
            )
        )
    )
    assert outcome == ("ok" if valid else "error")


HELPERS: dict[str, Callable[[GatewayClient, Any], Any]] = {
    "ensure_sheet(contract)": lambda c, bad: c.ensure_sheet("ns", bad),
    "ensure_sheet(namespace)": lambda c, bad: c.ensure_sheet(bad, CONTRACT),
    "start_sheet_dataset(rows)": lambda c, bad: c.start_sheet_dataset("ns", CONTRACT, bad, "r"),
    "start_sheet_dataset(contract)": lambda c, bad: c.start_sheet_dataset("ns", bad, [], "r"),
    "complete_map_rows(rows)": lambda c, bad: c.complete_map_rows(
        "ns", CONTRACT, bad, run_id="r", write_version=1
    ),
    "complete_map_rows(row)": lambda c, bad: c.complete_map_rows(
        "ns", CONTRACT, [bad], run_id="r", write_version=1
    ),
    "fail_map_rows(row)": lambda c, bad: c.fail_map_rows(
        "ns", CONTRACT, [bad], run_id="r", write_version=1
    ),
    "read_rows(request)": lambda c, bad: c.read_rows("ns", bad),
    "read_rows_batch(requests)": lambda c, bad: c.read_rows_batch("ns", bad),
    "read_rows_batch(request)": lambda c, bad: c.read_rows_batch("ns", [bad]),
    "read_row_keys(request)": lambda c, bad: c.read_row_keys("ns", bad),
    "create_db_session(contract)": lambda c, bad: c.create_db_session(
        table_namespace="ns", logical_table="sheet_rows", operations=["rows.read"], contract=bad
    ),
    "post_action(payload)": lambda c, bad: c.post_action("ensure_sheet", bad),
}


@FUZZ
@given(helper=st.sampled_from(sorted(HELPERS)), bad=wrong_types())
def test_gateway_client_helpers_fail_typed(helper: str, bad: Any) -> None:
    TRIED[f"GatewayClient.{helper.split('(')[0]}"] += 1
    sent: list[bytes] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(400, json={"error": "refused", "code": "invalid_request"})

    async def main() -> Any:
        async with GatewayClient(
            "http://gw.test", "tok", play_name="p", transport=httpx.MockTransport(handle)
        ) as client:
            return await _capture(HELPERS[helper](client, bad))

    result = run_virtual(main)
    if isinstance(result, BaseException):
        assert isinstance(result, TYPED), repr(result)
        if not isinstance(result, GatewayError):
            assert sent == [], "a refused argument was sent"


# --- the store, on a real Postgres ---


@pytest.fixture(scope="module")
def fuzz_database_url(sheetplane_database_url: str) -> Iterator[str]:
    """This module's own database: a snapshot reads only what the fuzzed calls made."""
    with own_database(sheetplane_database_url, "fuzz_entry") as url:
        yield url


@pytest.fixture(scope="module")
def store_loop(fuzz_database_url: str) -> Iterator[TrioThread]:
    async def setup(stack: AsyncExitStack) -> SheetStore:
        store: SheetStore = await stack.enter_async_context(open_store(fuzz_database_url))
        await store.start_dataset(SHEET, [{"_key": "a", "email": "a@x.org"}], "r1", CONTRACT)
        return store

    with TrioThread(setup) as loop:
        yield loop


SHEET = SheetRef("fuzz-entry-org", "fuzz-entry-play", "fuzz-entry-ns")
VERSION = 1


def _row_like() -> st.SearchStrategy[Any]:
    nul = st.just({"_key": "k", "email": "x\x00"})
    deep = st.integers(257, 400).map(lambda d: {"_key": "k", "email": _nest(d)})
    # A dict of wrong_types() is a valid (if odd) row: only non-objects are wrong here.
    return st.one_of(wrong_types().filter(lambda v: not isinstance(v, dict)), nul, deep)


def _nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


STORE_CALLS: dict[str, Callable[[SheetStore, Any], Any]] = {
    "ensure_sheet(sheet)": lambda s, bad: s.ensure_sheet(bad, CONTRACT),
    "ensure_sheet(contract)": lambda s, bad: s.ensure_sheet(SHEET, bad),
    "start_dataset(rows)": lambda s, bad: s.start_dataset(SHEET, bad, "r2", CONTRACT),
    "start_dataset(row)": lambda s, bad: s.start_dataset(SHEET, [bad], "r2", CONTRACT),
    "start_dataset(key)": lambda s, bad: s.start_dataset(SHEET, [{"_key": bad}], "r2", CONTRACT),
    "start_dataset(run_id)": lambda s, bad: s.start_dataset(SHEET, [{"_key": "z"}], bad, CONTRACT),
    "append_rows(row)": lambda s, bad: s.append_rows(SHEET, [bad], idempotency_key="i"),
    "append_rows(idempotency_key)": lambda s, bad: s.append_rows(SHEET, [], idempotency_key=bad),
    "upsert_rows(row)": lambda s, bad: s.upsert_rows(SHEET, [bad], idempotency_key="u"),
    "replace_rows(rows)": lambda s, bad: s.replace_rows(SHEET, bad, idempotency_key="x"),
    "complete_map_rows(row)": lambda s, bad: s.complete_map_rows(
        SHEET, CONTRACT, [bad], run_id="r1", write_version=VERSION
    ),
    "complete_map_rows(data)": lambda s, bad: s.complete_map_rows(
        SHEET, CONTRACT, [CompleteRow("a", bad)], run_id="r1", write_version=VERSION
    ),
    "complete_map_rows(write_version)": lambda s, bad: s.complete_map_rows(
        SHEET, CONTRACT, [CompleteRow("a", {"score": 1})], run_id="r1", write_version=bad
    ),
    "fail_map_rows(error)": lambda s, bad: s.fail_map_rows(
        SHEET, CONTRACT, [FailRow("a", bad)], run_id="r1", write_version=VERSION
    ),
    "claim_work_receipt(holder)": lambda s, bad: s.claim_work_receipt("o", "p", "k", bad),
    "complete_work_receipt(result)": lambda s, bad: s.complete_work_receipt(
        "o", "p", "k", _unstorable(bad), "r1"
    ),
    "complete_work_receipt(run_attempt)": lambda s, bad: s.complete_work_receipt(
        "o", "p", "k", 1, "r1", run_attempt=bad
    ),
    "read_rows(request)": lambda s, bad: s.read_rows(SHEET, bad),
    "read_rows_batch(pages)": lambda s, bad: s.read_rows_batch(SHEET, bad),
    "read_rows_after(limit)": lambda s, bad: s.read_rows_after(SHEET, None, bad),
    "read_rows_after(cursor)": lambda s, bad: s.read_rows_after(SHEET, bad, 10),
    "read_row_keys(run_id)": lambda s, bad: s.read_row_keys(
        SHEET, PageRequest(1, 0), which=RowFilter(run_id=bad)
    ),
    "count(run_id)": lambda s, bad: s.count(SHEET, which=RowFilter(run_id=bad)),
    "read_rows_by_keys(keys)": lambda s, bad: s.read_rows_by_keys(SHEET, bad),
    "summary(sheet)": lambda s, bad: s.summary(bad),
}


def _unstorable(value: Any) -> Any:
    """A receipt result no store may keep (wrong types that are valid JSON are wrapped
    around a NUL so the call is still bad input)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return value
    return {"v": value, "nul": "\x00"}


def _bad_argument(call: str) -> st.SearchStrategy[Any]:
    """Values that are wrong for the argument ``call`` names."""
    texts = st.one_of(
        wrong_types().filter(lambda v: not isinstance(v, str)), st.sampled_from(["", "x\x00"])
    )
    if call.endswith("(row)"):
        return _row_like()
    if call.endswith(("(run_id)", "(holder)", "(idempotency_key)", "(error)")):
        return texts
    if call.endswith("(key)"):
        return st.one_of(
            # None is no key at all: the row's identity is derived then.
            wrong_types().filter(lambda v: v is not None and not isinstance(v, str)),
            st.sampled_from(["", "k\x00", "\ud800", "é" * 2_000]),
        )
    if call.endswith("(write_version)"):
        return st.one_of(bad_numbers(), st.sampled_from([2**63, 2**70]))
    if call.endswith("(run_attempt)"):
        return st.one_of(bad_numbers(), st.sampled_from([2**31, 2**40]))
    if call.endswith("(limit)"):
        return st.one_of(bad_numbers(), st.sampled_from([0, 5_001, 2**63]))
    if call.endswith("(data)"):
        return st.one_of(
            wrong_types().filter(lambda v: v is not None and not isinstance(v, dict)),
            st.just({"score": "\x00"}),
            st.just({"score": _nest(300)}),
            st.just({"score": math.nan}),
        )
    # Any other argument: a wrong type, never an empty sequence (a valid, empty write).
    return wrong_types().filter(lambda v: not (isinstance(v, list | tuple) and not v))


@FUZZ
@given(call=st.sampled_from(sorted(STORE_CALLS)), data=st.data())
def test_store_methods_refuse_bad_input_typed_and_write_nothing(
    store_loop: TrioThread, fuzz_database_url: str, call: str, data: st.DataObject
) -> None:
    TRIED[f"SheetStore.{call.split('(')[0]}"] += 1
    bad = data.draw(_bad_argument(call), label="bad")
    before = snapshot(fuzz_database_url)
    store: SheetStore = store_loop.value

    async def attempt() -> Any:
        return await _capture(STORE_CALLS[call](store, bad))

    result = store_loop.run(attempt)
    if call.startswith(("read_", "count", "summary")) and not isinstance(result, BaseException):
        pass  # a read of an odd but valid argument may answer
    else:
        assert isinstance(result, BaseException), f"{call} accepted {bad!r}"
    if isinstance(result, BaseException):
        assert isinstance(result, TYPED), repr(result)
        assert "Postgres failed" not in str(result), "bad input reached Postgres"
    assert snapshot(fuzz_database_url) == before, "a refused call wrote something"


# --- open_runtime ---

RUNTIME_ARGS: dict[str, Any] = {
    "base_url": "http://127.0.0.1:9",
    "token": "tok",
    "org_id": "org",
    "play_name": "play",
    "run_id": "run",
    "strategy": "direct",
    "preloaded_sessions": (),
    "unwrap_key": None,
    "user_email": None,
    "headers": None,
}


def _bad_runtime_argument(name: str) -> st.SearchStrategy[Any]:
    if name in ("token", "org_id", "play_name", "run_id"):
        return st.one_of(
            wrong_types().filter(lambda v: not isinstance(v, str)), st.sampled_from(["", "a\x00"])
        )
    if name == "base_url":
        return st.one_of(
            wrong_types().filter(lambda v: not isinstance(v, str)),
            st.sampled_from(["", "ftp://x", "gw.test", "http://", "https:///path", "http://[::1"]),
        )
    if name == "strategy":
        return st.one_of(wrong_types(), st.sampled_from(["gateway", "DIRECT", ""]))
    if name == "preloaded_sessions":
        return st.one_of(
            wrong_types().filter(
                lambda v: v is not None and not (isinstance(v, list | tuple) and not v)
            ),
            st.lists(wrong_types(), min_size=1, max_size=2),
        )
    if name == "unwrap_key":
        return st.one_of(
            wrong_types().filter(lambda v: v is not None),
            st.binary(max_size=31),
            st.binary(min_size=33, max_size=40),
        )
    if name == "user_email":
        return wrong_types().filter(lambda v: v is not None and not isinstance(v, str))
    return st.one_of(  # headers
        wrong_types().filter(lambda v: v is not None and not (isinstance(v, dict) and not v)),
        st.just({"authorization": "Bearer other"}),
        st.just({"x-a": 1}),
    )


@FUZZ
@given(name=st.sampled_from(sorted(RUNTIME_ARGS)), data=st.data())
def test_open_runtime_refuses_a_bad_argument_before_connecting(
    name: str, data: st.DataObject
) -> None:
    from sheetplane import open_runtime

    TRIED["open_runtime"] += 1
    bad = data.draw(_bad_runtime_argument(name), label=name)

    async def main() -> Any:
        async def enter() -> None:
            async with open_runtime(**{**RUNTIME_ARGS, name: bad}):
                raise AssertionError("open_runtime accepted a bad argument")

        return await _capture(enter())

    result = run_virtual(main)
    assert isinstance(result, TYPED), repr(result)


RUNTIME_CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "writer(namespace)": lambda rt, bad: rt.writer(bad, CONTRACT),
    "writer(contract)": lambda rt, bad: rt.writer("ns", bad),
    "writer(write_version)": lambda rt, bad: rt.writer("ns", CONTRACT, write_version=bad),
    "dataset(namespace)": lambda rt, bad: rt.dataset(bad),
    "dataset(row_mode)": lambda rt, bad: rt.dataset("ns", bad),
    "RowWriter.start(rows)": lambda rt, bad: rt.writer("ns", CONTRACT).start(bad),
    "RowWriter.complete(rows)": lambda rt, bad: rt.writer("ns", CONTRACT, write_version=1).complete(
        bad
    ),
    "RowWriter.fail(rows)": lambda rt, bad: rt.writer("ns", CONTRACT, write_version=1).fail(bad),
    "ReceiptRecorder.complete(key)": lambda rt, bad: rt.receipts().complete(bad, {"ok": True}),
}


@FUZZ
@given(call=st.sampled_from(sorted(RUNTIME_CALLS)), data=st.data())
def test_runtime_parts_refuse_bad_arguments(call: str, data: st.DataObject) -> None:
    from sheetplane import open_runtime

    TRIED[f"Runtime.{call.split('(')[0]}"] += 1
    if call.endswith("(write_version)"):
        bad = data.draw(
            st.one_of(
                bad_numbers(), wrong_types().filter(lambda v: v is not None and type(v) is not int)
            )
        )
    elif call.endswith("(row_mode)"):
        bad = data.draw(st.one_of(wrong_types(), st.sampled_from(["rows", "ALL", ""])))
    elif call.endswith("(rows)"):
        bad = data.draw(
            st.one_of(
                wrong_types().filter(lambda v: not (isinstance(v, list | tuple) and not v)),
                st.lists(wrong_types(), min_size=1, max_size=2),
            )
        )
    else:
        bad = data.draw(
            st.one_of(
                wrong_types().filter(lambda v: not isinstance(v, str) or not v), st.just("a\x00")
            )
        )

    async def main() -> Any:
        async with open_runtime(**RUNTIME_ARGS) as rt:

            async def attempt() -> Any:
                made = RUNTIME_CALLS[call](rt, bad)
                if hasattr(made, "__await__"):
                    return await made
                return made

            return await _capture(attempt())

    result = run_virtual(main)
    assert isinstance(result, BaseException), f"{call} accepted {bad!r}"
    assert isinstance(result, TYPED), repr(result)


# --- sheetplane serve: its secret options ----------------------------------------------------
#
# The database URL and executor tokens come from the command line (warned about),
# files or the environment, in a stated precedence. Whatever the mix, good or bad,
# the command either starts with exactly the secrets the sources give or refuses
# (``ConfigurationError``: exit 2) naming the source; no secret is ever in a
# message, a warning or a repr.

_SECRET_TEXT = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    min_size=10,
    max_size=24,
)
#: A pair that ``parse_token_pairs`` refuses, for a token ``t`` (``{t}``) and an org.
_MALFORMED_PAIRS = ("{t}", "={org}", "{t}=", " = ", "{t}:{org}")


@st.composite
def token_sources(draw: st.DrawFn, name: str) -> tuple[list[str], bool, set[str]]:
    """``(pairs, malformed, tokens)`` of one source: ``TOKEN=ORG`` texts, whether one
    is malformed, and every token text in them (the secrets to look for)."""
    pairs: list[str] = []
    tokens: set[str] = set()
    malformed = False
    for index in range(draw(st.integers(0, 3))):
        token = f"tok{name}{index}{draw(_SECRET_TEXT)}"
        tokens.add(token)
        if draw(st.integers(0, 5)) == 0:
            pairs.append(draw(st.sampled_from(_MALFORMED_PAIRS)).format(t=token, org="org-x"))
            malformed = True
        else:
            pairs.append(f"{token}=org-{draw(st.integers(0, 2))}")
    return pairs, malformed, tokens


def _url(kind: str, password: str) -> str:
    return {
        "uri": f"postgresql://gw:{password}@127.0.0.1:5432/sheets?sslmode=disable",
        "uri_no_password": "postgresql://gw@127.0.0.1:5432/sheets",
        "conninfo": f"host=127.0.0.1 dbname=sheets user=gw password={password}",
        "unparseable": f"postgresql://gw:{password}@[::1:5432/sheets",
    }[kind]


@FUZZ
@given(
    password=_SECRET_TEXT,
    url_kind=st.sampled_from(["uri", "uri_no_password", "conninfo", "unparseable"]),
    url_source=st.sampled_from(["none", "env", "arg", "file", "both", "arg_and_env"]),
    url_file=st.sampled_from(["good", "padded", "empty", "missing", "directory", "not_utf8"]),
    cli=token_sources("c"),
    from_file=st.one_of(st.none(), token_sources("f")),
    env=token_sources("e"),
    tokens_file_missing=st.booleans(),
)
def test_serve_secret_options_start_with_exactly_their_secrets_or_refuse_without_echoing(
    password: str,
    url_kind: str,
    url_source: str,
    url_file: str,
    cli: tuple[list[str], bool, set[str]],
    from_file: tuple[list[str], bool, set[str]] | None,
    env: tuple[list[str], bool, set[str]],
    tokens_file_missing: bool,
) -> None:
    TRIED["serve_secret_options"] += 1
    url = _url(url_kind, password)
    secrets = {password, url, *cli[2], *env[2], *(from_file[2] if from_file else ())}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        argv = ["serve"]
        environ = {
            DATABASE_URL_ENV: "",
            TOKENS_ENV: ",".join(env[0]),
            METRICS_TOKEN_ENV: "",
        }
        expected_url: str | None = None
        refused = False
        if url_source in ("env", "arg_and_env"):
            environ[DATABASE_URL_ENV] = url
            expected_url = url
        if url_source in ("arg", "both", "arg_and_env"):
            argv += ["--database-url", url]
            expected_url = url
        if url_source in ("file", "both"):
            path = root / "database-url"
            if url_file == "directory":
                path.mkdir()
            elif url_file != "missing":
                content = {
                    "good": url.encode(),
                    "padded": f"\n  {url}  \n".encode(),
                    "empty": b" \n",
                    "not_utf8": b"\xff\xfe" + url.encode(),
                }[url_file]
                path.write_bytes(content)
            argv += ["--database-url-file", str(path)]
            expected_url = url
            refused |= url_file not in ("good", "padded")
        refused |= url_source == "both"
        for pair in cli[0]:
            argv.append(f"--token={pair}")
        if from_file is not None:
            tokens_path = root / "tokens"
            if not tokens_file_missing:
                lines = ["# executor tokens", "", *from_file[0]]
                tokens_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            argv += ["--tokens-file", str(tokens_path)]
            refused |= tokens_file_missing or from_file[1]
        refused |= cli[1] or env[1]
        args = build_parser().parse_args(argv)
        with mock.patch.dict(os.environ, environ):
            if not environ[DATABASE_URL_ENV]:
                del os.environ[DATABASE_URL_ENV]
            try:
                settings = serve_settings(args)
            except (ConfigurationError, InvalidInputError) as exc:
                message = str(exc)
                assert refused, message
                assert message
                for secret in secrets:
                    assert secret not in message
                return
    assert not refused, argv
    expected_tokens: dict[str, str] = {}
    for source in (env[0], from_file[0] if from_file else [], cli[0]):
        expected_tokens.update(p.split("=", 1) for p in source)
    assert settings.secrets["tokens"] == expected_tokens
    assert settings.secrets["database_url"] == expected_url
    warned = " ".join(settings.messages)
    assert ("--token puts" in warned) == bool(cli[0])
    on_command_line = url_source in ("arg", "arg_and_env") and url_kind != "uri_no_password"
    assert ("--database-url puts" in warned) == on_command_line
    assert ("no executor token" in warned) == (not expected_tokens)
    for secret in secrets:
        for text in (*settings.messages, repr(settings), repr(args.__dict__.get("run"))):
            assert secret not in text
