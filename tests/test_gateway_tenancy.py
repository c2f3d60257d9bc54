"""A hostile tenant against the real server and real Postgres: a scoped role of one
org cannot delay, read or forge anything of another org, nor hold the gateway."""

from __future__ import annotations

import base64
import functools
import gc
import hashlib
import logging
import os
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import sql

from _serve_helpers import secret_file_options, serving
from _session_helpers import aad_of, run_sql
from sheetplane import DatabaseNotHardenedError, crypto
from sheetplane._types import CompleteRow, FailRow, SheetRef
from sheetplane.bench._common import post_over_socket
from sheetplane.budgets import (
    MAX_CONTRACT_COLUMNS,
    MAX_ERROR_TEXT_BYTES,
    MAX_REQUEST_TEXT_BYTES,
    MAX_RUN_ID_BYTES,
    MAX_USER_EMAIL_BYTES,
    READ_BATCH_MAX_RESPONSE_BYTES,
    MiB,
)
from sheetplane.gateway.server import (
    RUNTIME_PATH,
    RunningGateway,
    hardening_statements,
    reap_expired_roles,
    running_gateway,
)
from sheetplane.gateway.server._hardening import REVOKED_FUNCTION_PATTERN, harden_database
from sheetplane.protocol import read_contract
from sheetplane.store import open_store, sheet_names
from sheetplane.store._counters import column_counts
from sheetplane.store._guards import admit_functions
from sheetplane.store._names import receipt_names
from sheetplane.store._schema import POSTGRES_SYSTEM_COLUMNS, RESERVED_SQL_NAMES, SYSTEM_COLUMNS

TOKEN_A = "tok-tenant-a-7f3e9c1d"
TOKEN_B = "tok-tenant-b-2a8b4e6f"
ORG_A = "org-a"
ORG_B = "org-b"
PLAY = "tenancy-play"
CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN_A: ORG_A, TOKEN_B: ORG_B}) as gw:
        yield gw


async def post(gw: RunningGateway, token: str, action: str, **fields: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        return await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": PLAY, **fields},
            headers={"authorization": f"Bearer {token}"},
        )


async def act(gw: RunningGateway, token: str, action: str, **fields: Any) -> Any:
    response = await post(gw, token, action, **fields)
    assert response.status_code == 200, response.text
    return response.json()


async def admit(gw: RunningGateway, token: str, namespace: str, n: int = 3) -> Any:
    rows = [{"_key": f"k{i}", "email": f"u{i}@example.com"} for i in range(n)]
    return await act(
        gw,
        token,
        "start_sheet_dataset",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        rows=rows,
        runId="run-1",
    )


def session_fields(namespace: str, operations: list[str], key: crypto.DecryptionKey) -> Any:
    return {
        "target": {"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        "operations": operations,
        "sheetContract": CONTRACT,
        "postgresUrlEncryption": key.encryption_request(),
    }


async def mint(gw: RunningGateway, token: str, namespace: str, operations: list[str]) -> Any:
    """``(answer, url)`` of a new scoped session."""
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    answer = await act(gw, token, "create_db_session", **session_fields(namespace, operations, key))
    aad = aad_of(answer)
    return answer, crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad)


def _lock_key(prefix: str, schema: str) -> int:
    """The key the issue found a tenant could compute (sha256 of a public name)."""
    digest = hashlib.sha256(f"{prefix}:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# --- finding 1: no lock, sleep or storage function outside the grants -------------------


async def test_scoped_role_cannot_call_advisory_lock_sleep_signal_or_storage_functions(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, TOKEN_A, namespace)
    _, url = await mint(gateway, TOKEN_A, namespace, ["rows.read"])
    for statement in (
        "SELECT pg_advisory_lock(1)",
        "SELECT pg_advisory_xact_lock(1)",
        "SELECT pg_try_advisory_lock(1, 2)",
        "SELECT pg_advisory_lock_shared(1)",
        "SELECT pg_sleep(0)",
        "SELECT pg_terminate_backend(pg_backend_pid())",
        "SELECT lo_creat(-1)",
        "SELECT lo_from_bytea(0, 'x')",
        "SELECT pg_notify('c', 'x')",
        "SELECT pg_logical_emit_message(false, 'p', 'x')",
        "CREATE TEMPORARY TABLE t (x int)",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await run_sql(url, statement)
    # What is left to the role of the revoked family: nothing.
    left = await run_sql(
        url,
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n"
        " ON n.oid = p.pronamespace WHERE n.nspname = 'pg_catalog' AND p.proname ~ %s"
        " AND has_function_privilege(p.oid, 'EXECUTE')",
        (REVOKED_FUNCTION_PATTERN,),
    )
    assert left == []
    # Already superuser-only by ACL (checked, left as Postgres ships them).
    for signature in (
        "pg_read_file(text)",
        "pg_ls_dir(text)",
        "lo_import(text)",
        "lo_export(oid,text)",
        "pg_reload_conf()",
        "pg_switch_wal()",
        "pg_create_restore_point(text)",
    ):
        granted = await run_sql(
            url, "SELECT has_function_privilege(%s::regprocedure, 'EXECUTE')", (signature,)
        )
        assert granted == [(False,)], signature


async def test_a_tenant_cannot_hold_another_orgs_ddl_or_grant_lock(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, TOKEN_A, namespace)
    answer_b, _ = await mint(gateway, TOKEN_B, namespace, ["rows.read"])
    schema_b = answer_b["postgres"]["schema"]
    _, url_a = await mint(gateway, TOKEN_A, namespace, ["rows.read"])

    def hold(conn: psycopg.Connection[Any]) -> None:
        for prefix in ("sheetplane-grants", "sheetplane-ddl"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT pg_advisory_lock(%s)", (_lock_key(prefix, schema_b),))

    held = await trio.to_thread.run_sync(psycopg.connect, url_a)
    try:
        held.autocommit = True
        await trio.to_thread.run_sync(hold, held)
        # org-b's DDL (a new sheet) and grants (a new session) go through at once.
        with trio.fail_after(10):
            await admit(gateway, TOKEN_B, f"{namespace}_new")
            await mint(gateway, TOKEN_B, f"{namespace}_new", ["rows.read", "rows.upsert"])
    finally:
        await trio.to_thread.run_sync(held.close)


async def test_a_gateway_that_is_not_superuser_refuses_an_unhardened_database(
    database_url: str,
) -> None:
    """It cannot revoke; it starts only once an operator ran the hardening statements."""
    role = f"sp_test_gw_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    url = psycopg.conninfo.make_conninfo(database_url, user=role, password=password)
    await run_sql(
        database_url,
        sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        ),
    )
    assert params["user"] != role
    async with open_store(url, max_connections=1) as store:
        with pytest.raises(DatabaseNotHardenedError) as caught:
            await harden_database(store)
        assert password not in str(caught.value)

        def grants(conn: psycopg.Connection[Any]) -> list[str]:
            return [s.as_string(conn) for s in hardening_statements(conn, role)]

        async with open_store(database_url, max_connections=1) as admin:
            statements = await admin.pool.run(grants)
            for statement in statements:
                await run_sql(database_url, statement)
        await harden_database(store)  # hardened and granted: no error


# --- finding 2: the privilege matrix, asserted by Postgres ------------------------------

#: Every column of the probed sheet: the store's system columns and the contract's.
SHEET_COLUMNS = (*SYSTEM_COLUMNS, "email", "score")
EVENT_COLUMNS = (
    "id",
    "kind",
    "run_id",
    "write_version",
    "idempotency_key",
    "row_count",
    "created_at",
    # The seed's per-row events (store._seedlayout).
    "play_name",
    "table_namespace",
    "_key",
    "_status",
    "_run_id",
    "_stage",
    "data_patch",
)
SUMMARY_COLUMNS = (
    "id",
    "total",
    "queued",
    "running",
    "completed",
    "failed",
    "write_version",
    "updated_at",
    "play_name",
    "table_namespace",
    "_updated_at",
)
COLSUM_COLUMNS = ("column_name", "non_null", "updated_at", "play_name", "table_namespace")
COUNTER_COLUMNS = ("kind", "name", "value")
RECEIPT_COLUMNS = ("key", "result", "run_id", "run_attempt", "completed_at")
TABLE_COLUMNS = {
    "sheetTable": SHEET_COLUMNS,
    "eventTable": EVENT_COLUMNS,
    "summaryTable": SUMMARY_COLUMNS,
    "columnSummaryTable": COLSUM_COLUMNS,
    "counterTable": COUNTER_COLUMNS,
    "lockTable": (),
    "otherSheetTable": SHEET_COLUMNS,
    "otherSummaryTable": SUMMARY_COLUMNS,
    "receiptsTable": RECEIPT_COLUMNS,
    "metaTable": ("kind", "name", "value"),
    "otherMetaTable": ("kind", "name", "value"),
}
WRITE_EVENT = (
    "kind",
    "run_id",
    "write_version",
    "idempotency_key",
    "row_count",
    # The seed's per-row events.
    "play_name",
    "table_namespace",
    "_key",
    "_status",
    "_run_id",
    "_stage",
    "data_patch",
)
#: What a write role may insert into and update of the rows (the contract's columns too):
#: what the store's direct writes and the seed's statements name.
ROW_INSERT_COLUMNS = ("_key", "_status", "_run_id", "_input_index", "email", "score")
ROW_UPDATE_COLUMNS = (
    "_status",
    "_run_id",
    "_error",
    "_updated_at",
    "_cell_meta",
    "_input_index",
    "email",
    "score",
)
#: The seed's summary upsert and replace reset, by column (the summary's guard drops
#: both: the counters stay the store's).
SUMMARY_INSERT = (
    "play_name",
    "table_namespace",
    "total",
    "queued",
    "running",
    "completed",
    "failed",
)
SUMMARY_UPDATE = ("total", "queued", "running", "completed", "failed", "_updated_at")


def expected_matrix(operation: str) -> set[tuple[str, str, str]]:
    """What ``operation`` may do: ``{(table, statement, column or "")}``, written out."""
    allowed: set[tuple[str, str, str]] = {
        # Postgres refuses none of these to any role; the watchdog ends a backend that
        # LISTENs, NOTIFYs or passes its memory bound (findings 4 and 5). Its expiry
        # and connection limit it cannot change.
        ("self", "NOTIFY", ""),
        ("self", "LISTEN", ""),
        ("self", "SET work_mem", ""),
        ("self", "ALTER ROLE SET", ""),
        ("self", "ALTER ROLE PASSWORD", ""),
        ("summaryTable", "SELECT", ""),
        ("columnSummaryTable", "SELECT", ""),
        ("counterTable", "SELECT", ""),
        ("metaTable", "SELECT", ""),
    }
    if operation == "rows.stage":
        # Staged admission's chunks only (their tables are not probed here): nothing
        # on the sheet's rows, its events or its counters.
        return allowed
    allowed.add(("sheetTable", "SELECT", ""))
    if operation == "rows.read":
        return allowed
    if operation == "rows.admit":
        # The direct road's one-transaction admission: new rows stamped with a version,
        # which the admit guard holds to the one its transaction took (the begin
        # function takes the lock and the version; no event, no lock table, no UPDATE).
        return allowed | {("sheetTable", "INSERT", c) for c in (*ROW_INSERT_COLUMNS, "seq")}
    allowed |= {("eventTable", "SELECT", "")}
    allowed |= {("eventTable", "INSERT", c) for c in WRITE_EVENT}
    # The writer lock is LOCK TABLE on the empty, columnless lock table (table-level
    # UPDATE). Counters, summary and column summary: SELECT only, for every operation.
    # Any lock mode on it, ACCESS EXCLUSIVE included: it is the writer lock its own
    # writes take exclusively, and no statement reads the empty table.
    allowed |= {("lockTable", "LOCK", ""), ("lockTable", "LOCK ACCESS EXCLUSIVE", "")}
    # The rows by column: never the version, the admitted version, the creation time,
    # the stage or the provider; a direct write's new row takes status 'pending' and
    # version 0 from the defaults. No table-level UPDATE and no DELETE (replace
    # deletes through the sheet's clear function), so no LOCK TABLE on the rows.
    allowed |= {("sheetTable", "INSERT", c) for c in ROW_INSERT_COLUMNS}
    allowed |= {("summaryTable", "INSERT", c) for c in SUMMARY_INSERT}
    allowed |= {("summaryTable", "UPDATE", c) for c in SUMMARY_UPDATE}
    if operation in ("rows.upsert", "rows.replace"):
        allowed |= {("sheetTable", "UPDATE", c) for c in ROW_UPDATE_COLUMNS}
    if operation == "rows.replace":
        # The seed's replace deletes the rows, its per-row events and the column
        # summary's rows of its play itself. DELETE lets LOCK TABLE through on each:
        # the stated cost (docs/gateway.md, the seed's direct road), bounded by the
        # session's transaction bound; the guards keep the store's events and counters.
        for table in ("sheetTable", "eventTable", "columnSummaryTable"):
            allowed |= {
                (table, "DELETE", ""),
                (table, "LOCK", ""),
                (table, "LOCK ACCESS EXCLUSIVE", ""),
            }
    return allowed


def probe_matrix(url: str, tables: dict[str, sql.Identifier]) -> set[tuple[str, str, str]]:
    """Try every statement kind on every table (and column) as the role; what Postgres allowed.

    Each statement touches no row (``WHERE false``) but Postgres checks its
    privileges all the same; all of it is rolled back.
    """
    allowed: set[tuple[str, str, str]] = set()
    with psycopg.connect(url) as conn:
        for name, table in tables.items():
            attempts: list[tuple[str, str, sql.Composable]] = [
                ("SELECT", "", sql.SQL("SELECT * FROM {} LIMIT 0").format(table)),
                ("DELETE", "", sql.SQL("DELETE FROM {} WHERE false").format(table)),
                ("TRUNCATE", "", sql.SQL("TRUNCATE {}").format(table)),
                ("LOCK", "", sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table)),
                (
                    "LOCK ACCESS EXCLUSIVE",
                    "",
                    sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table),
                ),
            ]
            for column in TABLE_COLUMNS[name]:
                col = sql.Identifier(column)
                attempts += [
                    (
                        "INSERT",
                        column,
                        sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM {t} WHERE false").format(
                            t=table, c=col
                        ),
                    ),
                    (
                        "UPDATE",
                        column,
                        sql.SQL("UPDATE {t} SET {c} = {c} WHERE false").format(t=table, c=col),
                    ),
                ]
            for kind, column, statement in attempts:
                try:
                    with conn.transaction():
                        conn.execute(statement)
                        raise _Rollback
                except _Rollback:
                    allowed.add((name, kind, column))
                except psycopg.errors.InsufficientPrivilege:
                    pass
        # On the role itself: commands no grant refuses (the watchdog bounds them).
        for kind, statement in SELF_COMMANDS:
            try:
                with conn.transaction():
                    conn.execute(statement)
                    raise _Rollback
            except _Rollback:
                allowed.add(("self", kind, ""))
            except psycopg.errors.InsufficientPrivilege:
                pass
    return allowed


#: What a role may do to itself that Postgres has no privilege for: each is bounded by
#: the gateway's watchdog instead (docs/gateway.md, Security).
SELF_COMMANDS: tuple[tuple[str, sql.Composable], ...] = (
    ("NOTIFY", sql.SQL("NOTIFY sheetplane_probe, 'x'")),
    ("LISTEN", sql.SQL("LISTEN sheetplane_probe")),
    ("SET work_mem", sql.SQL("SET LOCAL work_mem = '4GB'")),
    ("ALTER ROLE SET", sql.SQL("ALTER ROLE current_user SET work_mem = '4GB'")),
    ("ALTER ROLE PASSWORD", sql.SQL("ALTER ROLE current_user PASSWORD 'chosen-by-tenant'")),
    ("ALTER ROLE VALID UNTIL", sql.SQL("ALTER ROLE current_user VALID UNTIL 'infinity'")),
    ("ALTER ROLE CONNECTION LIMIT", sql.SQL("ALTER ROLE current_user CONNECTION LIMIT -1")),
)


class _Rollback(Exception):
    """Leaves a probe's savepoint without keeping anything."""


@pytest.mark.parametrize(
    "operation",
    ["rows.read", "rows.append", "rows.upsert", "rows.replace", "rows.admit", "rows.stage"],
)
async def test_privilege_matrix_of_every_operation_on_every_table_is_what_postgres_enforces(
    gateway: RunningGateway, namespace: str, operation: str
) -> None:
    await admit(gateway, TOKEN_A, namespace)
    await admit(gateway, TOKEN_A, f"{namespace}_other")
    other, _ = await mint(gateway, TOKEN_A, f"{namespace}_other", ["rows.read"])
    await act(gateway, TOKEN_A, "complete_work_receipt", key="r", result=1, runId="run-1")
    answer, url = await mint(gateway, TOKEN_A, namespace, [operation])
    pg = answer["postgres"]
    schema = pg["schema"]
    receipts = await run_sql(
        gateway.config.database_url,
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND relname LIKE %s",
        (schema, "%\\_receipts"),
    )
    assert len(receipts) == 1
    tables = {
        attr: sql.Identifier(schema, pg[attr])
        for attr in ("sheetTable", "eventTable", "summaryTable", "columnSummaryTable")
    }
    counters = pg["sheetTable"].removesuffix("_rows") + "_counts"  # not on the wire
    tables["counterTable"] = sql.Identifier(schema, counters)
    lock = sheet_names(SheetRef(ORG_A, PLAY, namespace)).lock_table  # not on the wire
    tables["lockTable"] = sql.Identifier(schema, lock)
    tables["otherSheetTable"] = sql.Identifier(schema, other["postgres"]["sheetTable"])
    tables["otherSummaryTable"] = sql.Identifier(schema, other["postgres"]["summaryTable"])
    tables["receiptsTable"] = sql.Identifier(schema, receipts[0][0])
    meta = sheet_names(SheetRef(ORG_A, PLAY, namespace)).meta_table  # not on the wire
    tables["metaTable"] = sql.Identifier(schema, meta)
    other_meta = sheet_names(SheetRef(ORG_A, PLAY, f"{namespace}_other")).meta_table
    tables["otherMetaTable"] = sql.Identifier(schema, other_meta)
    allowed = await trio.to_thread.run_sync(probe_matrix, url, tables)
    assert allowed == expected_matrix(operation)


async def test_a_write_role_cannot_forge_the_admission_counter(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, TOKEN_A, namespace)
    answer, url = await mint(gateway, TOKEN_A, namespace, ["rows.append"])
    summary = sql.Identifier(answer["postgres"]["schema"], answer["postgres"]["summaryTable"])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await run_sql(
            url, sql.SQL("UPDATE {} SET write_version = 9223372036854775807").format(summary)
        )
    # The next admission still takes the next version.
    assert (await admit(gateway, TOKEN_A, namespace))["writeVersion"] == 2


async def test_an_admit_role_stamps_only_the_version_its_own_transaction_took(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, TOKEN_A, namespace)  # version 1, three rows
    answer, url = await mint(gateway, TOKEN_A, namespace, ["rows.admit"])
    names = sheet_names(SheetRef(ORG_A, PLAY, namespace))
    rows = names.ident("sheet_table")
    begin, _taken, finish = admit_functions(names)
    insert = sql.SQL(
        "INSERT INTO {} (_key, seq.write_version, seq.admitted_version) VALUES (%s, %s, %s)"
    ).format(rows)

    finish_call = sql.SQL("SELECT * FROM {}('r')").format(finish)

    def hostile(conn: psycopg.Connection[Any]) -> list[str]:
        through = []
        attempts: list[tuple[str, Any]] = [
            # No version taken in this transaction: any version is forged.
            ("a version never taken", lambda: conn.execute(insert, ("x1", 7, 7))),
            ("the last admission's version", lambda: conn.execute(insert, ("x2", 1, 1))),
            # A plain row first (its counting trigger writes the summary in this
            # transaction), then the sheet's current version: still never taken here.
            (
                "the current version after a plain row",
                lambda: (
                    conn.execute(insert, ("x4", 0, None)),
                    conn.execute(insert, ("x5", 1, 1)),
                ),
            ),
            ("no begin, then finish", lambda: conn.execute(finish_call)),
            (
                "a whole seq never taken",
                lambda: conn.execute(
                    sql.SQL("INSERT INTO {} (_key, seq) VALUES ('x6', '(7,7)')").format(rows)
                ),
            ),
        ]

        def after_begin(version_delta: int) -> None:
            taken = conn.execute(sql.SQL("SELECT taken_version FROM {}()").format(begin)).fetchone()
            assert taken is not None
            conn.execute(insert, ("x3", taken[0] + version_delta, taken[0] + version_delta))

        attempts += [
            ("a version past the one taken", lambda: after_begin(1)),
            ("a version before the one taken", lambda: after_begin(-1)),
        ]
        for name, attempt in attempts:
            try:
                with conn.transaction():
                    attempt()
                    raise _Rollback
            except _Rollback:
                through.append(name)
            except psycopg.errors.InsufficientPrivilege:
                pass
        # The version its own transaction took is allowed (rolled back here too).
        try:
            with conn.transaction():
                after_begin(0)
                conn.execute(finish_call)
                raise _Rollback
        except _Rollback:
            through.append("its own version")
        return through

    def run() -> list[str]:
        with psycopg.connect(url) as conn:
            return hostile(conn)

    assert answer["operations"] == ["rows.admit"]
    assert await trio.to_thread.run_sync(run) == ["its own version"]


async def test_no_session_role_holds_usage_on_the_row_versions_type(
    gateway: RunningGateway, namespace: str
) -> None:
    """``seq``'s composite type: only its owner (the gateway) may make an object of
    it; a session reads and writes the column without any privilege on the type."""
    await admit(gateway, TOKEN_A, namespace)
    names = sheet_names(SheetRef(ORG_A, PLAY, namespace))
    versions = names.versions_type

    def probe(url: str) -> tuple[bool, bool, int]:
        with psycopg.connect(url, autocommit=True) as conn:
            found = conn.execute(
                sql.SQL(
                    "SELECT has_type_privilege(current_user, {t}, 'USAGE'), "
                    "EXISTS (SELECT FROM pg_type AS t, aclexplode(t.typacl) AS a "
                    "WHERE t.oid = {t}::regtype AND a.grantee = 0), "
                    "(SELECT count(*) FROM {rows} WHERE (seq).write_version = 1)"
                ).format(t=sql.Literal(versions.as_string(conn)), rows=names.ident("sheet_table"))
            ).fetchone()
            assert found is not None
            return bool(found[0]), bool(found[1]), int(found[2])

    for operations in (["rows.admit"], ["rows.read", "rows.upsert"], ["rows.replace"]):
        _, url = await mint(gateway, TOKEN_A, namespace, operations)
        assert await trio.to_thread.run_sync(probe, url) == (False, False, 3), operations


def hostile_counter_writes(url: str, names: Any) -> list[str]:
    """As the role: every way to move the sheet's counters that is not a row change.
    Returns the ones Postgres let through (each tried in its own transaction)."""
    summary, colsum = names.ident("summary_table"), names.ident("column_summary_table")
    counts, rows = names.ident("counter_table"), names.ident("sheet_table")
    attempts: list[tuple[str, sql.Composable]] = [
        ("summary total", sql.SQL("UPDATE {} SET total = -5").format(summary)),
        ("summary queued", sql.SQL("UPDATE {} SET queued = queued + 100").format(summary)),
        ("summary insert", sql.SQL("INSERT INTO {} (id) VALUES (true)").format(summary)),
        ("summary delete", sql.SQL("DELETE FROM {}").format(summary)),
        (
            "log insert",
            sql.SQL("INSERT INTO {} (kind, name, value) VALUES ('status', 'total', -5)").format(
                counts
            ),
        ),
        ("log update", sql.SQL("UPDATE {} SET value = -5").format(counts)),
        ("log delete", sql.SQL("DELETE FROM {}").format(counts)),
        ("log truncate", sql.SQL("TRUNCATE {}").format(counts)),
        (
            "column summary insert",
            sql.SQL("INSERT INTO {} (column_name, non_null) VALUES ('email', -5)").format(colsum),
        ),
        ("column summary update", sql.SQL("UPDATE {} SET non_null = -5").format(colsum)),
        ("column summary delete", sql.SQL("DELETE FROM {}").format(colsum)),
        (
            "call the counting function",
            # Named here, not through SheetNames, so the test runs on any layout.
            sql.SQL("SELECT {}()").format(
                sql.Identifier(names.schema, names.sheet_table.removesuffix("_rows") + "_count")
            ),
        ),
        ("disable the triggers", sql.SQL("ALTER TABLE {} DISABLE TRIGGER ALL").format(rows)),
        (
            "disable one trigger",
            sql.SQL("ALTER TABLE {} DISABLE TRIGGER sheetplane_count_update").format(rows),
        ),
        ("drop a trigger", sql.SQL("DROP TRIGGER sheetplane_count_insert ON {}").format(rows)),
        ("replica role", sql.SQL("SET session_replication_role = replica")),
        (
            "replica role default",
            sql.SQL("ALTER ROLE current_user SET session_replication_role = replica"),
        ),
        (
            "own function in the schema",
            sql.SQL("CREATE FUNCTION {}() RETURNS int LANGUAGE sql AS 'SELECT 1'").format(
                sql.Identifier(names.schema, "sheetplane_intruder")
            ),
        ),
    ]
    through = []
    with psycopg.connect(url, autocommit=True) as conn:
        for what, statement in attempts:
            try:
                conn.execute(statement)
            except (psycopg.errors.InsufficientPrivilege, psycopg.errors.FeatureNotSupported):
                continue  # refused (a trigger function called directly: not supported)
            except psycopg.Error:
                pass  # past the privilege check (a duplicate key, say): it got through
            through.append(what)
    return through


def hostile_row_changes(url: str, names: Any) -> None:
    """As the role: the row changes its grants allow, in its own SQL, without the
    store's write path (no writer lock, no event), inside and outside savepoints."""
    rows = names.ident("sheet_table")
    clear = sql.Identifier(names.schema, names.sheet_table.removesuffix("_rows") + "_clear")
    statements = [
        "INSERT INTO {} (_key, email, score) VALUES"
        " ('h1', to_jsonb('a'::text), '1'), ('h2', NULL, '2'),"
        " ('h3', to_jsonb('c'::text), NULL), ('h4', NULL, NULL)",
        "UPDATE {} SET _status = 'enriched' WHERE _key = 'h1'",
        "UPDATE {} SET _status = 'failed' WHERE _key = 'h2'",
        "UPDATE {} SET _status = 'failed', score = '3' WHERE _key = 'k0'",
        "INSERT INTO {} (_key, email) VALUES ('k2', to_jsonb('x'::text))"
        " ON CONFLICT (_key) DO UPDATE SET _status = 'enriched', email = NULL",
    ]
    with psycopg.connect(url) as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(rows))
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SELECT {}()").format(clear))
                raise _Rollback
        except _Rollback:
            pass


async def test_a_hostile_write_role_cannot_move_its_sheets_counters_and_they_stay_exact(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, TOKEN_A, namespace)
    operations = ["rows.read", "rows.append", "rows.upsert", "rows.replace"]
    _, url = await mint(gateway, TOKEN_A, namespace, operations)
    names = sheet_names(SheetRef(ORG_A, PLAY, namespace))
    # A base row in the column summary (an older sheet's; new sheets keep none), so the
    # replace role's DELETE on it (the seed's replace needs one) meets a counter row.
    await run_sql(
        gateway.config.database_url,
        sql.SQL("INSERT INTO {} (column_name, non_null) VALUES ('email', 0)").format(
            names.ident("column_summary_table")
        ),
    )
    assert await trio.to_thread.run_sync(hostile_counter_writes, url, names) == []
    await trio.to_thread.run_sync(hostile_row_changes, url, names)
    summary = await act(gateway, TOKEN_A, "runtime_sheet_summary", tableNamespace=namespace)
    recount = await run_sql(
        gateway.config.database_url,
        sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE _status IN ('pending', 'stale')), "
            "count(*) FILTER (WHERE _status = 'running'), "
            "count(*) FILTER (WHERE _status = 'enriched'), "
            "count(*) FILTER (WHERE _status = 'failed'), count(email), count(score) FROM {}"
        ).format(names.ident("sheet_table")),
    )
    total, queued, running, completed, failed, emails, scores = recount[0]
    assert summary == {
        "total": total,
        "queued": queued,
        "running": running,
        "completed": completed,
        "failed": failed,
    }
    # k0 failed, k1 pending, k2 enriched, h1 enriched, h2 failed, h3 and h4 pending.
    assert (total, queued, running, completed, failed) == (7, 3, 0, 2, 2)
    assert (emails, scores) == (4, 3)
    async with open_store(gateway.config.database_url, max_connections=1) as store:
        counts = await store.pool.run(functools.partial(column_counts, names=names))
    assert (counts.get("email", 0), counts.get("score", 0)) == (emails, scores)


# --- finding 3: every session is bounded in time and connections ------------------------

#: Short bounds so the watchdog acts within the test (the budgets' are seconds).
QUICK_BOUNDS = {
    "session_statement_timeout_ms": 1_000,
    "session_idle_timeout_ms": 500,
    "session_transaction_timeout_ms": 4_000,
    "watchdog_interval_ms": 100,
}
#: A statement that runs until something ends it, without pg_sleep (revoked).
ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


@pytest.fixture
async def bounded(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(
        database_url, tokens={TOKEN_A: ORG_A, TOKEN_B: ORG_B}, **QUICK_BOUNDS
    ) as gw:
        yield gw


async def end_role_backends(database_url: str, role: str) -> None:
    """Test cleanup: end what the role still runs (so a failing test cannot hang)."""
    await run_sql(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
        (role,),
    )


async def run_role(url: str, work: Any, database_url: str) -> None:
    """``work(conn)`` on a connection of the role, in a thread; at most 30 s."""
    role = psycopg.conninfo.conninfo_to_dict(url)["user"]

    def run() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            work(conn)

    try:
        with trio.fail_after(30):
            await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    finally:
        await end_role_backends(database_url, str(role))


async def test_a_statement_past_the_session_limit_is_ended_even_after_the_role_unsets_it(
    bounded: RunningGateway, database_url: str, namespace: str
) -> None:
    await admit(bounded, TOKEN_A, namespace)
    _, url = await mint(bounded, TOKEN_A, namespace, ["rows.read"])
    # The role default ends a plain overrun with Postgres's own timeout...
    with pytest.raises(psycopg.errors.QueryCanceled):
        await run_role(url, lambda conn: conn.execute(ENDLESS), database_url)

    def overrun(conn: psycopg.Connection[Any]) -> None:
        conn.execute("ALTER ROLE current_user SET statement_timeout = 0")
        conn.execute("SET statement_timeout = 0")
        conn.execute(ENDLESS)

    # ...and the watchdog ends one whose timeout the role took away. The watchdog
    # counts what it ended when its whole pass is over, which may be after the
    # role's connection saw its end (the pass goes on to the org budget, memory
    # and LISTEN checks: slower with more session backends on the server, as in a
    # whole file's run), so the count is waited for, not read at once.
    progress = bounded.state.reaper
    ended = progress.ended
    with pytest.raises(psycopg.OperationalError):
        await run_role(url, overrun, database_url)
    with trio.fail_after(30):  # as long as run_role gives the work
        await progress.wait_for_ended(ended + 1)
    assert progress.ended > ended
    # The bound a busy server keeps: the statement's bound, one interval of slack,
    # the wait for the next pass (an interval, or a pass when passes run longer) and
    # the pass itself, however long this server's passes have taken (measured).
    interval = QUICK_BOUNDS["watchdog_interval_ms"] / 1000
    statement = QUICK_BOUNDS["session_statement_timeout_ms"] / 1000
    passes = progress.longest_pass_s
    assert 0 < progress.longest_statement_s <= statement + interval + max(interval, passes) + passes


async def test_an_idle_transaction_is_ended_and_no_longer_blocks_ensure_sheet(
    bounded: RunningGateway, database_url: str, namespace: str
) -> None:
    await admit(bounded, TOKEN_A, namespace)
    answer, url = await mint(bounded, TOKEN_A, namespace, ["rows.read"])
    table = sql.Identifier(answer["postgres"]["schema"], answer["postgres"]["sheetTable"])
    held = await trio.to_thread.run_sync(psycopg.connect, url)
    try:

        def open_transaction() -> None:
            held.execute("SET idle_in_transaction_session_timeout = 0")
            held.execute(sql.SQL("SELECT * FROM {}").format(table)).fetchall()

        # An idle transaction holding its ACCESS SHARE lock on the sheet.
        await trio.to_thread.run_sync(open_transaction)
        wider = {"columns": [*CONTRACT["columns"], {"id": "x", "sqlName": "x", "source": "output"}]}
        with trio.fail_after(10):
            await act(
                bounded, TOKEN_A, "ensure_sheet", tableNamespace=namespace, sheetContract=wider
            )
        with pytest.raises(psycopg.OperationalError):
            await trio.to_thread.run_sync(held.execute, "SELECT 1")
    finally:
        await end_role_backends(database_url, str(held.info.user))
        await trio.to_thread.run_sync(held.close)


async def test_a_chain_of_quick_statements_cannot_hold_a_transaction_open(
    bounded: RunningGateway, database_url: str, namespace: str
) -> None:
    await admit(bounded, TOKEN_A, namespace)
    _, url = await mint(bounded, TOKEN_A, namespace, ["rows.read"])

    def chain(conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            while True:  # each statement and each gap short; the transaction is not
                conn.execute("SELECT 1")

    with pytest.raises(psycopg.OperationalError):
        await run_role(url, chain, database_url)


async def test_a_role_cannot_open_more_than_its_connection_limit_and_another_org_still_connects(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, TOKEN_A, namespace)
    _, url = await mint(gateway, TOKEN_A, namespace, ["rows.read"])
    limit = gateway.config.session_max_connections
    held: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(limit):
            held.append(await trio.to_thread.run_sync(psycopg.connect, url))
        with pytest.raises(psycopg.OperationalError, match="too many connections for role"):
            await trio.to_thread.run_sync(psycopg.connect, url)
        # The role cannot lift its own limit.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await trio.to_thread.run_sync(
                held[0].execute, "ALTER ROLE current_user CONNECTION LIMIT -1"
            )
        await admit(gateway, TOKEN_B, namespace)
        _, url_b = await mint(gateway, TOKEN_B, namespace, ["rows.read"])
        assert await run_sql(url_b, "SELECT 1") == [(1,)]
    finally:
        for conn in held:
            await trio.to_thread.run_sync(conn.close)


# --- finding 10: a write that cannot apply creates nothing ------------------------------


async def test_terminal_writes_to_a_sheet_never_admitted_create_no_schema_table_or_summary(
    database_url: str, namespace: str
) -> None:
    org = f"org-fresh-{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    sheet = SheetRef(org, PLAY, namespace)
    names = sheet_names(sheet)
    async with running_gateway(database_url, tokens={token: org}) as gw:
        for action, row in (
            ("runtime_sheet_complete_map_rows", {"key": "k0", "data": {"score": 1}}),
            ("runtime_sheet_fail_map_rows", {"key": "k0", "error": "boom"}),
        ):
            answer = await act(
                gw,
                token,
                action,
                tableNamespace=namespace,
                sheetContract=CONTRACT,
                runId="run-1",
                writeVersion=1,
                rows=[row],
            )
            assert answer["committedKeys"] == []
            assert answer["staleKeys"] == ["k0"]
            assert answer["staleRows"] == [
                {"key": "k0", "reason": "newer_write_version", "rowVersionStamp": None}
            ]
            assert answer["updated"] == 0
        assert await act(gw, token, "runtime_sheet_summary", tableNamespace=namespace) == {
            "total": 0,
            "queued": 0,
            "running": 0,
            "completed": 0,
            "failed": 0,
        }
    schemas = await run_sql(
        database_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", (names.schema,)
    )
    assert schemas == []


# --- finding 5: every stored text is capped ---------------------------------------------


async def sheet_bytes(database_url: str, schema: str) -> int:
    rows = await run_sql(
        database_url,
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
        (schema,),
    )
    return int(rows[0][0])


async def test_text_past_its_budget_is_400_and_stores_nothing(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    admission = await admit(gateway, TOKEN_A, namespace)
    schema = sheet_names(SheetRef(ORG_A, PLAY, namespace)).schema
    before = await sheet_bytes(database_url, schema)
    big_run_id = "r" * (MAX_RUN_ID_BYTES + 1)
    version = admission["writeVersion"]
    rows = [{"_key": f"k{i}", "email": "e"} for i in range(3)]
    base = {"tableNamespace": namespace, "sheetContract": CONTRACT}
    refused: list[dict[str, Any]] = [
        {"action": "start_sheet_dataset", **base, "rows": rows, "runId": big_run_id},
        {
            "action": "runtime_sheet_complete_map_rows",
            **base,
            "runId": big_run_id,
            "writeVersion": version,
            "rows": [{"key": "k0", "data": {"score": 1}}],
        },
        {
            "action": "runtime_sheet_fail_map_rows",
            **base,
            "runId": "run-1",
            "writeVersion": version,
            "rows": [{"key": "k0", "error": "e" * (MAX_ERROR_TEXT_BYTES + 1)}],
        },
        {
            "action": "runtime_sheet_fail_map_rows",
            **base,
            "runId": "run-1",
            "writeVersion": version,
            # 4-byte characters: the cap is in UTF-8 bytes, not characters.
            "rows": [{"key": "k0", "error": "\U0001f600" * (MAX_ERROR_TEXT_BYTES // 4 + 1)}],
        },
        {"action": "ensure_sheet", **base, "userEmail": "u" * MAX_USER_EMAIL_BYTES + "@x"},
        {"action": "complete_work_receipt", "key": "r", "result": 1, "runId": big_run_id},
        {"action": "complete_work_receipt", "key": "k" * 2049, "result": 1, "runId": "run-1"},
        {"action": "ensure_sheet", "tableNamespace": "n" * (MAX_REQUEST_TEXT_BYTES + 1)},
    ]
    for fields in refused:
        action = fields.pop("action")
        response = await post(gateway, TOKEN_A, action, **fields)
        assert response.status_code == 400, (action, response.text)
    long_play = {"playName": "p" * (MAX_REQUEST_TEXT_BYTES + 1)}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        response = await http.post(
            RUNTIME_PATH,
            json={"action": "ensure_sheet", "tableNamespace": namespace, **long_play},
            headers={"authorization": f"Bearer {TOKEN_A}"},
        )
    assert response.status_code == 400, response.text
    assert await sheet_bytes(database_url, schema) == before
    # At the cap, the run id is stored.
    at_cap = "r" * MAX_RUN_ID_BYTES
    await act(gateway, TOKEN_A, "start_sheet_dataset", **base, rows=rows, runId=at_cap)


# --- finding 8: 400 where a 500 used to be ------------------------------------------------


def b64_int(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


async def session_roles(database_url: str) -> int:
    rows = await run_sql(
        database_url, "SELECT count(*) FROM pg_roles WHERE starts_with(rolname, %s)", ("sp_sess_",)
    )
    return int(rows[0][0])


async def test_every_postgres_system_column_as_a_sqlname_is_400(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    reported = await run_sql(
        database_url,
        "SELECT attname FROM pg_attribute WHERE attrelid = 'pg_class'::regclass AND attnum < 0",
    )
    assert {row[0] for row in reported} == POSTGRES_SYSTEM_COLUMNS
    for name in sorted(POSTGRES_SYSTEM_COLUMNS):
        contract = {"columns": [{"id": "c", "sqlName": name, "source": "output"}]}
        response = await post(
            gateway, TOKEN_A, "ensure_sheet", tableNamespace=namespace, sheetContract=contract
        )
        assert response.status_code == 400, (name, response.text)
        assert "system column" in response.json()["error"]


def wide_contract(columns: int) -> dict[str, Any]:
    return {
        "columns": [{"id": f"c{i}", "sqlName": f"c{i}", "source": "input"} for i in range(columns)]
    }


async def test_a_contract_past_the_column_cap_is_400_and_one_at_the_cap_stores_full_rows(
    gateway: RunningGateway, namespace: str
) -> None:
    for columns in (MAX_CONTRACT_COLUMNS + 1, 1_700):
        response = await post(
            gateway,
            TOKEN_A,
            "ensure_sheet",
            tableNamespace=namespace,
            sheetContract=wide_contract(columns),
        )
        assert response.status_code == 400, response.text
    # At the cap, a row with an incompressible value in every column still fits a page.
    row = {f"c{i}": os.urandom(100).hex() for i in range(MAX_CONTRACT_COLUMNS)}
    answer = await act(
        gateway,
        TOKEN_A,
        "start_sheet_dataset",
        tableNamespace=namespace,
        sheetContract=wide_contract(MAX_CONTRACT_COLUMNS),
        rows=[{"_key": "k" * 2000, **row}],
        runId="r" * MAX_RUN_ID_BYTES,
    )
    assert answer["inserted"] == 1


async def test_a_ttl_past_bigint_milliseconds_is_400_not_500(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    before = await session_roles(database_url)
    for ttl in (1e308, 2**63, 10**300):  # 10**300: math.isfinite overflowed (gateway fuzzer)
        fields = {**session_fields(namespace, ["rows.read"], key), "ttlSeconds": ttl}
        response = await post(gateway, TOKEN_A, "create_db_session", **fields)
        assert response.status_code == 400, response.text
    assert await session_roles(database_url) == before


async def test_a_jwk_too_large_not_a_modulus_or_carrying_private_factors_is_400_and_mints_nothing(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    public = key.public_jwk()
    jwks = [
        {"kty": "RSA", "e": "AQAB", "n": b64_int((1 << 65_535) | 1)},  # 65,536 bits
        {"kty": "RSA", "e": "AQAB", "n": b64_int(1 << 2048)},  # even
        {"kty": "RSA", "e": "AQAB", "n": b64_int(3**1300)},  # small factors
        *({**public, member: "AQAB"} for member in ("p", "q", "dp", "dq", "qi")),
    ]
    before = await session_roles(database_url)
    for jwk in jwks:
        fields = session_fields(namespace, ["rows.read"], key)
        fields["postgresUrlEncryption"] = {"alg": crypto.ENVELOPE_REQUEST_ALG, "publicKeyJwk": jwk}
        response = await post(gateway, TOKEN_A, "create_db_session", **fields)
        assert response.status_code == 400, response.text
    assert await session_roles(database_url) == before


# --- finding 9: live sessions are capped; the reaper's drop never races a mint ----------


async def test_live_sessions_are_capped_per_token_and_per_org_with_retry_after(
    database_url: str, namespace: str
) -> None:
    org = f"org-cap-{uuid.uuid4().hex[:8]}"
    first, second, other = (f"tok-{uuid.uuid4().hex}" for _ in range(3))
    tokens = {first: org, second: org, other: f"{org}-other"}
    caps = {"session_max_live_per_token": 3, "session_max_live_per_org": 4}
    async with running_gateway(database_url, tokens=tokens, **caps) as gw:
        await admit(gw, first, namespace)
        await admit(gw, other, namespace)
        key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
        fields = session_fields(namespace, ["rows.read"], key)
        before = await session_roles(database_url)

        async def mint_status(token: str) -> httpx.Response:
            return await post(gw, token, "create_db_session", **fields)

        assert [(await mint_status(first)).status_code for _ in range(3)] == [200] * 3
        refused = await mint_status(first)
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "runtime_db_session_cap"
        assert refused.json()["retry_after_ms"] > 0
        # The org's fourth session comes from its other token; then the org is full.
        assert (await mint_status(second)).status_code == 200
        assert (await mint_status(second)).status_code == 429
        # Another org is not affected.
        assert (await mint_status(other)).status_code == 200
        assert await session_roles(database_url) == before + 5


async def test_the_reapers_drop_owned_does_not_race_concurrent_minting(
    database_url: str, namespace: str
) -> None:
    org = f"org-reap-{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    async with running_gateway(
        database_url, tokens={token: org}, reaper_interval_ms=3_600_000
    ) as gw:
        await admit(gw, token, namespace)
        key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
        short = {**session_fields(namespace, ["rows.read", "rows.upsert"], key), "ttlSeconds": 1}
        answers = [await act(gw, token, "create_db_session", **short) for _ in range(12)]
        # Postgres checks VALID UNTIL against its own clock: wait on that clock.
        with trio.fail_after(30):
            await run_sql(
                database_url, "SELECT pg_sleep_until(%s::timestamptz)", (answers[-1]["expiresAt"],)
            )
        fields = session_fields(namespace, ["rows.read", "rows.upsert"], key)
        statuses: list[int] = []
        dropped: list[int] = []

        async def reap() -> None:
            async with open_store(database_url, max_connections=1) as store:
                dropped.append(await reap_expired_roles(store))

        async def mint() -> None:
            statuses.append((await post(gw, token, "create_db_session", **fields)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reap)
            for _ in range(6):
                nursery.start_soon(mint)
        assert statuses == [200] * 6
        # Every expired role of the database goes, other tests' short-lived ones
        # included (one more was there in a full run), so at least this test's twelve.
        assert len(dropped) == 1 and dropped[0] >= 12


# --- finding 6: a refused read holds about its budget, not the page ---------------------


async def allocated_and_kept(work: Callable[[], Awaitable[None]]) -> tuple[int, int]:
    """What ``work`` allocated at its peak and what it kept (Python allocations, all
    threads), the cyclic collector held off as it is between its runs."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        await work()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    return peak - before, after - before


async def seed_mib_rows(database_url: str, namespace: str, n: int) -> dict[str, Any]:
    """``n`` rows of 1 MiB each in org-a's sheet; the batch read of all of them in one page."""
    rows = [{"_key": f"big{i}", "email": os.urandom(MiB // 2).hex()} for i in range(n)]
    sheet = SheetRef(ORG_A, PLAY, namespace)
    contract = read_contract(CONTRACT)
    async with open_store(database_url, max_connections=1) as store:
        await store.ensure_sheet(sheet, contract)
        await store.start_dataset(sheet, rows, "run-1", contract)
    pages = [{"limit": n, "offset": 0}]
    return {"input": {"tableNamespace": namespace, "rowMode": "all", "pages": pages}}


async def test_a_refused_batch_read_decodes_about_its_budget_not_the_whole_page(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    """Forty 1 MiB rows asked in one page: the read is refused 413, and the gateway
    decoded (Python allocations, all threads) well under the page's 40 MiB."""
    read = await seed_mib_rows(database_url, namespace, 40)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        response = await post(gateway, TOKEN_A, "runtime_sheet_read_rows_batch", **read)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 413, response.text
    assert response.json()["code"] == "runtime_sheet_read_batch_too_large"
    # The budget (12 MiB of answer) plus one bounded fetch, with room for the
    # interpreter's own allocations; the whole page is 40 MiB.
    assert peak < READ_BATCH_MAX_RESPONSE_BYTES + 12 * MiB, peak


async def test_refused_reads_hold_each_row_once_and_release_the_rows_when_answered(
    database_url: str, namespace: str
) -> None:
    """A refused read holds its rows once, as the bytes it would send; answered, it
    keeps none (refused 413 or failed 400 on a row it cannot send); and only the
    reads the pool admits hold rows at once.

    Before, each row also came as a str (encoded to bytes after), the previous
    fetch's rows stayed while the next arrived, and the rows a refused read had
    measured were held by its exception's traceback, which the gateway's answer
    put in a reference cycle: each refused read's rows (about its 12 MiB budget)
    stayed until the cyclic collector ran, so a burst of refused reads piled them
    up past what the pool's reads in flight hold (``sheetplane bench
    refused_reads``: 20 reads, 316 MiB of growth). The collector is held off
    here, as it is between its runs.
    """
    read = await seed_mib_rows(database_url, namespace, 14)
    pool, reads = 2, 4
    statuses: list[int] = []
    async with running_gateway(database_url, tokens={TOKEN_A: ORG_A}, max_connections=pool) as gw:

        async def one() -> None:
            response = await post(gw, TOKEN_A, "runtime_sheet_read_rows_batch", **read)
            statuses.append(response.status_code)

        async def traced(n: int) -> tuple[int, int]:
            """What ``n`` concurrent refused reads allocated at their peak, and kept."""

            async def reads() -> None:
                async with trio.open_nursery() as nursery:
                    for _ in range(n):
                        nursery.start_soon(one)

            return await allocated_and_kept(reads)

        alone, kept_alone = await traced(1)
        burst, kept = await traced(reads)
        # A stored number no float holds (the direct road's roles can write one)
        # fails the read 400 at the tenth row, after nine 1 MiB rows were read.
        table = sheet_names(SheetRef(ORG_A, PLAY, namespace)).ident("sheet_table")
        unreadable = "1" + "0" * 400 + ".5"
        await run_sql(
            database_url,
            sql.SQL("UPDATE {} SET email = %s::jsonb WHERE _key = 'big9'").format(table),
            (unreadable,),
        )
        _, kept_failed = await traced(1)
    assert statuses == [413] * (1 + reads) + [400]
    # One read: the rows within the budget and the one 1 MiB row that passes it,
    # each once (before: 14 MiB, the rows as text too).
    assert alone < READ_BATCH_MAX_RESPONSE_BYTES + MiB, alone / MiB
    # Each read in flight holds its budget and one fetch; the pool admits two at
    # once. Before, the answered reads' rows stayed too: four reads' budgets.
    in_flight = pool * (READ_BATCH_MAX_RESPONSE_BYTES + 3 * MiB)
    assert burst < in_flight + 4 * MiB, burst / MiB
    assert kept_alone < MiB and kept < 2 * MiB, (kept_alone / MiB, kept / MiB)
    # Nor does a read that fails on a row it cannot write (9 MiB before).
    assert kept_failed < MiB, kept_failed / MiB


async def post_and_drop(gw: RunningGateway, token: str, action: str, **fields: Any) -> int:
    """The status of a POST whose client keeps nothing of it (see ``post_over_socket``)."""
    return await post_over_socket(
        gw.base_url, token, {"action": action, "playName": PLAY, **fields}
    )


async def test_refused_large_writes_keep_neither_their_body_nor_their_rows_once_answered(
    database_url: str, namespace: str
) -> None:
    """A write refused 409 (a completion that conflicts at its write version) or
    400 (a staged chunk with a bad row) keeps nothing of its body once answered.

    Before, the error raised in the store's worker thread held every frame it
    passed (the rows given to the thread, those it made); re-raised in the
    gateway it also held the handler's and the answer's frames (the raw body),
    and the pool's frame holding the thread's outcome, trio's hand-back of a
    thread's error and the answer's frame holding the 409 each made a
    reference cycle of it: three copies of each 4 MiB body stayed until the
    cyclic collector ran (held off here, as between its runs).
    """
    n, rows, row_bytes = 4, 4, MiB
    async with running_gateway(database_url, tokens={TOKEN_A: ORG_A}, max_connections=2) as gw:
        version = (await admit(gw, TOKEN_A, namespace, rows))["writeVersion"]
        first = [{"key": f"k{i}", "data": {"score": "a"}} for i in range(rows)]
        fields = {"tableNamespace": namespace, "sheetContract": CONTRACT, "runId": "run-1"}
        await act(
            gw,
            TOKEN_A,
            "runtime_sheet_complete_map_rows",
            writeVersion=version,
            rows=first,
            **fields,
        )
        admissions = []
        for _ in range(n):
            admission_id = uuid.uuid4().hex
            staged = {"tableNamespace": f"{namespace}_staged", "sheetContract": CONTRACT}
            await act(
                gw,
                TOKEN_A,
                "begin_sheet_admission",
                admissionId=admission_id,
                runId="run-2",
                **staged,
            )
            admissions.append(admission_id)
        statuses: list[int] = []

        async def conflicting(i: int) -> None:
            other = [{"key": f"k{j}", "data": {"score": f"{i}" * row_bytes}} for j in range(rows)]
            statuses.append(
                await post_and_drop(
                    gw,
                    TOKEN_A,
                    "runtime_sheet_complete_map_rows",
                    writeVersion=version,
                    rows=other,
                    **fields,
                )
            )

        async def bad_chunk(i: int) -> None:
            chunk = [{"_key": f"s{j}", "email": f"{i}" * row_bytes} for j in range(rows)]
            statuses.append(
                await post_and_drop(
                    gw,
                    TOKEN_A,
                    "stage_sheet_admission_chunk",
                    admissionId=admissions[i],
                    seq=0,
                    firstPosition=0,
                    rows=[*chunk, {"_key": ""}],
                    **staged,
                )
            )

        async def burst() -> None:
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(conflicting, i)
                    nursery.start_soon(bad_chunk, i)

        peak, kept = await allocated_and_kept(burst)
    assert sorted(statuses) == [400] * n + [409] * n
    # The bodies were there (each about rows * row_bytes)...
    assert peak > n * rows * row_bytes, peak / MiB
    # ... and none stays (before: about 24 MiB per 409 and 30 MiB per 400).
    assert kept < 2 * MiB, kept / MiB


# --- finding 4: no org's metadata in what every role can read ---------------------------


async def test_a_scoped_role_finds_no_other_orgs_metadata_sizes_or_row_counts(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, TOKEN_B, namespace)
    await admit(gateway, TOKEN_A, namespace)
    schema_b = sheet_names(SheetRef(ORG_B, PLAY, namespace)).schema
    names_b = sheet_names(SheetRef(ORG_B, PLAY, namespace))
    _, url = await mint(gateway, TOKEN_A, namespace, ["rows.read", "rows.upsert"])
    # Table and column comments of every sheetplane table carry nothing.
    described = await run_sql(
        url,
        "SELECT c.relname, obj_description(c.oid, 'pg_class'),"
        " (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid"
        "  AND col_description(c.oid, a.attnum) IS NOT NULL)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname LIKE 'sp\\_%%' AND c.relkind = 'r'",
    )
    assert any(row[0] == names_b.sheet_table for row in described)
    assert all(row[1] is None and row[2] == 0 for row in described), described
    # The other org's metadata table, sizes and row statistics are refused.
    for statement in (
        sql.SQL("SELECT * FROM {}").format(names_b.ident("meta_table")),
        sql.SQL("SELECT pg_total_relation_size(%s::regclass)"),
        sql.SQL("SELECT pg_stat_get_live_tuples(%s::regclass)"),
        sql.SQL("SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = %s::regclass"),
    ):
        params = (
            () if "meta" in statement.as_string(None) else (f"{schema_b}.{names_b.sheet_table}",)
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await run_sql(url, statement, params)
    # A direct write with no contract still finds its own sheet's column ids.
    async with open_store(url, max_connections=1) as store:
        sheet = SheetRef(ORG_A, PLAY, namespace)
        await store.upsert_rows(sheet, [{"_key": "k0", "email": "new@x"}], idempotency_key="u1")
        rows = await store.read_rows_by_keys(sheet, ["k0"])
    assert rows[0]["email"] == "new@x"


# --- second pass, finding 10: small items ------------------------------------------------


@pytest.fixture
async def own_orgs(database_url: str) -> AsyncIterator[RunningGateway]:
    """A gateway whose two orgs are this test's alone: a gateway cannot reclaim the
    sessions another one minted, and earlier tests' hold the shared orgs' budgets."""
    suffix = uuid.uuid4().hex[:8]
    tokens = {TOKEN_A: f"org-a-{suffix}", TOKEN_B: f"org-b-{suffix}"}
    async with running_gateway(database_url, tokens=tokens) as gw:
        yield gw


async def test_a_sheet_system_column_as_a_sqlname_is_400_not_silently_dropped(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    """``sqlName: "_status"`` (any of the sheet's or the staging table's own columns)
    answered 200 and was never stored: a ``_`` name is no physical column."""
    assert {"_key", "_status", "seq", "_admission_id", "_position"} <= (RESERVED_SQL_NAMES)
    for name in sorted(RESERVED_SQL_NAMES):
        contract = {
            "columns": [
                {"id": "email", "sqlName": "email", "source": "input"},
                {"id": "x", "sqlName": name, "source": "output"},
            ]
        }
        for action, fields in (
            ("ensure_sheet", {}),
            ("start_sheet_dataset", {"rows": [{"_key": "k", "email": "e"}], "runId": "r"}),
        ):
            response = await post(
                gateway,
                TOKEN_A,
                action,
                tableNamespace=namespace,
                sheetContract=contract,
                **fields,
            )
            assert response.status_code == 400, (name, action, response.text)
            assert "system column" in response.json()["error"]
    names = sheet_names(SheetRef(ORG_A, PLAY, namespace))
    assert await run_sql(
        database_url, "SELECT to_regclass(%s)", (names.ident("sheet_table").as_string(None),)
    ) == [(None,)]
    # Any other ``_`` name stays a virtual column, as the runtime re-created has it.
    virtual = {"columns": [*CONTRACT["columns"], {"id": "v", "sqlName": "_v", "source": "output"}]}
    await act(gateway, TOKEN_A, "ensure_sheet", tableNamespace=namespace, sheetContract=virtual)


async def test_a_scoped_role_cannot_read_other_sessions_role_expiry_settings_or_database_size(
    own_orgs: RunningGateway, namespace: str
) -> None:
    await admit(own_orgs, TOKEN_A, namespace)
    await admit(own_orgs, TOKEN_B, namespace)
    _, url_b = await mint(own_orgs, TOKEN_B, namespace, ["rows.read"])
    _, url_a = await mint(own_orgs, TOKEN_A, namespace, ["rows.read"])
    held = await trio.to_thread.run_sync(
        functools.partial(psycopg.connect, url_b, application_name="org-b-secret-app")
    )
    try:
        for statement in (
            "SELECT application_name FROM pg_stat_activity",
            "SELECT count(*) FROM pg_stat_activity",
            "SELECT * FROM pg_stat_get_activity(NULL)",
            "SELECT pg_stat_get_backend_userid(1)",
            "SELECT rolvaliduntil FROM pg_roles",
            "SELECT rolconfig FROM pg_roles",
            "SELECT * FROM pg_roles",
            "SELECT valuntil, useconfig FROM pg_user",
            "SELECT setconfig FROM pg_db_role_setting",
            "SELECT pg_database_size(current_database())",
            "SELECT pg_database_size(oid) FROM pg_database",
            "SELECT pg_tablespace_size('pg_default')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await run_sql(url_a, statement)
        # What drivers and tools read of pg_roles stays readable.
        me = await run_sql(
            url_a,
            "SELECT rolname, rolsuper, rolcanlogin FROM pg_roles WHERE rolname = current_user",
        )
        assert len(me) == 1 and me[0][1:] == (False, True)
    finally:
        await trio.to_thread.run_sync(held.close)


# --- second pass, finding 6: a write role cannot break fencing on its own sheet ----------


def fence_breaking_writes(url: str, names: Any, version: int) -> list[str]:
    """As the role: every way the probe found (and a few more) to move what the fence
    decides; returns the ones Postgres let through (each in its own transaction)."""
    rows, events = names.ident("sheet_table"), names.ident("event_table")
    attempts: list[tuple[str, sql.Composable]] = [
        (
            "version up",
            sql.SQL("UPDATE {} SET seq.write_version = (seq).write_version + 1000").format(rows),
        ),
        ("admitted version", sql.SQL("UPDATE {} SET seq.admitted_version = 99").format(rows)),
        ("both versions", sql.SQL("UPDATE {} SET seq = ROW(99, 99)").format(rows)),
        ("key", sql.SQL("UPDATE {} SET _key = _key || 'x' WHERE _key = 'k1'").format(rows)),
        ("input index", sql.SQL("UPDATE {} SET _input_index = 99").format(rows)),
        (
            "insert enriched",
            sql.SQL("INSERT INTO {} (_key, _status) VALUES ('f', 'enriched')").format(rows),
        ),
        (
            "insert versioned",
            sql.SQL("INSERT INTO {} (_key, seq.write_version) VALUES ('f', 99)").format(rows),
        ),
        (
            "insert versioned whole",
            sql.SQL("INSERT INTO {} (_key, seq) VALUES ('f', '(99,99)')").format(rows),
        ),
        (
            "enriched back to pending",
            sql.SQL("UPDATE {} SET _status = 'pending' WHERE _key = 'k0'").format(rows),
        ),
        (
            "enriched to failed",
            sql.SQL("UPDATE {} SET _status = 'failed' WHERE _key = 'k0'").format(rows),
        ),
        (
            "pending to stale",
            sql.SQL("UPDATE {} SET _status = 'stale' WHERE _key = 'k1'").format(rows),
        ),
        (
            "pending to running",
            sql.SQL("UPDATE {} SET _status = 'running' WHERE _key = 'k1'").format(rows),
        ),
        (
            "admission event",
            sql.SQL(
                "INSERT INTO {} (kind, write_version, row_count) VALUES ('admission', 1e15, 1)"
            ).format(events),
        ),
        (
            "terminal event past the counter",
            sql.SQL(
                "INSERT INTO {} (kind, write_version, row_count)"
                " VALUES ('complete_map_rows', %s, 1)"
            ).format(events),
        ),
        (
            "replace event",
            sql.SQL("INSERT INTO {} (kind, row_count) VALUES ('replace', 1)").format(events),
        ),
        ("delete", sql.SQL("DELETE FROM {}").format(rows)),
        ("lock the rows", sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(rows)),
        ("lock the rows, share", sql.SQL("LOCK TABLE {} IN SHARE MODE").format(rows)),
        ("lock the events", sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(events)),
    ]
    through = []
    with psycopg.connect(url) as conn:
        for what, statement in attempts:
            params = (version + 1,) if "%s" in str(statement) else None
            try:
                with conn.transaction():
                    conn.execute(statement, params)
                    raise _Rollback  # it got through: undone, so the next one sees the same rows
            except psycopg.errors.InsufficientPrivilege:
                continue
            except (_Rollback, psycopg.Error):
                pass  # through, or past the privilege check (a duplicate key, say)
            through.append(what)
    return through


async def test_a_write_role_cannot_break_fencing_on_its_own_sheet(
    own_orgs: RunningGateway, namespace: str
) -> None:
    """``rows.upsert`` had table-wide UPDATE: it moved the write version by 1000, marked
    rows with forged outputs, inserted an ``admission`` event of version 10^15 and
    took ``LOCK TABLE ... ACCESS EXCLUSIVE``; the gateway's own write at the real
    version then answered 409. Every one of those is refused now, and the direct
    road's own writes (fenced completes, upserts, appends, replace) still work."""
    version = (await admit(own_orgs, TOKEN_A, namespace, n=4))["writeVersion"]
    fields = {"tableNamespace": namespace, "sheetContract": CONTRACT, "runId": "run-1"}
    await act(
        own_orgs,
        TOKEN_A,
        "runtime_sheet_complete_map_rows",
        writeVersion=version,
        rows=[{"key": "k0", "data": {"score": 7}}],
        **fields,
    )
    names = sheet_names(SheetRef(own_orgs.config.tokens[TOKEN_A], PLAY, namespace))
    # Only its own kind of event gets through: a replace role's "replace". The seed's
    # admission reorders the rows it re-admits (UPDATE of _input_index: read order, not
    # fencing), and its replace deletes the rows itself, which lets LOCK TABLE through
    # (the stated cost, docs/gateway.md: the seed's direct road).
    for operations, own in (
        (["rows.read", "rows.upsert"], ["input index"]),
        (
            ["rows.replace"],
            [
                "input index",
                "replace event",
                "delete",
                "lock the rows",
                "lock the rows, share",
                "lock the events",
            ],
        ),
    ):
        _, url = await mint(own_orgs, TOKEN_A, namespace, operations)
        through = await trio.to_thread.run_sync(fence_breaking_writes, url, names, version)
        assert through == own, operations
    # The gateway's own write at the real version is not stale and not a conflict.
    answer = await act(
        own_orgs,
        TOKEN_A,
        "runtime_sheet_complete_map_rows",
        writeVersion=version,
        rows=[{"key": "k1", "data": {"score": 1}}],
        **fields,
    )
    assert answer["committedKeys"] == ["k1"], answer
    # The direct road's writes on the narrower grants.
    sheet = SheetRef(own_orgs.config.tokens[TOKEN_A], PLAY, namespace)
    contract = read_contract(CONTRACT)
    _, url = await mint(own_orgs, TOKEN_A, namespace, ["rows.read", "rows.upsert"])
    async with open_store(url, max_connections=1) as store:
        done = await store.complete_map_rows(
            sheet,
            contract,
            [CompleteRow("k2", {"score": 2})],
            run_id="run-1",
            write_version=version,
        )
        assert done.committed_keys == ("k2",)
        failed = await store.fail_map_rows(
            sheet, contract, [FailRow("k3", "boom")], run_id="run-1", write_version=version
        )
        assert failed.committed_keys == ("k3",)
        upserted = await store.upsert_rows(
            sheet, [{"_key": "k1", "email": "new@x"}, {"_key": "n1"}], idempotency_key="u1"
        )
        assert upserted.written == 2
    for operation, write in (
        ("rows.append", lambda s: s.append_rows(sheet, [{"email": "a@x"}], idempotency_key="a1")),
        ("rows.replace", lambda s: s.replace_rows(sheet, [{"_key": "r"}], idempotency_key="r1")),
    ):
        _, url = await mint(own_orgs, TOKEN_A, namespace, [operation])
        async with open_store(url, max_connections=1) as store:
            assert (await write(store)).written == 1
    assert await run_sql(
        own_orgs.config.database_url,
        sql.SQL("SELECT _status, (seq).write_version FROM {}").format(names.ident("sheet_table")),
    ) == [("pending", 0)]


# --- second pass, finding 7: a lease is held by its token, not by its holder's name -----


async def test_a_receipt_holders_name_is_not_a_capability_without_its_lease_token(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused claim answered the live holder's name, and any runner of the org could
    then renew, release or complete as that holder. The claim's answer now carries a
    secret lease token to the claimant only; renewing, releasing and a fenced
    completion need it; no other answer and no log line carries it."""
    key = f"k-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG)
    claim = await act(gateway, TOKEN_A, "claim_work_receipt", key=key, holder="runner-1")
    token = claim["leaseToken"]
    assert claim["acquired"] and len(token) >= 32
    # Another runner of the org, knowing only the name.
    refused = await act(gateway, TOKEN_A, "claim_work_receipt", key=key, holder="runner-1")
    assert not refused["acquired"] and refused["holder"] == "runner-1"
    assert "leaseToken" not in refused and token not in str(refused)
    guess = "g" * 43
    answers = [
        await act(
            gateway, TOKEN_A, "release_work_receipt", key=key, holder="runner-1", leaseToken=guess
        ),
        await post(gateway, TOKEN_A, "release_work_receipt", key=key, holder="runner-1"),
        await post(
            gateway,
            TOKEN_A,
            "complete_work_receipt",
            key=key,
            result="forged",
            runId="run-x",
            holder="runner-1",
        ),
        await post(
            gateway,
            TOKEN_A,
            "complete_work_receipt",
            key=key,
            result="forged",
            runId="run-x",
            holder="runner-1",
            leaseToken=guess,
        ),
    ]
    assert answers[0] == {"released": False}
    assert [a.status_code for a in answers[1:]] == [200, 409, 409]
    assert answers[1].json() == {"released": False}  # a name alone releases nothing
    assert all(token not in a.text for a in answers[1:])
    # The claimant renews and completes with it.
    renewed = await act(
        gateway, TOKEN_A, "claim_work_receipt", key=key, holder="runner-1", leaseToken=token
    )
    assert renewed["acquired"] and renewed["leaseToken"] == token
    done = await act(
        gateway,
        TOKEN_A,
        "complete_work_receipt",
        key=key,
        result="mine",
        runId="run-1",
        holder="runner-1",
        leaseToken=token,
    )
    assert done["receipt"]["result"] == "mine"
    # Another org never sees the key at all.
    other = await act(gateway, TOKEN_B, "claim_work_receipt", key=key, holder="runner-1")
    assert other["acquired"] and other["leaseToken"] != token
    logged = "\n".join(
        f"{r.getMessage()} {vars(r)}"
        for r in caplog.records
        if r.name.startswith(("sheetplane", "hypercorn"))
    )
    assert token not in logged
    rows = await run_sql(
        gateway.config.database_url,
        sql.SQL("SELECT claim_token_digest FROM {} WHERE key = %s").format(
            receipt_names(ORG_B, PLAY).ident("receipts_table")
        ),
        (key,),
    )
    assert rows and rows[0][0] == hashlib.sha256(other["leaseToken"].encode()).digest()


# --- second pass, finding 1: no tenant takes the whole connection cap -------------------

TOKEN_A2 = "tok-tenant-a2-91c4d7e0"
#: Scaled to the CI machine: a 48-connection gateway and 60 hostile sockets of one
#: org from two tokens (the probe used 256 and 400); the org may hold 12 requests in
#: flight (6 per token) and 24 connections (12 per token).
HOSTILE_SOCKETS = 60
#: org-b's p100 latency while org-a stalls, as the issue asks.
OTHER_TENANT_P100_S = 2.0


def stalled_head(token: str) -> bytes:
    """A request head promising 100 body bytes, and 10 of them."""
    return (
        f"POST {RUNTIME_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {token}\r\n"
        "content-type: application/json\r\ncontent-length: 100\r\n\r\n"
    ).encode() + b"{" * 10


class Heads:
    """Counts hostile heads sent; ``all_sent`` once every socket sent one."""

    def __init__(self, sockets: int) -> None:
        self.first: set[int] = set()
        self.sockets = sockets
        self.all_sent = trio.Event()

    def sent(self, socket_no: int) -> None:
        self.first.add(socket_no)
        if len(self.first) == self.sockets:
            self.all_sent.set()


async def stall_forever(
    port: int, token: str, socket_no: int, heads: Heads, answers: list[bytes]
) -> None:
    """One hostile socket: send a head and part of a body, wait for the server to close
    it, reconnect at once; until cancelled."""
    while True:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.lowlevel.checkpoint()
            continue
        async with stream:
            data = b""
            try:
                await stream.send_all(stalled_head(token))
                heads.sent(socket_no)
                while chunk := await stream.receive_some():
                    data += chunk
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            answers.append(data[:400])


async def test_one_org_stalling_mid_body_leaves_another_org_its_latency(
    database_url: str, tmp_path: Path
) -> None:
    """60 sockets of org-a that send a head and stall mid-body, reconnecting as soon as
    they are closed, held every connection slot of a 48-connection gateway for the body
    timeout: org-b's requests waited in the backlog (40 s timeouts at the probe's
    scale). Past its share (a quarter of the connections in flight, derived from
    ``--max-http-connections``) org-a is answered 429 as soon as a head is read, before
    the body, and the connection closes, so org-b is served at once. The gateway is a
    real ``sheetplane serve`` process: the hostile sockets run in this one."""
    tokens = {TOKEN_A: ORG_A, TOKEN_A2: ORG_A, TOKEN_B: ORG_B}
    options = secret_file_options(tmp_path, database_url, tokens)
    async with serving(*options, "--max-http-connections", "48", tmp_path=tmp_path) as served:
        port = int(served.base_url.rsplit(":", 1)[1])
        heads = Heads(HOSTILE_SOCKETS)
        answers: list[bytes] = []
        latencies: list[float] = []
        async with trio.open_nursery() as hostile:
            for n in range(HOSTILE_SOCKETS):
                token = TOKEN_A if n % 2 else TOKEN_A2
                hostile.start_soon(stall_forever, port, token, n, heads, answers)
            # Every hostile socket has connected and sent its head at least once.
            with trio.fail_after(60):
                await heads.all_sent.wait()
            for _ in range(10):
                async with httpx.AsyncClient(base_url=served.base_url, timeout=60) as http:
                    started = trio.current_time()
                    response = await http.post(
                        RUNTIME_PATH,
                        json={"action": "resolve_play", "playRef": "no-such-play"},
                        headers={"authorization": f"Bearer {TOKEN_B}"},
                    )
                    latencies.append(trio.current_time() - started)
                assert response.status_code == 200, response.text
            hostile.cancel_scope.cancel()
    assert max(latencies) < OTHER_TENANT_P100_S, latencies
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 429 ")]
    assert refused, answers[:3]
    assert b'"code":"gateway_tenant_cap"' in refused[0]
    assert b'"retry_after_ms":' in refused[0]
    assert b"connection: close" in refused[0].lower()


# --- second pass, finding 4: memory settings are bounded by their effect ----------------

#: A small bound for the test (the budget's is 240 MiB): what one hash aggregate of
#: three million groups under ``work_mem = '4GB'`` passes within a second.
TEST_MEMORY_BOUND = 64 * MiB
HASHED = "SELECT count(*) FROM (SELECT x FROM generate_series(1, 3000000) AS x GROUP BY x) AS g"


def hash_aggregate(url: str, *settings: str) -> BaseException | None:
    """As the role: ``settings``, then the big hash aggregate; the error that ended it."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in settings:
            conn.execute(statement)
        plan = conn.execute("EXPLAIN " + HASHED).fetchall()
        assert any("HashAggregate" in row[0] for row in plan), plan
        try:
            conn.execute(HASHED).fetchall()
        except psycopg.OperationalError as exc:
            return exc
    return None


async def test_a_session_raising_work_mem_is_ended_at_its_memory_bound(database_url: str) -> None:
    """A scoped role ``SET work_mem = '4GB'`` and ``hash_mem_multiplier`` (user settings
    no grant can refuse) and persisted them with ``ALTER ROLE current_user SET``; one
    backend reached 1.6 GB. The watchdog reads each session backend's private memory
    on the database server and ends the backend past the bound, whatever it set."""
    # An org of its own: this gateway cannot reclaim the sessions the shared one minted.
    async with running_gateway(
        database_url,
        tokens={TOKEN_A: f"org-memory-{uuid.uuid4().hex[:8]}"},
        session_max_backend_memory_bytes=TEST_MEMORY_BOUND,
    ) as gw:
        assert gw.state.reaper.memory_watch
        namespace = f"ns_{uuid.uuid4().hex[:12]}"
        await admit(gw, TOKEN_A, namespace)
        _, url = await mint(gw, TOKEN_A, namespace, ["rows.read"])
        with trio.fail_after(60):
            ended = await trio.to_thread.run_sync(
                hash_aggregate, url, "SET work_mem = '4GB'", "SET hash_mem_multiplier = 10"
            )
        assert isinstance(ended, psycopg.errors.AdminShutdown), ended
        # Persisted for the role's next sessions: bounded all the same.
        await run_sql(url, "ALTER ROLE current_user SET work_mem = '4GB'")
        with trio.fail_after(60):
            ended = await trio.to_thread.run_sync(hash_aggregate, url)
        assert isinstance(ended, psycopg.errors.AdminShutdown), ended
        # A pass counts what it ended once it is over, which may be after the session
        # saw its end: waited for, not read at once (it read 1 once in CI).
        progress = gw.state.reaper
        with trio.fail_after(10):
            while progress.over_memory < 2:
                await progress.wait_for_watchdog_pass(progress.watchdog_passes + 1)
        # A statement under the role's ordinary settings is not touched.
        _, plain = await mint(gw, TOKEN_A, namespace, ["rows.read"])
        rows = await run_sql(plain, "SELECT count(*) FROM generate_series(1, 100000)")
        assert rows == [(100000,)]


# --- second pass, finding 5: no NOTIFY reaches another org's LISTEN ---------------------


def notifications(conn: psycopg.Connection[Any], seconds: float) -> list[str] | BaseException:
    """What ``conn`` receives within ``seconds``, or the error that ended it."""
    try:
        return [n.payload for n in conn.notifies(timeout=seconds)]
    except psycopg.OperationalError as exc:
        return exc


async def test_a_session_cannot_receive_another_orgs_notify(
    own_orgs: RunningGateway, namespace: str
) -> None:
    """``pg_notify()`` is revoked but ``LISTEN`` / ``NOTIFY`` are commands no grant
    refuses, and a channel is the whole database's: org-b's role notified a channel
    org-a's role listened on, and the message arrived. The watchdog ends every session
    backend whose last statement was a LISTEN or NOTIFY, so the listener is gone
    before org-b's message is sent."""
    await admit(own_orgs, TOKEN_A, namespace)
    await admit(own_orgs, TOKEN_B, namespace)
    _, url_a = await mint(own_orgs, TOKEN_A, namespace, ["rows.read"])
    _, url_b = await mint(own_orgs, TOKEN_B, namespace, ["rows.read"])
    progress = own_orgs.state.reaper
    listener = await trio.to_thread.run_sync(
        functools.partial(psycopg.connect, url_a, autocommit=True)
    )
    try:
        await trio.to_thread.run_sync(listener.execute, "LISTEN tenancy_channel")
        with trio.fail_after(30):
            while progress.notifying < 1:
                await progress.wait_for_watchdog_pass(progress.watchdog_passes + 1)
        notifier = await trio.to_thread.run_sync(
            functools.partial(psycopg.connect, url_b, autocommit=True)
        )
        try:
            await trio.to_thread.run_sync(notifier.execute, "NOTIFY tenancy_channel, 'from org-b'")
            received = await trio.to_thread.run_sync(notifications, listener, 2.0)
            # The notifier is ended too, on a later pass.
            with trio.fail_after(30):
                while progress.notifying < 2:
                    await progress.wait_for_watchdog_pass(progress.watchdog_passes + 1)
        finally:
            await trio.to_thread.run_sync(notifier.close)
    finally:
        await trio.to_thread.run_sync(listener.close)
    assert isinstance(received, psycopg.OperationalError), received
