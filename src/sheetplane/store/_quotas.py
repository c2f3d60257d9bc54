"""What one org may keep in the store: its sheets and its plays' receipt tables, its
open admissions and their staged bytes.

The bounds are ``budgets``' (``MAX_SHEETS_PER_ORG``, ``MAX_RECEIPT_TABLES_PER_ORG``,
``ORG_MAX_OPEN_ADMISSIONS``, ``TOKEN_MAX_OPEN_ADMISSIONS``, the staged-bytes
bounds); a store takes smaller ones for tests and for an operator's own limits.
A new sheet or receipt table is counted against them inside the DDL
transaction, after the org's DDL key (``_schema.ensure_ddl``), so concurrent
first callers of one org cannot together pass the cap.

Open admissions and staged bytes are counters, kept exact under concurrency by
reserving before anything is kept: ``UPDATE ... SET n = n + k WHERE n + k <=
bound``, which waits on a concurrent reservation of the same counter's row and
then reads its result, so two racing chunks cannot both take the last room.

* per admission, on its registry row: ``staged_bytes`` against
  ``max_staged_bytes`` (the begin's ``max_admission_staged_bytes``), and its
  token's id (``token_id``: a digest, never the token);
* per org and per token, one row each in the gateway-owned table
  ``sheetplane_staging.quotas`` (``(scope, key)``: ``('org', schema)``,
  ``('token', token id)``), with their bounds, which the begin that makes or
  changes them writes.

The total is not a counter anyone locks: it is every org's counter summed, read
without a lock, against the bound the row ``('total', '')`` records. A reserved
counter row stays locked until the reserving transaction ends, and a stage role
controls its own transaction: one row shared by every org let one org's open
transaction stall every other org's staging. The rows a chunk locks (its
admission's, its org's) couple a tenant only with itself. The price: the sum a
chunk reads holds what other orgs have committed, not what their transactions
in flight have reserved, so concurrent chunks of different orgs can pass the
total by what those transactions hold: at most one transaction per org (its
org's row orders its own), and each at most ``max_transaction_staged_bytes``
(``STAGING_MAX_TRANSACTION_BYTES``; every road writes one chunk per
transaction, so only a stage role's own transaction of many rows meets it),
counted per org in ``sheetplane_staging.transactions`` by the transaction's id.
A staging row is refused in a transaction above ``READ COMMITTED``, whose
snapshot would hide other orgs' commits from the sum.

A begin reserves one open admission of its org and of its token, only when it
registers a new admission (a retried begin reserves nothing), in its own
transaction: past a bound it raises and nothing is kept. A staging row is
reserved by an ``AFTER INSERT`` row trigger on the staging table whose function
(``sheetplane_staging.reserve_chunk``, ``SECURITY DEFINER``, owned by the
tables' owner) adds the row's ``pg_column_size`` of its keys and rows (the table
stores them uncompressed) to its admission's and its org's counters, in that
order, and to its transaction's on the org, then reads the total, and refuses
the row past any bound (the statement fails, and the row goes with it). It
fires for every road: the gateway's ``INSERT``, the direct road's, and a stage
role's own ``COPY``, which holds no privilege on the registry or the counters
and cannot disable the trigger. An admission that leaves ``open`` (commit,
abort, expiry; or a deleted open row) gives everything back: an ``AFTER UPDATE
OF state`` (and ``AFTER DELETE``) row trigger on the registry
(``sheetplane_staging.release_admission``) subtracts its staged bytes from its
org's counter and its open admission from its org's and its token's.

The rows are locked in one order, after the sheet's own locks
(``_locking``): the admission's registry row, then the org's counter, the
org's transaction row, the token's. Only a begin whose bounds differ from the
recorded ones writes the total's row (in the gateway's own short transaction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs
import psycopg
from psycopg import sql

from .._checks import positive_field as _positive
from ..budgets import (
    ADMISSION_MAX_LIFETIME_MS,
    ADMISSION_MAX_STAGED_BYTES,
    MAX_RECEIPT_TABLES_PER_ORG,
    MAX_SHEETS_PER_ORG,
    ORG_MAX_OPEN_ADMISSIONS,
    ORG_MAX_STAGED_BYTES,
    STAGING_CHUNK_RECORD_BYTES,
    STAGING_MAX_TOTAL_BYTES,
    STAGING_MAX_TRANSACTION_BYTES,
    TOKEN_MAX_OPEN_ADMISSIONS,
)
from ..errors import AdmissionStagingTooLargeError, SheetCapError, StagingQuotaError
from ._names import ADMISSIONS_SUFFIX

if TYPE_CHECKING:
    from ._names import SheetNames

__all__ = [
    "ADMISSION_QUOTA_COLUMNS",
    "QUOTA_SCHEMA",
    "QUOTA_TRIGGERS",
    "StoreQuotas",
    "check_admission_room",
    "check_room",
    "counted_orgs",
    "create_quota_objects",
    "quota_objects_missing",
    "quota_trigger_ddl",
    "quota_triggers_missing",
    "reconcile_org",
    "reconcile_tokens",
    "reserve_admission",
    "staging_refusal",
]


@attrs.frozen(kw_only=True)
class StoreQuotas:
    """The bounds of what one org may keep; the defaults are ``budgets``'."""

    max_sheets_per_org: int = attrs.field(default=MAX_SHEETS_PER_ORG, validator=_positive)
    max_receipt_tables_per_org: int = attrs.field(
        default=MAX_RECEIPT_TABLES_PER_ORG, validator=_positive
    )
    max_open_admissions_per_org: int = attrs.field(
        default=ORG_MAX_OPEN_ADMISSIONS, validator=_positive
    )
    max_open_admissions_per_token: int = attrs.field(
        default=TOKEN_MAX_OPEN_ADMISSIONS, validator=_positive
    )
    max_admission_staged_bytes: int = attrs.field(
        default=ADMISSION_MAX_STAGED_BYTES, validator=_positive
    )
    max_org_staged_bytes: int = attrs.field(default=ORG_MAX_STAGED_BYTES, validator=_positive)
    max_total_staged_bytes: int = attrs.field(default=STAGING_MAX_TOTAL_BYTES, validator=_positive)
    max_transaction_staged_bytes: int = attrs.field(
        default=STAGING_MAX_TRANSACTION_BYTES, validator=_positive
    )
    admission_lifetime_ms: int = attrs.field(default=ADMISSION_MAX_LIFETIME_MS, validator=_positive)


#: A sheet's tables are ``t_<slug>_<hash>_<suffix>`` and a play's receipts table
#: ``r_<slug>_<hash>_receipts`` (``_names``): one rows table per sheet.
_PATTERNS: Final = {"sheet": r"t\_%\_rows", "receipts": r"r\_%\_receipts"}

_COUNT: Final = (
    "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND c.relname LIKE %s"
)


def check_room(conn: psycopg.Connection[Any], schema: str, kind: str, cap: int) -> None:
    """Raise ``SheetCapError`` when ``schema`` already holds ``cap`` tables of ``kind``
    (``sheet``: sheets, ``receipts``: plays' receipt tables). Run under the org's DDL
    key, before creating a new one."""
    row = conn.execute(_COUNT, (schema, _PATTERNS[kind])).fetchone()
    held = 0 if row is None else int(row[0])
    if held >= cap:
        what = "sheets" if kind == "sheet" else "plays' receipt tables"
        raise SheetCapError(
            f"the org holds {held} {what}, its cap is {cap}: a new one is refused "
            "(reuse an existing sheet or play, or ask the operator to remove old ones)"
        )


#: The gateway-owned schema of the staging counters and their functions: no scoped
#: role has ``USAGE`` on it (the triggers' functions run as their owner).
QUOTA_SCHEMA: Final = "sheetplane_staging"
_QUOTAS: Final = sql.Identifier(QUOTA_SCHEMA, "quotas")
#: Per org: what its latest staging transaction reserved (``xact_id``,
#: ``staged_bytes``) against ``max_staged_bytes``.
_TRANSACTIONS: Final = sql.Identifier(QUOTA_SCHEMA, "transactions")
_TAKE: Final = sql.Identifier(QUOTA_SCHEMA, "take_bytes")
_RESERVE_CHUNK: Final = sql.Identifier(QUOTA_SCHEMA, "reserve_chunk")
_RELEASE: Final = sql.Identifier(QUOTA_SCHEMA, "release_admission")

#: The constraint names the staging trigger refuses a row with, one per bound.
ADMISSION_BOUND: Final = "sheetplane_admission_staged_bytes"
ORG_BOUND: Final = "sheetplane_org_staged_bytes"
TOTAL_BOUND: Final = "sheetplane_total_staged_bytes"
TRANSACTION_BOUND: Final = "sheetplane_transaction_staged_bytes"

#: The registry's quota columns (created with it, or added to an older one).
ADMISSION_QUOTA_COLUMNS: Final = (
    "token_id text",
    "staged_bytes bigint NOT NULL DEFAULT 0",
    f"max_staged_bytes bigint NOT NULL DEFAULT {ADMISSION_MAX_STAGED_BYTES}",
    "open_counted boolean NOT NULL DEFAULT false",
)

#: (trigger name, table attribute) of the quota triggers of one sheet.
QUOTA_TRIGGERS: Final = (
    ("sheetplane_reserve_staged_bytes", "staging_table"),
    ("sheetplane_admission_release", "admissions_table"),
    ("sheetplane_admission_release_deleted", "admissions_table"),
    ("sheetplane_reserve_chunk_record", "stage_chunks_table"),
)

#: The staging trigger's first form, a ``BEFORE INSERT`` one: handing each chunk's
#: row to a row trigger before it is stored cost a 2.7 MB chunk about 20 ms (the
#: trigger's own work, half a millisecond, is the same after it is stored).
_SUPERSEDED_TRIGGERS: Final = ("sheetplane_staged_bytes",)

_TAKE_BODY: Final = f"""
BEGIN
  UPDATE {QUOTA_SCHEMA}.quotas SET staged_bytes = staged_bytes + p_bytes
    WHERE scope = p_scope AND key = p_key AND staged_bytes + p_bytes <= max_staged_bytes;
  IF FOUND THEN
    RETURN true;
  END IF;
  -- A counter no begin made (an admission begun before the counters existed).
  INSERT INTO {QUOTA_SCHEMA}.quotas (scope, key, max_staged_bytes)
    VALUES (p_scope, p_key, p_bound) ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  UPDATE {QUOTA_SCHEMA}.quotas SET staged_bytes = staged_bytes + p_bytes
    WHERE scope = p_scope AND key = p_key AND staged_bytes + p_bytes <= max_staged_bytes;
  RETURN FOUND;
END
"""

_RESERVE_CHUNK_BODY: Final = f"""
DECLARE
  n bigint;
  admission text;
  found_state text;
  held bigint;
  bound bigint;
BEGIN
  IF TG_ARGV[2] = 'record' THEN
    -- A chunk record (the chunk table's row): what one costs on disk, index included.
    n := {STAGING_CHUNK_RECORD_BYTES};
    admission := NEW.admission_id;
  ELSE
    n := pg_column_size(NEW._keys) + pg_column_size(NEW._rows);
    admission := NEW._admission_id;
  END IF;
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    -- Its snapshot would hide what other orgs committed since from the total below.
    RAISE EXCEPTION 'staging rows are written only in READ COMMITTED transactions'
      USING ERRCODE = 'feature_not_supported';
  END IF;
  EXECUTE format('UPDATE %s SET staged_bytes = staged_bytes + $1 WHERE admission_id = $2 '
    'AND state = ''open'' AND staged_bytes + $1 <= max_staged_bytes RETURNING state',
    TG_ARGV[0]::regclass) INTO found_state USING n, admission;
  IF found_state IS NULL THEN
    EXECUTE format('SELECT state, staged_bytes, max_staged_bytes FROM %s WHERE admission_id = $1',
      TG_ARGV[0]::regclass) INTO found_state, held, bound USING admission;
    IF found_state IS NULL THEN
      RETURN NEW;  -- no such admission: the row's foreign key refuses it
    ELSIF found_state <> 'open' THEN
      RAISE EXCEPTION 'admission % is %', admission, found_state
        USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RAISE EXCEPTION 'admission % holds % staged bytes; a chunk of % would pass its bound of %',
      admission, held, n, bound
      USING ERRCODE = 'program_limit_exceeded', CONSTRAINT = '{ADMISSION_BOUND}';
  END IF;
  IF NOT {QUOTA_SCHEMA}.take_bytes('org', TG_ARGV[1], n, {ORG_MAX_STAGED_BYTES}) THEN
    SELECT staged_bytes, max_staged_bytes INTO held, bound FROM {QUOTA_SCHEMA}.quotas
      WHERE scope = 'org' AND key = TG_ARGV[1];
    RAISE EXCEPTION 'the org''s open admissions hold % staged bytes; a chunk of % would pass '
      'its bound of % (commit or abort some)', held, n, bound
      USING ERRCODE = 'configuration_limit_exceeded', CONSTRAINT = '{ORG_BOUND}';
  END IF;
  -- What this transaction reserved on its org (the row is its org's only): it is
  -- what the other orgs' reading of the total below cannot see until it commits.
  INSERT INTO {QUOTA_SCHEMA}.transactions AS t (org, xact_id, staged_bytes, max_staged_bytes)
    VALUES (TG_ARGV[1], pg_current_xact_id(), n, {STAGING_MAX_TRANSACTION_BYTES})
    ON CONFLICT (org) DO UPDATE SET xact_id = pg_current_xact_id(), staged_bytes =
      CASE WHEN t.xact_id = pg_current_xact_id() THEN t.staged_bytes + n ELSE n END
    RETURNING t.staged_bytes, t.max_staged_bytes INTO held, bound;
  IF held > bound THEN
    RAISE EXCEPTION 'this transaction has staged % bytes of the org; one may stage at most % '
      '(commit between chunks)', held, bound
      USING ERRCODE = 'configuration_limit_exceeded', CONSTRAINT = '{TRANSACTION_BOUND}';
  END IF;
  -- The total is every org's counter summed, read without locking: no row lock one
  -- org holds couples another org (an org's open transaction would stall them all).
  SELECT coalesce(sum(staged_bytes), 0) INTO held FROM {QUOTA_SCHEMA}.quotas
    WHERE scope = 'org';
  SELECT max_staged_bytes INTO bound FROM {QUOTA_SCHEMA}.quotas
    WHERE scope = 'total' AND key = '';
  IF held > coalesce(bound, {STAGING_MAX_TOTAL_BYTES}) THEN
    RAISE EXCEPTION 'the gateway''s staging space is full; retry after other admissions commit'
      USING ERRCODE = 'configuration_limit_exceeded', CONSTRAINT = '{TOTAL_BOUND}';
  END IF;
  -- An AFTER trigger's result is ignored; NEW keeps a sheet that still has the
  -- superseded BEFORE trigger storing its rows until ensure_sheet replaces it.
  RETURN NEW;
END
"""

_RELEASE_BODY: Final = f"""
BEGIN
  UPDATE {QUOTA_SCHEMA}.quotas SET staged_bytes = staged_bytes - OLD.staged_bytes,
      open_admissions = open_admissions - OLD.open_counted::integer
    WHERE scope = 'org' AND key = TG_ARGV[0];
  IF OLD.open_counted AND OLD.token_id IS NOT NULL THEN
    UPDATE {QUOTA_SCHEMA}.quotas SET open_admissions = open_admissions - 1
      WHERE scope = 'token' AND key = OLD.token_id;
  END IF;
  RETURN NULL;
END
"""

_PINNED: Final = "SET search_path = pg_catalog, pg_temp"


_BODIES: Final = {
    "take_bytes": _TAKE_BODY,
    "reserve_chunk": _RESERVE_CHUNK_BODY,
    "release_admission": _RELEASE_BODY,
}


def quota_objects_missing(conn: psycopg.Connection[Any]) -> bool:
    """Whether the counters' table or one of their functions is missing, or a function
    has another body than this version's (read from the catalog tables, as
    ``_schema.ensure_ddl`` needs)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        "  WHERE n.nspname = %(schema)s AND c.relname IN ('quotas', 'transactions')"
        "  AND c.relkind = 'r') = 2"
        " AND (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        "  JOIN unnest(%(names)s::text[], %(bodies)s::text[]) AS b(name, body)"
        "  ON b.name = p.proname AND b.body = p.prosrc"
        "  WHERE n.nspname = %(schema)s) = %(count)s",
        {
            "schema": QUOTA_SCHEMA,
            "names": list(_BODIES),
            "bodies": list(_BODIES.values()),
            "count": len(_BODIES),
        },
    ).fetchone()
    return row != (True,)


def create_quota_objects(conn: psycopg.Connection[Any]) -> None:
    """Create the counters' schema, table and functions (run under their DDL key)."""
    schema = sql.Identifier(QUOTA_SCHEMA)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
    conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(schema))
    conn.execute(
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                scope text NOT NULL CHECK (scope IN ('org', 'token', 'total')),
                key text NOT NULL,
                staged_bytes bigint NOT NULL DEFAULT 0,
                max_staged_bytes bigint NOT NULL DEFAULT 0,
                open_admissions integer NOT NULL DEFAULT 0,
                max_open_admissions integer NOT NULL DEFAULT 0,
                PRIMARY KEY (scope, key)
            )"""
        ).format(_QUOTAS)
    )
    conn.execute(
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                org text PRIMARY KEY,
                xact_id xid8,
                staged_bytes bigint NOT NULL DEFAULT 0,
                max_staged_bytes bigint NOT NULL
            )"""
        ).format(_TRANSACTIONS)
    )
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}(p_scope text, p_key text, p_bytes bigint, "
            "p_bound bigint) RETURNS boolean LANGUAGE plpgsql {} AS {}"
        ).format(_TAKE, sql.SQL(_PINNED), sql.Literal(_TAKE_BODY))
    )
    for function, body, definer in (
        (_RESERVE_CHUNK, _RESERVE_CHUNK_BODY, sql.SQL("SECURITY DEFINER ")),
        (_RELEASE, _RELEASE_BODY, sql.SQL("")),
    ):
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql {}{} AS {}"
            ).format(function, definer, sql.SQL(_PINNED), sql.Literal(body))
        )
    for signature in (
        sql.SQL("{}(text, text, bigint, bigint)").format(_TAKE),
        sql.SQL("{}()").format(_RESERVE_CHUNK),
        sql.SQL("{}()").format(_RELEASE),
    ):
        conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(signature))
    # The total row keeps only the bound now (the total is the orgs' counters summed);
    # what an older version counted on it is cleared so no reader takes it for one.
    conn.execute(
        sql.SQL(
            "UPDATE {} SET staged_bytes = 0 WHERE scope = 'total' AND staged_bytes <> 0"
        ).format(_QUOTAS)
    )


def quota_trigger_ddl(conn: psycopg.Connection[Any], names: SheetNames) -> list[sql.Composed]:
    """The sheet's missing quota triggers created: the staging row's reservation, the
    registry's release (none when all are there: a trigger's DDL locks its table,
    which the sheet's DDL must not do to a live staging table or registry)."""
    staging, admissions = names.ident("staging_table"), names.ident("admissions_table")
    chunks = names.ident("stage_chunks_table")
    present = {
        str(row[0])
        for row in conn.execute(
            "SELECT tgname FROM pg_trigger"
            " WHERE tgrelid IN (%s::regclass, %s::regclass, %s::regclass)",
            (staging.as_string(conn), admissions.as_string(conn), chunks.as_string(conn)),
        ).fetchall()
    }
    schema = sql.Literal(names.schema)
    made = {
        QUOTA_TRIGGERS[0][0]: sql.SQL(
            "CREATE TRIGGER {} AFTER INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}({}, {})"
        ).format(
            sql.Identifier(QUOTA_TRIGGERS[0][0]),
            staging,
            _RESERVE_CHUNK,
            sql.Literal(admissions.as_string(conn)),
            schema,
        ),
        QUOTA_TRIGGERS[1][0]: sql.SQL(
            "CREATE TRIGGER {} AFTER UPDATE OF state ON {} FOR EACH ROW "
            "WHEN (OLD.state = 'open' AND NEW.state <> 'open') EXECUTE FUNCTION {}({})"
        ).format(sql.Identifier(QUOTA_TRIGGERS[1][0]), admissions, _RELEASE, schema),
        QUOTA_TRIGGERS[2][0]: sql.SQL(
            "CREATE TRIGGER {} AFTER DELETE ON {} FOR EACH ROW "
            "WHEN (OLD.state = 'open') EXECUTE FUNCTION {}({})"
        ).format(sql.Identifier(QUOTA_TRIGGERS[2][0]), admissions, _RELEASE, schema),
        QUOTA_TRIGGERS[3][0]: sql.SQL(
            "CREATE TRIGGER {} AFTER INSERT ON {} FOR EACH ROW"
            " EXECUTE FUNCTION {}({}, {}, 'record')"
        ).format(
            sql.Identifier(QUOTA_TRIGGERS[3][0]),
            chunks,
            _RESERVE_CHUNK,
            sql.Literal(admissions.as_string(conn)),
            schema,
        ),
    }
    # The registry's first (the lock order of the sheet's DDL, ``_schema.ensure_sheet``).
    order = (
        QUOTA_TRIGGERS[1][0],
        QUOTA_TRIGGERS[2][0],
        QUOTA_TRIGGERS[3][0],
        QUOTA_TRIGGERS[0][0],
    )
    statements = [made[name] for name in order if name not in present]
    statements += [
        sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(name), staging)
        for name in _SUPERSEDED_TRIGGERS
        if name in present
    ]
    return statements


def quota_triggers_missing(conn: psycopg.Connection[Any], names: SheetNames) -> bool:
    """Whether one of the sheet's quota triggers is missing (an older sheet)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = ANY(%s) AND t.tgname = ANY(%s)",
        (
            names.schema,
            [names.staging_table, names.admissions_table, names.stage_chunks_table],
            [name for name, _ in QUOTA_TRIGGERS],
        ),
    ).fetchone()
    return row is None or row[0] != len(QUOTA_TRIGGERS)


def reserve_admission(
    conn: psycopg.Connection[Any], quotas: StoreQuotas, schema: str, token_id: str | None
) -> None:
    """Reserve one open admission of the org of ``schema`` and of the token ``token_id``
    (None: a store called without one), writing the counters' bounds first; raise
    ``StagingQuotaError`` past either bound (the caller's transaction then keeps
    nothing). Run by a begin that registered a new admission."""
    counters = [
        ("org", schema, quotas.max_org_staged_bytes, quotas.max_open_admissions_per_org),
        ("total", "", quotas.max_total_staged_bytes, 0),
    ]
    if token_id is not None:
        counters.append(("token", token_id, 0, quotas.max_open_admissions_per_token))
    values = sql.SQL(", ").join(sql.SQL("(%s, %s, %s::bigint, %s::integer)") for _ in counters)
    flat = [value for counter in counters for value in counter]
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (scope, key, max_staged_bytes, max_open_admissions) VALUES {} "
            "ON CONFLICT DO NOTHING"
        ).format(_QUOTAS, values),
        flat,
    )
    # Only a changed bound is written: an unchanged one takes no row lock.
    conn.execute(
        sql.SQL(
            "UPDATE {} AS q SET max_staged_bytes = v.b, max_open_admissions = v.o "
            "FROM (VALUES {}) AS v(s, k, b, o) WHERE q.scope = v.s AND q.key = v.k "
            "AND (q.max_staged_bytes, q.max_open_admissions) IS DISTINCT FROM (v.b, v.o)"
        ).format(_QUOTAS, values),
        flat,
    )
    bound = quotas.max_transaction_staged_bytes
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (org, max_staged_bytes) VALUES (%s, %s) ON CONFLICT DO NOTHING"
        ).format(_TRANSACTIONS),
        (schema, bound),
    )
    conn.execute(
        sql.SQL(
            "UPDATE {} SET max_staged_bytes = %s WHERE org = %s AND max_staged_bytes <> %s"
        ).format(_TRANSACTIONS),
        (bound, schema, bound),
    )
    for scope, key, what in _open_counters(schema, token_id):
        taken = conn.execute(
            sql.SQL(
                "UPDATE {} SET open_admissions = open_admissions + 1 WHERE scope = %s "
                "AND key = %s AND open_admissions < max_open_admissions "
                "RETURNING open_admissions"
            ).format(_QUOTAS),
            (scope, key),
        ).fetchone()
        if taken is None:
            _refuse_open(conn, scope, key, what, None)


def _open_counters(schema: str, token_id: str | None) -> list[tuple[str, str, str]]:
    """``(scope, key, what)`` of the open-admission counters a begin takes, in order."""
    counters = [("org", schema, "the org")]
    if token_id is not None:
        counters.append(("token", token_id, "this token"))
    return counters


def _refuse_open(
    conn: psycopg.Connection[Any], scope: str, key: str, what: str, bound: int | None
) -> None:
    """Raise ``StagingQuotaError`` when the counter ``(scope, key)`` holds its bound
    (``bound``, else the one its row records; a missing row holds none)."""
    found = conn.execute(
        sql.SQL(
            "SELECT open_admissions, max_open_admissions FROM {} WHERE scope = %s AND key = %s"
        ).format(_QUOTAS),
        (scope, key),
    ).fetchone()
    held = 0 if found is None else int(found[0])
    if bound is None:
        bound = 0 if found is None else int(found[1])
    if held >= bound:
        raise StagingQuotaError(
            f"{what} holds {held} open admissions, its bound is {bound} (commit or abort some)"
        )


def check_admission_room(
    conn: psycopg.Connection[Any], quotas: StoreQuotas, schema: str, token_id: str | None
) -> None:
    """Raise ``StagingQuotaError`` when the org of ``schema`` or the token ``token_id``
    holds its bound of open admissions: a begin on a new sheet checks this before the
    sheet's tables are made (``reserve_admission`` counts exactly, after them)."""
    if quota_objects_missing(conn):
        return  # no admission was ever begun here
    bounds = {
        "org": quotas.max_open_admissions_per_org,
        "token": quotas.max_open_admissions_per_token,
    }
    for scope, key, what in _open_counters(schema, token_id):
        _refuse_open(conn, scope, key, what, bounds[scope])


def staging_refusal(exc: psycopg.Error) -> Exception | None:
    """The store's error for a staging row the reservation trigger refused (None when
    ``exc`` is something else)."""
    constraint = exc.diag.constraint_name
    message = exc.diag.message_primary or ""
    if isinstance(exc, psycopg.errors.ProgramLimitExceeded) and constraint == ADMISSION_BOUND:
        return AdmissionStagingTooLargeError(message)
    if isinstance(exc, psycopg.errors.ConfigurationLimitExceeded) and constraint in (
        ORG_BOUND,
        TOTAL_BOUND,
        TRANSACTION_BOUND,
    ):
        return StagingQuotaError(message)
    return None


# --- reconciliation (the reaper's pass) -------------------------------------------------

_REGISTRIES: Final = (
    "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'open_counted'"
    " AND NOT a.attisdropped WHERE c.relkind = 'r' AND n.nspname LIKE %s AND c.relname LIKE %s"
)


def _open_admissions(conn: psycopg.Connection[Any], schema: str | None) -> sql.Composable:
    """A query of ``(token_id, staged_bytes, open_counted)`` of every open admission of
    ``schema``'s registries (None: every org's) that carry the quota columns."""
    rows = conn.execute(
        _REGISTRIES,
        (
            schema.replace("_", r"\_") if schema else r"sp\_%",
            "%" + ADMISSIONS_SUFFIX.replace("_", r"\_"),
        ),
    ).fetchall()
    parts = [
        sql.SQL("SELECT token_id, staged_bytes, open_counted FROM {} WHERE state = 'open'").format(
            sql.Identifier(str(n), str(c))
        )
        for n, c in rows
    ]
    if not parts:
        return sql.SQL("SELECT NULL::text, 0::bigint, false WHERE false")
    return sql.SQL(" UNION ALL ").join(parts)


def reconcile_org(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Set the org's counter to what its open admissions hold (it drifts only when a
    registry is dropped with open admissions in it); whether it differed.

    Exact under concurrency: the counter's row is locked first, so a reservation
    that took it has committed before the registries are read, and one waiting for
    it adds to the value set here (its registry row, uncommitted, is not counted).
    A row another transaction holds is skipped until the next pass (``SKIP
    LOCKED``): a stage role's open transaction holds its org's row, and the sweep
    must not wait behind it with every other org's reconciliation after it.
    """
    if (
        conn.execute(
            sql.SQL(
                "SELECT FROM {} WHERE scope = 'org' AND key = %s FOR UPDATE SKIP LOCKED"
            ).format(_QUOTAS),
            (schema,),
        ).fetchone()
        is None
    ):
        return False
    found = conn.execute(
        sql.SQL(
            "SELECT coalesce(sum(o.staged_bytes), 0)::bigint, "
            "(count(*) FILTER (WHERE o.open_counted))::integer FROM ({}) AS o(t, staged_bytes, "
            "open_counted)"
        ).format(_open_admissions(conn, schema))
    ).fetchone()
    assert found is not None
    return (
        conn.execute(
            sql.SQL(
                "UPDATE {} SET staged_bytes = %s, open_admissions = %s WHERE scope = 'org' "
                "AND key = %s AND (staged_bytes, open_admissions) IS DISTINCT FROM (%s, %s)"
            ).format(_QUOTAS),
            (found[0], found[1], schema, found[0], found[1]),
        ).rowcount
        == 1
    )


def reconcile_tokens(conn: psycopg.Connection[Any]) -> int:
    """Set every token's counter to its open admissions in every org's registries (the
    token rows locked first, in key order); how many differed (none before the
    counters' table exists: a database no admission has begun in yet)."""
    if not _counters_exist(conn):
        return 0
    conn.execute(
        sql.SQL("SELECT FROM {} WHERE scope = 'token' ORDER BY key FOR UPDATE").format(_QUOTAS)
    )
    return conn.execute(
        sql.SQL(
            "UPDATE {q} AS q SET open_admissions = coalesce(c.n, 0) FROM {q} AS k "
            "LEFT JOIN (SELECT o.t, count(*)::integer AS n FROM ({open}) AS o(t, staged_bytes, "
            "open_counted) WHERE o.open_counted GROUP BY o.t) AS c ON c.t = k.key "
            "WHERE k.scope = 'token' AND q.scope = 'token' AND q.key = k.key "
            "AND q.open_admissions <> coalesce(c.n, 0)"
        ).format(q=_QUOTAS, open=_open_admissions(conn, None))
    ).rowcount


def counted_orgs(conn: psycopg.Connection[Any]) -> list[str]:
    """The org schemas the counters hold a row for (none before any begin)."""
    if not _counters_exist(conn):
        return []
    return [
        str(row[0])
        for row in conn.execute(
            sql.SQL("SELECT key FROM {} WHERE scope = 'org' ORDER BY key").format(_QUOTAS)
        ).fetchall()
    ]


def _counters_exist(conn: psycopg.Connection[Any]) -> bool:
    """Whether the counters' table exists (it is made by the first begin's DDL)."""
    found = conn.execute("SELECT to_regclass(%s)", (f"{QUOTA_SCHEMA}.quotas",)).fetchone()
    return found is not None and found[0] is not None
