"""SessionManager: cache keys, renewal, preloaded matching, decryption, pools, in virtual time.

The gateway is a scripted transport that mints sessions the way the reference
gateway does (expiry ``DB_SESSION_TTL_MS`` ahead, URL sealed to the caller's
key with the session identity as AAD). The wall clock follows trio's virtual
clock from a fixed epoch.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import psycopg
import pytest
import trio

from sheetplane import (
    EnvelopeDecryptionError,
    GatewayProtocolError,
    InvalidInputError,
    SessionError,
    StoreUnavailableError,
)
from sheetplane._types import ContractColumn, SheetContract
from sheetplane.budgets import (
    CALL_BUDGET_MS,
    DB_SESSION_POOL_IDLE_MS,
    DB_SESSION_RENEWAL_WINDOW_MS,
    DB_SESSION_TTL_MS,
    POSTGRES_CONNECT_RETRY_DELAYS_MS,
    POSTGRES_FIRST_CONNECT_BUDGET_MS,
)
from sheetplane.crypto import (
    DecryptionKey,
    encrypt_postgres_url,
    encrypt_with_unwrap_key,
    generate_decryption_key,
    session_aad,
)
from sheetplane.gateway.client import GatewayClient
from sheetplane.pages import PageRequest
from sheetplane.protocol import SessionLimitsWire, session_limits_of, structure
from sheetplane.sessions import (
    AccessShape,
    PreloadedSession,
    SessionLimits,
    SessionManager,
    batch_read_shape,
    session_cache_key,
)

EPOCH = 1_900_000_000.0
TOKEN = "exec-token-sessions"
UNWRAP_KEY = bytes(range(32))
READ = AccessShape("leads", ("rows.read",))
TTL = DB_SESSION_TTL_MS / 1000
WINDOW = DB_SESSION_RENEWAL_WINDOW_MS / 1000


def wall() -> float:
    return EPOCH + trio.current_time()


def iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="milliseconds")


def session_answer(
    n: int,
    *,
    org: str = "org-1",
    play: str = "enrich-leads",
    namespace: str = "leads",
    table: str = "sheet_rows",
    operations: tuple[str, ...] = ("rows.read",),
    limits: dict[str, int] | None = None,
    expires: float,
    seal: Any,
) -> dict[str, Any]:
    expires_at = iso(expires)
    aad = session_aad(
        org_id=org,
        play_name=play,
        table_namespace=namespace,
        logical_table=table,
        operations=operations,
        expires_at=expires_at,
    )
    return {
        "expiresAt": expires_at,
        "playName": play,
        "target": {"orgId": org, "tableNamespace": namespace, "logicalTable": table},
        "operations": list(operations),
        "limits": limits or {},
        "postgres": {
            "schema": "sp_org_1",
            "sheetTable": "t_sheet",
            "eventTable": "t_event",
            "summaryTable": "t_summary",
            "columnSummaryTable": "t_colsum",
        },
        "encryptedPostgresUrl": seal(url_of(n), aad),
    }


def url_of(n: int) -> str:
    return f"postgresql://sp_role_{n}:secret-{n}@127.0.0.1:5432/sheets"


@attrs.define
class FakeGateway:
    """Mints sessions; ``tamper`` breaks the next envelope; ``other_scope`` lies about the scope."""

    requests: list[dict[str, Any]] = attrs.field(factory=list)
    tamper: bool = False
    other_scope: bool = False
    #: The namespace the answers name, when not the requested one as it was sent.
    spelled: str | None = None

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        assert body["action"] == "create_db_session"
        self.requests.append(body)
        jwk = body["postgresUrlEncryption"]["publicKeyJwk"]
        n = len(self.requests)

        def seal(url: str, aad: bytes) -> dict[str, str]:
            envelope = encrypt_postgres_url(url, jwk, aad)
            if self.tamper:
                # Another first character, always: "A" over a ciphertext that
                # already starts with "A" changed nothing (1 run in 64).
                first = envelope["ciphertext"][0]
                envelope["ciphertext"] = ("B" if first == "A" else "A") + envelope["ciphertext"][1:]
            return envelope

        answer = session_answer(
            n,
            namespace="other"
            if self.other_scope
            else self.spelled or body["target"]["tableNamespace"],
            table=body["target"]["logicalTable"],
            operations=tuple(body["operations"]),
            limits=body.get("limits"),
            expires=wall() + body["ttlSeconds"],
            seal=seal,
        )
        return httpx.Response(200, json=answer)


@attrs.define
class FakePools:
    """Records when pools open and close, and who is inside."""

    events: list[tuple[float, str, str]] = attrs.field(factory=list)
    fail_next: bool = False
    #: How many opens Postgres refuses the login of (its role reclaimed), as libpq says it.
    refuse_logins: int = 0

    @asynccontextmanager
    async def open(self, url: str) -> AsyncIterator[Any]:
        if self.fail_next:
            self.fail_next = False
            raise OSError("connection refused")
        if self.refuse_logins:
            self.refuse_logins -= 1
            role = url.split("//")[1].split(":")[0]
            await trio.sleep(0.01)  # a connect's round trip
            try:
                raise psycopg.OperationalError(
                    f'connection failed: FATAL:  password authentication failed for user "{role}"'
                )
            except psycopg.OperationalError as refused:
                raise StoreUnavailableError(
                    "could not connect to Postgres (1 attempt(s) in 10 ms)", transient=False
                ) from refused
        self.events.append((trio.current_time(), "open", url))
        try:
            yield {"url": url}
        finally:
            self.events.append((trio.current_time(), "close", url))


@pytest.fixture(scope="module")
def key() -> DecryptionKey:
    return generate_decryption_key()


@asynccontextmanager
async def manager_for(
    key: DecryptionKey,
    gateway: FakeGateway | None = None,
    pools: FakePools | None = None,
    *,
    org_id: str | None = "org-1",
    **kwargs: Any,
) -> AsyncIterator[SessionManager]:
    gateway = gateway or FakeGateway()
    pools = pools or FakePools()
    transport = httpx.MockTransport(gateway.handle)
    client = GatewayClient(
        "http://gw.test", TOKEN, play_name="enrich-leads", org_id=org_id, transport=transport
    )
    async with (
        client,
        SessionManager(
            client, clock=wall, open_pool=pools.open, decryption_key=key, **kwargs
        ) as manager,
    ):
        yield manager


# --- cache keys and shapes ------------------------------------------------------------------


def test_cache_key_covers_the_token_and_the_whole_shape() -> None:
    contract = SheetContract((ContractColumn("email", "email", "input"),))
    base = session_cache_key("http://gw", "digest-a", "play", READ)
    variants = [
        session_cache_key("http://gw", "digest-b", "play", READ),
        session_cache_key("http://other", "digest-a", "play", READ),
        session_cache_key("http://gw", "digest-a", "play-2", READ),
        session_cache_key("http://gw", "digest-a", "play", attrs.evolve(READ, table_namespace="x")),
        session_cache_key(
            "http://gw", "digest-a", "play", attrs.evolve(READ, logical_table="dataset_rows")
        ),
        session_cache_key(
            "http://gw", "digest-a", "play", AccessShape("leads", ("rows.read", "rows.upsert"))
        ),
        session_cache_key(
            "http://gw", "digest-a", "play", attrs.evolve(READ, limits=SessionLimits(max_rows=5))
        ),
        session_cache_key("http://gw", "digest-a", "play", attrs.evolve(READ, contract=contract)),
        session_cache_key("http://gw", "digest-a", "play", attrs.evolve(READ, user_email="a@b.c")),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert all(len(k) == 64 and "digest" not in k for k in [base, *variants])
    # Operation order does not matter.
    swapped = AccessShape("leads", ("rows.upsert", "rows.read"))
    assert session_cache_key("g", "d", "p", swapped) == session_cache_key(
        "g", "d", "p", AccessShape("leads", ("rows.read", "rows.upsert"))
    )


def test_batch_read_asks_for_the_sum_of_page_limits() -> None:
    shape = batch_read_shape(
        "leads", [PageRequest(100, 0), PageRequest(50, 100), PageRequest(7, 150)]
    )
    assert shape.operations == ("rows.read",)
    assert shape.limits == SessionLimits(max_rows=157)


def test_limits_satisfy() -> None:
    assert SessionLimits().satisfies(SessionLimits(max_rows=10**9))
    assert SessionLimits(max_rows=10).satisfies(SessionLimits(max_rows=10))
    assert not SessionLimits(max_rows=9).satisfies(SessionLimits(max_rows=10))
    assert SessionLimits(max_rows=9).satisfies(SessionLimits(max_bytes=10))


# --- minting, caching, renewal -----------------------------------------------------------------


async def test_mint_sends_the_shape_and_a_public_key_and_decrypts(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    gateway = FakeGateway()
    shape = AccessShape("leads", ("rows.upsert", "rows.read"), limits=SessionLimits(max_rows=10))
    async with manager_for(key, gateway) as manager:
        session = await manager.session(shape)
    assert session.postgres_url == url_of(1)
    assert url_of(1) not in repr(session) and "secret-1" not in repr(session)
    assert session.expires_at_epoch == pytest.approx(EPOCH + TTL)
    (request,) = gateway.requests
    assert request["target"] == {"tableNamespace": "leads", "logicalTable": "sheet_rows"}
    assert request["operations"] == ["rows.read", "rows.upsert"]
    assert request["limits"] == {"maxRows": 10}
    assert request["ttlSeconds"] == DB_SESSION_TTL_MS // 1000
    assert request["postgresUrlEncryption"]["alg"] == "RSA-OAEP-256+A256GCM"
    assert request["postgresUrlEncryption"]["publicKeyJwk"] == key.public_jwk()


async def test_reused_only_while_more_than_the_renewal_window_remains(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    gateway = FakeGateway()
    async with manager_for(key, gateway) as manager:
        first = await manager.session(READ)
        await trio.sleep_until(TTL - WINDOW - 0.001)
        assert await manager.session(READ) is first
        await trio.sleep_until(TTL - WINDOW)
        second = await manager.session(READ)
    assert second is not first and second.postgres_url == url_of(2)
    assert len(gateway.requests) == 2


async def test_other_shapes_get_their_own_sessions(autojump_clock: Any, key: DecryptionKey) -> None:
    gateway = FakeGateway()
    async with manager_for(key, gateway) as manager:
        a = await manager.session(READ)
        b = await manager.session(attrs.evolve(READ, limits=SessionLimits(max_rows=3)))
        c = await manager.session(AccessShape("leads", ("rows.read", "rows.append")))
        assert await manager.session(READ) is a
    assert len({a.postgres_url, b.postgres_url, c.postgres_url}) == 3
    assert manager.minted == 3


async def test_concurrent_requests_for_one_shape_share_one_mint(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    gateway = FakeGateway()
    results = []
    async with manager_for(key, gateway) as manager:

        async def ask() -> None:
            results.append(await manager.session(READ))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(ask)
    assert len(gateway.requests) == 1
    assert all(r is results[0] for r in results)


async def test_tampered_envelope_fails_without_leaking(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    async with manager_for(key, FakeGateway(tamper=True)) as manager:
        with pytest.raises(EnvelopeDecryptionError) as excinfo:
            await manager.session(READ)
    assert "secret" not in str(excinfo.value) and "postgresql" not in str(excinfo.value)


async def test_answer_for_another_scope_is_refused(autojump_clock: Any, key: DecryptionKey) -> None:
    async with manager_for(key, FakeGateway(other_scope=True)) as manager:
        with pytest.raises(GatewayProtocolError, match="another scope"):
            await manager.session(READ)


# --- preloaded sessions ---------------------------------------------------------------------------


def preloaded(n: int = 100, **changes: Any) -> PreloadedSession:
    answer_args: dict[str, Any] = {
        "expires": EPOCH + TTL,
        "seal": lambda url, aad: encrypt_with_unwrap_key(url, UNWRAP_KEY, aad),
    }
    shape_args: dict[str, Any] = {}
    for name, value in changes.items():
        if name in {"org", "play", "namespace", "table", "operations", "limits", "expires"}:
            answer_args[name] = value
        else:
            shape_args[name] = value
    answer = session_answer(n, **answer_args)
    return PreloadedSession(
        table_namespace=shape_args.get("table_namespace", answer["target"]["tableNamespace"]),
        operations=shape_args.get("operations_declared", tuple(answer["operations"])),
        session=answer,
        logical_table=shape_args.get("logical_table", answer["target"]["logicalTable"]),
        limits=shape_args.get(
            "declared_limits",
            session_limits_of(structure(answer["limits"], SessionLimitsWire)),
        ),
    )


async def test_matching_preloaded_session_is_used_and_cached(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    gateway = FakeGateway()
    async with manager_for(key, gateway, preloaded=[preloaded()], unwrap_key=UNWRAP_KEY) as manager:
        session = await manager.session(attrs.evolve(READ, limits=SessionLimits(max_rows=10**6)))
        assert session.postgres_url == url_of(100)
    assert gateway.requests == []


@pytest.mark.parametrize(
    "candidate",
    [
        preloaded(org="org-2"),
        preloaded(play="other-play"),
        preloaded(namespace="other"),
        preloaded(table_namespace="other"),
        preloaded(table="dataset_rows"),
        preloaded(operations=("rows.read", "rows.upsert")),
        preloaded(limits={"maxRows": 5}),
        preloaded(declared_limits=SessionLimits(max_rows=5)),
        preloaded(expires=EPOCH + WINDOW),
    ],
)
async def test_preloaded_session_that_does_not_match_is_not_used(
    autojump_clock: Any, key: DecryptionKey, candidate: PreloadedSession
) -> None:
    gateway = FakeGateway()
    shape = attrs.evolve(READ, limits=SessionLimits(max_rows=10))
    async with manager_for(key, gateway, preloaded=[candidate], unwrap_key=UNWRAP_KEY) as manager:
        session = await manager.session(shape)
    assert session.postgres_url == url_of(1)
    assert len(gateway.requests) == 1


async def test_preloaded_without_unwrap_key_is_a_session_error(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    async with manager_for(key, preloaded=[preloaded()]) as manager:
        with pytest.raises(SessionError, match="no harness unwrap key"):
            await manager.session(READ)


async def test_preloaded_with_wrong_unwrap_key_fails(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    wrong = bytes(reversed(UNWRAP_KEY))
    async with manager_for(key, preloaded=[preloaded()], unwrap_key=wrong) as manager:
        with pytest.raises(EnvelopeDecryptionError):
            await manager.session(READ)


# --- pools ---------------------------------------------------------------------------


async def test_pool_is_shared_and_closes_at_expiry(autojump_clock: Any, key: DecryptionKey) -> None:
    pools = FakePools()
    async with manager_for(key, pools=pools) as manager:
        async with manager.store(READ) as first, manager.store(READ) as second:
            assert first is second and first["url"] == url_of(1)
            await trio.sleep(TTL + 1)
        assert pools.events == [(0.0, "open", url_of(1)), (TTL, "close", url_of(1))]


async def test_an_idle_pool_gives_its_connections_back_and_opens_again_on_next_use(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    # A runner between two uses must not hold its org's connection budget.
    pools = FakePools()
    idle = DB_SESSION_POOL_IDLE_MS / 1000
    async with manager_for(key, pools=pools) as manager:
        async with manager.store(READ):
            await trio.sleep(1)
        await trio.sleep(idle + 1)
        async with manager.store(READ) as again:
            assert again["url"] == url_of(1)  # the same session, a new pool
        assert manager.minted == 1
    assert pools.events[:3] == [
        (0.0, "open", url_of(1)),
        (1 + idle, "close", url_of(1)),
        (2 + idle, "open", url_of(1)),
    ]


async def test_a_released_pool_closes_when_its_last_user_leaves(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    pools = FakePools()
    async with manager_for(key, pools=pools) as manager:
        async with manager.store(READ):
            assert manager.release(lambda shape: shape.operations == ("rows.read",)) == 1
            await trio.sleep(0.5)
        await trio.sleep(0.25)
        assert pools.events == [(0.0, "open", url_of(1)), (0.5, "close", url_of(1))]


async def test_retired_session_closes_its_pool_when_its_users_leave(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    pools = FakePools()
    renewal = TTL - WINDOW
    async with manager_for(key, pools=pools) as manager:
        async with manager.store(READ):
            await trio.sleep_until(renewal)
            async with manager.store(READ) as fresh:
                assert fresh["url"] == url_of(2)
                await trio.sleep(1)
            # The old pool still has this caller inside.
            assert (renewal, "close", url_of(1)) not in pools.events
        await trio.sleep(1)
    assert pools.events == [
        (0.0, "open", url_of(1)),
        (renewal, "open", url_of(2)),
        (renewal + 1, "close", url_of(1)),  # retired, and its last user left
        (renewal + 2, "close", url_of(2)),  # still current: closed with the manager
    ]


async def test_pool_that_fails_to_open_is_tried_again(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    pools = FakePools(fail_next=True)
    async with manager_for(key, pools=pools) as manager:
        with pytest.raises(OSError):
            async with manager.store(READ):
                pass
        async with manager.store(READ) as store:
            assert store["url"] == url_of(1)


async def test_a_session_refused_again_and_again_is_minted_anew_each_time(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    # Each of the runner's sessions was reclaimed while it waited for a slot: its
    # login refused. Before, one was minted anew once; the second refusal failed the
    # call (and every other caller waiting on the same pool failed at the first).
    gateway, pools = FakeGateway(), FakePools(refuse_logins=3)
    got: list[str] = []
    async with manager_for(key, gateway, pools) as manager:

        async def caller() -> None:
            async with manager.store(READ) as store:
                got.append(store["url"])

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(caller)
    assert got == [url_of(4)] * 4
    assert len(gateway.requests) == 4


async def test_refused_logins_end_at_the_calls_deadline_without_naming_the_role(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    gateway, pools = FakeGateway(), FakePools(refuse_logins=10**6)
    async with manager_for(key, gateway, pools) as manager:
        started = trio.current_time()
        with pytest.raises(StoreUnavailableError) as caught:
            async with manager.store(READ):
                pass
        waited = trio.current_time() - started
    assert CALL_BUDGET_MS / 1000 - 2 <= waited <= CALL_BUDGET_MS / 1000
    # Minted anew on the connect ladder's rungs, not as fast as the gateway answers.
    assert 10 < len(gateway.requests) < CALL_BUDGET_MS / POSTGRES_CONNECT_RETRY_DELAYS_MS[-1] + 5
    assert not caught.value.transient
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "sp_role_" not in str(caught.value) and "secret-" not in str(caught.value)
    assert f"{len(gateway.requests)} session(s)" in str(caught.value)


async def test_leaving_the_manager_closes_every_pool(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    pools = FakePools()
    async with manager_for(key, pools=pools) as manager:
        async with manager.store(READ):
            pass
        async with manager.store(AccessShape("leads", ("rows.upsert",))):
            pass
        await trio.sleep(1)
    assert [(t, kind) for t, kind, _ in pools.events] == [
        (0.0, "open"),
        (0.0, "open"),
        (1.0, "close"),
        (1.0, "close"),
    ]


# --- names as identities ---------------------------------------------------------------------


async def test_spellings_of_one_namespace_share_one_cached_session(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    gateway = FakeGateway()
    spellings = ("NormTest", "normtest", " NormTest ", "\tNORMTEST\n")
    async with manager_for(key, gateway) as manager:
        sessions = [await manager.session(AccessShape(ns, ("rows.read",))) for ns in spellings]
        keys = {manager.cache_key(AccessShape(ns, ("rows.read",))) for ns in spellings}
    assert all(session is sessions[0] for session in sessions)
    assert len(keys) == 1
    (request,) = gateway.requests
    assert request["target"]["tableNamespace"] == "normtest"


async def test_a_preloaded_session_matches_every_spelling_of_its_names(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    # Minted by a harness that kept the names as typed: they are compared normalised.
    candidate = preloaded(play=" Enrich-Leads ", namespace="NormTest", table_namespace=" NormTest ")
    gateway = FakeGateway()
    async with manager_for(key, gateway, preloaded=[candidate], unwrap_key=UNWRAP_KEY) as manager:
        session = await manager.session(AccessShape("normTEST", ("rows.read",)))
    assert session.postgres_url == url_of(100)
    assert gateway.requests == []


async def test_a_minted_answer_naming_the_sheet_otherwise_spelled_is_its_scope(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    # A gateway may echo the namespace as its caller typed it, not as it was sent.
    async with manager_for(key, FakeGateway(spelled=" Leads ")) as manager:
        session = await manager.session(AccessShape("leads", ("rows.read",)))
    assert session.table_namespace == " Leads "  # as answered: the seal is bound to it
    assert session.postgres_url == url_of(1)


@pytest.mark.parametrize("blank", ["", "   ", "\t\n"])
def test_a_namespace_blank_once_trimmed_is_refused(blank: str) -> None:
    with pytest.raises(InvalidInputError, match="table_namespace"):
        AccessShape(blank, ("rows.read",))
    with pytest.raises(InvalidInputError, match="table_namespace"):
        PreloadedSession(table_namespace=blank, operations=("rows.read",), session={})


async def test_without_pool_caching_every_use_opens_and_closes_its_own_pool(
    autojump_clock: Any, key: DecryptionKey
) -> None:
    pools = FakePools()
    gateway = FakeGateway()
    async with manager_for(key, gateway, pools, cache_pools=False) as manager:
        async with manager.store(READ) as first:
            await trio.sleep(1)
            async with manager.store(READ) as second:
                assert first is not second
        await trio.sleep(1)
        async with manager.store(READ):
            pass
        opened_in_block = list(pools.events)
    assert [(t, kind) for t, kind, _ in opened_in_block] == [
        (0.0, "open"),
        (1.0, "open"),
        (1.0, "close"),
        (1.0, "close"),
        (2.0, "open"),
        (2.0, "close"),
    ]
    assert {url for _, _, url in pools.events} == {url_of(1)}  # one session, shared
    assert len(gateway.requests) == 1


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- the direct road's first connect -------------------------------------------------------


async def test_the_first_connect_to_an_unreachable_session_postgres_fails_fast(
    autojump_clock: Any,
    key: DecryptionKey,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, a session URL the runner cannot reach was waited on for the whole connect
    # budget (22.5 s) in silence; until a session's Postgres has answered, the opening
    # connect now gives up after POSTGRES_FIRST_CONNECT_BUDGET_MS, saying what it tried.
    port = _refused_port()
    monkeypatch.setattr(
        sys.modules[__name__],
        "url_of",
        lambda n: f"postgresql://sp_role_{n}:sekret-{n}@127.0.0.1:{port}/sheets",
    )
    gateway = FakeGateway()
    client = GatewayClient(
        "http://gw.test",
        "exec-token-first-connect",
        play_name="enrich-leads",
        org_id="org-1",
        transport=httpx.MockTransport(gateway.handle),
    )
    start = trio.current_time()
    with caplog.at_level(logging.WARNING, logger="sheetplane.store"):
        async with (
            client,
            SessionManager(client, clock=wall, decryption_key=key) as manager,
        ):
            with pytest.raises(StoreUnavailableError) as excinfo:
                async with manager.store(AccessShape("leads", ("rows.read",))):
                    raise AssertionError("a pool opened on a refused port")
    elapsed = trio.current_time() - start
    assert elapsed <= POSTGRES_FIRST_CONNECT_BUDGET_MS / 1000
    message = str(excinfo.value)
    assert message.startswith("the direct road's first connect failed: ")
    assert f"127.0.0.1:{port}" in message and "attempt(s)" in message
    assert "\n" not in message and "sekret" not in message
    warnings = [r.getMessage() for r in caplog.records if r.name == "sheetplane.store"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"Postgres connect to 127.0.0.1:{port} failed: ")
    assert "retrying for up to" in warnings[0]
