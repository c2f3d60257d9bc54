"""Plays registered per org, and resolving a play reference to one.

Each org's schema holds one ``plays`` table: a row per play id, with an
optional unique name, the play's source or built artifact, its code format
and the contract snapshot it was built against. A reference resolves to the
play whose id it is, else to the play of that name; another org's plays are
in another schema, so a reference never crosses orgs. Scoped session roles
are granted nothing on this table: only the gateway reads it.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from .._rowchecks import check_json_value
from .._types import ResolvedPlay
from ..errors import InvalidInputError
from ._names import org_schema
from ._pool import ConnectionRunner
from ._rowdata import check_key
from ._schema import ensure_ddl, relations_missing

__all__ = ["register_play", "resolve_play"]

#: The table name inside the org's schema (other tables carry a ``t_``/``r_`` prefix).
PLAYS_TABLE: Final = "plays"

_DDL: Final = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {} (
        play_id text PRIMARY KEY,
        name text UNIQUE,
        source_code text,
        artifact jsonb,
        code_format text CHECK (code_format IN ('function', 'cjs_module', 'esm_module')),
        contract_snapshot jsonb,
        registered_at timestamptz NOT NULL DEFAULT statement_timestamp()
    )"""
)

_COLUMNS: Final = sql.SQL("play_id, source_code, artifact, code_format, contract_snapshot")


def _table(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, PLAYS_TABLE)


def _exists(conn: psycopg.Connection[Any], schema: str) -> bool:
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (_table(schema).as_string(conn),)
    ).fetchone()
    return bool(row and row[0])


async def register_play(
    pool: ConnectionRunner, org_id: str, play: ResolvedPlay, *, name: str | None = None
) -> None:
    """Register ``play`` for ``org_id`` (replacing the play of the same id), under
    ``name`` if given. Raises ``InvalidInputError`` when ``name`` names another play."""
    if not isinstance(play, ResolvedPlay):
        raise InvalidInputError(f"play must be a ResolvedPlay, got {play!r}")
    check_key(play.play_id, "play id")
    if name is not None:
        check_key(name, "play name")
    check_json_value(play.artifact, "play artifact")
    check_json_value(play.contract_snapshot, "play contract snapshot")
    if play.source_code is not None:
        check_json_value(play.source_code, "play source code")
    schema = org_schema(org_id)
    table = _table(schema)
    params = {
        "play_id": play.play_id,
        "name": name,
        "source_code": play.source_code,
        "artifact": None if play.artifact is None else Jsonb(play.artifact),
        "code_format": play.code_format,
        "snapshot": None if play.contract_snapshot is None else Jsonb(play.contract_snapshot),
    }

    def create(conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(_DDL.format(table))

    await ensure_ddl(
        pool, schema, lambda conn: relations_missing(conn, schema, [PLAYS_TABLE]), create
    )

    def run(conn: psycopg.Connection[Any]) -> None:
        try:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (play_id, name, source_code, artifact, code_format, "
                    "contract_snapshot) VALUES (%(play_id)s, %(name)s, %(source_code)s, "
                    "%(artifact)s, %(code_format)s, %(snapshot)s) "
                    "ON CONFLICT (play_id) DO UPDATE SET name = EXCLUDED.name, "
                    "source_code = EXCLUDED.source_code, artifact = EXCLUDED.artifact, "
                    "code_format = EXCLUDED.code_format, "
                    "contract_snapshot = EXCLUDED.contract_snapshot, "
                    "registered_at = statement_timestamp()"
                ).format(table),
                params,
            )
        except psycopg.errors.UniqueViolation:
            raise InvalidInputError(f"play name {name!r} already names another play") from None

    await pool.run(run)


async def resolve_play(pool: ConnectionRunner, org_id: str, play_ref: str) -> ResolvedPlay | None:
    """The play of ``org_id`` whose id is ``play_ref``, else whose name is; None if neither."""
    check_key(play_ref, "play reference")
    schema = org_schema(org_id)

    def run(conn: psycopg.Connection[Any]) -> ResolvedPlay | None:
        if not _exists(conn, schema):
            return None
        row = conn.execute(
            sql.SQL(
                "SELECT {cols} FROM {tbl} WHERE play_id = %(ref)s OR name = %(ref)s "
                "ORDER BY play_id = %(ref)s DESC LIMIT 1"
            ).format(cols=_COLUMNS, tbl=_table(schema)),
            {"ref": play_ref},
        ).fetchone()
        if row is None:
            return None
        play_id, source_code, artifact, code_format, snapshot = row
        return ResolvedPlay(play_id, source_code, artifact, code_format, snapshot)

    return await pool.run(run)
