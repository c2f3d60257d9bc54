"""The Postgres sheet store: layout, pools on trio, reads, writes, fencing, receipts.

``open_store(url)`` gives a ``SheetStore``, the facade every road uses; the
modules behind it are private. See docs/store.md.
"""

from __future__ import annotations

from ._pool import PoolSaturatedError as PoolSaturatedError
from ._pool import TrioPool as TrioPool
from ._pool import open_pool as open_pool
from ._schema import SheetNames as SheetNames
from ._schema import sheet_names as sheet_names

__all__ = [
    "PoolSaturatedError",
    "SheetNames",
    "TrioPool",
    "open_pool",
    "sheet_names",
]
