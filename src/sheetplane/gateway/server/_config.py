"""How one reference gateway is configured."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ... import crypto
from ..._checks import positive_field as _positive
from ...budgets import (
    DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    DB_SESSION_LOGIN_TIMEOUT_MS,
    DB_SESSION_MAX_BACKEND_MEMORY_BYTES,
    DB_SESSION_MAX_CONNECTIONS,
    DB_SESSION_MAX_LIVE_PER_ORG,
    DB_SESSION_MAX_LIVE_PER_TOKEN,
    DB_SESSION_MAX_ORG_MEMORY_BYTES,
    DB_SESSION_REAPER_INTERVAL_MS,
    DB_SESSION_STATEMENT_TIMEOUT_MS,
    DB_SESSION_TRANSACTION_TIMEOUT_MS,
    DB_SESSION_TTL_MS,
    DB_SESSION_WATCHDOG_INTERVAL_MS,
    GATEWAY_ACTION_BUDGET_MS,
    GATEWAY_BODY_READ_TIMEOUT_MS,
    POSTGRES_POOL_ACQUIRE_TIMEOUT_MS,
)
from ...store import StoreQuotas
from ._plays import PlayDefinition
from ._roles import SessionBounds, SessionCaps
from ._shares import TenantCaps


def _optional_positive(
    instance: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is not None:
        _positive(instance, attribute, value)


#: The default of ``session_max_backend_memory_bytes`` (typed so None may replace it).
_MEMORY_BOUND: int | None = DB_SESSION_MAX_BACKEND_MEMORY_BYTES


def _plays(value: Iterable[PlayDefinition]) -> tuple[PlayDefinition, ...]:
    return tuple(value)


@attrs.frozen
class GatewayConfig:
    """Everything ``create_app`` needs. Secrets never appear in its ``repr``."""

    database_url: str = attrs.field(repr=False)
    """The Postgres URL the gateway connects with; its role must be able to
    create schemas, tables and roles. A secret."""
    tokens: Mapping[str, str] = attrs.field(repr=False, factory=dict)
    """``{executor token: org id}``. Secrets."""
    allow_test_faults: bool = False
    """Honour the ``x-sheetplane-test-fault`` header (tests only)."""
    legacy: bool = False
    """Emulate a gateway that predates ``runtime_sheet_read_rows_batch`` and
    stale reasons (``staleKeys`` without ``staleRows``)."""
    actions: frozenset[str] | None = attrs.field(
        default=None, converter=attrs.converters.optional(frozenset)
    )
    """Serve only these actions (None: every one); any other is answered 400
    "Unsupported runtime data-plane action: <action>", as a gateway that
    predates it (``sheetplane.testing.seed_gateway`` makes the runtime's own
    gateway of it)."""
    max_connections: int | None = attrs.field(default=None, validator=_optional_positive)
    """Size of the gateway's Postgres pool; None keeps the store's default."""
    pool_acquire_timeout_ms: int = attrs.field(
        default=POSTGRES_POOL_ACQUIRE_TIMEOUT_MS, validator=_positive
    )
    """How long a request waits for a pooled connection before it is answered
    503 back-pressure."""
    session_ttl_ms: int = attrs.field(default=DB_SESSION_TTL_MS, validator=_positive)
    """Longest lifetime of a scoped session; a requested ``ttlSeconds`` is clamped to it."""
    reaper_interval_ms: int = attrs.field(
        default=DB_SESSION_REAPER_INTERVAL_MS, validator=_positive
    )
    """How often expired session roles are dropped."""
    session_statement_timeout_ms: int = attrs.field(
        default=DB_SESSION_STATEMENT_TIMEOUT_MS, validator=_positive
    )
    """``statement_timeout`` of every session role; the watchdog ends a session
    statement running past it (plus one watchdog interval)."""
    session_idle_timeout_ms: int = attrs.field(
        default=DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS, validator=_positive
    )
    """``idle_in_transaction_session_timeout`` of every session role, enforced
    by the watchdog too."""
    session_transaction_timeout_ms: int = attrs.field(
        default=DB_SESSION_TRANSACTION_TIMEOUT_MS, validator=_positive
    )
    """The watchdog ends a session transaction older than this."""
    session_max_connections: int = attrs.field(
        default=DB_SESSION_MAX_CONNECTIONS, validator=_positive
    )
    """``CONNECTION LIMIT`` of every session role."""
    session_max_live_per_org: int = attrs.field(
        default=DB_SESSION_MAX_LIVE_PER_ORG, validator=_positive
    )
    """Live sessions one org may hold; a mint past it is answered 429."""
    session_max_live_per_token: int = attrs.field(
        default=DB_SESSION_MAX_LIVE_PER_TOKEN, validator=_positive
    )
    """Live sessions one executor token may hold; a mint past it is answered 429."""
    session_max_connections_per_org: int | None = attrs.field(
        default=None, validator=_optional_positive
    )
    """Connections all session roles of one org may hold at once: the watchdog
    ends an org's newest session backends past it, and a mint for an org at it
    is answered 429. None: derived from the server's ``max_connections`` when
    the gateway starts (``budgets.org_connection_budget``)."""
    watchdog_interval_ms: int = attrs.field(
        default=DB_SESSION_WATCHDOG_INTERVAL_MS, validator=_positive
    )
    """How often the watchdog looks for session backends past their limits."""
    unwrap_key: bytes | None = attrs.field(
        default=None, repr=False, validator=crypto.optional_unwrap_key
    )
    """A 32-byte harness key: preloaded sessions are minted encrypted under it. A secret."""
    allow_plain_session_urls: bool = False
    """Answer ``postgresUrl`` in the clear when a ``create_db_session`` carries no
    ``postgresUrlEncryption``. Off by default: a request without it is refused
    400. Only for loopback tests of the reference server."""
    plays: tuple[PlayDefinition, ...] = attrs.field(default=(), converter=_plays)
    """Plays registered when the gateway starts (``sheetplane serve --plays DIR``)."""
    quotas: StoreQuotas = attrs.field(factory=StoreQuotas)
    """What one org may keep in the store (sheets, receipt tables, staged bytes, open
    admissions); the defaults are ``budgets``'."""

    def session_bounds(self) -> SessionBounds:
        """The time and connection bounds every session role is created with."""
        return SessionBounds(
            statement_timeout_ms=self.session_statement_timeout_ms,
            idle_in_transaction_timeout_ms=self.session_idle_timeout_ms,
            transaction_timeout_ms=self.session_transaction_timeout_ms,
            max_connections=self.session_max_connections,
        )

    body_read_timeout_ms: int = attrs.field(
        default=GATEWAY_BODY_READ_TIMEOUT_MS, validator=_positive
    )
    """A request's whole body must arrive within this, else 408 and the connection closes."""
    action_budget_ms: int = attrs.field(default=GATEWAY_ACTION_BUDGET_MS, validator=_positive)
    """An action still running after this is cancelled and answered 504."""
    metrics_token: str | None = attrs.field(default=None, repr=False)
    """The bearer token ``GET /metrics`` requires; None: ``/metrics`` answers 404. A secret."""
    session_max_backend_memory_bytes: int | None = attrs.field(
        default=_MEMORY_BOUND, validator=_optional_positive
    )
    """Private memory one session backend may hold before the watchdog ends it (read
    on the database server; None: not watched)."""
    session_max_org_memory_bytes: int = attrs.field(
        default=DB_SESSION_MAX_ORG_MEMORY_BYTES, validator=_positive
    )
    """Private memory all of one org's session backends may hold together (when
    memory is watched); past it the watchdog ends the org's newest."""
    session_login_timeout_ms: int = attrs.field(
        default=DB_SESSION_LOGIN_TIMEOUT_MS, validator=_positive
    )
    """A client backend still without a role this long after it began is ended (a
    superuser gateway only: Postgres lets no other end it)."""
    tenant_caps: TenantCaps | None = None
    """Each token's and org's share of this process: requests in flight and connections
    (``_shares``); past one a request is 429 ``gateway_tenant_cap`` before its body.
    None: derived from the server's connection cap (``TenantCaps.for_server``)."""

    def session_caps(self, connections_per_org: int | None = None) -> SessionCaps:
        """How many live sessions one org and one token may hold, and (once
        resolved) how many connections one org's sessions may hold."""
        return SessionCaps(
            per_org=self.session_max_live_per_org,
            per_token=self.session_max_live_per_token,
            connections_per_org=connections_per_org,
        )
