"""Database hardening: what every role (``PUBLIC``) may do is cut down to what a
scoped session needs, before the gateway serves a request.

Postgres grants ``EXECUTE`` on most of its built-in functions, and
``TEMPORARY`` on a database, to ``PUBLIC``, so a freshly minted session role
could call them. Some let one tenant reach past its sheet:

* the advisory-lock family (``pg_advisory_lock`` and every sibling): the
  gateway serialises DDL and grants per org schema with transaction advisory
  locks; a tenant holding the same key would stall another org's
  ``ensure_sheet`` and ``create_db_session``, and many held keys fill the
  shared lock table;
* ``pg_sleep`` and its siblings: a session would hold its connection idle at
  will (the statement timeout and the watchdog bound it anyway);
* ``pg_cancel_backend`` / ``pg_terminate_backend``: only the role's own
  backends, but a session needs neither (a client cancels over the protocol);
* the large-object functions (``lo_*``, ``loread``, ``lowrite``): storage
  outside the sheet that no grant scopes and that the reaper's
  ``REASSIGN OWNED`` would hand to the gateway;
* ``pg_notify``: a channel every role of the database shares;
* ``pg_logical_emit_message``: WAL of any size;
* ``TEMPORARY`` on the database: temporary tables outside every grant;
* the relation size functions (``pg_relation_size``, ``pg_total_relation_size``,
  ``pg_table_size``, ``pg_indexes_size``) and the per-relation statistics
  functions behind ``pg_stat_*_tables`` / ``pg_statio_*`` (live and dead
  tuples, scans, vacuums): they tell one tenant how big another's sheets are
  and how busy. (``pg_class.reltuples`` and ``relpages`` stay readable: the
  catalog has no row-level privileges, see docs/gateway.md.)
* ``pg_database_size`` / ``pg_tablespace_size``: the size of every org's data
  together;
* the views that show other sessions: ``pg_stat_activity`` (and the functions
  behind it, ``pg_stat_get_activity`` and ``pg_stat_get_backend_*``: other
  sessions' ``application_name``, client address and start times),
  ``pg_user`` and ``pg_db_role_setting`` (every session role's expiry and
  settings), and the columns ``rolvaliduntil`` and ``rolconfig`` of
  ``pg_roles`` (its other columns stay readable: drivers and tools read them).

At startup a superuser gateway revokes all of these from ``PUBLIC`` (in the
current database only), once, under a lock so gateways starting together do
not race. A gateway that is not a superuser cannot revoke them: it checks that
an operator did (:func:`hardening_statements` prints the SQL, including the
grants such a gateway needs itself) and refuses to start otherwise, so a
database where a tenant could lock out another is never served. Such a
gateway also refuses to start (:class:`GatewayRoleLacksPrivilegesError`,
naming each) without ``CREATEROLE`` or membership in ``pg_read_all_stats``
and ``pg_signal_backend``: without them its watchdog would see no session
backend's state and its reaper could end none, and sessions would run
unbounded while the gateway served.

Startup also creates the gateway's own schema and session ledger
(``_roles.ensure_session_ledger``), under the same lock.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import psycopg
from psycopg import sql

from ...errors import DatabaseNotHardenedError, GatewayRoleLacksPrivilegesError
from ...store import SheetStore
from ._ddlguard import ddl_guard_installed, ddl_guard_statements
from ._roles import GATEWAY_SCHEMA, LEDGER_GRANTS, ROLE_PREFIX, ensure_session_ledger

__all__ = [
    "GATEWAY_FUNCTIONS",
    "GATEWAY_MEMBERSHIPS",
    "REVOKED_FUNCTION_PATTERN",
    "REVOKED_ROLE_COLUMNS",
    "REVOKED_VIEWS",
    "harden_database",
    "hardening_statements",
    "public_functions",
]

log = logging.getLogger("sheetplane.gateway.server")

#: Built-in functions (``pg_catalog``, by name) no scoped session may execute.
REVOKED_FUNCTION_PATTERN: Final = (
    r"^(pg_(try_)?advisory_.*|pg_sleep(_for|_until)?|pg_(cancel|terminate)_backend"
    r"|lo_.*|loread|lowrite|pg_notify|pg_logical_emit_message"
    # Other orgs' table sizes and row counts, by relation.
    r"|pg_(relation|total_relation|table|indexes)_size"
    r"|pg_stat_get_(xact_)?(numscans|lastscan|tuples_.*|live_tuples|dead_tuples"
    r"|mod_since_analyze|ins_since_vacuum|blocks_fetched|blocks_hit|last_.*_time"
    r"|(auto)?(vacuum|analyze)_count|total_(auto)?(vacuum|analyze)_time)"
    # The database's total size; other sessions' backends.
    r"|pg_(database|tablespace)_size|pg_stat_get_activity|pg_stat_get_backend_.*)$"
)

#: Catalog views no scoped session may read at all (``SELECT`` revoked from ``PUBLIC``).
REVOKED_VIEWS: Final = ("pg_stat_activity", "pg_user", "pg_db_role_setting")

#: ``pg_roles`` stays readable but for these columns: every session role's expiry
#: and settings (a revoke of the whole view, then a grant of the rest by column).
REVOKED_ROLE_COLUMNS: Final = ("rolvaliduntil", "rolconfig")

#: What a gateway reads itself of those: ``pg_stat_activity`` (its watchdog and
#: reaper) and the roles' expiry (its reaper); a non-superuser gateway needs them granted.
GATEWAY_READS: Final = (
    "GRANT SELECT ON pg_catalog.pg_stat_activity TO {role}",
    "GRANT SELECT (rolvaliduntil) ON pg_catalog.pg_roles TO {role}",
)

#: Of those, what the gateway itself calls (a non-superuser gateway needs them granted).
GATEWAY_FUNCTIONS: Final = (
    "pg_advisory_xact_lock(bigint)",
    "pg_try_advisory_xact_lock(bigint)",
    "pg_terminate_backend(integer,bigint)",
    # Behind pg_stat_activity (a view checks the functions it calls against the
    # reader, not its owner).
    "pg_stat_get_activity(integer)",
)

#: Predefined roles a non-superuser gateway must be a member of: its reaper and
#: watchdog read the state, start times and transaction ages of other roles'
#: backends in ``pg_stat_activity`` (hidden from a role without
#: ``pg_read_all_stats``: they read NULL, and nothing would ever be ended) and
#: terminate them (refused without ``pg_signal_backend``: the creator of a role
#: holds no privileges of it on Postgres 16+).
GATEWAY_MEMBERSHIPS: Final = ("pg_read_all_stats", "pg_signal_backend")

#: The key of the lock under which one gateway at a time revokes (REVOKE rewrites
#: catalog rows; two at once fail with "tuple concurrently updated").
_HARDENING_LOCK_KEY: Final = 0x5350_4844_4E00_0001  # "SPHDN", 1

_PUBLIC_FUNCTIONS = sql.SQL(
    """
    SELECT p.oid::regprocedure::text FROM pg_proc AS p
    JOIN pg_namespace AS n ON n.oid = p.pronamespace
    WHERE n.nspname = 'pg_catalog' AND p.proname ~ %(pattern)s
      AND (p.proacl IS NULL OR EXISTS (
          SELECT FROM aclexplode(p.proacl) AS a
          WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
    ORDER BY 1
    """
)

_PUBLIC_TEMPORARY = sql.SQL(
    """
    SELECT d.datacl IS NULL OR EXISTS (
        SELECT FROM aclexplode(d.datacl) AS a
        WHERE a.grantee = 0 AND a.privilege_type = 'TEMPORARY')
    FROM pg_database AS d WHERE d.datname = current_database()
    """
)


#: Of ``REVOKED_VIEWS`` and ``pg_roles``, those ``PUBLIC`` may still read whole.
_PUBLIC_VIEWS = sql.SQL(
    """
    SELECT c.relname FROM pg_class AS c
    WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relname = ANY(%(views)s)
      AND (c.relacl IS NULL OR EXISTS (
          SELECT FROM aclexplode(c.relacl) AS a
          WHERE a.grantee = 0 AND a.privilege_type = 'SELECT'))
    ORDER BY 1
    """
)


def _public_views(conn: psycopg.Connection[Any]) -> list[str]:
    views = [*REVOKED_VIEWS, "pg_roles"]
    return [str(row[0]) for row in conn.execute(_PUBLIC_VIEWS, {"views": views}).fetchall()]


def _view_statements(conn: psycopg.Connection[Any]) -> list[sql.Composed]:
    statements = []
    for view in _public_views(conn):
        ident = sql.Identifier("pg_catalog", view)
        statements.append(sql.SQL("REVOKE SELECT ON {} FROM PUBLIC").format(ident))
        if view == "pg_roles":
            kept = conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'pg_catalog.pg_roles'::regclass"
                " AND attnum > 0 AND NOT attisdropped AND NOT attname = ANY(%s) ORDER BY attnum",
                (list(REVOKED_ROLE_COLUMNS),),
            ).fetchall()
            statements.append(
                sql.SQL("GRANT SELECT ({}) ON {} TO PUBLIC").format(
                    sql.SQL(", ").join(sql.Identifier(str(row[0])) for row in kept), ident
                )
            )
    return statements


def _lacking_reads(conn: psycopg.Connection[Any]) -> list[str]:
    """Of ``GATEWAY_READS``, those the current role cannot do (by what they read)."""
    row = conn.execute(
        "SELECT has_table_privilege('pg_catalog.pg_stat_activity', 'SELECT'),"
        " has_column_privilege('pg_catalog.pg_roles', 'rolvaliduntil', 'SELECT')"
    ).fetchone()
    assert row is not None
    reads = ("pg_stat_activity", "pg_roles.rolvaliduntil")
    return [what for what, ok in zip(reads, row, strict=True) if not ok]


def public_functions(conn: psycopg.Connection[Any]) -> list[str]:
    """The revoked family's functions ``PUBLIC`` may still execute (``name(args)``)."""
    rows = conn.execute(_PUBLIC_FUNCTIONS, {"pattern": REVOKED_FUNCTION_PATTERN}).fetchall()
    return [str(row[0]) for row in rows]


def _public_temporary(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(_PUBLIC_TEMPORARY).fetchone()
    return bool(row and row[0])


def hardening_statements(
    conn: psycopg.Connection[Any], gateway_role: str | None = None
) -> list[sql.Composed]:
    """The statements that harden the current database (empty once it is).

    With ``gateway_role`` (a non-superuser gateway), they also grant that role
    the functions the gateway calls itself, the predefined roles of
    ``GATEWAY_MEMBERSHIPS`` it is not yet a member of, and its session ledger
    when another role created it. An operator runs them as a superuser. (The
    role must also have ``CREATEROLE``, a role attribute its creator gives it.)
    """
    statements = [
        sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(sql.SQL(signature))
        for signature in public_functions(conn)
    ]
    statements += _view_statements(conn)
    if _public_temporary(conn):
        database = conn.execute("SELECT current_database()").fetchone()
        assert database is not None
        statements.append(
            sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(
                sql.Identifier(str(database[0]))
            )
        )
    # The session DDL guard (an event trigger: a superuser's to create).
    statements += ddl_guard_statements(conn, ROLE_PREFIX)
    if gateway_role is not None:
        role = sql.Identifier(gateway_role)
        statements.extend(
            sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(signature), role)
            for signature in GATEWAY_FUNCTIONS
        )
        statements.extend(sql.SQL(grant).format(role=role) for grant in GATEWAY_READS)
        lacking = _lacking_memberships(conn, gateway_role)
        if lacking:
            statements.append(
                sql.SQL("GRANT {} TO {}").format(
                    sql.SQL(", ").join(map(sql.Identifier, lacking)), role
                )
            )
        ledger = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{GATEWAY_SCHEMA}.sessions",))
        if ledger.fetchone() == (True,):
            statements.extend(
                sql.SQL(grant).format(
                    schema=sql.Identifier(GATEWAY_SCHEMA),
                    ledger=sql.Identifier(GATEWAY_SCHEMA, "sessions"),
                    role=role,
                )
                for grant in LEDGER_GRANTS
            )
    return statements


def _lacking_memberships(conn: psycopg.Connection[Any], role: str) -> list[str]:
    """Of ``GATEWAY_MEMBERSHIPS``, those whose privileges ``role`` does not have."""
    check = "SELECT pg_has_role(%s, %s, 'USAGE')"
    return [
        member
        for member in GATEWAY_MEMBERSHIPS
        if conn.execute(check, (role, member)).fetchone() != (True,)
    ]


def _check_gateway_role(conn: psycopg.Connection[Any], me: str) -> None:
    """Raise :class:`GatewayRoleLacksPrivilegesError` naming what ``me`` lacks."""
    row = conn.execute("SELECT rolcreaterole FROM pg_roles WHERE rolname = %s", (me,)).fetchone()
    missing = [] if row == (True,) else ["CREATEROLE"]
    missing += _lacking_memberships(conn, me)
    if not missing:
        return
    raise GatewayRoleLacksPrivilegesError(
        f"gateway role {me!r} is not a superuser and lacks {', '.join(missing)}: without them "
        "it cannot mint and drop session roles (CREATEROLE), see its sessions' backends "
        "(pg_read_all_stats) or end them (pg_signal_backend), so no session would be bounded; "
        "a superuser must grant them (sheetplane.gateway.server.hardening_statements lists "
        "the grants; docs/gateway.md, Security)",
        missing,
    )


def _harden(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "SELECT rolsuper, current_user FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None
    superuser, me = bool(row[0]), str(row[1])
    if superuser:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_HARDENING_LOCK_KEY,))
        statements = hardening_statements(conn)
        for statement in statements:
            conn.execute(statement)
        if statements:
            log.info("revoked %d built-in privileges from PUBLIC", len(statements))
        ensure_session_ledger(conn)
        return
    _check_gateway_role(conn, me)
    left = public_functions(conn)
    check = "SELECT has_function_privilege(%s::regprocedure, 'EXECUTE')"
    missing = [
        signature
        for signature in GATEWAY_FUNCTIONS
        if conn.execute(check, (signature,)).fetchone() != (True,)
    ]
    missing += _lacking_reads(conn)
    # A dropped role's ledger row is kept (UPDATE) while its backends live.
    ledger = conn.execute("SELECT to_regclass(%s)", (f"{GATEWAY_SCHEMA}.sessions",)).fetchone()
    if ledger is not None and ledger[0] is not None:
        writable = conn.execute(
            "SELECT has_table_privilege(%s::regclass, 'UPDATE')", (f"{GATEWAY_SCHEMA}.sessions",)
        ).fetchone()
        if writable != (True,):
            missing.append(f"UPDATE on {GATEWAY_SCHEMA}.sessions")
    views = _public_views(conn)
    if left or views or _public_temporary(conn) or missing:
        raise DatabaseNotHardenedError(
            f"the database still lets every role call {len(left)} lock, sleep, signal or "
            f"storage function(s), read {len(views)} view(s) of other sessions (or create "
            f"temporary tables), or role {me!r} lacks "
            f"{len(missing)} it needs; a superuser must run the statements of "
            "sheetplane.gateway.server.hardening_statements first (docs/gateway.md, Security)"
        )
    if not ddl_guard_installed(conn):
        log.warning(
            "the session DDL guard is not installed in this database: write sessions are "
            "not made members of their sheet's owner role, so the seed's runtime cannot run "
            "its ALTER TABLE (a superuser runs hardening_statements to install it)",
            extra={"event": "ddl_guard_missing"},
        )
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_HARDENING_LOCK_KEY,))
    ensure_session_ledger(conn)


async def harden_database(store: SheetStore) -> None:
    """Revoke the family from ``PUBLIC`` (superuser), or check that it was.

    Raises :class:`DatabaseNotHardenedError` when it was not and cannot be, and
    :class:`GatewayRoleLacksPrivilegesError` when a non-superuser gateway's role
    could not bound the sessions it mints (the message names what it lacks).
    """
    await store.pool.run(_harden)
