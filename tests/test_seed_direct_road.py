"""The seed's direct road (0.1.2's ``runtime-api.ts`` statements, by their SQL shape)
on sessions minted by ``create_db_session`` with public-key encryption, against
the reference gateway on real Postgres: what the seed's statements write, the
gateway reads back, and the other way round; the session may run the seed's
``ALTER TABLE`` and no other DDL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import sql

from _seed_sql import SeedSession
from _session_helpers import aad_of, run_sql
from sheetplane import crypto, derive_row_identity
from sheetplane._types import (
    CompleteRow,
    ContractColumn,
    FailRow,
    SheetContract,
    SheetRef,
    Summary,
)
from sheetplane.crypto import PUBLIC_KEY_ENVELOPE_ALG
from sheetplane.errors import EnvelopeDecryptionError
from sheetplane.gateway.server import RUNTIME_PATH, RunningGateway, running_gateway
from sheetplane.protocol import prepare_chunk
from sheetplane.store import SheetStore, open_store, sheet_names
from sheetplane.store._seedlayout import OWNER_ROLE_PREFIX, SEED_EVENT_COLUMNS
from test_gateway_nonsuperuser import (
    GatewayDatabase,
    gateway_database,  # noqa: F401 (a fixture)
)

TOKEN = "tok-seed-road-4b1e"
ORG = "org-seed-road"
PLAY = "seed-road-play"
CONTRACT = {
    "columns": [
        {"id": "email", "sqlName": "email", "source": "input", "field": "email"},
        {"id": "score", "sqlName": "score", "source": "output"},
    ]
}

pytestmark = pytest.mark.usefixtures("session_roles_reaped")


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN: ORG}) as gw:
        yield gw


@pytest.fixture
def namespace() -> str:
    return f"seed_{uuid.uuid4().hex[:10]}"


async def act(gw: RunningGateway, action: str, **fields: Any) -> Any:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=60) as http:
        response = await http.post(
            RUNTIME_PATH,
            json={"action": action, "playName": PLAY, **fields},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
    assert response.status_code == 200, response.text
    return response.json()


async def mint(gw: RunningGateway, namespace: str, operations: list[str]) -> SeedSession:
    """A session as the seed asks for it (``postgresUrlEncryption`` with its public key)."""
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    answer = await act(
        gw,
        "create_db_session",
        target={"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        operations=operations,
        limits={"maxRows": 100},
        sheetContract=CONTRACT,
        ttlSeconds=600,
        postgresUrlEncryption=key.encryption_request(),
    )
    url = crypto.decrypt_postgres_url(answer["encryptedPostgresUrl"], key, aad_of(answer))
    return SeedSession(answer, url, CONTRACT)


def rows_of(*keys: str) -> list[dict[str, Any]]:
    return [{"__deeplineRowKey": k, "email": f"{k}@example.com"} for k in keys]


async def gateway_rows(gw: RunningGateway, namespace: str) -> dict[str, dict[str, Any]]:
    query = {"tableNamespace": namespace, "limit": 100, "offset": 0}
    page = await act(gw, "runtime_sheet_read_rows", input=query)
    return {row["_key"]: row for row in page["rows"]}


async def summary(gw: RunningGateway, namespace: str) -> dict[str, int]:
    answer = await act(gw, "runtime_sheet_summary", tableNamespace=namespace)
    return {k: answer[k] for k in ("total", "queued", "running", "completed", "failed")}


async def test_a_public_key_session_names_its_alg_and_the_runtime_still_opens_it(
    gateway: RunningGateway, namespace: str
) -> None:
    key = await trio.to_thread.run_sync(crypto.generate_decryption_key)
    answer = await act(
        gateway,
        "create_db_session",
        target={"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        operations=["rows.read"],
        sheetContract=CONTRACT,
        postgresUrlEncryption=key.encryption_request(),
    )
    envelope = answer["encryptedPostgresUrl"]
    # The seed branches on this member to unwrap with the private key it kept.
    assert envelope["alg"] == PUBLIC_KEY_ENVELOPE_ALG == "RSA-OAEP-256+A256GCM"
    url = crypto.decrypt_postgres_url(envelope, key, aad_of(answer))
    assert url.startswith("postgresql://")
    with pytest.raises(EnvelopeDecryptionError, match="alg member"):
        crypto.decrypt_postgres_url({**envelope, "alg": "A256KW+A256GCM"}, key, aad_of(answer))
    # An envelope without the member (a gateway before it) still opens.
    bare = {k: v for k, v in envelope.items() if k != "alg"}
    assert crypto.decrypt_postgres_url(bare, key, aad_of(answer)) == url


async def test_the_seeds_admission_completion_and_count_agree_with_the_gateway(
    gateway: RunningGateway, namespace: str
) -> None:
    await act(gateway, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
    seed = await mint(gateway, namespace, ["rows.read", "rows.upsert"])
    first = await trio.to_thread.run_sync(seed.start, rows_of("a", "b", "c"), "run-1")
    assert (first["inserted"], first["skipped"]) == (3, 0)
    assert first["pendingKeys"] == ["a", "b", "c"]
    assert await trio.to_thread.run_sync(seed.count) == 3
    assert await summary(gateway, namespace) == {
        "total": 3,
        "queued": 3,
        "running": 0,
        "completed": 0,
        "failed": 0,
    }
    done = [
        {"key": "a", "data": {"score": 1}, "cellMetaPatch": {"score": {"source": "t"}}},
        {"key": "b", "data": {"score": 2}},
    ]
    assert await trio.to_thread.run_sync(seed.complete, done, "run-1") == 2
    read = await gateway_rows(gateway, namespace)
    assert {k: (r["_status"], r.get("score")) for k, r in read.items()} == {
        "a": ("enriched", 1),
        "b": ("enriched", 2),
        "c": ("pending", None),
    }
    assert read["a"]["email"] == "a@example.com"
    assert await summary(gateway, namespace) == {
        "total": 3,
        "queued": 1,
        "running": 0,
        "completed": 2,
        "failed": 0,
    }
    # Re-admitted with one new row and a duplicate: the seed's counts.
    again = await trio.to_thread.run_sync(seed.start, rows_of("a", "b", "c", "d", "d"), "run-2")
    assert (again["inserted"], again["skipped"]) == (1, 4)
    assert again["pendingKeys"] == ["c", "d"]
    assert [r["__deeplineRowKey"] for r in again["completedRows"]] == ["a", "b"]
    assert again["completedRows"][0]["score"] == 1
    assert await trio.to_thread.run_sync(seed.count) == 4
    assert (await summary(gateway, namespace))["total"] == 4
    # The gateway's own admission of the same sheet after the seed's: it sees the
    # seed's rows (two enriched), and the seed's count follows it.
    admitted = await act(
        gateway,
        "start_sheet_dataset",
        tableNamespace=namespace,
        sheetContract=CONTRACT,
        rows=rows_of("a", "e"),
        runId="run-3",
    )
    assert admitted["inserted"] == 1
    assert [r["_key"] for r in admitted["completedRows"]] == ["a"]
    assert await trio.to_thread.run_sync(seed.count) == 5
    # The seed's per-row events carry its columns.
    events = await run_sql(
        gateway.config.database_url,
        sql.SQL(
            "SELECT _key, _status, _stage, play_name, table_namespace FROM {} "
            "WHERE play_name IS NOT NULL ORDER BY id"
        ).format(sql.Identifier(seed.schema, seed.answer["postgres"]["eventTable"])),
    )
    assert events[:3] == [
        ("a", "pending", "queued", PLAY, namespace),
        ("b", "pending", "queued", PLAY, namespace),
        ("c", "pending", "queued", PLAY, namespace),
    ]
    assert ("a", "enriched", "completed", PLAY, namespace) in events


def identity(namespace: str) -> Any:
    return lambda row: derive_row_identity(row, namespace)


async def test_the_seeds_upsert_append_and_replace_write_what_the_gateway_reads(
    gateway: RunningGateway, namespace: str
) -> None:
    await act(gateway, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
    derive = identity(namespace)
    upsert = await mint(gateway, namespace, ["rows.upsert"])
    rows = [{"email": "x@example.com"}, {"email": "y@example.com"}, {"email": "x@example.com"}]
    written = await trio.to_thread.run_sync(upsert.write, rows, "run-u", "upsert", "k1", derive)
    assert written == 2
    append = await mint(gateway, namespace, ["rows.append"])
    appended = await trio.to_thread.run_sync(
        append.write, [{"email": "z@example.com"}], "run-a", "append", "idem-1", derive
    )
    assert appended == 1
    read = await gateway_rows(gateway, namespace)
    assert sorted(r["email"] for r in read.values()) == [
        "x@example.com",
        "y@example.com",
        "z@example.com",
    ]
    reader = await mint(gateway, namespace, ["rows.read"])
    assert await trio.to_thread.run_sync(reader.count) == 3
    replace = await mint(gateway, namespace, ["rows.replace"])
    replaced = await trio.to_thread.run_sync(
        replace.write, [{"email": "r@example.com"}], "run-r", "replace", "idem-2", derive
    )
    assert replaced == 1
    read = await gateway_rows(gateway, namespace)
    assert [r["email"] for r in read.values()] == ["r@example.com"]
    assert await trio.to_thread.run_sync(reader.count) == 1
    assert await summary(gateway, namespace) == {
        "total": 1,
        "queued": 1,
        "running": 0,
        "completed": 0,
        "failed": 0,
    }


def ddl_outcomes(seed: SeedSession) -> dict[str, str]:
    """As the session: the seed's ALTER, and DDL its ownership would otherwise allow."""
    rows = seed.rows
    attempts = {
        "seed alter": None,
        "alter adding a column": f'ALTER TABLE {rows} ADD COLUMN IF NOT EXISTS "intruder" jsonb',
        "disable triggers": f"ALTER TABLE {rows} DISABLE TRIGGER ALL",
        "two statements": (
            f'ALTER TABLE {rows} ADD COLUMN IF NOT EXISTS "email" jsonb;'
            f" ALTER TABLE {rows} DISABLE TRIGGER ALL"
        ),
        "in a DO block": (
            f"DO $$ BEGIN EXECUTE 'ALTER TABLE {rows.replace(chr(39), chr(39) * 2)}"
            " DISABLE TRIGGER ALL'; END $$"
        ),
        "grant": f"GRANT ALL ON {rows} TO PUBLIC",
        "drop": f"DROP TABLE {rows}",
        "index": f"CREATE INDEX ON {rows} (email)",
        "truncate": f"TRUNCATE {rows}",
        "owner": f"ALTER TABLE {rows} OWNER TO CURRENT_USER",
    }
    outcomes: dict[str, str] = {}
    with seed.connect() as conn:
        for what, statement in attempts.items():
            try:
                if statement is None:
                    seed.alter(conn)
                else:
                    conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                outcomes[what] = "refused"
            else:
                outcomes[what] = "ran"
    return outcomes


@pytest.mark.parametrize("operations", [["rows.read", "rows.upsert"], ["rows.append"]])
async def test_a_write_session_runs_the_seeds_alter_table_and_no_other_ddl(
    gateway: RunningGateway, namespace: str, operations: list[str]
) -> None:
    await act(gateway, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
    seed = await mint(gateway, namespace, operations)
    outcomes = await trio.to_thread.run_sync(ddl_outcomes, seed)
    assert outcomes == {
        "seed alter": "ran",
        **{what: "refused" for what in outcomes if what != "seed alter"},
    }
    columns = await run_sql(
        gateway.config.database_url,
        "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'intruder'",
        (seed.rows,),
    )
    assert columns == [(0,)]


async def test_a_read_session_cannot_run_the_seeds_alter_table(
    gateway: RunningGateway, namespace: str
) -> None:
    await act(gateway, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
    seed = await mint(gateway, namespace, ["rows.read"])

    def alter() -> None:
        with seed.connect() as conn:
            seed.alter(conn)

    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must be owner"):
        await trio.to_thread.run_sync(alter)


async def test_a_sheet_made_before_the_seed_layout_migrates_on_its_next_ensure_sheet(
    store: SheetStore, sheet: SheetRef, database_url: str
) -> None:
    contract = SheetContract(columns=(ContractColumn("email", "email", "input"),))
    await store.ensure_sheet(sheet, contract)
    rows = [{"email": f"u{i}@example.com"} for i in range(3)]
    assert (await store.append_rows(sheet, rows, idempotency_key="a1")).written == 3
    names = sheet_names(sheet)
    rows_table, summary_table = names.ident("sheet_table"), names.ident("summary_table")

    def layout_before(conn: psycopg.Connection[Any]) -> None:
        """Back to the layout before the seed's contract: inserts counted in the log,
        none of the seed's columns, the rows table the store role's, no new guards."""
        conn.execute(
            sql.SQL(
                "INSERT INTO {log} (kind, name, value) SELECT 'status', n, v FROM {s},"
                " LATERAL (VALUES ('total', total), ('queued', queued)) AS x(n, v) WHERE id"
            ).format(log=names.ident("counter_table"), s=summary_table)
        )
        conn.execute(sql.SQL("UPDATE {} SET total = 0, queued = 0").format(summary_table))
        for attr, columns in (
            ("event_table", SEED_EVENT_COLUMNS),
            ("summary_table", ("play_name", "table_namespace", "_updated_at")),
            ("column_summary_table", ("play_name", "table_namespace")),
        ):
            conn.execute(
                sql.SQL("ALTER TABLE {} {}").format(
                    names.ident(attr),
                    sql.SQL(", ").join(
                        sql.SQL("DROP COLUMN {}").format(sql.Identifier(c)) for c in columns
                    ),
                )
            )
        conn.execute(sql.SQL("DROP TRIGGER sheetplane_fence_insert ON {}").format(rows_table))
        conn.execute(sql.SQL("ALTER TABLE {} OWNER TO CURRENT_USER").format(rows_table))

    await store.pool.run(layout_before)
    assert (await store.summary(sheet)).total == 3
    async with open_store(database_url) as fresh:  # nothing remembered
        await fresh.ensure_sheet(sheet, contract)

        def layout_after(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
            row = conn.execute(
                sql.SQL(
                    "SELECT total, queued, play_name, table_namespace,"
                    " (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = %s::regclass),"
                    " (SELECT count(*) FROM {log} WHERE kind = 'status') FROM {s} WHERE id"
                ).format(log=names.ident("counter_table"), s=summary_table),
                (rows_table.as_string(conn),),
            ).fetchone()
            assert row is not None
            return tuple(row)

        total, queued, play, namespace, owner, logged = await fresh.pool.run(layout_after)
        assert (total, queued, play, namespace) == (3, 3, sheet.play_name, sheet.table_namespace)
        assert owner.startswith(OWNER_ROLE_PREFIX) and logged == 0
        assert await fresh.summary(sheet) == Summary(3, 3, 0, 0, 0)


COUNT_CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)


async def admitted_counts(
    store: SheetStore, sheet: SheetRef, rows: list[dict[str, Any]], path: str
) -> tuple[int, int]:
    """(inserted, skipped) of one admission of ``rows``, whole or staged."""
    if path == "whole":
        admission = await store.start_dataset(sheet, rows, "run-2", COUNT_CONTRACT)
        return admission.inserted, admission.skipped
    admission_id = uuid.uuid4().hex
    await store.begin_admission(sheet, COUNT_CONTRACT, admission_id, "run-2")
    assert await store.stage_chunk(sheet, admission_id, 0, 0, prepare_chunk(rows, 0))
    counts = await store.commit_admission(
        sheet, COUNT_CONTRACT, admission_id, "run-2", chunks=1, rows=len(rows)
    )
    return counts.inserted, counts.skipped


@pytest.mark.parametrize("path", ["whole", "staged"])
async def test_an_admission_counts_inserted_and_skipped_as_the_seed_does(
    store: SheetStore, sheet: SheetRef, path: str
) -> None:
    """inserted = new rows and revived (stale) ones; skipped = input rows - inserted:
    the duplicates, the enriched rows and the open rows admitted again as they are."""
    first = [{"_key": k, "email": f"{k}@x"} for k in ("p", "r", "f", "e", "s")]
    admission = await store.start_dataset(sheet, first, "run-1", COUNT_CONTRACT)
    version = admission.write_version
    await store.complete_map_rows(
        sheet,
        COUNT_CONTRACT,
        [CompleteRow("e", {"score": 1})],
        run_id="run-1",
        write_version=version,
    )
    await store.fail_map_rows(
        sheet, COUNT_CONTRACT, [FailRow("f", "boom")], run_id="run-1", write_version=version
    )
    names = sheet_names(sheet)
    await store.pool.run(
        lambda c: c.execute(
            sql.SQL(
                "UPDATE {} SET _status = CASE _key WHEN 's' THEN 'stale' ELSE 'running' END"
                " WHERE _key IN ('s', 'r')"
            ).format(names.ident("sheet_table"))
        )
    )
    # p pending, r running, f failed, e enriched, s stale; n new, n and p repeated.
    again = [{"_key": k, "email": f"{k}@x"} for k in ("p", "r", "f", "e", "s", "n", "n", "p")]
    # The seed: inserted = n + s; skipped = 8 - 2 (p, r, f again; e; the repeats).
    assert await admitted_counts(store, sheet, again, path) == (2, 6)


async def test_unversioned_and_versioned_writers_in_both_orders(
    gateway: RunningGateway, namespace: str
) -> None:
    """An unversioned write (the seed's 0.1.2 runtime; ``writeVersion`` left out) is
    unfenced and leaves the row's version; a versioned attempt's write of a row it
    finished first is ``already_terminal``, not a conflict; the reverse is the
    unversioned writer's business; versioned attempts stay fenced exactly."""
    fields = {"tableNamespace": namespace, "sheetContract": CONTRACT}
    admitted = await act(
        gateway, "start_sheet_dataset", rows=rows_of("a", "b", "c"), runId="run-v", **fields
    )
    version = admitted["writeVersion"]
    seed = await mint(gateway, namespace, ["rows.read", "rows.upsert"])

    async def complete(run: str, rows: list[dict[str, Any]], **more: Any) -> Any:
        return await act(
            gateway, "runtime_sheet_complete_map_rows", runId=run, rows=rows, **fields, **more
        )

    # Unversioned first: the seed completes a; the attempt's own write of a is benign.
    assert await trio.to_thread.run_sync(seed.complete, [{"key": "a", "data": {"score": 1}}], "s")
    answer = await complete(
        "run-v",
        [{"key": "a", "data": {"score": 9}}, {"key": "b", "data": {"score": 2}}],
        writeVersion=version,
    )
    assert answer["committedKeys"] == ["b"]
    assert answer["staleRows"] == [
        {"key": "a", "reason": "already_terminal", "rowVersionStamp": version}
    ]
    # Versioned first (b): an unversioned write through sheetplane overwrites nothing;
    # the seed's own statement is unfenced and overwrites it, as 0.1.2 does.
    answer = await complete("run-u", [{"key": "b", "data": {"score": 7}}])
    assert (answer["committedKeys"], [r["reason"] for r in answer["staleRows"]]) == (
        [],
        ["already_terminal"],
    )
    assert await trio.to_thread.run_sync(seed.complete, [{"key": "b", "data": {"score": 8}}], "s")
    read = await gateway_rows(gateway, namespace)
    assert {k: (r["_status"], r.get("score")) for k, r in read.items()} == {
        "a": ("enriched", 1),
        "b": ("enriched", 8),
        "c": ("pending", None),
    }
    names = sheet_names(SheetRef(ORG, PLAY, namespace))
    stamps = await run_sql(
        gateway.config.database_url,
        sql.SQL("SELECT _key, (seq).write_version FROM {} ORDER BY _key").format(
            names.ident("sheet_table")
        ),
    )
    assert stamps == [("a", version), ("b", version), ("c", version)]
    # Between versioned attempts nothing changed: a newer admission fences the old one.
    newer = await act(gateway, "start_sheet_dataset", rows=rows_of("c"), runId="run-w", **fields)
    answer = await complete("run-v", [{"key": "c", "data": {"score": 3}}], writeVersion=version)
    assert answer["staleRows"] == [
        {"key": "c", "reason": "newer_write_version", "rowVersionStamp": newer["writeVersion"]}
    ]


async def test_the_seeds_direct_road_on_a_gateway_that_is_not_a_superuser(
    gateway_database: GatewayDatabase,  # noqa: F811 (the fixture imported above)
    namespace: str,
) -> None:
    """A CREATEROLE gateway on a database an operator hardened (the DDL guard
    included): it makes the sheet's owner role, its write sessions run the seed's
    ALTER TABLE and admission, and no other DDL."""
    statements = await gateway_database.hardened()
    assert any("EVENT TRIGGER" in text for text in statements), statements
    async with running_gateway(gateway_database.url, tokens={TOKEN: ORG}) as gw:
        await act(gw, "ensure_sheet", tableNamespace=namespace, sheetContract=CONTRACT)
        seed = await mint(gw, namespace, ["rows.read", "rows.upsert"])
        first = await trio.to_thread.run_sync(seed.start, rows_of("a", "b"), "run-1")
        assert (first["inserted"], first["skipped"]) == (2, 0)
        assert await trio.to_thread.run_sync(seed.count) == 2
        outcomes = await trio.to_thread.run_sync(ddl_outcomes, seed)
        assert outcomes == {
            "seed alter": "ran",
            **{what: "refused" for what in outcomes if what != "seed alter"},
        }
