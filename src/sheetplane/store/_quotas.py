"""What one org may keep in the store: its sheets and its plays' receipt tables.

The bounds are ``budgets``' (``MAX_SHEETS_PER_ORG``, ``MAX_RECEIPT_TABLES_PER_ORG``);
a store takes smaller ones for tests and for an operator's own limits. A new
sheet or receipt table is counted against them inside the DDL transaction,
after the org's DDL key (``_schema.ensure_ddl``), so concurrent first callers
of one org cannot together pass the cap.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import psycopg

from ..budgets import MAX_RECEIPT_TABLES_PER_ORG, MAX_SHEETS_PER_ORG
from ..errors import SheetCapError

__all__ = ["StoreQuotas", "check_room"]


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
