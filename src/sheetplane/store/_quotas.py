"""What one org may keep in the store: its sheets and its plays' receipt tables, its
open admissions and their staged bytes.

The bounds are ``budgets``' (``MAX_SHEETS_PER_ORG``, ``MAX_RECEIPT_TABLES_PER_ORG``,
``ORG_MAX_OPEN_ADMISSIONS``, the staged-bytes bounds);
a store takes smaller ones for tests and for an operator's own limits. A new
sheet or receipt table is counted against them inside the DDL transaction,
after the org's DDL key (``_schema.ensure_ddl``), so concurrent first callers
of one org cannot together pass the cap. Staged bytes and open admissions are
counted in the transaction that would add to them, before anything is written
(``_staging``): chunks racing each other may each pass a bound by one chunk.
Staged bytes are the chunks' ``pg_column_size`` (the staging table stores them
uncompressed), summed over the live staging rows: what the tables hold, not
the dead space a commit leaves until vacuum.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import psycopg
from psycopg import sql

from ..budgets import (
    ADMISSION_MAX_LIFETIME_MS,
    ADMISSION_MAX_STAGED_BYTES,
    MAX_RECEIPT_TABLES_PER_ORG,
    MAX_SHEETS_PER_ORG,
    ORG_MAX_OPEN_ADMISSIONS,
    ORG_MAX_STAGED_BYTES,
    STAGING_MAX_TOTAL_BYTES,
)
from ..errors import AdmissionStagingTooLargeError, SheetCapError, StagingQuotaError
from ._names import ADMISSIONS_SUFFIX

__all__ = ["StoreQuotas", "check_admission_room", "check_room", "check_staging_room"]


def _positive(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


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
    max_admission_staged_bytes: int = attrs.field(
        default=ADMISSION_MAX_STAGED_BYTES, validator=_positive
    )
    max_org_staged_bytes: int = attrs.field(default=ORG_MAX_STAGED_BYTES, validator=_positive)
    max_total_staged_bytes: int = attrs.field(default=STAGING_MAX_TOTAL_BYTES, validator=_positive)
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


def _tables(conn: psycopg.Connection[Any], schema: str | None, suffix: str) -> list[sql.Identifier]:
    """The sheets' tables ending in ``suffix`` in ``schema`` (None: every org's)."""
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'r' AND n.nspname LIKE %s AND c.relname LIKE %s",
        (schema.replace("_", r"\_") if schema else r"sp\_%", r"t\_%" + suffix.replace("_", r"\_")),
    ).fetchall()
    return [sql.Identifier(str(n), str(c)) for n, c in rows]


def _sum(conn: psycopg.Connection[Any], parts: list[sql.Composable]) -> int:
    if not parts:
        return 0
    query = sql.SQL("SELECT coalesce(sum(n), 0) FROM ({}) AS u(n)").format(
        sql.SQL(" UNION ALL ").join(parts)
    )
    row = conn.execute(query).fetchone()
    return 0 if row is None else int(row[0])


_STAGED = sql.SQL("SELECT sum(pg_column_size(_keys) + pg_column_size(_rows))::bigint FROM {}")


def _staged_bytes(conn: psycopg.Connection[Any], schema: str | None) -> int:
    return _sum(conn, [_STAGED.format(table) for table in _tables(conn, schema, "_staging")])


def check_staging_room(
    conn: psycopg.Connection[Any],
    quotas: StoreQuotas,
    schema: str,
    staging: sql.Identifier,
    admission_id: str,
    incoming: int,
) -> None:
    """Refuse a chunk of ``incoming`` bytes that would take its admission, its org or
    every org past its staged bytes; run before the chunk is written."""
    row = conn.execute(
        sql.SQL(
            "SELECT coalesce(sum(pg_column_size(_keys) + pg_column_size(_rows)), 0)::bigint "
            "FROM {} WHERE _admission_id = %s"
        ).format(staging),
        (admission_id,),
    ).fetchone()
    held = 0 if row is None else int(row[0])
    if held + incoming > quotas.max_admission_staged_bytes:
        raise AdmissionStagingTooLargeError(
            f"admission {admission_id} holds {held} staged bytes; a chunk of {incoming} "
            f"would pass its bound of {quotas.max_admission_staged_bytes}"
        )
    org = _staged_bytes(conn, schema)
    if org + incoming > quotas.max_org_staged_bytes:
        raise StagingQuotaError(
            f"the org's open admissions hold {org} staged bytes; a chunk of {incoming} "
            f"would pass its bound of {quotas.max_org_staged_bytes} (commit or abort some)"
        )
    total = _staged_bytes(conn, None)
    if total + incoming > quotas.max_total_staged_bytes:
        raise StagingQuotaError(
            "the gateway's staging space is full; retry after other admissions commit"
        )


def check_admission_room(conn: psycopg.Connection[Any], quotas: StoreQuotas, schema: str) -> None:
    """Refuse a new admission of an org holding ``max_open_admissions_per_org`` open."""
    open_count = _sum(
        conn,
        [
            sql.SQL("SELECT count(*) FROM {} WHERE state = 'open'").format(table)
            for table in _tables(conn, schema, ADMISSIONS_SUFFIX)
        ],
    )
    if open_count >= quotas.max_open_admissions_per_org:
        raise StagingQuotaError(
            f"the org holds {open_count} open admissions, its bound is "
            f"{quotas.max_open_admissions_per_org} (commit or abort some)"
        )
