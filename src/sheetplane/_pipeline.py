"""Which sheet contract a play's static pipeline gives a table namespace.

``resolve_sheet_contract(pipeline, table_namespace)`` is the runtime's
``resolveRuntimeSheetContract``. ``pipeline`` is the play's static pipeline as
decoded JSON, in the runtime's camelCase::

    {"tableNamespace": "leads", "sheetContract": {"columns": [...]},
     "stages": [{"type": "map", "tableNamespace": "...", "sheetContract": {...}}, ...],
     "substeps": [...]}

The lookup, in the runtime's order: the root namespace first, then every
``map`` entry of ``stages`` followed by ``substeps`` (other entry types are
skipped); the first namespace equal to ``table_namespace`` after
normalisation (``sheetplane.names``) answers with its contract (``None`` when
that entry has none). No match, no pipeline, or a namespace that is blank once
trimmed answers ``None``. A contract is returned as a ``SheetContract`` (a
``SheetContract`` already in the pipeline is returned as it is; JSON is read as
the wire reads it, ``InvalidInputError`` naming the entry when it is off).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ._types import SheetContract
from .errors import InvalidInputError
from .names import normalize_table_namespace
from .protocol import WireError, read_contract

__all__ = ["resolve_sheet_contract"]


def resolve_sheet_contract(
    pipeline: Mapping[str, Any] | None, table_namespace: str | None
) -> SheetContract | None:
    """The sheet contract ``pipeline`` gives ``table_namespace``, or None (see the module)."""
    if table_namespace is not None and not isinstance(table_namespace, str):
        raise InvalidInputError(
            f"table_namespace must be a string or None, got {table_namespace!r}"
        )
    if pipeline is None or table_namespace is None or not table_namespace.strip():
        return None
    if not isinstance(pipeline, Mapping):
        raise InvalidInputError(f"pipeline must be a mapping or None, got {pipeline!r}")
    wanted = normalize_table_namespace(table_namespace)
    for where, entry in _candidates(pipeline):
        if _namespace_of(entry) == wanted:
            return _contract(where, entry.get("sheetContract"))
    return None


def _candidates(pipeline: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The root, then the ``map`` entries of ``stages`` and ``substeps``, in order."""
    yield "pipeline", pipeline
    for member in ("stages", "substeps"):
        entries = pipeline.get(member)
        if entries is None:
            continue
        if isinstance(entries, str | bytes | Mapping) or not isinstance(entries, Sequence):
            raise InvalidInputError(f"pipeline.{member} must be a list, got {entries!r}")
        for index, entry in enumerate(entries):
            if isinstance(entry, Mapping) and entry.get("type") == "map":
                yield f"pipeline.{member}[{index}]", entry


def _namespace_of(entry: Mapping[str, Any]) -> str | None:
    """An entry's normalised namespace; None when it has none (or one that is not a name)."""
    value = entry.get("tableNamespace")
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return normalize_table_namespace(value)
    except InvalidInputError:
        return None


def _contract(where: str, value: object) -> SheetContract | None:
    if value is None or isinstance(value, SheetContract):
        return value
    try:
        return read_contract(value)
    except WireError as exc:
        raise InvalidInputError(f"{where}.sheetContract: {exc}") from None
