"""The physical layout: names, idempotent DDL, new columns, hostile names."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from sheetplane._types import ContractColumn, SheetContract, SheetRef
from sheetplane.budgets import MAX_LOGICAL_NAME_CHARS
from sheetplane.errors import InvalidInputError
from sheetplane.store import SheetStore, sheet_names
from sheetplane.store._names import receipt_names

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
TABLES = (
    "sheet_table",
    "event_table",
    "summary_table",
    "column_summary_table",
    "counter_table",
    "lock_table",
    "receipts_table",
    "meta_table",
    "staging_table",
    "admissions_table",
    "stage_chunks_table",
    "shares_table",
)

HOSTILE = (
    '"; drop table x; --',
    'it\'s "quoted"',
    "ünïcödé ☃ 名前",
    "Robert'); DROP TABLE students;--",
    "  padded\tname  ",
    "a" * MAX_LOGICAL_NAME_CHARS,
)


def contract(*columns: tuple[str, str]) -> SheetContract:
    return SheetContract(tuple(ContractColumn(cid, name, "input") for cid, name in columns))


def _all_names(ref: SheetRef) -> list[str]:
    names = sheet_names(ref)
    return [
        names.schema,
        *(getattr(names, attr) for attr in TABLES),
        names.order_index,
        names.event_key_index,
        names.staging_index,
    ]


logical = st.text(min_size=1, max_size=80).filter(lambda s: "\x00" not in s)


@settings(max_examples=200)
@given(logical, logical, logical)
def test_names_are_short_plain_identifiers(org: str, play: str, namespace: str) -> None:
    try:
        ref = SheetRef(org, play, namespace)
        names = _all_names(ref)
    except InvalidInputError:
        # Only lone surrogates, and a play or namespace blank once trimmed, are refused.
        assert any(0xD800 <= ord(ch) <= 0xDFFF for ch in org + play + namespace) or not (
            play.strip() and namespace.strip()
        )
        return
    for name in names:
        assert IDENTIFIER.match(name), name
        assert len(name.encode()) <= 63
    assert sheet_names(SheetRef(org, play, namespace)) == sheet_names(ref)


@settings(max_examples=200)
@given(st.tuples(logical, logical, logical), st.tuples(logical, logical, logical))
def test_distinct_sheets_never_share_a_table(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in "".join(a + b)):
        return
    try:
        refs = SheetRef(*a), SheetRef(*b)
    except InvalidInputError:  # a play or namespace blank once trimmed
        return
    if refs[0] == refs[1]:  # the same sheet once the names are normalised
        return
    a = (refs[0].org_id, refs[0].play_name, refs[0].table_namespace)
    b = (refs[1].org_id, refs[1].play_name, refs[1].table_namespace)
    first, second = sheet_names(refs[0]), sheet_names(refs[1])
    assert (first.schema, first.sheet_table) != (second.schema, second.sheet_table)
    if a[0] != b[0]:
        assert first.schema != second.schema
    if a[:2] != b[:2]:
        assert (first.schema, first.receipts_table) != (second.schema, second.receipts_table)


def test_names_that_normalise_alike_are_one_sheet() -> None:
    one = sheet_names(SheetRef("org", "normtest", "normtest"))
    for play, namespace in (("NormTest", "NormTest"), (" NormTest ", "\tNORMTEST\n")):
        assert sheet_names(SheetRef("org", play, namespace)) == one
    assert receipt_names("org", " NormTest ").receipts_table == one.receipts_table


def test_names_that_sanitise_alike_still_differ() -> None:
    first = sheet_names(SheetRef("org", "play", "a-b"))
    second = sheet_names(SheetRef("org", "play", "a_b"))
    assert first.schema == second.schema
    assert first.sheet_table != second.sheet_table
    assert first.sheet_table.startswith("t_play_a_b_")


@pytest.mark.parametrize(
    ("org", "play", "namespace"),
    [
        ("", "p", "n"),
        ("o", "", "n"),
        ("o", "p", ""),
        ("o", "p", "   "),
        ("o", "\t\n", "n"),
        ("o\x00", "p", "n"),
        ("o", "p", "n\x00x"),
        ("o" * (MAX_LOGICAL_NAME_CHARS + 1), "p", "n"),
        ("o", "\ud800", "n"),
        (1, "p", "n"),
    ],
)
def test_bad_logical_names_are_rejected(org: Any, play: Any, namespace: Any) -> None:
    with pytest.raises(InvalidInputError):
        sheet_names(SheetRef(org, play, namespace))


def test_receipt_names_belong_to_the_play() -> None:
    names = receipt_names("org", "play")
    sheet = sheet_names(SheetRef("org", "play", "ns"))
    assert (names.schema, names.receipts_table) == (sheet.schema, sheet.receipts_table)
    with pytest.raises(InvalidInputError):
        receipt_names("org", "")


def test_identifiers_render_quoted() -> None:
    names = sheet_names(SheetRef("o", "p", "n"))
    rendered = names.ident("sheet_table").as_string(None)
    assert rendered == f'"{names.schema}"."{names.sheet_table}"'
    with pytest.raises(ValueError, match="not a table"):
        names.ident("schema")


# --- DDL against Postgres ---------------------------------------------------------------------


def _columns(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, str | None]:
    """Every column of the sheet table, with the id its metadata table records (or None)."""
    meta = sql.Identifier(schema, table.removesuffix("_rows") + "_meta")
    rows = conn.execute(
        sql.SQL(
            "SELECT a.attname, m.value FROM pg_attribute a"
            " LEFT JOIN {} m ON m.kind = 'column' AND m.name = a.attname"
            " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"
        ).format(meta),
        (sql.Identifier(schema, table).as_string(conn),),
    ).fetchall()
    comments = conn.execute(
        "SELECT count(*) FROM pg_attribute a WHERE a.attrelid = to_regclass(%s)"
        " AND col_description(a.attrelid, a.attnum) IS NOT NULL",
        (sql.Identifier(schema, table).as_string(conn),),
    ).fetchone()
    assert comments == (0,)  # the ids are never kept in catalog comments
    return dict(rows)


async def test_ensure_sheet_is_idempotent(store: SheetStore, sheet: SheetRef) -> None:
    names = sheet_names(sheet)
    spec = contract(("company", "company"), ("Score", "score"), ("hidden", "_hidden"))
    for _ in range(3):
        await store.ensure_sheet(sheet, spec)

    def inspect(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
        tables = conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY relname",
            (names.schema,),
        ).fetchall()
        summary = conn.execute(
            sql.SQL("SELECT total, write_version FROM {}").format(names.ident("summary_table"))
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s ORDER BY indexname",
            (names.schema,),
        ).fetchall()
        return (
            sorted(t for (t,) in tables),
            summary,
            [i for (i,) in indexes],
            _columns(conn, names.schema, names.sheet_table),
        )

    tables, summary, indexes, columns = await store.pool.run(inspect)
    assert tables == sorted(getattr(names, attr) for attr in TABLES)
    assert summary == [(0, 0)]
    assert names.order_index in indexes and names.event_key_index in indexes
    assert columns["company"] == "company"
    assert columns["score"] == "Score"
    assert "_hidden" not in columns
    assert "seq" in columns and "_cell_meta" in columns
    assert "_write_version" not in columns and "_admitted_version" not in columns


async def test_new_contract_columns_are_added_and_data_kept(
    store: SheetStore, sheet: SheetRef
) -> None:
    names = sheet_names(sheet)
    await store.ensure_sheet(sheet, contract(("a", "a")))
    await store.pool.run(
        lambda c: c.execute(
            sql.SQL("INSERT INTO {} (_key, a) VALUES ('k', '1')").format(names.ident("sheet_table"))
        )
    )
    await store.ensure_sheet(sheet, contract(("a", "a"), ("Beta", "b")))
    # A later contract without "a" drops nothing.
    await store.ensure_sheet(sheet, contract(("Beta", "b")))
    columns = await store.pool.run(lambda c: _columns(c, names.schema, names.sheet_table))
    assert columns["a"] == "a" and columns["b"] == "Beta"
    row = await store.pool.run(
        lambda c: c.execute(
            sql.SQL("SELECT a, b FROM {}").format(names.ident("sheet_table"))
        ).fetchone()
    )
    assert row == (1, None)


async def test_concurrent_ensure_sheet_races_safely(store: SheetStore, sheet: SheetRef) -> None:
    sheets = [sheet, *(SheetRef(sheet.org_id, sheet.play_name, f"ns-{n}") for n in range(3))]
    async with trio.open_nursery() as nursery:
        for n in range(8):
            target = sheets[n % len(sheets)]
            nursery.start_soon(store.ensure_sheet, target, contract(("c", f"col_{n % 2}")))
    for target in sheets:
        assert await store.count(target) == 0
        assert (await store.summary(target)).total == 0


async def test_hostile_names_work_and_stay_isolated(store: SheetStore, database_url: str) -> None:
    victim = f"x_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE TABLE {} (v int)").format(sql.Identifier(victim)))
    try:
        tag = uuid.uuid4().hex[:8]
        refs = [
            SheetRef(f"org {tag} {text[:100]}", text, f'"; drop table {victim}; --')
            for text in HOSTILE
        ]
        refs.append(SheetRef(f"org {tag} {HOSTILE[0]}", HOSTILE[0], HOSTILE[1]))
        spec = contract(('id "quoted"', 'col"; drop table x; --'), ("ü", "ünï ☃"))
        for ref in refs:
            await store.ensure_sheet(ref, spec)
        first = sheet_names(refs[0])
        await store.pool.run(
            lambda c: c.execute(
                sql.SQL("INSERT INTO {} (_key, {}) VALUES (%s, %s)").format(
                    first.ident("sheet_table"), sql.Identifier('col"; drop table x; --')
                ),
                ("k'1", '"v"'),
            )
        )
        counts = [await store.count(ref) for ref in refs]
        assert counts == [1] + [0] * (len(refs) - 1)
        with psycopg.connect(database_url, autocommit=True) as admin:
            assert admin.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(victim).as_string(admin),)
            ).fetchone() == (True,)
            comment = admin.execute(
                "SELECT obj_description(to_regclass(%s), 'pg_class')",
                (first.ident("sheet_table").as_string(admin),),
            ).fetchone()
            logical = admin.execute(
                sql.SQL("SELECT name, value FROM {} WHERE kind = 'sheet'").format(
                    first.ident("meta_table")
                )
            ).fetchall()
        assert comment == (None,)  # logical names stay out of catalog comments
        assert dict(logical)["play_name"] == HOSTILE[0]
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(victim)))


@pytest.mark.parametrize(
    "column",
    [
        ContractColumn("k", "_key_shadow_ok", "input"),  # underscore: never physical, accepted
    ],
)
async def test_underscore_columns_are_not_physical(
    store: SheetStore, sheet: SheetRef, column: ContractColumn
) -> None:
    await store.ensure_sheet(sheet, SheetContract((column,)))
    names = sheet_names(sheet)
    columns = await store.pool.run(lambda c: _columns(c, names.schema, names.sheet_table))
    assert column.sql_name not in columns


@pytest.mark.parametrize("sql_name", ["x" * 64, "bad\x00name", "ü" * 32])
async def test_too_long_or_nul_column_names_are_rejected(
    store: SheetStore, sheet: SheetRef, sql_name: str
) -> None:
    with pytest.raises(InvalidInputError):
        await store.ensure_sheet(sheet, contract(("c", sql_name)))
    # Nothing was created.
    assert await store.count(sheet) == 0
    names = sheet_names(sheet)
    exists = await store.pool.run(
        lambda c: c.execute(
            "SELECT to_regclass(%s)", (names.ident("sheet_table").as_string(c),)
        ).fetchone()
    )
    assert exists == (None,)


async def test_longest_column_name_fits(store: SheetStore, sheet: SheetRef) -> None:
    longest = "é" * 31 + "x"  # 63 bytes
    await store.ensure_sheet(sheet, contract(("c", longest)))
    names = sheet_names(sheet)
    columns = await store.pool.run(lambda c: _columns(c, names.schema, names.sheet_table))
    assert longest in columns


async def test_a_sheet_records_its_identity_scheme_once(store: SheetStore, sheet: SheetRef) -> None:
    from sheetplane.identity import IDENTITY_SCHEME

    names = sheet_names(sheet)
    meta = names.ident("meta_table")

    def scheme(conn: psycopg.Connection[Any]) -> Any:
        return conn.execute(
            sql.SQL(
                "SELECT value FROM {} WHERE kind = 'sheet' AND name = 'identity_scheme'"
            ).format(meta)
        ).fetchall()

    def pretend_older(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET value = 'older-scheme' "
                "WHERE kind = 'sheet' AND name = 'identity_scheme'"
            ).format(meta)
        )

    one = SheetContract((ContractColumn("a", "a_col", "input"),))
    await store.ensure_sheet(sheet, one)
    assert await store.pool.run(scheme) == [(IDENTITY_SCHEME,)]
    await store.pool.run(pretend_older)
    # A new column runs the sheet's DDL again: the recorded scheme is never rewritten.
    await store.ensure_sheet(
        sheet, SheetContract((*one.columns, ContractColumn("b", "b_col", "output")))
    )
    assert await store.pool.run(scheme) == [("older-scheme",)]
