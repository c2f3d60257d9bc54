"""The physical names of a sheet's tables, derived from its logical names.

One schema per org (``sp_<org>_<hash>``); in it, per sheet (play + table
namespace) a family of tables named ``t_<play>_<namespace>_<hash>`` plus a
suffix, and per play a work-receipts table. Logical names can be any text
(quotes, unicode, SQL-looking strings): the physical names are a sanitised
ASCII prefix plus a SHA-256 suffix of the exact logical name, so they are
always valid identifiers of at most 63 bytes and two distinct sheets never
share a table. Every module of the store names tables through
:class:`SheetNames`; none of this touches a connection.
"""

from __future__ import annotations

import hashlib
import re

import attrs
from psycopg import sql

from .._types import SheetRef
from ..errors import InvalidInputError
from ..names import check_name as _check_logical
from ..names import normalize_play_name

__all__ = [
    "ADMISSIONS_SUFFIX",
    "TABLE_ATTRS",
    "VERSIONS_TYPE",
    "SheetNames",
    "org_schema",
    "receipt_names",
    "sheet_names",
    "sheet_tables",
]

_HASH_CHARS = 12
#: The composite type of a row's write version and admitted version, one per org
#: schema: the rows table's ``seq`` column, the one system column name the seed's
#: runtime reserves and never reads or writes (docs/store.md, "Row versions").
VERSIONS_TYPE = "sp_row_versions"
# Table names are <base><suffix>; the longest derived name is the staging
# index (_staging_pos, 12 bytes), so a base of 49 bytes keeps every name <= 61.
_MAX_BASE_BYTES = 49
_SANITISE = re.compile(r"[^a-z0-9]+")


def _digest(*parts: str) -> str:
    # Length-prefixed so ("a", "bc") and ("ab", "c") never hash alike.
    text = "".join(f"{len(part)}:{part}" for part in parts)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_HASH_CHARS]


def _slug(value: str, max_chars: int) -> str:
    slug = _SANITISE.sub("_", value.lower()).strip("_")
    return slug[:max_chars].rstrip("_")


def _base(prefix: str, parts: tuple[str, ...]) -> str:
    """``<prefix>_<slug>_<slug>..._<hash>``, at most ``_MAX_BASE_BYTES`` bytes."""
    digest = _digest(prefix, *parts)
    room = _MAX_BASE_BYTES - len(prefix) - 1 - _HASH_CHARS - 1
    per_part = max(1, room // len(parts) - 1)
    slugs = [slug for slug in (_slug(part, per_part) for part in parts) if slug]
    name = "_".join([prefix, *slugs, digest])
    assert len(name.encode("ascii")) <= _MAX_BASE_BYTES, name
    return name


@attrs.frozen
class SheetNames:
    """The physical names of one sheet's tables (and its play's receipts table)."""

    schema: str
    """The org's schema."""
    sheet_table: str
    """The rows."""
    event_table: str
    """One row per write (with its idempotency key)."""
    summary_table: str
    """The single row of the admission counter (``write_version``) and the status
    counters an older sheet kept (the base the counter log adds to)."""
    column_summary_table: str
    """Non-null counts per physical column kept by an older sheet (the base the
    counter log adds to; nothing writes it any more)."""
    counter_table: str
    """The counter log: every statement's changes to the status counters and the
    non-null counts, appended by the counting triggers, summed on read
    (``store._counters``)."""
    lock_table: str
    """An empty table with no columns whose table lock is the sheet's writer lock
    (``store._locking``): writing roles hold table-level ``UPDATE`` on it (what
    ``LOCK TABLE`` needs), which changes nothing on a table without rows or columns."""
    receipts_table: str
    """The play's work receipts."""
    meta_table: str
    """The sheet's metadata: its logical names and its columns' ids. Granted
    only to the sheet's own session roles, never kept in catalog comments
    (which every role of the database can read)."""
    staging_table: str
    """Staged admissions' rows, until their commit (``UNLOGGED``: scratch space)."""
    admissions_table: str
    """One row per staged admission: its state and, once committed, its counts."""
    stage_chunks_table: str
    """One row per staged chunk: what makes a retried chunk a no-op."""
    shares_table: str = ""
    """The attempts' shares: blocks of pending rows claimed by workers (``_shares``)."""

    def ident(self, table_attr: str) -> sql.Identifier:
        """The schema-qualified identifier of ``getattr(self, table_attr)``."""
        if table_attr not in TABLE_ATTRS:
            raise ValueError(f"not a table of SheetNames: {table_attr!r}")
        table: str = getattr(self, table_attr)
        return sql.Identifier(self.schema, table)

    @property
    def versions_type(self) -> sql.Identifier:
        """The org's composite type of a row's two versions, the rows table's ``seq``."""
        return sql.Identifier(self.schema, VERSIONS_TYPE)

    @property
    def count_function(self) -> str:
        """The sheet's counting trigger function (``store._counters``)."""
        return f"{self.sheet_table.removesuffix('_rows')}_count"

    @property
    def order_index(self) -> str:
        """The sheet table's read-order index."""
        return f"{self.sheet_table}_order"

    @property
    def versions_statistics(self) -> str:
        """The sheet table's statistics on ``(seq).write_version`` and
        ``(seq).admitted_version``, the fence's and the admission reads' expressions."""
        return f"{self.sheet_table}_seq"

    @property
    def staging_prev_constraint(self) -> str:
        """The staging table's foreign key from a chunk's row to the one before it."""
        return f"{self.staging_table}_prev"

    @property
    def staging_owner_constraint(self) -> str:
        """The staging table's foreign key from a chunk's row to its recorded chunk
        (and so to a registered admission): no staging row without one."""
        return f"{self.staging_table}_own"

    @property
    def staging_keys_constraint(self) -> str:
        """The staging table's check that every key fits ``MAX_ROW_KEY_BYTES``."""
        return f"{self.staging_table}_key"

    @property
    def staging_index(self) -> str:
        """The staging table's ``(admission id, chunk seq)`` key."""
        return f"{self.staging_table}_pos"

    @property
    def event_key_index(self) -> str:
        """The event table's unique ``(kind, idempotency_key)`` index."""
        return f"{self.event_table}_key"


#: The attributes of ``SheetNames`` that name a table.
TABLE_ATTRS = frozenset(
    {
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
    }
)


#: The suffix of a sheet's admission registry; the reaper finds sheets by it.
ADMISSIONS_SUFFIX = "_admissions"


def sheet_tables(schema: str, sheet: str, *, receipts_table: str = "") -> SheetNames:
    """The names of the tables of the sheet whose tables are named ``sheet`` + a suffix."""
    return SheetNames(
        schema=schema,
        sheet_table=f"{sheet}_rows",
        event_table=f"{sheet}_events",
        summary_table=f"{sheet}_summary",
        column_summary_table=f"{sheet}_colsum",
        counter_table=f"{sheet}_counts",
        lock_table=f"{sheet}_lock",
        receipts_table=receipts_table,
        meta_table=f"{sheet}_meta",
        staging_table=f"{sheet}_staging",
        admissions_table=f"{sheet}{ADMISSIONS_SUFFIX}",
        stage_chunks_table=f"{sheet}_chunks",
        shares_table=f"{sheet}_shares",
    )


def _names(org_id: str, play_name: str, table_namespace: str) -> SheetNames:
    return sheet_tables(
        _base("sp", (org_id,)),
        _base("t", (play_name, table_namespace)),
        receipts_table=f"{_base('r', (play_name,))}_receipts",
    )


def sheet_names(sheet: SheetRef) -> SheetNames:
    """The physical names of ``sheet``; raises InvalidInputError for a bad org, play or namespace.

    Any other text is accepted: it is sanitised into the name and hashed into its suffix.
    """
    if not isinstance(sheet, SheetRef):
        raise InvalidInputError(f"sheet must be a SheetRef, got {type(sheet).__name__}")
    return _names(
        _check_logical("org_id", sheet.org_id),
        _check_logical("play_name", sheet.play_name),
        _check_logical("table_namespace", sheet.table_namespace),
    )


def receipt_names(org_id: str, play_name: str) -> SheetNames:
    """Names for work receipts, which belong to a play rather than a sheet (the play
    name normalised, as a sheet's is).

    Only ``schema`` and ``receipts_table`` are meaningful; the sheet tables are
    named for the empty namespace, which no sheet can have.
    """
    return _names(_check_logical("org_id", org_id), normalize_play_name(play_name), "")


def org_schema(org_id: str) -> str:
    """The schema of ``org_id``'s tables (its sheets, receipts and plays)."""
    return _base("sp", (_check_logical("org_id", org_id),))
