"""Work receipts: a unit of work recorded once, with optional leased claims.

A receipt row per key lives in the play's receipts table. Completion is
insert-or-return-the-winner: the first completion writes the row and answers
``persisted``; every later one writes nothing and answers ``existing`` with the
winner's row, whatever result it carried. Both run in one statement plus, for
the loser, one read, so two racing completions have exactly one winner.

Claims are optional. ``claim_work_receipt(key, holder, lease_token=)`` takes a
lease of ``WORK_RECEIPT_LEASE_TTL_MS`` on a not-yet-completed key and answers
the lease's secret token (the one the claimant proposed, else a new random
one) to the claimant only. A holder's name is a name, not a capability: the
holder renews by claiming again with its token; another holder (or the same
name without the token) may take the claim only once the lease has expired
(``now >= claim_expires_at``) or its holder released it (``release_work_receipt``,
which needs the token too). A refused claim names the live holder and its
expiry, never the token. The table keeps the token's SHA-256 digest, not the
token. A completion is fenced by the claim: it is accepted when no one holds
a live claim, when the completer is the claim's holder and presents its token
(``holder=``, ``lease_token=``), or when the claim has expired. A claim taken
before leases carried tokens (no digest) has to expire first.
When another holder's live claim owns the key, the completion raises
``WorkReceiptFencedError`` and writes nothing: the late attempt lost the work
to its successor, and there is no winner's row to hand back yet. Once the
successor completes, the late attempt gets ``existing`` with the successor's
row, like any loser.

``now`` (a timezone-aware ``datetime``) exists for tests and replays; by default
the database's clock decides (``statement_timestamp()``), so holders on
different machines agree on expiry.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from .._ints import check_int
from .._rowchecks import check_json_value
from .._types import (
    INTEGER_MAX,
    LEASE_TOKEN_BYTES,
    Receipt,
    ReceiptClaim,
    ReceiptCompletion,
    new_lease_token,
)
from ..budgets import MAX_REQUEST_TEXT_BYTES, WORK_RECEIPT_LEASE_TTL_MS
from ..errors import InvalidInputError, WorkReceiptFencedError
from ._names import SheetNames
from ._pool import ConnectionRunner
from ._rowdata import check_key, check_text

__all__ = [
    "LEASE_TOKEN_BYTES",
    "ReceiptClaim",
    "check_claim",
    "check_completion",
    "check_lease_token",
    "claim_work_receipt",
    "complete_work_receipt",
    "new_lease_token",
    "release_work_receipt",
]

_NOW = sql.SQL("coalesce(%(now)s::timestamptz, statement_timestamp())")


#: The receipts table keeps ``run_attempt`` as a Postgres ``integer``.
_MAX_RUN_ATTEMPT = INTEGER_MAX


#: The shortest token a claimant may propose (about 96 bits as URL-safe base64).
_MIN_LEASE_TOKEN_CHARS: Final = 16


def check_lease_token(token: object, *, required: bool) -> None:
    """Raise ``InvalidInputError`` for a token that is not a text of 16 to
    ``MAX_REQUEST_TEXT_BYTES`` printable ASCII characters (never echoing it)."""
    if token is None and not required:
        return
    if (
        not isinstance(token, str)
        or not _MIN_LEASE_TOKEN_CHARS <= len(token) <= MAX_REQUEST_TEXT_BYTES
        or not token.isascii()
        or not token.isprintable()
    ):
        raise InvalidInputError(
            f"lease_token must be a text of {_MIN_LEASE_TOKEN_CHARS} to "
            f"{MAX_REQUEST_TEXT_BYTES} printable ASCII characters (the claim's answer carries it)"
        )


def _digest(token: str | None) -> bytes | None:
    return None if token is None else hashlib.sha256(token.encode("ascii")).digest()


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _receipt(key: str, result: Any, run_id: str | None, completed_at: dt.datetime) -> Receipt:
    return Receipt(
        key=key, result=result, run_id=run_id or "", completed_at=completed_at.isoformat()
    )


def _stored(conn: psycopg.Connection[Any], table: sql.Identifier, key: str) -> tuple[Any, ...]:
    """The receipt row an insert conflicted with: result, run_id, completed_at,
    claim_holder, claim_expires_at."""
    cur = conn.execute(
        sql.SQL(
            "SELECT result, run_id, completed_at, claim_holder, claim_expires_at "
            "FROM {} WHERE key = %s"
        ).format(table),
        (key,),
    )
    row: tuple[Any, ...] | None = cur.fetchone()
    assert row is not None  # the conflicting row exists and rows are never deleted
    return row


def _check_now(now: dt.datetime | None) -> dt.datetime | None:
    if now is None:
        return None
    if not isinstance(now, dt.datetime) or now.tzinfo is None:
        raise InvalidInputError(f"now must be a timezone-aware datetime, got {now!r}")
    return now


async def claim_work_receipt(
    pool: ConnectionRunner,
    names: SheetNames,
    key: str,
    holder: str,
    *,
    lease_token: str | None = None,
    now: dt.datetime | None = None,
) -> ReceiptClaim:
    """Claim ``key`` for ``holder`` for ``WORK_RECEIPT_LEASE_TTL_MS``.

    ``lease_token`` renews the caller's own live lease (or names the token of a
    new one: a retried claim then renews instead of finding itself the holder);
    without it a new lease gets a fresh token. Acquired, the answer carries the
    token. Not acquired when the work is already completed (``receipt`` is set)
    or another live lease holds the key (``holder``/``expires_at`` name it; the
    same holder name without that lease's token is another). If cancelled, the
    statement is cancelled and nothing changes.
    """
    check_claim(key, holder)
    check_lease_token(lease_token, required=False)
    token = lease_token if lease_token is not None else new_lease_token()
    params = {
        "key": key,
        "holder": holder,
        "digest": _digest(token),
        "now": _check_now(now),
        "ttl_ms": WORK_RECEIPT_LEASE_TTL_MS,
    }
    table = names.ident("receipts_table")

    def run(conn: psycopg.Connection[Any]) -> ReceiptClaim:
        cur = conn.execute(
            sql.SQL(
                "INSERT INTO {tbl} AS r (key, claim_holder, claim_expires_at, claim_token_digest) "
                "VALUES (%(key)s, %(holder)s, {now} + %(ttl_ms)s * interval '1 millisecond', "
                "%(digest)s) "
                "ON CONFLICT (key) DO UPDATE SET claim_holder = EXCLUDED.claim_holder, "
                "claim_expires_at = EXCLUDED.claim_expires_at, "
                "claim_token_digest = EXCLUDED.claim_token_digest "
                "WHERE r.completed_at IS NULL AND (r.claim_holder IS NULL "
                "OR (r.claim_holder = EXCLUDED.claim_holder "
                "    AND r.claim_token_digest = EXCLUDED.claim_token_digest) "
                "OR r.claim_expires_at <= {now}) "
                "RETURNING claim_holder, claim_expires_at"
            ).format(tbl=table, now=_NOW),
            params,
        )
        taken = cur.fetchone()
        if taken is not None:
            return ReceiptClaim(True, taken[0], _iso(taken[1]), None, token)
        result, run_id, completed_at, claim_holder, expires_at = _stored(conn, table, key)
        if completed_at is not None:
            return ReceiptClaim(False, None, None, _receipt(key, result, run_id, completed_at))
        return ReceiptClaim(False, claim_holder, _iso(expires_at), None)

    return await pool.run(run)


async def release_work_receipt(
    pool: ConnectionRunner, names: SheetNames, key: str, holder: str, lease_token: str | None
) -> bool:
    """Give up ``holder``'s lease on ``key`` so another holder need not wait for its expiry.

    True when ``holder`` held it with ``lease_token`` (the lease is gone); False
    when it did not (never claimed, taken over, completed, another token or none):
    nothing changes then. If cancelled, the statement is cancelled and nothing
    changes.
    """
    check_claim(key, holder)
    check_lease_token(lease_token, required=False)
    if lease_token is None:
        return False  # a holder's name alone releases nothing
    table = names.ident("receipts_table")

    def run(conn: psycopg.Connection[Any]) -> bool:
        cur = conn.execute(
            sql.SQL(
                "UPDATE {} SET claim_holder = NULL, claim_expires_at = NULL, "
                "claim_token_digest = NULL WHERE key = %s AND claim_holder = %s "
                "AND claim_token_digest = %s AND completed_at IS NULL RETURNING 1"
            ).format(table),
            (key, holder, _digest(lease_token)),
        )
        return cur.fetchone() is not None

    return await pool.run(run)


def check_claim(key: object, holder: object) -> None:
    """Raise ``InvalidInputError`` for a bad claim argument (before any table is touched)."""
    check_key(key, "receipt key")
    check_text(holder, "holder")


def check_completion(
    key: object,
    result: object,
    run_id: object,
    *,
    run_attempt: object,
    holder: object,
    lease_token: object = None,
) -> None:
    """Raise ``InvalidInputError`` for a bad completion argument (before any table is touched)."""
    check_key(key, "receipt key")
    check_text(run_id, "run_id")
    if holder is not None:
        check_text(holder, "holder")
    check_lease_token(lease_token, required=False)
    if run_attempt is not None:
        check_int("run_attempt", run_attempt, 0, _MAX_RUN_ATTEMPT)
    check_json_value(result, "receipt result")


async def complete_work_receipt(
    pool: ConnectionRunner,
    names: SheetNames,
    key: str,
    result: Any,
    run_id: str,
    *,
    run_attempt: int | None = None,
    holder: str | None = None,
    lease_token: str | None = None,
    now: dt.datetime | None = None,
) -> ReceiptCompletion:
    """Record ``result`` for ``key`` unless an earlier completion won.

    ``persisted``: this call wrote the receipt. ``existing``: an earlier writer
    won; its row is returned and ``result`` is dropped. Raises
    ``WorkReceiptFencedError`` (nothing written) when another holder's live
    claim owns the key (a live claim of ``holder`` needs its ``lease_token``),
    and ``InvalidInputError`` for a bad argument (a result
    that is not JSON, or larger than ``MAX_ROW_BYTES``). If cancelled, the
    statement is cancelled and nothing is written.
    """
    check_completion(
        key, result, run_id, run_attempt=run_attempt, holder=holder, lease_token=lease_token
    )
    params = {
        "key": key,
        "result": Jsonb(result),
        "run_id": run_id,
        "attempt": run_attempt,
        "holder": holder,
        "digest": _digest(lease_token),
        "now": _check_now(now),
    }
    table = names.ident("receipts_table")

    def run(conn: psycopg.Connection[Any]) -> ReceiptCompletion:
        cur = conn.execute(
            sql.SQL(
                "INSERT INTO {tbl} AS r (key, result, run_id, run_attempt, completed_at) "
                "VALUES (%(key)s, %(result)s, %(run_id)s, %(attempt)s, {now}) "
                "ON CONFLICT (key) DO UPDATE SET result = EXCLUDED.result, "
                "run_id = EXCLUDED.run_id, run_attempt = EXCLUDED.run_attempt, "
                "completed_at = EXCLUDED.completed_at "
                "WHERE r.completed_at IS NULL AND (r.claim_holder IS NULL "
                "OR (r.claim_holder = %(holder)s AND r.claim_token_digest = %(digest)s) "
                "OR r.claim_expires_at <= {now}) "
                "RETURNING result, run_id, completed_at"
            ).format(tbl=table, now=_NOW),
            params,
        )
        written = cur.fetchone()
        if written is not None:
            return ReceiptCompletion(_receipt(key, *written), "persisted")
        stored_result, stored_run, completed_at, _holder, expires_at = _stored(conn, table, key)
        if completed_at is not None:
            return ReceiptCompletion(
                _receipt(key, stored_result, stored_run, completed_at), "existing"
            )
        raise WorkReceiptFencedError(
            f"work receipt {key!r} is claimed by another holder until {_iso(expires_at)}; "
            f"the completion of run {run_id!r} was not recorded"
        )

    return await pool.run(run)
