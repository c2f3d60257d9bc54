"""Shares: an attempt's pending rows divided between its workers, in Postgres.

Many workers (processes, machines) map one attempt (one admission of a sheet,
named by its write version). They coordinate only here, beside the rows, in
the sheet's shares table (``SheetNames.shares_table``):

* A **share** is a block of up to ``max_rows`` of the attempt's pending rows in
  input order: the ``_input_index`` range ``first_index..last_index``. Row
  ``share_no = 0`` of an attempt is its cursor: how many shares were made
  (``first_index``) and the last index they cover (``last_index``).
* A **claim** takes the first share whose lease has ended unfinished (a dead
  or cut-off worker's: ``FOR UPDATE SKIP LOCKED``, so two claims never take
  one share), else makes the next share from the cursor (its row lock orders
  the makers; each takes the next ``max_rows`` unsettled rows after it), else
  answers ``none`` with how many shares are still held and when the first of
  them expires. The lease lasts ``ttl_ms`` (within ``SHARE_LEASE_MIN_TTL_MS``
  .. ``SHARE_LEASE_TTL_MS``) on the database's clock; the claim carries a secret
  token, of which the table keeps the SHA-256 digest.
* A **renewal** (the token) pushes the expiry on; a **release** gives the share
  up: finished (``done``, only when no row of its range is left unsettled, so a
  worker cannot drop rows) or not (free at once for another claim).
* Every call first reads the sheet's admission counter (the summary's
  ``write_version``): once a newer admission exists, claims and renewals answer
  ``superseded`` and the worker stops.

The rules are four ``SECURITY DEFINER`` functions per sheet, owned by the
tables' owner, with a pinned ``search_path``: the gateway's store calls them,
and a scoped session granted ``rows.claim`` may only ``EXECUTE`` them (no
privilege on the shares table), so it can claim shares only of its sheet's
current attempt and renew or release only shares whose token it holds.

Terminal writes stay fenced by the write version alone (``_fencing``): a
share's rows are written by whoever holds it, and the worker's lease keeping
(``sheetplane._workers``) stops its fn calls before its lease can end.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql

from .. import _checks
from .._attempts import AttemptStatus, ShareClaim, ShareRenewal
from .._ints import check_int
from .._types import BIGINT_MAX
from ..budgets import SHARE_LEASE_MIN_TTL_MS, SHARE_LEASE_TTL_MS, SHARE_MAX_ROWS
from ..errors import InvalidInputError
from ._names import SheetNames
from ._pool import ConnectionRunner

__all__ = [
    "SHARE_FUNCTIONS",
    "attempt_status",
    "claim_share",
    "release_share",
    "renew_share",
    "share_ddl",
    "share_function",
    "share_signatures",
    "shares_missing",
]

#: The share functions of a sheet and their argument types.
SHARE_FUNCTIONS: Final = {
    "claim": "bigint, text, text, integer, integer",
    "renew": "bigint, integer, text, integer",
    "release": "bigint, integer, text, boolean",
    "status": "bigint",
}

_UNSETTLED: Final = "_status IN ('pending', 'running')"


def share_function(names: SheetNames, which: str) -> sql.Identifier:
    """The sheet's share function ``which`` (``claim``, ``renew``, ``release``, ``status``)."""
    if which not in SHARE_FUNCTIONS:
        raise ValueError(f"not a share function: {which!r}")
    return sql.Identifier(names.schema, f"{names.sheet_table.removesuffix('_rows')}_share_{which}")


def share_signatures(names: SheetNames) -> list[sql.Composed]:
    """``fn(argument types)`` of each share function, as GRANT and REVOKE name them."""
    return [
        sql.SQL("{}({})").format(share_function(names, which), sql.SQL(types))
        for which, types in SHARE_FUNCTIONS.items()
    ]


def _bodies(names: SheetNames) -> dict[str, sql.Composed]:
    shares, sheet = names.ident("shares_table"), names.ident("sheet_table")
    summary = names.ident("summary_table")
    own = sql.SQL(
        "(r.seq).admitted_version = v AND (r.seq).write_version = v "
        "AND r._status IN ('pending', 'running')"
    )
    common = {"shares": shares, "sheet": sheet, "summary": summary, "own": own}
    claim = sql.SQL(
        """
DECLARE
  now_ timestamptz := clock_timestamp();
  expiry timestamptz;
  digest bytea;
  cur bigint;
  s record;
  made integer;
  covered bigint;
  f bigint;
  l bigint;
  n integer;
  first_expiry timestamptz;
BEGIN
  IF v IS NULL OR claim_holder IS NULL OR token IS NULL OR ttl_ms IS NULL OR max_rows IS NULL
     OR ttl_ms NOT BETWEEN {min_ttl} AND {max_ttl} OR max_rows NOT BETWEEN 1 AND {max_rows} THEN
    RAISE EXCEPTION 'a share claim out of bounds' USING ERRCODE = '22023';
  END IF;
  expiry := now_ + ttl_ms * interval '1 millisecond';
  digest := sha256(convert_to(token, 'UTF8'));
  SELECT write_version INTO cur FROM {summary};
  IF cur IS NULL OR cur < v THEN
    outcome := 'unknown'; RETURN NEXT; RETURN;
  ELSIF cur > v THEN
    outcome := 'superseded'; RETURN NEXT; RETURN;
  END IF;
  SELECT * INTO s FROM {shares} AS x
    WHERE x.write_version = v AND x.share_no > 0 AND NOT x.done AND x.expires_at <= now_
    ORDER BY x.share_no LIMIT 1 FOR UPDATE SKIP LOCKED;
  IF FOUND THEN
    UPDATE {shares} AS x SET holder = claim_holder, token_digest = digest,
      expires_at = expiry, claims = x.claims + 1
      WHERE x.write_version = v AND x.share_no = s.share_no;
    outcome := 'claimed'; share := s.share_no; first_i := s.first_index;
    last_i := s.last_index; taken := true; live_n := 0;
    RETURN NEXT; RETURN;
  END IF;
  INSERT INTO {shares} (write_version, share_no, first_index, last_index, done)
    VALUES (v, 0, 0, {before_all}, true) ON CONFLICT DO NOTHING;
  SELECT x.first_index, x.last_index INTO made, covered FROM {shares} AS x
    WHERE x.write_version = v AND x.share_no = 0 FOR UPDATE;
  SELECT min(q.i), max(q.i), count(*) INTO f, l, n FROM (
    SELECT r._input_index AS i FROM {sheet} AS r
      WHERE r._input_index > covered AND {own}
      ORDER BY r._input_index LIMIT max_rows) AS q;
  IF n > 0 THEN
    UPDATE {shares} AS x SET first_index = made + 1, last_index = l
      WHERE x.write_version = v AND x.share_no = 0;
    INSERT INTO {shares} (write_version, share_no, first_index, last_index, holder,
        token_digest, expires_at, done, claims)
      VALUES (v, made + 1, f, l, claim_holder, digest, expiry, false, 1);
    outcome := 'claimed'; share := made + 1; first_i := f; last_i := l;
    taken := false; live_n := 0;
    RETURN NEXT; RETURN;
  END IF;
  SELECT count(*), min(x.expires_at) INTO n, first_expiry FROM {shares} AS x
    WHERE x.write_version = v AND x.share_no > 0 AND NOT x.done;
  outcome := 'none'; live_n := n;
  retry_ms := CASE WHEN n = 0 THEN NULL ELSE greatest(0,
    ceil(extract(epoch FROM first_expiry - now_) * 1000))::bigint END;
  RETURN NEXT;
END
"""
    ).format(
        min_ttl=sql.Literal(SHARE_LEASE_MIN_TTL_MS),
        max_ttl=sql.Literal(SHARE_LEASE_TTL_MS),
        max_rows=sql.Literal(SHARE_MAX_ROWS),
        before_all=sql.Literal(-BIGINT_MAX - 1),
        **common,
    )
    renew = sql.SQL(
        """
DECLARE
  cur bigint;
BEGIN
  IF v IS NULL OR share IS NULL OR token IS NULL
     OR ttl_ms IS NULL OR ttl_ms NOT BETWEEN {min_ttl} AND {max_ttl} THEN
    RAISE EXCEPTION 'a share renewal out of bounds' USING ERRCODE = '22023';
  END IF;
  SELECT write_version INTO cur FROM {summary};
  IF cur > v THEN
    RETURN 'superseded';
  END IF;
  UPDATE {shares} AS x SET expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond'
    WHERE x.write_version = v AND x.share_no = share AND share > 0 AND NOT x.done
      AND x.token_digest = sha256(convert_to(token, 'UTF8'));
  IF FOUND THEN
    RETURN 'renewed';
  END IF;
  RETURN 'lost';
END
"""
    ).format(
        min_ttl=sql.Literal(SHARE_LEASE_MIN_TTL_MS),
        max_ttl=sql.Literal(SHARE_LEASE_TTL_MS),
        **common,
    )
    release = sql.SQL(
        """
DECLARE
  s record;
  settled boolean;
BEGIN
  IF v IS NULL OR share IS NULL OR token IS NULL OR finished IS NULL THEN
    RAISE EXCEPTION 'a share release out of bounds' USING ERRCODE = '22023';
  END IF;
  SELECT * INTO s FROM {shares} AS x
    WHERE x.write_version = v AND x.share_no = share AND share > 0 AND NOT x.done
      AND x.token_digest = sha256(convert_to(token, 'UTF8'))
    FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 'lost';
  END IF;
  settled := finished AND NOT EXISTS (SELECT FROM {sheet} AS r
    WHERE r._input_index BETWEEN s.first_index AND s.last_index AND {own});
  UPDATE {shares} AS x SET done = settled, token_digest = NULL,
      expires_at = least(x.expires_at, clock_timestamp())
    WHERE x.write_version = v AND x.share_no = share;
  RETURN 'released';
END
"""
    ).format(**common)
    status = sql.SQL(
        """
DECLARE
  now_ timestamptz := clock_timestamp();
BEGIN
  SELECT write_version INTO current_version FROM {summary};
  SELECT count(*) FILTER (WHERE r._status IN ('pending', 'running')),
         count(*) FILTER (WHERE r._status = 'enriched'),
         count(*) FILTER (WHERE r._status = 'failed')
    INTO pending_n, enriched_n, failed_n
    FROM {sheet} AS r WHERE (r.seq).admitted_version = v AND (r.seq).write_version = v;
  SELECT count(*) INTO claimed_n FROM {sheet} AS r JOIN {shares} AS x
    ON x.write_version = v AND x.share_no > 0 AND NOT x.done AND x.expires_at > now_
    AND r._input_index BETWEEN x.first_index AND x.last_index
    WHERE {own};
  SELECT count(DISTINCT x.holder) INTO workers_n FROM {shares} AS x
    WHERE x.write_version = v AND x.share_no > 0 AND NOT x.done AND x.expires_at > now_;
  RETURN NEXT;
END
"""
    ).format(**common)
    return {"claim": claim, "renew": renew, "release": release, "status": status}


_HEADS: Final = {
    "claim": (
        "v bigint, claim_holder text, token text, ttl_ms integer, max_rows integer",
        "TABLE (outcome text, share integer, first_i bigint, last_i bigint, taken boolean,"
        " live_n integer, retry_ms bigint)",
    ),
    "renew": ("v bigint, share integer, token text, ttl_ms integer", "text"),
    "release": ("v bigint, share integer, token text, finished boolean", "text"),
    "status": (
        "v bigint",
        "TABLE (current_version bigint, pending_n bigint, claimed_n bigint, enriched_n bigint,"
        " failed_n bigint, workers_n bigint)",
    ),
}


def share_ddl(conn: psycopg.Connection[Any], names: SheetNames) -> list[sql.Composed]:
    """The statements that (re)create the shares table and its functions; run by the
    tables' owner under the DDL lock (``_schema.ensure_sheet``)."""
    pinned = sql.SQL("SET search_path = pg_catalog, pg_temp")
    statements = [
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                write_version bigint NOT NULL,
                share_no integer NOT NULL,
                first_index bigint NOT NULL,
                last_index bigint NOT NULL,
                holder text,
                token_digest bytea,
                expires_at timestamptz,
                done boolean NOT NULL DEFAULT false,
                claims integer NOT NULL DEFAULT 0,
                PRIMARY KEY (write_version, share_no)
            )"""
        ).format(names.ident("shares_table")),
        # No policy: a role granted more than it should on the table still sees no row.
        sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(names.ident("shares_table")),
    ]
    for which, body in _bodies(names).items():
        arguments, returns = _HEADS[which]
        function = share_function(names, which)
        statements += [
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {}({}) RETURNS {} LANGUAGE plpgsql "
                "SECURITY DEFINER {} AS {}"
            ).format(
                function,
                sql.SQL(arguments),
                sql.SQL(returns),
                pinned,
                sql.Literal(body.as_string(conn)),
            ),
            sql.SQL("REVOKE ALL ON FUNCTION {}({}) FROM PUBLIC").format(
                function, sql.SQL(SHARE_FUNCTIONS[which])
            ),
        ]
    return statements


def shares_missing(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether any of the sheet's share functions is missing (the table is one of
    ``TABLE_ATTRS``, checked with the others)."""
    signatures = [signature.as_string(conn) for signature in share_signatures(names)]
    row = conn.execute(
        "SELECT bool_or(to_regprocedure(s) IS NULL) FROM unnest(%s::text[]) AS s", (signatures,)
    ).fetchone()
    return bool(row and row[0])


def _require(conn: psycopg.Connection[Any], names: SheetNames, which: str, version: int) -> None:
    """``InvalidInputError`` when the sheet has no share functions: it was never
    admitted (or not since shares existed), so ``version`` names no attempt of it."""
    signature = sql.SQL("{}({})").format(
        share_function(names, which), sql.SQL(SHARE_FUNCTIONS[which])
    )
    row = conn.execute(
        "SELECT to_regprocedure(%s) IS NOT NULL", (signature.as_string(conn),)
    ).fetchone()
    if not (row and row[0]):
        raise InvalidInputError(
            f"the sheet has no admission at write version {version}: not an attempt"
        )


def _version(write_version: object) -> int:
    return check_int("write_version", write_version, 1, BIGINT_MAX)


def _ttl(ttl_ms: object) -> int:
    return check_int("ttl_ms", ttl_ms, SHARE_LEASE_MIN_TTL_MS, SHARE_LEASE_TTL_MS)


def _share(share: object) -> int:
    return check_int("share", share, 1, 2**31 - 1)


async def claim_share(
    pool: ConnectionRunner,
    names: SheetNames,
    write_version: int,
    holder: str,
    token: str,
    *,
    ttl_ms: int,
    max_rows: int,
) -> ShareClaim:
    """Claim a share of the attempt at ``write_version`` for ``holder`` (see the module
    docstring). Raises ``InvalidInputError`` for bad arguments, or when the sheet has no
    admission at ``write_version`` (nothing written)."""
    version = _version(write_version)
    params = (
        version,
        _checks.text("holder", holder),
        _checks.text("token", token),
        _ttl(ttl_ms),
        check_int("max_rows", max_rows, 1, SHARE_MAX_ROWS),
    )

    def run(conn: psycopg.Connection[Any]) -> ShareClaim:
        _require(conn, names, "claim", version)
        row = conn.execute(
            sql.SQL("SELECT * FROM {}(%s, %s, %s, %s, %s)").format(share_function(names, "claim")),
            params,
        ).fetchone()
        assert row is not None
        outcome, share, first, last, taken, live, retry = row
        if outcome == "unknown":
            raise InvalidInputError(
                f"the sheet has no admission at write version {version}: not an attempt"
            )
        if outcome == "claimed":
            return ShareClaim("claimed", share, first, last, taken_over=bool(taken))
        if outcome == "superseded":
            return ShareClaim("superseded")
        return ShareClaim("none", live=int(live), retry_after_ms=retry)

    return await pool.run(run)


async def renew_share(
    pool: ConnectionRunner,
    names: SheetNames,
    write_version: int,
    share: int,
    token: str,
    *,
    ttl_ms: int,
) -> ShareRenewal:
    """Push the lease of ``share`` (held with ``token``) ``ttl_ms`` on from now:
    ``renewed``, ``lost`` (not this token's, or finished) or ``superseded``."""
    params = (_version(write_version), _share(share), _checks.text("token", token), _ttl(ttl_ms))

    def run(conn: psycopg.Connection[Any]) -> ShareRenewal:
        _require(conn, names, "renew", params[0])
        row = conn.execute(
            sql.SQL("SELECT {}(%s, %s, %s, %s)").format(share_function(names, "renew")), params
        ).fetchone()
        assert row is not None
        return ShareRenewal(row[0])

    return await pool.run(run)


async def release_share(
    pool: ConnectionRunner,
    names: SheetNames,
    write_version: int,
    share: int,
    token: str,
    *,
    finished: bool,
) -> ShareRenewal:
    """Give ``share`` up: ``finished`` marks it done when none of its rows is left
    unsettled; otherwise (or when some are) it is free for another claim at once.
    ``released``, or ``lost`` when it was not this token's."""
    if not isinstance(finished, bool):
        raise InvalidInputError(f"finished must be a bool, got {finished!r}")
    params = (_version(write_version), _share(share), _checks.text("token", token), finished)

    def run(conn: psycopg.Connection[Any]) -> ShareRenewal:
        _require(conn, names, "release", params[0])
        row = conn.execute(
            sql.SQL("SELECT {}(%s, %s, %s, %s)").format(share_function(names, "release")), params
        ).fetchone()
        assert row is not None
        return ShareRenewal(row[0])

    return await pool.run(run)


async def attempt_status(
    pool: ConnectionRunner, names: SheetNames, write_version: int
) -> AttemptStatus:
    """Where the attempt at ``write_version`` stands (``AttemptStatus``)."""
    version = _version(write_version)

    def run(conn: psycopg.Connection[Any]) -> AttemptStatus:
        _require(conn, names, "status", version)
        row = conn.execute(
            sql.SQL("SELECT * FROM {}(%s)").format(share_function(names, "status")), (version,)
        ).fetchone()
        assert row is not None
        current, pending, claimed, enriched, failed, workers = row
        if current is None or current < version:
            raise InvalidInputError(
                f"the sheet has no admission at write version {version}: not an attempt"
            )
        return AttemptStatus(
            pending=int(pending),
            claimed=int(claimed),
            enriched=int(enriched),
            failed=int(failed),
            workers=int(workers),
            superseded=current > version,
        )

    return await pool.run(run)
