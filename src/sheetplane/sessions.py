"""Scoped database sessions: minting, caching, renewal, preloaded matching, pools.

A runner on the direct road reads and writes a sheet through a short-lived
Postgres role the gateway mints (``create_db_session``). This module turns
an *access shape* (namespace, logical table, operations, limits, contract,
user) into an open session and a pool on it:

* **Cache.** Sessions are cached under a SHA-256 digest of the gateway, the
  executor token's digest, the play and the whole access shape, so a
  long-lived worker never hands one org's or one privilege set's URL to
  another. A cached session is reused only while more than
  ``DB_SESSION_RENEWAL_WINDOW_MS`` remains before it expires; that window
  covers ``POSTGRES_OPERATION_BUDGET_MS``, so an operation started on a
  reused session finishes before the role expires.
* **Preloaded sessions.** A harness may mint sessions ahead of a run. One
  matches a request when it still has its renewal window and its org, play,
  namespace, logical table and operations are the requested ones (names
  compared normalised, ``sheetplane.names``), and its limits are at least the
  requested ones; a limit the preloaded session does
  not set satisfies any request (the role's grants are the real boundary).
* **Encryption.** A minted session's URL comes back as a JWE addressed to an
  RSA key this manager generated (one per manager); a preloaded one is sealed
  under the harness unwrap key. Both are bound to the session's identity
  (see ``sheetplane.crypto``). The plaintext URL lives only in
  ``DbSession.postgres_url`` (never in a repr) and in the pool opened on it.
* **Pools.** ``async with manager.store(shape) as store`` opens a pool on the
  session's URL once and shares it. A pool closes when its session has been
  retired (no longer reusable) or released (``release``: its user is done
  with it) and no caller is inside it, when no caller has used it for
  ``DB_SESSION_POOL_IDLE_MS``, and at the session's expiry at the latest. A
  pool closed while idle opens again on the next use.
* **Gone sessions.** The gateway reclaims an org's roles that hold no
  connection for another runner of the org waiting to mint, and a runner
  waiting for a connection slot holds none. A login Postgres refuses (28P01 /
  28000) for a session this manager minted means the session is gone: it is
  retired and a new one minted through the gateway's fair queue, as often as
  it happens, until the call's deadline (``store``). No message names the role.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from . import _tracing, crypto
from . import protocol as m
from ._groups import single_error
from ._recovery import call_deadline
from ._types import (
    LOGICAL_TABLES,
    OPERATIONS,
    DbSession,
    PageRequest,
    PostgresTables,
    SessionLimits,
    SheetContract,
    canonical_operations,
)
from .budgets import (
    DB_SESSION_MAX_CONNECTIONS,
    DB_SESSION_POOL_IDLE_MS,
    DB_SESSION_TTL_MS,
    POSTGRES_CONNECT_RETRY_DELAYS_MS,
    POSTGRES_FIRST_CONNECT_BUDGET_MS,
    POSTGRES_PREWARM_MAX_ATTEMPTS,
    POSTGRES_PREWARM_RETRY_DELAYS_MS,
)
from .errors import (
    GatewayProtocolError,
    InvalidInputError,
    SessionError,
    SessionPrewarmError,
    StoreError,
    StoreUnavailableError,
)
from .names import normalize_name, normalize_table_namespace

if TYPE_CHECKING:
    from .gateway.client import GatewayClient
    from .store import SheetStore

__all__ = [
    "AccessShape",
    "DbSession",
    "PostgresTables",
    "PreloadedSession",
    "SessionLimits",
    "SessionManager",
    "batch_read_shape",
    "session_cache_key",
]


#: Opens a pool (a ``SheetStore``) on a scoped URL; replaceable for tests.
PoolOpener = Callable[[str], AbstractAsyncContextManager["SheetStore"]]

_MS: Final = 1000


def _operations(value: Iterable[str]) -> tuple[str, ...]:
    given = tuple(value)
    ops = canonical_operations(given)
    if not ops:
        raise InvalidInputError(
            f"operations must be a non-empty subset of {OPERATIONS}, got {given}"
        )
    return ops


def _raw_session(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, Mapping):
        raise InvalidInputError(
            f"a preloaded session must be a create_db_session answer (an object), "
            f"got {type(value).__name__}"
        )


def _logical_table(value: str) -> str:
    if value not in LOGICAL_TABLES:
        raise InvalidInputError(f"logical table must be one of {LOGICAL_TABLES}, got {value!r}")
    return value


@attrs.frozen
class AccessShape:
    """What a session is for: everything that decides its grants, and its cache key."""

    table_namespace: str = attrs.field(converter=normalize_table_namespace)
    """The sheet's namespace within the play (normalised: ``sheetplane.names``)."""
    operations: tuple[str, ...] = attrs.field(converter=_operations)
    """Granted operations, in the canonical order (``OPERATIONS``; any order may be given)."""
    logical_table: str = attrs.field(default="sheet_rows", converter=_logical_table)
    """Which table of the namespace."""
    limits: SessionLimits = attrs.field(factory=SessionLimits)
    """Advisory limits."""
    contract: SheetContract | None = None
    """The sheet contract the session is minted for."""
    user_email: str | None = None
    """The user on whose behalf, if any."""

    def to_json(self) -> dict[str, Any]:
        """A canonical JSON form, for cache keys."""
        return {
            "tableNamespace": self.table_namespace,
            "logicalTable": self.logical_table,
            "operations": list(self.operations),
            "limits": m.session_limits_json(self.limits),
            "sheetContract": None if self.contract is None else m.contract_json(self.contract),
            "userEmail": self.user_email,
        }


def batch_read_shape(
    table_namespace: str,
    pages: Sequence[PageRequest],
    *,
    contract: SheetContract | None = None,
    user_email: str | None = None,
) -> AccessShape:
    """The shape of a direct batch read: ``rows.read``, ``max_rows`` = the sum of page limits."""
    if not pages:
        raise InvalidInputError("a batch read needs at least one page")
    return AccessShape(
        table_namespace=table_namespace,
        operations=("rows.read",),
        limits=SessionLimits(max_rows=sum(page.limit for page in pages)),
        contract=contract,
        user_email=user_email,
    )


def session_cache_key(base_url: str, token_digest: str, play_name: str, shape: AccessShape) -> str:
    """SHA-256 hex of the gateway, the token's digest, the play and the whole access shape."""
    material = json.dumps(
        [base_url, token_digest, play_name, shape.to_json()],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


@attrs.frozen
class PreloadedSession:
    """A session a harness minted ahead of the run, with the shape it was minted for."""

    table_namespace: str = attrs.field(converter=normalize_table_namespace)
    operations: tuple[str, ...] = attrs.field(converter=_operations)
    session: Mapping[str, Any] = attrs.field(repr=False, validator=_raw_session)
    """The raw ``create_db_session`` answer (its URL sealed under the unwrap key)."""
    logical_table: str = attrs.field(default="sheet_rows", converter=_logical_table)
    limits: SessionLimits = attrs.field(factory=SessionLimits)


@attrs.frozen
class _Answer:
    """A ``create_db_session`` answer, checked, with its URL still sealed."""

    identity: DbSession
    envelope: Mapping[str, Any] | None
    aad: bytes


def _parse_answer(answer: Mapping[str, Any]) -> _Answer:
    """Read a ``create_db_session`` answer (``protocol/m.parse_db_session``) and
    the additional data its sealed URL is bound to."""
    identity, envelope = m.parse_db_session(answer)
    aad = crypto.session_aad(
        org_id=identity.org_id,
        play_name=identity.play_name,
        table_namespace=identity.table_namespace,
        logical_table=identity.logical_table,
        operations=identity.operations,
        expires_at=identity.expires_at,
    )
    return _Answer(identity, envelope, aad)


def _default_pool_opener(url: str) -> AbstractAsyncContextManager[SheetStore]:
    from .store import open_store

    # The session's role accepts no more connections than this (CONNECTION LIMIT).
    return open_store(url, max_connections=DB_SESSION_MAX_CONNECTIONS)


def _own_pool_opener(url: str) -> AbstractAsyncContextManager[SheetStore]:
    """One caller's own pool when pools are not cached: one connection, as the
    runtime's request-local pool (``maxConnections: 1``); a ``store`` block runs
    one store operation, which needs no more."""
    from .store import open_store

    return open_store(url, max_connections=1)


def _first_connect(max_connections: int) -> PoolOpener:
    """A default pool of ``max_connections`` whose opening connect gives up after
    ``POSTGRES_FIRST_CONNECT_BUDGET_MS``: used until a session's Postgres has answered."""

    def opener(url: str) -> AbstractAsyncContextManager[SheetStore]:
        from .store import open_store

        return open_store(
            url,
            max_connections=max_connections,
            open_connect_budget_ms=POSTGRES_FIRST_CONNECT_BUDGET_MS,
        )

    return opener


def _check_pool_opener(url: str) -> AbstractAsyncContextManager[SheetStore]:
    """A one-connection pool that connects once: prewarm's own ladder does the retrying."""
    from .store import open_store

    return open_store(url, max_connections=1, connect_retry_delays_ms=())


def _same_name(answered: str, wanted: str) -> bool:
    """Whether a name a session answer carries (as the gateway wrote it, which is
    what its seal is bound to) is ``wanted`` (already normalised) once normalised."""
    try:
        return normalize_name("name", answered) == wanted
    except InvalidInputError:
        return False


def _identity(session: DbSession) -> str:
    return (
        f"org={session.org_id!r} play={session.play_name!r} "
        f"namespace={session.table_namespace!r} table={session.logical_table!r} "
        f"operations={list(session.operations)}"
    )


def _transient(exc: BaseException) -> bool:
    from .store import is_transient_connect_error

    cause = exc.__cause__
    return is_transient_connect_error(exc) or (
        cause is not None and is_transient_connect_error(cause)
    )


def _login_refused(exc: BaseException) -> bool:
    from .store import is_login_refused

    return is_login_refused(exc)


async def _prewarm_one(session: DbSession, open_pool: PoolOpener) -> None:
    """Open a pool on ``session`` and run ``SELECT 1``, on the prewarm ladder."""
    for attempt in range(1, POSTGRES_PREWARM_MAX_ATTEMPTS + 1):
        try:
            async with open_pool(session.postgres_url) as store:
                await store.pool.run(lambda conn: conn.execute("SELECT 1").fetchone())
            return
        except Exception as exc:  # the pool is closed (dropped) by leaving its block
            if attempt == POSTGRES_PREWARM_MAX_ATTEMPTS or not _transient(exc):
                transient = "transient " if _transient(exc) else ""
                raise SessionPrewarmError(
                    f"prewarming the preloaded DB session {_identity(session)} failed "
                    f"after {attempt} attempt(s) on a {transient}{type(exc).__name__}"
                ) from exc
        await trio.sleep(POSTGRES_PREWARM_RETRY_DELAYS_MS[attempt - 1] / _MS)


@attrs.define
class _Refusals:
    """The sessions one ``store`` call met gone (their logins refused): each is
    minted anew until the call's deadline, set at the first. The first is
    minted anew at once; each later one after the next rung of the connect
    ladder (``POSTGRES_CONNECT_RETRY_DELAYS_MS``, then its last), so a refusal
    that keeps coming does not hammer the gateway with mints."""

    count: int = 0
    deadline: float = math.inf
    started: float = attrs.field(factory=trio.current_time)
    """When the ``store`` call began (its budget's start outside ``retry_idempotent``)."""

    async def add(self) -> None:
        self.count += 1
        if self.count == 1:
            self.deadline = call_deadline(self.started)
        else:
            rung = min(self.count - 2, len(POSTGRES_CONNECT_RETRY_DELAYS_MS) - 1)
            wake = trio.current_time() + POSTGRES_CONNECT_RETRY_DELAYS_MS[rung] / _MS
            await trio.sleep_until(min(wake, self.deadline))
        if trio.current_time() >= self.deadline:
            # From nothing: the refusal being handled names the role.
            raise self.error() from None

    def error(self) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"no DB session could be opened within the call's budget: Postgres refused"
            f" the login of the {self.count} session(s) minted for it (the gateway"
            f" reclaimed each role while this runner waited for a connection slot,"
            f" or it expired)",
            transient=False,
        )


@attrs.define(eq=False)
class _Pool:
    """A pool on one session's URL, run by its own task in the manager's nursery."""

    session: DbSession
    shape: AccessShape
    minted: bool = False
    """Whether this manager minted the session (a gone one is minted anew)."""
    ready: trio.Event = attrs.field(factory=trio.Event)
    changed: trio.Event = attrs.field(factory=trio.Event)
    store: SheetStore | None = None
    error: BaseException | None = None
    users: int = 0
    retired: bool = False
    closed: bool = False

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class SessionManager:
    """Scoped sessions for one gateway client, cached, renewed, and pooled.

    Use it as ``async with SessionManager(client) as manager:``. Leaving the
    block closes every pool it opened (after their callers leave).

    ``clock`` is the wall clock in seconds since the epoch (sessions expire
    at wall-clock instants); tests inject one that follows trio's virtual
    clock. ``open_pool`` opens a pool on a URL (default:
    ``sheetplane.store.open_store``); ``open_check_pool`` opens the
    one-connection, one-attempt pool ``prewarm`` checks a session with;
    ``open_own_pool`` opens a caller's own pool when ``cache_pools`` is false
    (default: one connection wide, or ``open_pool`` when one was given).
    ``decryption_key`` is the RSA key minted URLs are sealed to; by default
    the manager generates one (in a worker thread) on its first mint and
    keeps it for its lifetime.
    """

    def __init__(
        self,
        client: GatewayClient,
        *,
        preloaded: Sequence[PreloadedSession] = (),
        unwrap_key: bytes | None = None,
        clock: Callable[[], float] = time.time,
        open_pool: PoolOpener = _default_pool_opener,
        open_check_pool: PoolOpener = _check_pool_opener,
        open_own_pool: PoolOpener | None = None,
        decryption_key: crypto.DecryptionKey | None = None,
        cache_pools: bool = True,
    ) -> None:
        if unwrap_key is not None:
            crypto.check_unwrap_key(unwrap_key)
        if not isinstance(cache_pools, bool):
            raise InvalidInputError(f"cache_pools must be a bool, got {cache_pools!r}")
        self._cache_pools = cache_pools
        self._client = client
        self._preloaded = tuple(preloaded)
        self._unwrap_key = unwrap_key
        self._clock = clock
        self._open_pool = open_pool
        self._open_check_pool = open_check_pool
        if open_own_pool is None:
            # A caller that opens its own pools opens these too; by default an
            # uncached pool is one connection wide.
            open_own_pool = _own_pool_opener if open_pool is _default_pool_opener else open_pool
        self._open_own_pool = open_own_pool
        #: Until a session's Postgres has answered this manager, pools open with a
        #: short first-connect budget (only the default openers have one).
        self._open_first_pool = (
            _first_connect(DB_SESSION_MAX_CONNECTIONS)
            if open_pool is _default_pool_opener
            else open_pool
        )
        self._open_first_own_pool = (
            _first_connect(1) if open_own_pool is _own_pool_opener else open_own_pool
        )
        self._reached_postgres = False
        self._key = decryption_key
        self._key_lock = trio.Lock()
        self._sessions: dict[str, DbSession] = {}
        #: The cached sessions this manager minted (not preloaded), by cache key.
        self._minted: dict[str, DbSession] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._pools: dict[str, _Pool] = {}
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: AbstractAsyncContextManager[trio.Nursery] | None = None
        #: How many sessions this manager minted through the gateway (for tests and stats).
        self.minted = 0

    async def __aenter__(self) -> SessionManager:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        for pool in self._pools.values():
            pool.retired = True
            pool.users = 0
            pool.notify()
        self._pools.clear()
        self._sessions.clear()
        self._minted.clear()
        cm, self._nursery_cm, self._nursery = self._nursery_cm, None, None
        assert cm is not None
        try:
            return await cm.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The nursery is this manager's own: a caller who did not open it gets the
            # one error itself, not wrapped in a group (the block's own error unchanged).
            single = single_error(group)
            if single is group:
                raise
            if single is exc:
                return False
            raise single from single.__cause__

    # --- sessions -------------------------------------------------------------------

    def cache_key(self, shape: AccessShape) -> str:
        """This manager's cache key for ``shape``."""
        client = self._client
        return session_cache_key(client.base_url, client.token_digest, client.play_name, shape)

    async def session(self, shape: AccessShape) -> DbSession:
        """A session for ``shape``: cached, preloaded, or minted now.

        Concurrent requests for one shape share one mint. Raises
        ``SessionError`` (or ``EnvelopeDecryptionError``) when the URL cannot
        be opened, and the gateway's errors when minting fails.
        """
        if not isinstance(shape, AccessShape):
            raise InvalidInputError(f"shape must be an AccessShape, got {type(shape).__name__}")
        key = self.cache_key(shape)
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            cached = self._sessions.get(key)
            if cached is not None:
                if cached.reusable(self._clock()):
                    return cached
                self._retire(key)
            session = self._match_preloaded(shape)
            if session is None:
                session = await self._mint(shape)
                self._minted[key] = session
            self._sessions[key] = session
            return session

    def _retire(self, key: str) -> None:
        self._sessions.pop(key, None)
        self._minted.pop(key, None)
        pool = self._pools.pop(key, None)
        if pool is not None:
            pool.retired = True
            pool.notify()

    def _match_preloaded(self, shape: AccessShape) -> DbSession | None:
        client, now = self._client, self._clock()
        for preloaded in self._preloaded:
            try:
                parsed = _parse_answer(preloaded.session)
            except GatewayProtocolError:
                continue
            session = parsed.identity
            if not (
                session.reusable(now)
                and (client.org_id is None or session.org_id == client.org_id)
                and _same_name(session.play_name, client.play_name)
                and preloaded.table_namespace == shape.table_namespace
                and _same_name(session.table_namespace, shape.table_namespace)
                and preloaded.logical_table == shape.logical_table
                and session.logical_table == shape.logical_table
                and preloaded.operations == shape.operations
                and session.operations == shape.operations
                and preloaded.limits.satisfies(shape.limits)
                and session.limits.satisfies(shape.limits)
            ):
                continue
            return self._open_preloaded(parsed)
        return None

    # --- prewarm ------------------------------------------------------------------------

    async def prewarm(self) -> int:
        """Open and check (``SELECT 1``) a connection on every usable preloaded session.

        Each try opens a pool on the session's URL with a single connect
        attempt, runs ``SELECT 1`` and closes the pool again; a transient
        connection error (refused, reset, timed out, 57P01, "connection
        terminated/closed/reset") drops that pool and tries again after the
        next rung of ``POSTGRES_PREWARM_RETRY_DELAYS_MS``. A non-transient
        error, or the last try's failure, raises ``SessionPrewarmError``
        naming the session's identity, never its URL. Sessions that could not
        be used any more (inside their renewal window, or unreadable) are
        skipped. Returns how many sessions were checked. If cancelled, the
        try in progress is cancelled and its pool closed.
        """
        checked = 0
        now = self._clock()
        for preloaded in self._preloaded:
            try:
                parsed = _parse_answer(preloaded.session)
            except GatewayProtocolError:
                continue
            if not parsed.identity.reusable(now):
                continue
            session = self._open_preloaded(parsed)
            await _prewarm_one(session, self._open_check_pool)
            checked += 1
        return checked

    def _open_preloaded(self, parsed: _Answer) -> DbSession:
        if parsed.envelope is None:
            return parsed.identity
        if self._unwrap_key is None:
            raise SessionError(
                "a preloaded DB session is encrypted, but no harness unwrap key was provided"
            )
        url = crypto.decrypt_with_unwrap_key(parsed.envelope, self._unwrap_key, parsed.aad)
        return attrs.evolve(parsed.identity, postgres_url=url)

    async def _mint(self, shape: AccessShape) -> DbSession:
        with _tracing.span(
            "sheetplane.session.mint",
            {
                "sheetplane.table_namespace": shape.table_namespace,
                "sheetplane.session.logical_table": shape.logical_table,
                "sheetplane.session.operations": list(shape.operations),
            },
        ):
            return await self._mint_session(shape)

    def prepare_key(self) -> None:
        """Start making this manager's decryption key now, on a worker thread (RSA key
        generation releases the GIL), unless it has one: a caller that knows a mint is
        coming (a direct admission, while it checks its first chunk and probes the
        gateway) saves the mint that wait. A failure here is left to the mint to meet."""
        if self._key is None and self._nursery is not None and not self._key_lock.locked():

            async def make() -> None:
                with contextlib.suppress(Exception):
                    await self._make_key()

            self._nursery.start_soon(make)

    async def _make_key(self) -> crypto.DecryptionKey:
        # One key for the manager's lifetime: concurrent first mints (of two
        # shapes) wait for one generation instead of each replacing the key
        # another's request was sealed to.
        async with self._key_lock:
            if self._key is None:
                # RSA key generation is CPU work; keep it off the event loop.
                self._key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
            return self._key

    async def _mint_session(self, shape: AccessShape) -> DbSession:
        key = await self._make_key()
        answer = await self._client.create_db_session(
            table_namespace=shape.table_namespace,
            logical_table=shape.logical_table,
            operations=shape.operations,
            limits=m.session_limits_json(shape.limits) or None,
            contract=shape.contract,
            ttl_seconds=DB_SESSION_TTL_MS // _MS,
            encryption=key.encryption_request(),
        )
        parsed = _parse_answer(answer)
        session = parsed.identity
        client = self._client
        if (
            not _same_name(session.play_name, client.play_name)
            or (client.org_id is not None and session.org_id != client.org_id)
            or not _same_name(session.table_namespace, shape.table_namespace)
            or session.logical_table != shape.logical_table
            or session.operations != shape.operations
        ):
            raise GatewayProtocolError(
                200, None, "create_db_session answered a session for another scope"
            )
        self.minted += 1
        if parsed.envelope is None:
            return session
        url = crypto.decrypt_postgres_url(parsed.envelope, key, parsed.aad)
        return attrs.evolve(session, postgres_url=url)

    # --- pools ------------------------------------------------------------------------

    @asynccontextmanager
    async def store(self, shape: AccessShape) -> AsyncIterator[SheetStore]:
        """A pool on ``shape``'s session, shared by every caller of that session.

        The pool opens on first use. If opening fails, the error propagates
        and the next call tries again. Cancellation while waiting for the pool
        leaves it opening for the others.

        A session this manager minted whose login Postgres refuses (28P01 /
        28000: the gateway reclaimed its role while this runner waited for a
        connection slot, or the role expired) is gone, not down: it is retired
        and a new one is minted through the gateway (which queues the mint
        fairly for room in the org's connection budget), again each time it
        happens, until the call's deadline (``_recovery.call_deadline``); then
        ``StoreUnavailableError`` says so. A refusal met inside the block (a
        statement's connect) retires the session and raises a transient
        ``StoreUnavailableError``: the direct road's retry mints anew. No
        message names the role or carries its password or URL.

        A manager made with ``cache_pools=False`` (``open_runtime``'s
        ``disable_postgres_pool_cache``, the runtime's ``disablePostgresPoolCache``)
        shares sessions but no pools: each call opens its own pool on the
        session's URL, one connection wide as the runtime's request-local pool,
        and closes it when the block is left, so no connection outlives the
        operation that used it.
        """
        if self._nursery is None:
            raise RuntimeError("use SessionManager inside 'async with'")
        key = self.cache_key(shape)
        if not self._cache_pools:
            async with contextlib.AsyncExitStack() as stack:
                session, minted, own = await self._open_own(shape, key, stack)
                try:
                    yield own
                except StoreError as exc:
                    lost = self._lost(key, session, minted, exc)
                    if lost is None:
                        raise
                    raise lost from None
            return
        pool = await self._open_shared(shape, key)
        pool.users += 1
        pool.notify()  # a caller is in: the pool's idle timer stops
        try:
            assert pool.store is not None
            yield pool.store
        except StoreError as exc:
            lost = self._lost(key, pool.session, pool.minted, exc)
            if lost is None:
                raise
            raise lost from None
        finally:
            pool.users -= 1
            pool.notify()

    async def _open_shared(self, shape: AccessShape, key: str) -> _Pool:
        """The open shared pool of ``shape``'s session (opened now if need be)."""
        refusals = _Refusals()
        while True:
            pool: _Pool | None = None
            with trio.move_on_at(refusals.deadline):
                pool = await self._ready_pool(shape, key)
            if pool is None:
                raise refusals.error()
            if pool.store is None:
                if self._pools.get(key) is pool:
                    del self._pools[key]
                assert pool.error is not None
                if not (pool.minted and _login_refused(pool.error)):
                    raise pool.error
                await self._gone(key, pool.session, refusals)
                continue
            if not pool.closed:
                return pool

    async def _ready_pool(self, shape: AccessShape, key: str) -> _Pool:
        """The pool of ``shape``'s session once it is ready (open, or failed to)."""
        assert self._nursery is not None
        session = await self.session(shape)
        pool = self._pools.get(key)
        if pool is None or pool.closed or pool.session is not session:
            if pool is not None:
                pool.retired = True
                pool.notify()
            pool = _Pool(session, shape, minted=self._minted.get(key) is session)
            self._pools[key] = pool
            self._nursery.start_soon(self._run_pool, key, pool)
        await pool.ready.wait()
        return pool

    async def _open_own(
        self, shape: AccessShape, key: str, stack: contextlib.AsyncExitStack
    ) -> tuple[DbSession, bool, SheetStore]:
        """A pool of this caller's own on ``shape``'s session, closed with ``stack``."""
        refusals = _Refusals()
        while True:
            with trio.move_on_at(refusals.deadline):
                session = await self.session(shape)
                minted = self._minted.get(key) is session
                try:
                    own = await stack.enter_async_context(
                        self._opened(session.postgres_url, own=True)
                    )
                except Exception as exc:
                    if not (minted and _login_refused(exc)):
                        raise
                    await self._gone(key, session, refusals)
                    continue
                return session, minted, own
            raise refusals.error()

    @contextlib.asynccontextmanager
    async def _opened(self, url: str, *, own: bool = False) -> AsyncIterator[SheetStore]:
        """A pool on a session's ``url`` (``own``: one caller's own). Before any session's
        Postgres has answered, its opening connect fails fast, with an error that says
        what the direct road tried (``POSTGRES_FIRST_CONNECT_BUDGET_MS``); after, the
        whole connect budget."""
        first = not self._reached_postgres
        if own:
            opener = self._open_first_own_pool if first else self._open_own_pool
        else:
            opener = self._open_first_pool if first else self._open_pool
        async with contextlib.AsyncExitStack() as stack:
            try:
                store = await stack.enter_async_context(opener(url))
            except StoreUnavailableError as exc:
                if not first or _login_refused(exc):
                    raise
                raise type(exc)(
                    f"the direct road's first connect failed: {exc}; is the DB session's"
                    " Postgres reachable from this runner? (strategy='gateway_only' needs"
                    " no direct connection)",
                    transient=exc.transient,
                    waited_ms=exc.waited_ms,
                ) from exc
            self._reached_postgres = True
            yield store

    async def _gone(self, key: str, session: DbSession, refusals: _Refusals) -> None:
        """Postgres refused the login of ``session``, which this manager minted:
        retire it (unless another caller did) so the next try mints anew."""
        if self._sessions.get(key) is session:
            self._retire(key)
        await refusals.add()

    def _lost(
        self, key: str, session: DbSession, minted: bool, exc: StoreError
    ) -> StoreUnavailableError | None:
        """What to raise instead of ``exc``, met inside a ``store`` block, when it
        says the session is gone (its session retired: the retry mints anew);
        None when it says nothing of the kind."""
        # Raised from nothing: a refused login's own text names the role.
        if minted and _login_refused(exc):
            lost = StoreUnavailableError(
                "Postgres refused the DB session's login (the gateway reclaimed its role"
                " while this runner waited for a connection slot, or it expired): the"
                " statement did not run; the next attempt mints a new session"
            )
        elif (
            not isinstance(exc, StoreUnavailableError)
            and getattr(exc.__cause__, "sqlstate", None) == "42501"
        ):
            # The role went away under the pool (the gateway reclaimed it while it
            # looked idle): nothing ran.
            lost = StoreUnavailableError(f"the DB session's role was reclaimed while in use: {exc}")
        else:
            return None
        if self._sessions.get(key) is session:
            self._retire(key)
        return lost

    def release(self, match: Callable[[AccessShape], bool]) -> int:
        """Give back the pools of the sessions whose shape ``match`` accepts: the
        caller will not use them again (an admission's staging session once it
        has committed). Each closes as soon as no caller is inside it; the session
        stays cached, so a later use opens a pool again. Returns how many."""
        released = 0
        for pool in list(self._pools.values()):
            if not pool.closed and not pool.retired and match(pool.shape):
                pool.retired = True
                pool.notify()
                released += 1
        return released

    async def _run_pool(self, key: str, pool: _Pool) -> None:
        expiry = trio.current_time() + (pool.session.expires_at_epoch - self._clock())
        opened = self._opened(pool.session.postgres_url)
        try:
            store = await opened.__aenter__()
        except Exception as exc:
            pool.error = exc
            pool.ready.set()
            return
        pool.store = store
        pool.ready.set()
        try:
            with trio.move_on_at(expiry):
                while not (pool.retired and pool.users == 0):
                    if pool.users:
                        await pool.changed.wait()
                        continue
                    # No caller: the pool gives its connections back after
                    # DB_SESSION_POOL_IDLE_MS (the session stays cached; a later
                    # caller opens a new pool), so an org's connections are held
                    # by work, not by runners between two uses.
                    with trio.move_on_after(DB_SESSION_POOL_IDLE_MS / _MS) as idle:
                        await pool.changed.wait()
                    if idle.cancelled_caught and pool.users == 0:
                        break
        finally:
            pool.closed = True
            if self._pools.get(key) is pool:
                del self._pools[key]
            # Closing a pool whose role has expired may fail; there is nothing left to do.
            with contextlib.suppress(Exception):
                await opened.__aexit__(None, None, None)
