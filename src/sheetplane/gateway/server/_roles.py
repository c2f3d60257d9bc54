"""Scoped database sessions: one short-lived Postgres LOGIN role per session.

``create_db_session`` mints a role named ``sp_sess_<random>`` with a random
password, ``VALID UNTIL`` the session's expiry, granted ``USAGE`` on the org's
schema and only the privileges the requested operations need, on only that
sheet's tables: ``store.session_grants``, beside the schema they mirror
(``store/_grants.py`` says what each operation is granted, and why). A write
session is also made a member of the sheet's owner role
(``store._seedlayout``), when the session DDL guard (``_ddlguard``) is
installed: the rows table's ownership is what the seed's ``ALTER TABLE ...
ADD COLUMN IF NOT EXISTS`` needs, and the guard refuses every other DDL.
Postgres itself enforces the boundary (``tests/test_gateway_tenancy.py``'s
privilege matrix and its hostile counter writer).

The password never reaches the server in the clear: the role is created with
a SCRAM-SHA-256 verifier computed here, so neither a statement log nor
``pg_stat_activity`` shows it. Statements are built with ``psycopg.sql`` only.

Every role is bounded in time and connections: ``CONNECTION LIMIT``, and
``statement_timeout`` and ``idle_in_transaction_session_timeout`` as role
defaults (:class:`SessionBounds`, from ``budgets``). A role may ``SET`` (or
``ALTER ROLE ... SET``) its own timeouts away, so the watchdog
(``_watchdog.run_watchdog``) also ends every session backend whose statement,
idle transaction or transaction has outlived its bound.

``VALID UNTIL`` stops new logins after expiry; the reaper
(``_watchdog.run_reaper``, a task in the server's nursery) then terminates any
connection the role still holds and drops it (:func:`drop_role`:
``REASSIGN OWNED``, ``DROP OWNED``, ``DROP ROLE``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Iterable, Sequence
from typing import Any, Final
from urllib.parse import quote, urlencode

import attrs
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from ..._types import OPERATIONS, Operation, SheetRef, canonical_operations
from ...budgets import (
    DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    DB_SESSION_MAX_CONNECTIONS,
    DB_SESSION_MAX_LIVE_PER_ORG,
    DB_SESSION_MAX_LIVE_PER_TOKEN,
    DB_SESSION_RECLAIM_AFTER_MS,
    DB_SESSION_STATEMENT_TIMEOUT_MS,
    DB_SESSION_TRANSACTION_TIMEOUT_MS,
)
from ...errors import InvalidInputError
from ...store import (
    ROW_WRITES,
    SheetNames,
    SheetStore,
    column_ids,
    owner_role,
    session_grants,
    sheet_names,
)
from ...store import grant_lock_key as _grant_lock_key
from ._ddlguard import ddl_guard_installed

__all__ = [
    "GATEWAY_SCHEMA",
    "LEDGER",
    "LEDGER_GRANTS",
    "OPERATIONS",
    "ORG_BACKENDS",
    "ROLE_PREFIX",
    "MintedRole",
    "SessionBounds",
    "SessionCapReachedError",
    "SessionCaps",
    "create_role_statements",
    "create_session_role",
    "drop_role",
    "ensure_session_ledger",
    "format_expires_at",
    "retire_roles",
    "scoped_url",
]

log = logging.getLogger("sheetplane.gateway.server")

#: Every session role's name starts with this, so the reaper (and an operator)
#: can tell them apart from every other role.
ROLE_PREFIX: Final = "sp_sess_"


#: PBKDF2 iterations of the SCRAM verifier (Postgres' own default).
_SCRAM_ITERATIONS: Final = 4096
_SCRAM_SALT_BYTES: Final = 16
_PASSWORD_BYTES: Final = 32
_ROLE_SUFFIX_BYTES: Final = 12


@attrs.frozen
class MintedRole:
    """A session role that exists in Postgres. ``password`` and ``url`` are secrets."""

    role: str
    """The role name (``sp_sess_...``)."""
    password: str = attrs.field(repr=False)
    """Its password (random, URL-safe)."""
    expires_at: str
    """``VALID UNTIL``, as the ISO 8601 string the answer carries."""
    names: SheetNames
    """The sheet's physical names the role was granted on."""
    operations: tuple[Operation, ...]
    """The granted operations, in canonical order."""


@attrs.frozen
class SessionBounds:
    """How long and how wide one session role may run (defaults from ``budgets``)."""

    statement_timeout_ms: int = DB_SESSION_STATEMENT_TIMEOUT_MS
    idle_in_transaction_timeout_ms: int = DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS
    transaction_timeout_ms: int = DB_SESSION_TRANSACTION_TIMEOUT_MS
    max_connections: int = DB_SESSION_MAX_CONNECTIONS


@attrs.frozen
class SessionCaps:
    """How many live (unexpired) sessions one org and one token may hold, and
    how many connections one org's sessions may hold together."""

    per_org: int = DB_SESSION_MAX_LIVE_PER_ORG
    per_token: int = DB_SESSION_MAX_LIVE_PER_TOKEN
    connections_per_org: int | None = None
    """Connections all of one org's session roles may hold at once; a mint for
    an org already holding that many is refused. None: not checked at mint
    (the gateway resolves it when it starts, :func:`resolve_org_connection_budget`)."""


class SessionCapReachedError(Exception):
    """A mint refused: the org or the token already holds its cap of live sessions.

    The gateway answers it 429 with ``retry_after_ms``; nothing was created.
    """

    def __init__(
        self, which: str, cap: int, what: str = "live DB sessions", *, connections: bool = False
    ) -> None:
        super().__init__(f"this {which} already holds {cap} {what} (the cap)")
        self.which = which
        #: Refused for the org's connection budget (a mint may wait for room).
        self.connections = connections
        self.cap = cap


#: The gateway's own schema: tables no scoped role can read (no grant to
#: ``PUBLIC``), here the ledger of minted sessions.
GATEWAY_SCHEMA: Final = "sheetplane_gateway"
LEDGER = sql.Identifier(GATEWAY_SCHEMA, "sessions")


#: What a gateway needs on a ledger another role created: ``{schema}`` and ``{ledger}``.
LEDGER_GRANTS: Final = (
    "GRANT USAGE ON SCHEMA {schema} TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {ledger} TO {role}",
)


#: The oids of ledger rows an older gateway wrote without one (``{org}``: a filter).
_BACKFILL_OIDS = sql.SQL(
    "UPDATE {ledger} AS l SET role_oid = r.oid FROM pg_roles AS r"
    " WHERE l.role_oid IS NULL AND r.rolname = l.role{org}"
)


def ensure_session_ledger(conn: psycopg.Connection[Any]) -> None:
    """Create the gateway schema and its session ledger if missing (idempotent).

    One row per minted role: its org, its token's id (never the token), its
    org schema, its expiry and its oid. The caps count live rows; a dropped
    role's row stays, expired, until its last backend is gone (the reaper
    deletes it then), so such a backend still counts against its org. The
    caller serialises concurrent creations.
    ``LEDGER_GRANTS`` are what a gateway role that does not own it needs.
    """
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (LEDGER.as_string(conn),))
    if exists.fetchone() == (True,):
        # A ledger made before roles recorded when they were minted, or their oid.
        for column, definition in (
            ("minted_at", "timestamptz NOT NULL DEFAULT now()"),
            ("role_oid", "oid"),
        ):
            present = conn.execute(
                "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%s)"
                " AND attname = %s AND NOT attisdropped)",
                (LEDGER.as_string(conn), column),
            ).fetchone()
            if present == (False,):
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                        LEDGER, sql.Identifier(column), sql.SQL(definition)
                    )
                )
        conn.execute(_BACKFILL_OIDS.format(ledger=LEDGER, org=sql.SQL("")))
        return
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(GATEWAY_SCHEMA)))
    conn.execute(
        sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(GATEWAY_SCHEMA))
    )
    conn.execute(
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                role text PRIMARY KEY,
                org_id text NOT NULL,
                token_id text,
                schema_name text NOT NULL,
                expires_at timestamptz NOT NULL,
                minted_at timestamptz NOT NULL DEFAULT now(),
                role_oid oid
            )"""
        ).format(LEDGER)
    )
    conn.execute(
        sql.SQL("CREATE INDEX IF NOT EXISTS sessions_org ON {} (org_id, expires_at)").format(LEDGER)
    )


def format_expires_at(moment: dt.datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC, as JavaScript's ``toISOString`` writes it."""
    utc = moment.astimezone(dt.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _scram_verifier(password: str) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for ``password`` (RFC 5802/7677)."""
    salt = os.urandom(_SCRAM_SALT_BYTES)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, _SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return f"SCRAM-SHA-256${_SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def create_role_statements(
    role: str,
    verifier: str,
    expires_at: str,
    names: SheetNames,
    operations: Sequence[str],
    bounds: SessionBounds = SessionBounds(),
    columns: Sequence[str] = (),
    owner: str | None = None,
) -> list[sql.Composed]:
    """The statements that create, bound and grant one session role (pinned by tests);
    ``columns`` are the sheet's contract columns, granted by name. With ``owner``
    (the sheet's owner role, for a write session where the session DDL guard is
    installed) the role inherits that role's one right, the rows table's ownership."""
    ident = sql.Identifier(role)
    statements = [
        sql.SQL(
            "CREATE ROLE {role} WITH LOGIN NOSUPERUSER {inherit} NOCREATEDB NOCREATEROLE"
            " NOREPLICATION NOBYPASSRLS CONNECTION LIMIT {limit} PASSWORD {verifier}"
            " VALID UNTIL {expires}"
        ).format(
            role=ident,
            inherit=sql.SQL("NOINHERIT" if owner is None else "INHERIT"),
            limit=sql.Literal(bounds.max_connections),
            verifier=sql.Literal(verifier),
            expires=sql.Literal(expires_at),
        ),
        *(
            sql.SQL("ALTER ROLE {role} SET {setting} = {value}").format(
                role=ident, setting=sql.Identifier(setting), value=sql.Literal(value)
            )
            for setting, value in (
                ("statement_timeout", f"{bounds.statement_timeout_ms}ms"),
                (
                    "idle_in_transaction_session_timeout",
                    f"{bounds.idle_in_transaction_timeout_ms}ms",
                ),
                # No parallel workers: their shared memory escapes the memory bound,
                # and the watchdog ends a session that raises this to get one.
                ("max_parallel_workers_per_gather", "0"),
            )
        ),
        sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {role}").format(
            schema=sql.Identifier(names.schema), role=ident
        ),
    ]
    statements += session_grants(ident, names, operations, columns)
    if owner is not None:
        statements.append(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner), ident))
    return statements


#: Every backend of an org's roles, live or dropped: the ledger keeps a role's oid
#: (and its org) after the role is dropped until the role's last backend is gone, so
#: a backend that outlived its role still counts against its org. By ``usesysid``,
#: not by name: a dropped role's backends have no name.
ORG_BACKENDS = sql.SQL(
    "SELECT a.pid, a.backend_start, l.org_id FROM pg_stat_activity AS a"
    " JOIN {} AS l ON l.role_oid = a.usesysid WHERE a.pid <> pg_backend_pid()"
).format(LEDGER)

#: The connections the org may hold now: the connection limits of its live roles
#: (Postgres refuses each role's logins past its own, at its role check) and every
#: backend of its other roles (expired, retired or dropped: no limit counts them).
_ORG_GRANTED = sql.SQL(
    "SELECT coalesce((SELECT sum(greatest(r.rolconnlimit, 0)) FROM {ledger} AS l"
    " JOIN pg_roles AS r ON r.oid = l.role_oid"
    " WHERE l.org_id = %(org)s AND l.expires_at > now() AND r.rolcanlogin), 0)"
    " + (SELECT count(*) FROM pg_stat_activity AS a JOIN {ledger} AS l"
    " ON l.role_oid = a.usesysid WHERE l.org_id = %(org)s AND a.pid <> pg_backend_pid()"
    " AND NOT (l.expires_at > now() AND EXISTS ("
    " SELECT FROM pg_roles AS r WHERE r.oid = l.role_oid AND r.rolcanlogin)))"
).format(ledger=LEDGER)

#: The org's live roles, minted at least ``DB_SESSION_RECLAIM_AFTER_MS`` ago by any
#: gateway, that may log in and hold no connection now: oldest first.
_IDLE_ROLES = sql.SQL(
    "SELECT l.role FROM {} AS l JOIN pg_roles AS r ON r.oid = l.role_oid"
    " WHERE l.org_id = %s AND l.expires_at > now() AND r.rolcanlogin"
    " AND l.minted_at <= now() - %s * interval '1 millisecond'"
    " AND NOT EXISTS (SELECT FROM pg_stat_activity AS a WHERE a.usesysid = l.role_oid)"
    " ORDER BY l.minted_at, l.role"
).format(LEDGER)

#: The org's roles a mint retired (NOLOGIN, committed) and did not drop yet: live
#: ones, by the clock of this statement. By ``now()`` (the mint transaction's start) a
#: long mint also dropped expired roles the reaper had just retired, drops no reaper
#: pass counted; expired roles are the reaper's.
_RETIRED_ROLES = sql.SQL(
    "SELECT l.role FROM {} AS l JOIN pg_roles AS r ON r.oid = l.role_oid"
    " WHERE l.org_id = %s AND l.expires_at > clock_timestamp() AND NOT r.rolcanlogin"
    " ORDER BY l.role"
).format(LEDGER)


def org_session_backends(conn: psycopg.Connection[Any], org_id: str) -> int:
    """The connections the session roles of ``org_id`` hold now, those of its dropped
    roles included (the ledger knows each role's org and oid); for the watchdog's
    tests and benchmarks that watch an org's budget."""
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM ({}) AS b WHERE b.org_id = %s").format(ORG_BACKENDS),
        (org_id,),
    ).fetchone()
    return int(row[0]) if row is not None else 0


def retire_roles(conn: psycopg.Connection[Any], roles: Iterable[str]) -> list[str]:
    """``ALTER ROLE ... NOLOGIN`` each of ``roles``: commit it before ending their
    backends and dropping them (:func:`drop_role`).

    A login checks ``VALID UNTIL`` and the password when it begins, and looks its
    role up (``rolcanlogin``, ``CONNECTION LIMIT``) only after authenticating; until
    then its backend shows no role in ``pg_stat_activity``. A drop that ends the
    role's backends cannot see such a login, and one that looks its role up before
    the drop commits logs in and outlives its role. Once NOLOGIN is committed, every
    login that had not yet looked its role up is refused (28000). Returns the roles
    retired (one that fails, e.g. altered by another process at once, is left).
    """
    retired = []
    for role in roles:
        try:
            with conn.transaction():  # a savepoint: a role another process alters is skipped
                conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
        except psycopg.Error as exc:
            log.warning("could not retire session role %s: %s", role, type(exc).__name__)
        else:
            retired.append(role)
    return retired


def _granted_connections(conn: psycopg.Connection[Any], org_id: str) -> int:
    row = conn.execute(_ORG_GRANTED, {"org": org_id}).fetchone()
    return int(row[0]) if row is not None else 0


class _Retired:
    """A mint's first pass retired idle roles (committed): run it again."""


def _out_of_connections(caps: SessionCaps) -> SessionCapReachedError:
    return SessionCapReachedError(
        "org",
        caps.connections_per_org or 0,
        "DB connections through its sessions' connection limits",
        connections=True,
    )


def _session_owner(conn: psycopg.Connection[Any], names: SheetNames) -> str | None:
    """The sheet's owner role, when a write session may be its member: the rows table
    is that role's, and the session DDL guard confines what the membership allows."""
    if not ddl_guard_installed(conn):
        return None
    name = owner_role(conn, names)
    row = conn.execute(
        "SELECT pg_get_userbyid(relowner) = %s FROM pg_class WHERE oid = to_regclass(%s)",
        (name, names.ident("sheet_table").as_string(conn)),
    ).fetchone()
    return name if row == (True,) else None


def _refusal(
    conn: psycopg.Connection[Any],
    sheet: SheetRef,
    token_id: str | None,
    caps: SessionCaps,
    bounds: SessionBounds,
) -> SessionCapReachedError | _Retired | None:
    """Why a mint for ``sheet`` may not go on now (under the org's grant lock): a cap
    of live sessions, or the org's connection budget (after retiring idle roles:
    ``_Retired``, the caller tries again). None: it may."""
    live = conn.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE org_id = %(org)s),"
            " count(*) FILTER (WHERE token_id = %(token)s)"
            " FROM {} WHERE expires_at > now() AND org_id = %(org)s"
        ).format(LEDGER),
        {"org": sheet.org_id, "token": token_id},
    ).fetchone()
    assert live is not None
    # Rows an older gateway process (a rolling upgrade) wrote without an oid.
    conn.execute(
        _BACKFILL_OIDS.format(ledger=LEDGER, org=sql.SQL(" AND l.org_id = %s")),
        (sheet.org_id,),
    )
    if live[0] >= caps.per_org:
        return SessionCapReachedError("org", caps.per_org)
    if token_id is not None and live[1] >= caps.per_token:
        return SessionCapReachedError("token", caps.per_token)
    if caps.connections_per_org is not None:
        budget, width = caps.connections_per_org, bounds.max_connections
        # Roles an earlier pass retired (their NOLOGIN committed): dropped now.
        for (retired,) in conn.execute(_RETIRED_ROLES, (sheet.org_id,)).fetchall():
            drop_role(conn, str(retired))
        granted = _granted_connections(conn, sheet.org_id)
        if granted + width > budget:
            idle = conn.execute(_IDLE_ROLES, (sheet.org_id, DB_SESSION_RECLAIM_AFTER_MS)).fetchall()
            if idle:
                # Retire them and commit; the next pass drops them and mints.
                retire_roles(conn, [str(r) for (r,) in idle])
                return _Retired()
            return _out_of_connections(caps)
    return None


def _grant_event_sequence(conn: psycopg.Connection[Any], names: SheetNames, role: str) -> None:
    """The event table's id is a bigserial: a role that inserts events needs its sequence."""
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = pg_get_serial_sequence(%s, 'id')::regclass",
        (names.ident("event_table").as_string(conn),),
    ).fetchone()
    if row is not None:
        conn.execute(
            sql.SQL("GRANT USAGE ON SEQUENCE {seq} TO {role}").format(
                seq=sql.Identifier(str(row[0]), str(row[1])),
                role=sql.Identifier(role),
            )
        )


async def create_session_role(
    store: SheetStore,
    sheet: SheetRef,
    operations: Iterable[str],
    expires: dt.datetime,
    *,
    bounds: SessionBounds = SessionBounds(),
    caps: SessionCaps = SessionCaps(),
    token_id: str | None = None,
    acquire_timeout_ms: int | None = None,
) -> MintedRole:
    """Create a LOGIN role for ``sheet`` with only ``operations``, valid until ``expires``.

    The sheet's tables must exist (``store.ensure_sheet`` first). Runs as one
    transaction on the store's pool: either the role exists with every grant
    and its ledger row or not at all. Raises :class:`SessionCapReachedError`
    (nothing created) when the org, or the token ``token_id`` names, already
    holds its cap of live sessions: the count and the insert run under the
    org schema's grant lock, so concurrent mints cannot both pass a full cap.

    With ``caps.connections_per_org``, the org's connection budget is kept by
    construction: the connection limits of the org's live roles, this one's
    included, add up to at most the budget, and Postgres refuses any login
    past a role's limit. When the new role does not fit, the org's roles that
    were minted at least ``DB_SESSION_RECLAIM_AFTER_MS`` ago (by any gateway
    process: a restarted gateway's older roles count too) and hold no
    connection now are dropped first; if it still does not fit, the mint is
    refused (``SessionCapReachedError``, the caller queues and tries again).
    If cancelled, the statement is cancelled on the server and the
    transaction rolls back.
    """
    names = sheet_names(sheet)
    ops = canonical_operations(operations)
    if not ops:
        raise InvalidInputError(f"operations must be drawn from {list(OPERATIONS)}")
    role = ROLE_PREFIX + secrets.token_hex(_ROLE_SUFFIX_BYTES)
    password = secrets.token_urlsafe(_PASSWORD_BYTES)
    expires_at = format_expires_at(expires)
    writes = any(op != "rows.read" for op in ops)

    def create(conn: psycopg.Connection[Any]) -> SessionCapReachedError | _Retired | None:
        verifier = _scram_verifier(password)
        # GRANTs rewrite the schema's and the tables' ACLs in the catalog; two
        # sessions minted at once for one org (or a mint and the reaper's DROP
        # OWNED) would fail with "tuple concurrently updated", so grants on one
        # schema take turns. The same lock makes the cap check exact.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_grant_lock_key(names.schema),))
        refused = _refusal(conn, sheet, token_id, caps, bounds)
        if refused is not None:
            return refused
        columns = [name for name, _ in column_ids(conn, names) or ()]
        owner = _session_owner(conn, names) if any(op in ROW_WRITES for op in ops) else None
        for statement in create_role_statements(
            role, verifier, expires_at, names, ops, bounds, columns, owner
        ):
            conn.execute(statement)
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (role, org_id, token_id, schema_name, expires_at, role_oid)"
                " SELECT %s, %s, %s, %s, %s, oid FROM pg_roles WHERE rolname = %s"
            ).format(LEDGER),
            (role, sheet.org_id, token_id, names.schema, expires, role),
        )
        if writes:
            _grant_event_sequence(conn, names, role)
        return None

    refused = await store.pool.run(create, acquire_timeout_ms=acquire_timeout_ms)
    if isinstance(refused, _Retired):
        refused = await store.pool.run(create, acquire_timeout_ms=acquire_timeout_ms)
    if isinstance(refused, _Retired):  # others went idle meanwhile: the queue tries again
        refused = _out_of_connections(caps)
    if refused is not None:
        raise refused
    return MintedRole(role, password, expires_at, names, ops)


def scoped_url(database_url: str, role: str, password: str) -> str:
    """``database_url`` with its user and password replaced by the session role's.

    Host, port, database and connection options (``sslmode``...) are kept;
    any password file or service setting of the gateway's own login is dropped.
    """
    params = conninfo_to_dict(database_url)
    host = str(params.pop("host", "127.0.0.1"))
    port = params.pop("port", None)
    dbname = str(params.pop("dbname", "postgres"))
    for private in ("user", "password", "passfile", "service", "servicefile"):
        params.pop(private, None)
    netloc_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{netloc_host}"
    if port is not None:
        netloc = f"{netloc}:{port}"
    query = urlencode(sorted((k, str(v)) for k, v in params.items()))
    url = f"postgresql://{netloc}/{quote(dbname, safe='')}"
    return f"{url}?{query}" if query else url


def drop_role(conn: psycopg.Connection[Any], role: str) -> None:
    """End ``role``'s connections and drop it (in the caller's transaction); its
    ledger row stays, expired, with its oid, until the role's last backend is gone.

    Retire the role first, in a transaction committed before this one
    (:func:`retire_roles`): a login this drop cannot see is refused then.
    """
    ident = sql.Identifier(role)
    oid = conn.execute("SELECT oid FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    # DROP OWNED revokes the role's grants, rewriting the same catalog rows (the
    # tables' and the schema's ACLs) as a GRANT of another session on that org:
    # take the org's grant key first, as minting does, or one of the two fails
    # with "tuple concurrently updated". Keys in schema name order (one lock order).
    schemas = conn.execute(
        "SELECT DISTINCT n.nspname FROM pg_shdepend d"
        " JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE d.refclassid = 'pg_authid'::regclass"
        " AND d.refobjid = (SELECT oid FROM pg_roles WHERE rolname = %s) ORDER BY 1",
        (role,),
    ).fetchall()
    for (schema,) in schemas:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_grant_lock_key(str(schema)),))
    # REASSIGN OWNED and DROP OWNED need the role's privileges. A superuser has
    # them; a CREATEROLE gateway holds only ADMIN OPTION on the roles it created
    # (Postgres 16+ grants the creator no inherited membership), which lets it
    # take that membership now, for the rest of this transaction: DROP ROLE
    # removes it with the role.
    inherits = conn.execute("SELECT pg_has_role(%s, 'USAGE')", (role,)).fetchone()
    if inherits != (True,):
        conn.execute(sql.SQL("GRANT {role} TO CURRENT_USER WITH INHERIT TRUE").format(role=ident))
    conn.execute(sql.SQL("REASSIGN OWNED BY {role} TO CURRENT_USER").format(role=ident))
    conn.execute(sql.SQL("DROP OWNED BY {role}").format(role=ident))
    if oid is not None:
        # Every backend of the role, by oid (a backend shows its role once its login
        # is done), as late as this transaction allows: the watchdog ends any that
        # still outlives the role (``_watchdog``).
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE usesysid = %s AND pid <> pg_backend_pid()",
            (oid[0],),
        )
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {role}").format(role=ident))
    conn.execute(
        sql.SQL(
            "UPDATE {} SET expires_at = least(expires_at, now()),"
            " role_oid = coalesce(role_oid, %s) WHERE role = %s"
        ).format(LEDGER),
        (oid[0] if oid is not None else None, role),
    )
