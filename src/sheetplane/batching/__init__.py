"""Bounded batching: ``BoundedBatchFunction`` and its scheduling core.

The core (``_core.py``) decides everything and does no I/O; the trio shell
(``_shell.py``) parks and wakes callers, runs batches and keeps the timer.
"""

from __future__ import annotations

from ._core import Batch as Batch
from ._core import SchedulingCore as SchedulingCore
from ._shell import BoundedBatchFunction as BoundedBatchFunction
from ._shell import Pending as Pending
from ._stats import BatcherStatistics as BatcherStatistics

__all__ = ["Batch", "BatcherStatistics", "BoundedBatchFunction", "Pending", "SchedulingCore"]
