"""Input rows that carry nothing for a contract's input column.

An admission whose rows carry no value (absent, or null) for an input column in
any row is almost always a mismatch between the rows and the contract (rows
keyed ``name`` against a column ``company``): every row would be admitted, and
enriched, with that column null. ``RowWriter.start`` (and ``Runtime.map``) watch
the rows as the admission reads them: by default one warning (logger
``sheetplane.runtime``) names each such column and the row count; with
``strict_inputs=True`` the admission raises ``InvalidInputError`` before its
commit, so nothing is written.

The watch stops looking at rows once every input column has met a value (the
first row, for rows that match their contract), so a matching input costs one
look per column.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import attrs

from ._types import SheetContract
from .errors import InvalidInputError

__all__ = ["InputCoverage", "watch_inputs"]

log = logging.getLogger("sheetplane.runtime")

#: Keys of the first row a message names at most.
_SHOWN_KEYS: Final = 8


@attrs.define(eq=False)
class InputCoverage:
    """Which of a contract's input columns no row read so far carries a value for."""

    namespace: str
    missing: dict[str, tuple[str, ...]]
    """Column id -> the names a row may carry it under, for columns not yet met."""
    rows: int = 0
    """Rows looked at (all of them, while a column is still missing)."""
    first_keys: tuple[str, ...] | None = None

    @classmethod
    def of(cls, contract: SheetContract, namespace: str) -> InputCoverage:
        inputs = {c.id: c.lookup_names for c in contract.columns if c.source == "input"}
        return cls(namespace, inputs)

    def see(self, row: object) -> None:
        """Look at one input row (a row that is not a mapping is the admission's to refuse)."""
        self.rows += 1
        if not isinstance(row, Mapping):
            return
        if self.first_keys is None:
            self.first_keys = tuple(str(k) for k in row)
        for column, names in list(self.missing.items()):
            if any(row.get(name) is not None for name in names):
                del self.missing[column]

    def finish(self, strict: bool) -> None:
        """The rows have all been read: warn about, or refuse (``strict``), each input
        column none of them carried a value for."""
        if not self.missing or self.rows == 0:
            return
        columns = ", ".join(
            f"{column!r} (read from {' or '.join(map(repr, names))})"
            for column, names in self.missing.items()
        )
        keys = self.first_keys or ()
        shown = ", ".join(map(repr, keys[:_SHOWN_KEYS])) + (
            ", ..." if len(keys) > _SHOWN_KEYS else ""
        )
        text = (
            f"no input row carries a value for input column {columns}: all {self.rows} rows"
            f" admitted to {self.namespace!r} would have it null (the first row carries"
            f" {shown or 'no keys'})"
        )
        if strict:
            raise InvalidInputError(f"{text}; nothing was admitted")
        log.warning(
            "%s; pass strict_inputs=True to refuse such an admission",
            text,
            extra={"event": "input_columns_missing", "columns": list(self.missing)},
        )


def watch_inputs(rows: Any, contract: SheetContract, namespace: str, *, strict: bool) -> Any:
    """``rows`` as the admission should read them, watched for input columns no row
    carries (module docstring). A sequence is looked at here, before anything is
    sent, and returned as it is (an admission may read a sequence again); any other
    iterable is wrapped, and its watch ends when the admission has read it all."""
    coverage = InputCoverage.of(contract, namespace)
    if not coverage.missing:
        return rows
    if isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
        for row in rows:
            coverage.see(row)
            if not coverage.missing:
                break
        coverage.finish(strict)
        return rows
    if isinstance(rows, AsyncIterable):
        return _watched_async(rows, coverage, strict)
    return _watched(rows, coverage, strict)


def _watched(rows: Iterable[Any], coverage: InputCoverage, strict: bool) -> Iterator[Any]:
    iterator = iter(rows)
    for row in iterator:
        coverage.see(row)
        yield row
        if not coverage.missing:
            yield from iterator
            return
    coverage.finish(strict)


async def _watched_async(
    rows: AsyncIterable[Any], coverage: InputCoverage, strict: bool
) -> AsyncIterator[Any]:
    async for row in rows:
        if coverage.missing:
            coverage.see(row)
        yield row
    coverage.finish(strict)
