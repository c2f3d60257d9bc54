"""The Postgres sheet store: layout, pools on trio, reads, writes, fencing, receipts.

``open_store(url)`` gives a ``SheetStore``, the facade every road uses; the
modules behind it are private. See docs/store.md.
"""

from __future__ import annotations

from .._superseded import raise_if_superseded as raise_if_superseded
from .._superseded import superseded_error as superseded_error
from .._superseded import superseded_rows as superseded_rows
from .._types import EVERY_ROW as EVERY_ROW
from .._types import RowCursor as RowCursor
from .._types import RowFilter as RowFilter
from ._grants import ROW_WRITES as ROW_WRITES
from ._grants import session_grants as session_grants
from ._guards import admit_functions as admit_functions
from ._guards import clear_function as clear_function
from ._names import SheetNames as SheetNames
from ._names import sheet_names as sheet_names
from ._pool import ConnectionRunner as ConnectionRunner
from ._pool import PoolSaturatedError as PoolSaturatedError
from ._pool import TrioPool as TrioPool
from ._pool import is_login_refused as is_login_refused
from ._pool import is_transient_connect_error as is_transient_connect_error
from ._pool import open_pool as open_pool
from ._quotas import StoreQuotas as StoreQuotas
from ._reads import JsonPage as JsonPage
from ._reads import whole_sheet_read as whole_sheet_read
from ._roads import StorePlays as StorePlays
from ._roads import StoreReceipts as StoreReceipts
from ._rowdata import check_key as check_key
from ._rowdata import next_write_version as next_write_version
from ._schema import POSTGRES_SYSTEM_COLUMNS as POSTGRES_SYSTEM_COLUMNS
from ._schema import RESERVED_SQL_NAMES as RESERVED_SQL_NAMES
from ._schema import column_ids as column_ids
from ._seedlayout import SEED_EVENT_COLUMNS as SEED_EVENT_COLUMNS
from ._seedlayout import SEED_SUMMARY_COLUMNS as SEED_SUMMARY_COLUMNS
from ._seedlayout import grant_lock_key as grant_lock_key
from ._seedlayout import owner_role as owner_role
from ._shares import share_signatures as share_signatures
from ._store import SheetStore as SheetStore
from ._store import open_store as open_store
from ._writes import check_keyed_write as check_keyed_write

__all__ = [
    "EVERY_ROW",
    "POSTGRES_SYSTEM_COLUMNS",
    "RESERVED_SQL_NAMES",
    "ROW_WRITES",
    "SEED_EVENT_COLUMNS",
    "SEED_SUMMARY_COLUMNS",
    "ConnectionRunner",
    "JsonPage",
    "PoolSaturatedError",
    "RowCursor",
    "RowFilter",
    "SheetNames",
    "SheetStore",
    "StorePlays",
    "StoreQuotas",
    "StoreReceipts",
    "TrioPool",
    "admit_functions",
    "check_key",
    "check_keyed_write",
    "clear_function",
    "column_ids",
    "grant_lock_key",
    "is_login_refused",
    "is_transient_connect_error",
    "next_write_version",
    "open_pool",
    "open_store",
    "owner_role",
    "raise_if_superseded",
    "session_grants",
    "share_signatures",
    "sheet_names",
    "superseded_error",
    "superseded_rows",
    "whole_sheet_read",
]
