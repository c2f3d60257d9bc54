"""Scoped sessions against the real server and real Postgres: Postgres itself enforces
every boundary, envelopes open only for their session, secrets stay out of logs."""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from joserfc import jwe
from joserfc.jwk import OctKey, RSAKey
from psycopg import sql

from _session_helpers import aad_of, run_sql
from sheetplane import EnvelopeDecryptionError, GatewayAuthError, crypto
from sheetplane._types import CompleteRow, SheetRef
from sheetplane.gateway.client import GatewayClient
from sheetplane.gateway.server import (
    ROLE_PREFIX,
    RUNTIME_PATH,
    RunningGateway,
    reap_expired_roles,
    running_gateway,
)
from sheetplane.gateway.server._roles import create_role_statements
from sheetplane.protocol import read_contract
from sheetplane.store import open_store, sheet_names

TOKEN = "tok-security-1b2c3d4e5f"
ORG = "acme"
PLAY = "enrich-leads"
CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}
UNWRAP_KEY = os.urandom(32)


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}, unwrap_key=UNWRAP_KEY) as gw:
        yield gw


async def act(gw: RunningGateway, action: str, **fields: Any) -> Any:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        response = await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": PLAY, **fields},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
    assert response.status_code == 200, response.text
    return response.json()


async def admit(gw: RunningGateway, namespace: str, n: int = 3) -> Any:
    rows = [{"_key": f"k{i}", "email": f"u{i}@example.com"} for i in range(n)]
    return await act(
        gw,
        "start_sheet_dataset",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        rows=rows,
        runId="run-1",
    )


class Session:
    """A decrypted session answer."""

    def __init__(self, answer: dict[str, Any], url: str, key: crypto.DecryptionKey) -> None:
        self.answer = answer
        self.url = url
        self.key = key

    @property
    def aad(self) -> bytes:
        return aad_of(self.answer)

    def table(self, attr: str = "sheetTable") -> sql.Identifier:
        return sql.Identifier(self.answer["postgres"]["schema"], self.answer["postgres"][attr])

    @property
    def role(self) -> str:
        user = psycopg.conninfo.conninfo_to_dict(self.url)["user"]
        assert isinstance(user, str)
        return user


async def open_session(
    gw: RunningGateway, namespace: str, operations: list[str], ttl_seconds: int | None = None
) -> Session:
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    fields: dict[str, Any] = {
        "target": {"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        "operations": operations,
        "sheetContract": CONTRACT,
        "postgresUrlEncryption": key.encryption_request(),
    }
    if ttl_seconds is not None:
        fields["ttlSeconds"] = ttl_seconds
    answer = await act(gw, "create_db_session", **fields)
    url = crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))
    return Session(answer, url, key)


# --- Postgres enforces the grants -------------------------------------------------------


async def test_read_role_cannot_insert_update_or_delete(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, namespace)
    session = await open_session(gateway, namespace, ["rows.read"])
    table = session.table()
    rows = await run_sql(session.url, sql.SQL("SELECT _key FROM {} ORDER BY _key").format(table))
    assert [r[0] for r in rows] == ["k0", "k1", "k2"]
    for statement in (
        sql.SQL("UPDATE {} SET _status = 'failed'").format(table),
        sql.SQL("INSERT INTO {} (_key) VALUES ('intruder')").format(table),
        sql.SQL("DELETE FROM {}").format(table),
        sql.SQL("INSERT INTO {} (kind, row_count) VALUES ('x', 0)").format(
            session.table("eventTable")
        ),
        sql.SQL("UPDATE {} SET total = 0").format(session.table("summaryTable")),
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await run_sql(session.url, statement)


async def test_session_for_one_namespace_cannot_read_another(
    gateway: RunningGateway, namespace: str
) -> None:
    other = f"{namespace}_b"
    await admit(gateway, namespace)
    await admit(gateway, other)
    session = await open_session(gateway, namespace, ["rows.read", "rows.upsert"])
    other_names = sheet_names(SheetRef(ORG, PLAY, other))
    assert other_names.schema == session.answer["postgres"]["schema"]  # same org schema
    for attr in ("sheet_table", "summary_table", "event_table"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await run_sql(session.url, sql.SQL("SELECT * FROM {}").format(other_names.ident(attr)))


async def test_upsert_role_writes_rows_but_cannot_delete_or_create(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, namespace)
    session = await open_session(gateway, namespace, ["rows.upsert"])
    table = session.table()
    await run_sql(
        session.url, sql.SQL("UPDATE {} SET _error = 'x' WHERE _key = 'k0'").format(table)
    )
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await run_sql(session.url, sql.SQL("DELETE FROM {}").format(table))
    schema = sql.Identifier(session.answer["postgres"]["schema"])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await run_sql(session.url, sql.SQL("CREATE TABLE {}.t (x int)").format(schema))


async def test_write_role_runs_the_stores_terminal_write(
    gateway: RunningGateway, namespace: str
) -> None:
    """The direct road: the store's fenced write path runs on a scoped session's URL."""
    admission = await admit(gateway, namespace)
    session = await open_session(gateway, namespace, ["rows.read", "rows.upsert"])
    sheet = SheetRef(ORG, PLAY, namespace)
    contract = read_contract(CONTRACT)
    async with open_store(session.url, max_connections=1) as store:
        result = await store.complete_map_rows(
            sheet,
            contract,
            [CompleteRow("k1", {"score": 7})],
            run_id="run-1",
            write_version=admission["writeVersion"],
        )
        assert result.committed_keys == ("k1",)
        rows = await store.read_rows_by_keys(sheet, ["k1"])
    assert rows[0]["score"] == 7


async def test_write_roles_run_the_stores_append_and_replace(
    gateway: RunningGateway, namespace: str
) -> None:
    """Each write operation's grants cover exactly what the store's write path needs."""
    await admit(gateway, namespace)
    sheet = SheetRef(ORG, PLAY, namespace)
    append = await open_session(gateway, namespace, ["rows.append"])
    async with open_store(append.url, max_connections=1) as store:
        result = await store.append_rows(
            sheet, [{"_key": "k9", "email": "u9@example.com"}], idempotency_key="a-1"
        )
        assert result.written == 1
    replace = await open_session(gateway, namespace, ["rows.replace"])
    async with open_store(replace.url, max_connections=1) as store:
        await store.replace_rows(
            sheet, [{"_key": "only", "email": "o@example.com"}], idempotency_key="r-1"
        )
        assert await store.count(sheet) == 1
        assert await store.read_rows_by_keys(sheet, ["k0"]) == []
    # The append role could not have done the replace.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await run_sql(append.url, sql.SQL("DELETE FROM {}").format(append.table()))


def test_role_statements_grant_only_what_the_operations_need() -> None:
    names = sheet_names(SheetRef("o", "p", "n"))
    rendered = [
        s.as_string(None)
        for s in create_role_statements(
            "sp_sess_x", "SCRAM-SHA-256$v", "2030-01-01T00:00:00.000Z", names, ["rows.read"]
        )
    ]
    assert rendered[0] == (
        'CREATE ROLE "sp_sess_x" WITH LOGIN NOSUPERUSER NOINHERIT NOCREATEDB NOCREATEROLE'
        " NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 4 PASSWORD 'SCRAM-SHA-256$v'"
        " VALID UNTIL '2030-01-01T00:00:00.000Z'"
    )
    assert rendered[1:3] == [
        """ALTER ROLE "sp_sess_x" SET "statement_timeout" = '20000ms'""",
        """ALTER ROLE "sp_sess_x" SET "idle_in_transaction_session_timeout" = '5000ms'""",
    ]
    grants = " ".join(rendered[3:])
    for forbidden in ("INSERT", "UPDATE", "DELETE", names.event_table):
        assert forbidden not in grants
    writes = " ".join(
        s.as_string(None)
        for s in create_role_statements("r", "v", "t", names, ["rows.append"], columns=["email"])
    )
    assert "DELETE" not in writes
    assert (
        'GRANT SELECT, INSERT ("_key", "_status", "_run_id", "_input_index", "email") ON TABLE'
        f' "{names.schema}"."{names.sheet_table}"'
    ) in writes
    replace = " ".join(
        s.as_string(None) for s in create_role_statements("r", "v", "t", names, ["rows.replace"])
    )
    # No table-level UPDATE on the rows; DELETE only for a replace (the seed's replace
    # deletes the rows itself; docs/gateway.md states what that lets through).
    assert (
        'GRANT SELECT, INSERT ("_key", "_status", "_run_id", "_input_index"), UPDATE ("_status",'
        ' "_run_id", "_error", "_updated_at", "_cell_meta", "_input_index"), DELETE ON TABLE'
        f' "{names.schema}"."{names.sheet_table}"'
    ) in replace
    # A write session inherits the sheet's owner role only when the minting code found
    # the DDL guard installed and the role owning the rows (``owner``).
    assert "NOINHERIT" in writes and 'GRANT "sp_own' not in writes
    owned = [
        s.as_string(None)
        for s in create_role_statements("r", "v", "t", names, ["rows.append"], owner="sp_own_x")
    ]
    assert " INHERIT " in owned[0] and owned[-1] == 'GRANT "sp_own_x" TO "r"'
    clear = names.sheet_table.removesuffix("_rows") + "_clear"
    assert f'GRANT EXECUTE ON FUNCTION "{names.schema}"."{clear}"() TO "r"' in replace


# --- expiry and the reaper --------------------------------------------------------------


async def wait_until_expired(expires_at: str) -> None:
    """Real time, for this one test: Postgres checks VALID UNTIL against its own clock."""
    moment = dt.datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    remaining = (moment - dt.datetime.now(dt.UTC)).total_seconds()
    await trio.sleep(max(0.0, remaining) + 0.2)


async def role_exists(database_url: str, role: str) -> bool:
    rows = await run_sql(
        database_url, sql.SQL("SELECT 1 FROM pg_roles WHERE rolname = %s"), (role,)
    )
    return bool(rows)


async def test_expired_role_cannot_log_in_and_the_reaper_drops_it(
    gateway: RunningGateway, database_url: str, namespace: str
) -> None:
    await admit(gateway, namespace)
    session = await open_session(gateway, namespace, ["rows.read"], ttl_seconds=1)
    assert session.role.startswith(ROLE_PREFIX)
    # Before expiry it logs in.
    assert await run_sql(session.url, sql.SQL("SELECT 1")) == [(1,)]
    held = await trio.to_thread.run_sync(psycopg.connect, session.url)
    try:
        await wait_until_expired(session.answer["expiresAt"])
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            await run_sql(session.url, sql.SQL("SELECT 1"))
        assert await role_exists(database_url, session.role)

        async with open_store(database_url, max_connections=1) as store:
            assert await reap_expired_roles(store) >= 1
        assert not await role_exists(database_url, session.role)
        # The connection it still held was ended too.
        with pytest.raises(psycopg.OperationalError):
            await trio.to_thread.run_sync(held.execute, "SELECT 1")
    finally:
        await trio.to_thread.run_sync(held.close)


async def test_the_servers_reaper_task_drops_expired_roles(
    database_url: str, namespace: str
) -> None:
    async with running_gateway(database_url, tokens={TOKEN: ORG}, reaper_interval_ms=50) as gw:
        await admit(gw, namespace)
        session = await open_session(gw, namespace, ["rows.read"], ttl_seconds=1)
        await wait_until_expired(session.answer["expiresAt"])
        progress = gw.state.reaper
        with trio.fail_after(30):
            # A pass that starts after expiry must drop it: wait for two more passes.
            await progress.wait_for_pass(progress.passes + 2)
        assert not await role_exists(database_url, session.role)
        assert progress.dropped >= 1


async def test_ttl_is_clamped_to_the_session_budget(database_url: str, namespace: str) -> None:
    async with running_gateway(database_url, tokens={TOKEN: ORG}, session_ttl_ms=60_000) as gw:
        session = await open_session(gw, namespace, ["rows.read"], ttl_seconds=3_600)
    expires = dt.datetime.fromisoformat(session.answer["expiresAt"].replace("Z", "+00:00"))
    assert expires <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)


# --- envelopes --------------------------------------------------------------------------


async def test_envelope_is_standard_jwe_bound_to_its_session(
    gateway: RunningGateway, namespace: str
) -> None:
    session = await open_session(gateway, namespace, ["rows.read"])
    envelope = session.answer["encryptedPostgresUrl"]
    opened = jwe.decrypt_json(
        dict(envelope),
        RSAKey.import_key(session.key.private_key),
        algorithms=["RSA-OAEP-256", "A256GCM"],
    )
    assert opened.plaintext.decode() == session.url
    assert opened.aad == session.aad

    # Tampered ciphertext.
    tampered = dict(envelope)
    flipped = "A" if envelope["ciphertext"][0] != "A" else "B"
    tampered["ciphertext"] = flipped + envelope["ciphertext"][1:]
    with pytest.raises(EnvelopeDecryptionError):
        crypto.decrypt_postgres_url(tampered, session.key, session.aad)
    # The AAD of another session (another namespace, or a later expiry).
    for change in ({"tableNamespace": "elsewhere"},):
        other = {**session.answer, "target": {**session.answer["target"], **change}}
        with pytest.raises(EnvelopeDecryptionError):
            crypto.decrypt_postgres_url(envelope, session.key, aad_of(other))
    later = {**session.answer, "expiresAt": "2999-01-01T00:00:00.000Z"}
    with pytest.raises(EnvelopeDecryptionError):
        crypto.decrypt_postgres_url(envelope, session.key, aad_of(later))
    # Another session's key.
    second = await open_session(gateway, namespace, ["rows.read"])
    with pytest.raises(EnvelopeDecryptionError):
        crypto.decrypt_postgres_url(envelope, second.key, session.aad)
    assert second.url != session.url


async def test_preloaded_session_opens_with_the_unwrap_key_only(
    gateway: RunningGateway, namespace: str
) -> None:
    await admit(gateway, namespace)
    answer = await gateway.mint_preloaded_session(
        org_id=ORG, play_name=PLAY, table_namespace=namespace, operations=["rows.read"]
    )
    envelope = answer["encryptedPostgresUrl"]
    url = crypto.decrypt_with_unwrap_key(envelope, UNWRAP_KEY, aad_of(answer))
    assert await run_sql(
        url,
        sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(answer["postgres"]["schema"], answer["postgres"]["sheetTable"])
        ),
    ) == [(3,)]
    opened = jwe.decrypt_json(
        dict(envelope), OctKey.import_key(UNWRAP_KEY), algorithms=["A256KW", "A256GCM"]
    )
    assert opened.plaintext.decode() == url
    with pytest.raises(EnvelopeDecryptionError):
        crypto.decrypt_with_unwrap_key(envelope, os.urandom(32), aad_of(answer))


# --- secrets stay out of logs and bodies ------------------------------------------------


async def test_plaintext_url_never_in_logs_or_bodies(
    gateway: RunningGateway,
    database_url: str,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await admit(gateway, namespace)
    session = await open_session(gateway, namespace, ["rows.read"])
    password = psycopg.conninfo.conninfo_to_dict(session.url)["password"]
    assert isinstance(password, str) and len(password) >= 32
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as http:
        bodies = [
            (
                await http.post(
                    RUNTIME_PATH,
                    json={"action": action, "playName": PLAY, **fields},
                    headers={"authorization": f"Bearer {TOKEN}"},
                )
            ).text
            for action, fields in [
                (
                    "create_db_session",
                    {
                        "target": {"tableNamespace": namespace, "logicalTable": "sheet_rows"},
                        "operations": ["rows.read"],
                    },
                ),
                (
                    "create_db_session",
                    {
                        "target": {"tableNamespace": namespace, "logicalTable": "sheet_rows"},
                        "operations": ["rows.read"],
                        "postgresUrlEncryption": {
                            "alg": "RSA-OAEP-256+A256GCM",
                            "publicKeyJwk": {"kty": "RSA"},
                        },
                    },
                ),
                (
                    "runtime_sheet_read_rows",
                    {"input": {"tableNamespace": namespace, "limit": 1, "offset": 0}},
                ),
            ]
        ]
    server_password = psycopg.conninfo.conninfo_to_dict(database_url)["password"]
    for text in [caplog.text, *bodies, repr(gateway), repr(gateway.config), repr(gateway.state)]:
        assert session.url not in text
        assert password not in text
        assert str(server_password) not in text
        assert TOKEN not in text


async def test_wrong_or_missing_token_is_refused(gateway: RunningGateway) -> None:
    async with GatewayClient(gateway.base_url, "tok-wrong", play_name=PLAY) as client:
        with pytest.raises(GatewayAuthError) as caught:
            await client.summary("anything")
    assert caught.value.status == 401
    assert "tok-wrong" not in str(caught.value)
    async with httpx.AsyncClient(base_url=gateway.base_url) as http:
        response = await http.post(RUNTIME_PATH, json={"action": "ensure_sheet"})
    assert response.status_code == 401
    assert response.json() == {"error": "missing executor token", "code": "unauthorized"}
