"""What ``RowWriter.start`` answers: an admission's counts, and its rows as lazy datasets.

An ``Admission`` holds a handful of integers whatever the size of the input:
the rows themselves stay on the sheet, and ``pending()`` / ``completed()``
read them back lazily, through the runtime's road (a scoped session on
``direct``, the gateway on ``gateway_only``), by keyset like every dataset.

* ``pending()``: the rows this admission admitted or re-admitted for mapping,
  in input order. The filter is the admission's write version
  (``_admitted_version = v AND _write_version = v``), not the rows' status,
  so the set does not shift while the runner completes or fails them: it is
  the attempt's work list. A later admission of the same rows takes them
  over (they leave this set).
* ``completed()``: the input rows that were already enriched, kept with their
  outputs and their older version, in input order.

Each row carries ``_key``, the contract's columns under their column ids,
``_status``, ``_error`` and ``_input_index`` (the sheet's ``output`` row mode).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ._types import AdmissionCounts, AdmittedPart
from .dataset import Dataset

__all__ = ["Admission"]


@attrs.frozen(eq=False)
class Admission:
    """One admission: its write version, what it did, and its rows to read lazily."""

    write_version: int
    """The admission's write version; terminal writes carry it and are fenced by it."""
    inserted: int
    """Input rows inserted as new ``pending`` rows."""
    skipped: int
    """Input rows not to map: duplicates within the input and already-enriched rows."""
    pending_count: int
    """Rows to map (new and re-admitted): what ``pending()`` holds."""
    completed_count: int
    """Already-enriched input rows: what ``completed()`` holds."""
    table_namespace: str
    """The sheet's namespace."""
    _open: Callable[[AdmittedPart], Dataset] = attrs.field(repr=False, alias="open")
    """Opens a dataset over one part of this admission (the runtime's road)."""

    @classmethod
    def from_counts(
        cls, counts: AdmissionCounts, open: Callable[[AdmittedPart], Dataset]
    ) -> Admission:
        """An admission over ``counts``, reading its rows through ``open``."""
        return cls(
            write_version=counts.write_version,
            inserted=counts.inserted,
            skipped=counts.skipped,
            pending_count=counts.pending_count,
            completed_count=counts.completed_count,
            table_namespace=counts.table_namespace,
            open=open,
        )

    def pending(self) -> Dataset:
        """The rows to map, in input order, each carrying ``_key`` (read lazily)."""
        return self._open(AdmittedPart(self.write_version, "pending"))

    def completed(self) -> Dataset:
        """The already-enriched input rows with their outputs, in input order (read lazily)."""
        return self._open(AdmittedPart(self.write_version, "completed"))
