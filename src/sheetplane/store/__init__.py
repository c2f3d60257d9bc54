"""The Postgres sheet store: layout, pools on trio, reads, writes, fencing, receipts.

``open_store(url)`` gives a ``SheetStore``, the facade every road uses; the
modules behind it are private. See docs/store.md.
"""

from __future__ import annotations

from .._types import EVERY_ROW as EVERY_ROW
from .._types import RowCursor as RowCursor
from .._types import RowFilter as RowFilter
from ._fencing import raise_if_superseded as raise_if_superseded
from ._fencing import superseded_error as superseded_error
from ._fencing import superseded_rows as superseded_rows
from ._names import SheetNames as SheetNames
from ._names import sheet_names as sheet_names
from ._pool import PoolSaturatedError as PoolSaturatedError
from ._pool import TrioPool as TrioPool
from ._pool import open_pool as open_pool
from ._quotas import StoreQuotas as StoreQuotas
from ._reads import JsonPage as JsonPage
from ._store import SheetStore as SheetStore
from ._store import open_store as open_store

__all__ = [
    "EVERY_ROW",
    "JsonPage",
    "PoolSaturatedError",
    "RowCursor",
    "RowFilter",
    "SheetNames",
    "SheetStore",
    "StoreQuotas",
    "TrioPool",
    "open_pool",
    "open_store",
    "raise_if_superseded",
    "sheet_names",
    "superseded_error",
    "superseded_rows",
]
