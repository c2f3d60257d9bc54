"""A gateway whose Postgres role is not a superuser, on the real server: with
``CREATEROLE``, ``CREATE`` on its database, the hardening statements run by an
operator, and ``pg_read_all_stats`` + ``pg_signal_backend``, its reaper drops
expired session roles and its watchdog ends overrunning and idle-in-transaction
session backends; without those two roles it refuses to start, naming them."""

from __future__ import annotations

import select
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import sql

from _serve_helpers import FIRST_LINE_TIMEOUT_S, SHEETPLANE
from _session_helpers import aad_of, run_sql
from sheetplane import DatabaseNotHardenedError, GatewayRoleLacksPrivilegesError, crypto
from sheetplane._types import ContractColumn, SheetContract, SheetRef
from sheetplane.gateway.server import RUNTIME_PATH, hardening_statements, running_gateway
from sheetplane.gateway.server._hardening import GATEWAY_MEMBERSHIPS, harden_database
from sheetplane.runtime import open_runtime
from sheetplane.store import open_store, sheet_names

TOKEN = "tok-nonsuper-5d1c"
ORG = "org-nonsuper"
PLAY = "nonsuper-play"
CONTRACT = {"columns": [{"id": "email", "sqlName": "email", "source": "input"}]}
#: Short bounds, so the watchdog's work shows within a second or two.
QUICK = {
    "session_statement_timeout_ms": 1_000,
    "session_idle_timeout_ms": 500,
    "session_transaction_timeout_ms": 4_000,
    "watchdog_interval_ms": 100,
    "reaper_interval_ms": 100,
}
#: A statement that runs until something ends it (``pg_sleep`` is revoked).
ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


class GatewayDatabase:
    """A fresh database and a non-superuser gateway role on it."""

    def __init__(self, admin_url: str) -> None:
        tag = uuid.uuid4().hex[:10]
        self.database = f"sp_nonsuper_{tag}"
        self.role = f"sp_test_gw_{tag}"
        self.password = uuid.uuid4().hex
        self.admin_url = psycopg.conninfo.make_conninfo(admin_url, dbname=self.database)
        self.url = psycopg.conninfo.make_conninfo(
            admin_url, dbname=self.database, user=self.role, password=self.password
        )

    async def hardened(self, *, withhold: tuple[str, ...] = ()) -> list[str]:
        """Run, as a superuser, what docs/gateway.md tells an operator to run
        (less the grants of the roles in ``withhold``); the statements run."""

        def run() -> list[str]:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                texts = [s.as_string(conn) for s in hardening_statements(conn, self.role)]
                if withhold:
                    granted = [m for m in GATEWAY_MEMBERSHIPS if m not in withhold]
                    texts = [t for t in texts if not t.startswith('GRANT "pg_')]
                    if granted:
                        texts.append(
                            sql.SQL("GRANT {} TO {}")
                            .format(
                                sql.SQL(", ").join(map(sql.Identifier, granted)),
                                sql.Identifier(self.role),
                            )
                            .as_string(conn)
                        )
                for text in texts:
                    conn.execute(text.encode())
                return texts

        return await trio.to_thread.run_sync(run)


@pytest.fixture
async def gateway_database(database_url: str) -> AsyncIterator[GatewayDatabase]:
    db = GatewayDatabase(database_url)
    await run_sql(database_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db.database)))
    await run_sql(
        database_url,
        sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(
            sql.Identifier(db.role), sql.Literal(db.password)
        ),
    )
    await run_sql(
        database_url,
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(db.database), sql.Identifier(db.role)
        ),
    )
    try:
        yield db
    finally:
        await run_sql(
            database_url,
            sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(db.database)),
        )
        # Session roles the test left (each created by the gateway role), and the
        # sheets' owner roles (the gateway role is a member of each).
        for (role,) in await run_sql(
            database_url,
            "SELECT r.rolname FROM pg_roles r JOIN pg_auth_members m ON m.roleid = r.oid"
            " WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = %s)"
            " AND (starts_with(r.rolname, 'sp_sess_') OR starts_with(r.rolname, 'sp_own_'))",
            (db.role,),
        ):
            await run_sql(
                database_url, sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role))
            )
        await run_sql(database_url, sql.SQL("DROP ROLE {}").format(sql.Identifier(db.role)))


async def act(base_url: str, action: str, **fields: Any) -> Any:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        response = await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": PLAY, **fields},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
    assert response.status_code == 200, response.text
    return response.json()


async def mint(base_url: str, namespace: str, ttl_seconds: int = 600) -> tuple[str, str]:
    """``(role, url)`` of a new ``rows.read`` session."""
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    answer = await act(
        base_url,
        "create_db_session",
        target={"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        operations=["rows.read"],
        sheetContract=CONTRACT,
        ttlSeconds=ttl_seconds,
        postgresUrlEncryption=key.encryption_request(),
    )
    url = crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))
    return str(psycopg.conninfo.conninfo_to_dict(url)["user"]), url


async def role_exists(admin_url: str, role: str) -> bool:
    rows = await run_sql(admin_url, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,))
    return bool(rows[0][0])


async def ended_by_the_gateway(url: str, work: Any) -> BaseException:
    """Run ``work(conn)`` as the session role; the exception that ended it (within 20 s)."""

    def run() -> BaseException:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                work(conn)
        except psycopg.Error as exc:
            return exc
        raise AssertionError("the work returned: nothing ended it")

    with trio.fail_after(20):
        return await trio.to_thread.run_sync(run, abandon_on_cancel=True)


async def test_a_gateway_that_is_not_superuser_reaps_expired_roles_and_ends_overrunning_backends(
    gateway_database: GatewayDatabase,
    namespace: str,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = gateway_database
    # An expired session role another gateway made (roles are the cluster's): not
    # this gateway's to drop, so its reaper must not try.
    foreign = f"sp_sess_foreign{uuid.uuid4().hex[:8]}"
    await run_sql(
        database_url,
        sql.SQL("CREATE ROLE {} LOGIN VALID UNTIL '2000-01-01'").format(sql.Identifier(foreign)),
    )
    statements = await db.hardened()
    # What the operator ran grants both predefined roles.
    assert any(all(f'"{m}"' in t for m in GATEWAY_MEMBERSHIPS) for t in statements), statements
    async with running_gateway(db.url, tokens={TOKEN: ORG}, **QUICK) as gw:
        assert not (
            await run_sql(db.url, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        )[0][0]
        await act(gw.base_url, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
        progress = gw.state.reaper

        # The watchdog: a statement whose timeout the role took away...
        _, url = await mint(gw.base_url, namespace)

        def overrun(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SET statement_timeout = 0")
            conn.execute(ENDLESS)

        ended = progress.ended
        assert isinstance(await ended_by_the_gateway(url, overrun), psycopg.OperationalError)
        with trio.fail_after(5):  # the pass that ended it records it once its query returns
            await progress.wait_for_ended(ended + 1)

        # ...and an idle transaction that lifted its own limit.
        def idle(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SET idle_in_transaction_session_timeout = 0")
            conn.execute("BEGIN")
            conn.execute("SELECT 1")
            # Idle in transaction until the server closes the connection.
            select.select([conn.fileno()], [], [], 30)
            conn.execute("SELECT 1")

        ended = progress.ended
        assert isinstance(await ended_by_the_gateway(url, idle), psycopg.OperationalError)
        with trio.fail_after(5):  # the pass that ended it records it once its query returns
            await progress.wait_for_ended(ended + 1)

        ended_by_time = gw.state.metrics.registry.get_sample_value(
            "sheetplane_session_backends_ended_total", {"reason": "time_bound"}
        )
        assert ended_by_time is not None and ended_by_time >= 2

        # The reaper: an expired role, still connected, is ended and dropped.
        role, short_url = await mint(gw.base_url, namespace, ttl_seconds=1)
        held = await trio.to_thread.run_sync(psycopg.connect, short_url)
        try:
            with trio.fail_after(20):
                while await role_exists(db.admin_url, role):
                    await progress.wait_for_pass(progress.passes + 1)
            with pytest.raises(psycopg.OperationalError):
                await trio.to_thread.run_sync(held.execute, "SELECT 1")
        finally:
            await trio.to_thread.run_sync(held.close)
            await run_sql(database_url, sql.SQL("DROP ROLE {}").format(sql.Identifier(foreign)))
    # Every pass dropped what it tried: the other gateway's role was left alone.
    assert not [r for r in caplog.records if "could not drop" in r.getMessage()]


@pytest.mark.parametrize("withheld", [("pg_signal_backend",), GATEWAY_MEMBERSHIPS])
async def test_a_gateway_that_is_not_superuser_refuses_to_start_without_pg_signal_backend_naming_it(
    gateway_database: GatewayDatabase, withheld: tuple[str, ...]
) -> None:
    db = gateway_database
    await db.hardened(withhold=withheld)
    async with open_store(db.url, max_connections=1) as store:
        with pytest.raises(GatewayRoleLacksPrivilegesError) as caught:
            await harden_database(store)
    assert caught.value.missing == withheld
    assert caught.value.code == "gateway_role_lacks_privileges"
    assert isinstance(caught.value, DatabaseNotHardenedError)
    for name in withheld:
        assert name in str(caught.value)
    assert db.password not in str(caught.value)
    # The gateway itself does not start: it raises the same error, unwrapped.
    with pytest.raises(GatewayRoleLacksPrivilegesError):
        async with running_gateway(db.url, tokens={TOKEN: ORG}):
            raise AssertionError("the gateway started")


async def test_sheetplane_serve_as_a_role_without_pg_signal_backend_exits_2_naming_it(
    gateway_database: GatewayDatabase, tmp_path: Path
) -> None:
    """Never ``listening on``: one line on stderr names what is missing, not the URL."""
    db = gateway_database
    await db.hardened(withhold=("pg_signal_backend",))
    url_file = tmp_path / "database-url"
    url_file.write_text(db.url)
    with trio.fail_after(FIRST_LINE_TIMEOUT_S):
        done = await trio.run_process(
            [
                *SHEETPLANE,
                "serve",
                "--database-url-file",
                str(url_file),
                "--token",
                f"{TOKEN}={ORG}",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 2, stderr[-2000:]
    assert "listening on" not in stdout
    refusal = [line for line in stderr.splitlines() if "the gateway cannot start" in line]
    assert len(refusal) == 1, stderr[-2000:]
    assert "pg_signal_backend" in refusal[0]
    assert "Traceback" not in stderr
    assert db.password not in stdout + stderr


async def test_the_direct_roads_one_transaction_works_through_a_gateway_that_is_not_superuser(
    gateway_database: GatewayDatabase, namespace: str
) -> None:
    # The begin, taken and finish functions are the gateway's (their ANALYZE needs its
    # privileges on a rows table the sheet's owner role holds; the marker row needs the
    # lock table, which only its owner, the gateway, sees).
    db = gateway_database
    await db.hardened()
    contract = SheetContract((ContractColumn("email", "email", "input"),))
    async with (
        running_gateway(db.url, tokens={TOKEN: ORG}, **QUICK) as gw,
        open_runtime(
            base_url=gw.base_url,
            token=TOKEN,
            org_id=ORG,
            play_name=PLAY,
            run_id="run-1",
            strategy="direct",
        ) as rt,
    ):
        rows = [{"_key": f"k{i:05d}", "email": f"{i}@x.io"} for i in range(3_000)]
        admission = await rt.writer(namespace, contract).start(rows)
        assert (admission.write_version, admission.inserted) == (1, 3_000)
        assert await rt.dataset(namespace).count() == 3_000
    names = sheet_names(SheetRef(ORG, PLAY, namespace))
    staged = await run_sql(
        db.url, sql.SQL("SELECT count(*) FROM {}").format(names.ident("admissions_table"))
    )
    events = await run_sql(
        db.url,
        sql.SQL("SELECT kind, write_version, row_count FROM {}").format(names.ident("event_table")),
    )
    marker = await run_sql(
        db.url, sql.SQL("SELECT count(*) FROM {}").format(names.ident("lock_table"))
    )
    assert (staged, events, marker) == ([(0,)], [("admission", 1, 3_000)], [(0,)])
