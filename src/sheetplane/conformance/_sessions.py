"""Scoped sessions: ``create_db_session`` answers, their envelope, and the role's rights.

The kit makes its own RSA key, sends the public half as a JWK, opens the
answer's JWE with joserfc (an independent RFC 7516 implementation) and checks
the envelope's additional data is the session's identity as the answer states
it. Then it connects with psycopg as the scoped role and tries what the
session's operations allow and what they do not.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any, Final

import attrs
import psycopg
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jwe
from joserfc.errors import JoseError
from joserfc.jwk import RSAKey
from psycopg import sql

from ..budgets import DB_SESSION_TTL_MS, POSTGRES_CONNECT_TIMEOUT_MS, REQUEST_TIMEOUT_MS
from ._context import CONTRACT, Admitted, CheckFailed, CheckSkipped, Context, check, expect, ok
from ._http import Exchange

__all__ = ["Session", "mint", "open_envelope", "open_session"]

ENVELOPE_ALG: Final = "RSA-OAEP-256+A256GCM"
#: The seed's session lifetime: the gateway may grant less, never more (plus clock slack).
SESSION_TTL: Final = dt.timedelta(milliseconds=DB_SESSION_TTL_MS)
#: The answer's clock may run ahead of the kit's by at most one request's time.
CLOCK_SLACK: Final = dt.timedelta(milliseconds=REQUEST_TIMEOUT_MS)
_MS_PER_S: Final = 1000
_TABLE_NAMES: Final = ("schema", "sheetTable", "eventTable", "summaryTable", "columnSummaryTable")
_PERMISSION_DENIED: Final = "42501"


def _b64u(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@attrs.frozen
class Session:
    """A minted session as the kit opened it."""

    answer: Exchange
    url: str = attrs.field(repr=False)
    schema: str
    sheet_table: str


def _request(namespace: str, operations: list[str], key: rsa.RSAPrivateKey) -> dict[str, Any]:
    public = key.public_key().public_numbers()
    jwk = {
        "kty": "RSA",
        "n": _b64u(public.n),
        "e": _b64u(public.e),
        "alg": "RSA-OAEP-256",
        "use": "enc",
    }
    return {
        "target": {"tableNamespace": namespace, "logicalTable": "sheet_rows"},
        "operations": operations,
        "limits": {"maxRows": 100},
        "sheetContract": CONTRACT,
        "postgresUrlEncryption": {"alg": ENVELOPE_ALG, "publicKeyJwk": jwk},
    }


def _identity(body: dict[str, Any], play_name: str) -> bytes:
    """The session identity the envelope must be bound to (docs/gateway.md, session_aad)."""
    target = body.get("target") or {}
    identity = {
        "expiresAt": body.get("expiresAt"),
        "logicalTable": target.get("logicalTable"),
        "operations": sorted(body.get("operations") or []),
        "orgId": target.get("orgId"),
        "playName": play_name,
        "tableNamespace": target.get("tableNamespace"),
    }
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _shape_problems(
    body: dict[str, Any], namespace: str, operations: list[str], play: str
) -> list[str]:
    problems = []
    target = body.get("target")
    if not (
        isinstance(target, dict)
        and isinstance(target.get("orgId"), str)
        and target.get("tableNamespace") == namespace
        and target.get("logicalTable") == "sheet_rows"
    ):
        problems.append("target {orgId, tableNamespace, logicalTable} echoing the request")
    if body.get("playName") != play:
        problems.append("playName echoed")
    if sorted(body.get("operations") or []) != sorted(operations):
        problems.append(f"operations {sorted(operations)}")
    if body.get("limits") != {"maxRows": 100}:
        problems.append("limits {maxRows: 100} echoed")
    tables = body.get("postgres")
    if not (isinstance(tables, dict) and all(isinstance(tables.get(n), str) for n in _TABLE_NAMES)):
        problems.append(f"postgres {{{', '.join(_TABLE_NAMES)}}}")
    if "postgresUrl" in body or not isinstance(body.get("encryptedPostgresUrl"), dict):
        problems.append("encryptedPostgresUrl and no postgresUrl in the clear")
    try:
        expires = dt.datetime.fromisoformat(str(body.get("expiresAt")))
        now = dt.datetime.now(dt.UTC)
        if expires.tzinfo is None or not now < expires <= now + SESSION_TTL + CLOCK_SLACK:
            problems.append("expiresAt in the future, at most 10 minutes ahead, with a zone")
    except ValueError:
        problems.append("expiresAt an ISO 8601 timestamp")
    return problems


def mint(ctx: Context, namespace: str, operations: list[str]) -> tuple[Exchange, rsa.RSAPrivateKey]:
    """Mint a session with a fresh key and check its answer's shape (SP-SESS-1)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    answer = ctx.wire.post("create_db_session", _request(namespace, operations, key))
    body = ok(answer, "create_db_session to answer 200 with a JSON object")
    problems = _shape_problems(body, namespace, operations, ctx.wire.play_name)
    expect(not problems, "; ".join(problems), answer)
    return answer, key


def open_envelope(ctx: Context, answer: Exchange, key: rsa.RSAPrivateKey) -> Session:
    """Open the answer's envelope with ``key`` and check it (SP-SESS-2)."""
    body = answer.json_object
    envelope = body["encryptedPostgresUrl"]
    header: dict[str, Any] = {}
    try:
        protected = str(envelope.get("protected", ""))
        header = json.loads(base64.urlsafe_b64decode(protected + "=" * (-len(protected) % 4)))
        opened = jwe.decrypt_json(
            envelope, RSAKey.import_key(key), algorithms=["RSA-OAEP-256", "A256GCM"]
        )
        url = opened.plaintext.decode("utf-8") if opened.plaintext is not None else ""
        aad = opened.aad
    except (JoseError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise CheckFailed(
            "an RSA-OAEP-256 + A256GCM flattened JWE that opens with the key sent",
            answer,
            detail=f"protected header {header}: {type(exc).__name__}",
        ) from None
    expect(
        header.get("alg") == "RSA-OAEP-256" and header.get("enc") == "A256GCM",
        "protected header alg RSA-OAEP-256, enc A256GCM",
        answer,
    )
    expect(
        url.startswith(("postgres://", "postgresql://")),
        "the envelope to hold a postgres:// URL",
        answer,
    )
    identity = _identity(body, ctx.wire.play_name)
    expect(
        aad == identity,
        f"the envelope's aad to be the session identity {identity.decode()}",
        answer,
    )
    tables = body["postgres"]
    return Session(answer, url, tables["schema"], tables["sheetTable"])


def open_session(ctx: Context, namespace: str, operations: list[str]) -> Session:
    """Mint a session and open its envelope."""
    return open_envelope(ctx, *mint(ctx, namespace, operations))


def _connect(session: Session) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            session.url, connect_timeout=POSTGRES_CONNECT_TIMEOUT_MS // _MS_PER_S, autocommit=True
        )
    except psycopg.OperationalError as exc:
        text = str(exc).lower()
        if "password" in text or "authentication" in text or "role" in text:
            raise CheckFailed(
                "the session's URL to log in as its role", session.answer, detail="login refused"
            ) from None
        raise CheckSkipped(
            "the session's Postgres host is not reachable from here (connection failed)"
        ) from None


def _table(session: Session) -> sql.Identifier:
    return sql.Identifier(session.schema, session.sheet_table)


def _refused(conn: psycopg.Connection[Any], statement: sql.Composed) -> bool:
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return True
    except psycopg.Error as exc:
        return exc.sqlstate == _PERMISSION_DENIED
    return False


def _reads_sheet(ctx: Context) -> tuple[Admitted, Session]:
    sheet = ctx.shared_sheet()
    return sheet, open_session(ctx, sheet.namespace, ["rows.read"])


@check("SP-SESS-1")
def session_answer(ctx: Context) -> None:
    mint(ctx, ctx.shared_sheet().namespace, ["rows.read"])


@check("SP-SESS-2")
def session_envelope(ctx: Context) -> None:
    open_session(ctx, ctx.shared_sheet().namespace, ["rows.read"])


@check("SP-SESS-3")
def session_reads(ctx: Context) -> None:
    sheet, session = _reads_sheet(ctx)
    with _connect(session) as conn:
        try:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(_table(session))
            ).fetchone()
        except psycopg.Error as exc:
            raise CheckFailed(
                f"SELECT on {session.schema}.{session.sheet_table} as the rows.read role",
                session.answer,
                detail=f"Postgres answered SQLSTATE {exc.sqlstate}",
            ) from None
    expect(
        row is not None and row[0] == len(sheet.keys),
        f"the role to count the sheet's {len(sheet.keys)} rows",
        session.answer,
    )


@check("SP-SESS-4")
def session_limits(ctx: Context) -> None:
    _, session = _reads_sheet(ctx)
    other_namespace = ctx.namespace("other")
    ctx.admit(other_namespace, [{"n": 1, "label": "other"}], ctx.name("run"))
    other = open_session(ctx, other_namespace, ["rows.read"])
    with _connect(session) as conn:
        update = sql.SQL("UPDATE {} SET {} = NULL").format(_table(session), sql.Identifier("out"))
        expect(
            _refused(conn, update),
            "UPDATE of its sheet refused (SQLSTATE 42501) for a rows.read role",
            session.answer,
        )
        delete = sql.SQL("DELETE FROM {}").format(_table(session))
        expect(_refused(conn, delete), "DELETE refused for a rows.read role", session.answer)
        foreign = sql.SQL("SELECT count(*) FROM {}").format(_table(other))
        expect(
            _refused(conn, foreign),
            f"SELECT on another sheet's table {other.schema}.{other.sheet_table} refused",
            session.answer,
        )


@check("SP-SESS-5")
def session_upserts(ctx: Context) -> None:
    admitted = ctx.fresh([1], tag="upsert")
    session = open_session(ctx, admitted.namespace, ["rows.read", "rows.upsert"])
    with _connect(session) as conn:
        try:
            cursor = conn.execute(
                sql.SQL("UPDATE {} SET {} = %s::jsonb WHERE _key = %s").format(
                    _table(session), sql.Identifier("out")
                ),
                ('"written directly"', admitted.keys[0]),
            )
        except psycopg.Error as exc:
            raise CheckFailed(
                "UPDATE of an output column allowed for a rows.upsert role",
                session.answer,
                detail=f"Postgres answered SQLSTATE {exc.sqlstate}",
            ) from None
        expect(cursor.rowcount == 1, "the UPDATE to change the one row", session.answer)
