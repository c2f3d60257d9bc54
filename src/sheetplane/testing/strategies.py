"""Hypothesis strategies for suites that exercise the data plane.

* :func:`column_names`, :func:`sheet_contracts`: valid contracts, with names
  that quote, shout SQL and leave ASCII;
* :func:`hostile_text`, :func:`json_values`, :func:`rows`: JSON rows a
  runner may be handed, hostile ones included (quotes, unicode, SQL-looking
  strings, huge strings and numbers, deep nesting); never a NUL character,
  which Postgres cannot store in text or jsonb and the store refuses;
* :func:`page_requests`, :func:`page_request_batches`;
* :func:`fault_specs` and :func:`gateway_fault_schedules`: faults the
  reference gateway's ``x-sheetplane-test-fault`` header arms;
  :func:`transport_faults`: the finer per-request faults a fake transport
  plays (connect refusals, slow answers, Retry-After values, answers lost
  after the gateway applied the request), as :func:`~sheetplane.testing.models.predict_call`
  understands them;
* :func:`bad_numbers`, :func:`wrong_types`, :func:`bad_json_bodies`: inputs
  every entry point must refuse with a typed error (or a 4xx answer);
* :func:`wire_json` and :func:`wire_messages`: any request or answer of the
  gateway, drawn from its wire class (``protocol/m.py``: its field
  types, bounds and camelCase names), as decoded JSON or as the class.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal, TypeVar

import attrs
from hypothesis import strategies as st

from .. import protocol as m
from .._types import (
    BIGINT_MAX,
    BIGINT_MIN,
    SYSTEM_COLUMNS,
    ColumnSource,
    ContractColumn,
    PageRequest,
    SheetContract,
)
from ..budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS
from ..gateway.faults import FAULT_KINDS, FaultSpec
from ..protocol import encode_body

__all__ = [
    "ACTIONS",
    "SQL_LOOKING",
    "bad_json_bodies",
    "bad_numbers",
    "column_names",
    "fault_specs",
    "gateway_fault_schedules",
    "hostile_text",
    "json_values",
    "page_request_batches",
    "page_requests",
    "row_keys",
    "rows",
    "sheet_contracts",
    "transport_faults",
    "wire_json",
    "wire_messages",
    "wrong_types",
]

T = TypeVar("T")

#: The actions the fault strategies draw by default: the seed's runtime actions (the
#: gateway's later ones, play registry and staged admission, have suites of their own).
ACTIONS: tuple[str, ...] = (
    m.action_of(m.EnsureSheetRequest),
    m.action_of(m.StartSheetDatasetRequest),
    m.action_of(m.CreateDbSessionRequest),
    m.action_of(m.ReadRowsRequest),
    m.action_of(m.ReadRowsBatchRequest),
    m.action_of(m.ReadRowKeysRequest),
    m.action_of(m.CompleteMapRowsRequest),
    m.action_of(m.FailMapRowsRequest),
    m.action_of(m.CompleteWorkReceiptRequest),
    m.action_of(m.SummaryRequest),
)

#: Strings that look like SQL, quoting or injection attempts.
SQL_LOOKING: tuple[str, ...] = (
    "'; DROP TABLE users; --",
    '"; DROP SCHEMA public CASCADE; --',
    "Robert'); DELETE FROM sheets;--",
    "1 OR 1=1",
    "' OR ''='",
    "$$; SELECT pg_sleep(10); $$",
    "E'\\\\x41'",
    "%s %(x)s {} {0}",
    "\\",
    "'",
    '"',
    "`",
    "pg_terminate_backend(pg_backend_pid())",
    "ALTER ROLE postgres PASSWORD 'x'",
    "/* */ -- ",
    "null",
    "NaN",
    "\u202eevil\u202c",
    "\ufeffbom",
)

_NO_NUL = st.characters(codec="utf-8", exclude_characters="\x00")
_SYSTEM_COLUMNS = frozenset(SYSTEM_COLUMNS)


def hostile_text(*, min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    """Text without NUL: SQL-looking strings, quotes, any unicode, now and then a huge one."""
    return st.one_of(
        st.sampled_from(SQL_LOOKING).filter(lambda s: len(s) >= min_size),
        st.text(_NO_NUL, min_size=min_size, max_size=max_size),
        st.integers(min_value=max(min_size, 10_000), max_value=200_000).map(lambda n: "é" * n),
    )


def column_names() -> st.SearchStrategy[str]:
    """A valid physical column name: 1 to 63 UTF-8 bytes, no NUL, not starting with ``_``,
    not all whitespace (the wire refuses a blank ``sqlName`` or ``id``: pattern ``\\S``)."""
    return (
        st.one_of(
            st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
            st.sampled_from(SQL_LOOKING),
            st.text(_NO_NUL, min_size=1, max_size=20),
        )
        .filter(lambda s: not s.startswith("_") and s.strip() != "")
        .filter(lambda s: 0 < len(s.encode("utf-8")) <= 63)
    )


@st.composite
def sheet_contracts(
    draw: st.DrawFn, *, min_columns: int = 0, max_columns: int = 5, ids_are_names: bool = False
) -> SheetContract:
    """A contract with distinct physical names; some columns are inputs, some outputs.

    With ``ids_are_names`` every column's id is its ``sqlName`` (simplest for models).
    """
    names = draw(st.lists(column_names(), min_size=min_columns, max_size=max_columns, unique=True))
    columns = []
    for name in names:
        source: ColumnSource = draw(st.sampled_from(["input", "mapField", "output"]))
        column_id = name if ids_are_names else draw(st.sampled_from([name, f"id {name}"]))
        columns.append(ContractColumn(column_id, name, source))
    return SheetContract(tuple(columns))


def _finite_floats() -> st.SearchStrategy[float]:
    return st.floats(allow_nan=False, allow_infinity=False)


def json_values(*, max_leaves: int = 12, hostile: bool = True) -> st.SearchStrategy[Any]:
    """JSON values with finite numbers and NUL-free strings; hostile ones are huge or deep."""
    text = hostile_text() if hostile else st.text(_NO_NUL, max_size=20)
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=BIGINT_MIN, max_value=BIGINT_MAX),
        _finite_floats(),
        text,
    )
    nested = st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.text(_NO_NUL, max_size=10), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )
    if not hostile:
        return nested
    return st.one_of(
        nested,
        st.integers(min_value=1, max_value=200).map(_deep),
        st.integers(min_value=10**30, max_value=10**60),
        st.sampled_from([1e308, -1e308, 5e-324, -0.0]),
    )


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"d": value}
    return value


def row_keys() -> st.SearchStrategy[str]:
    """Row keys: short ids, SQL-looking strings and unicode (never empty, never NUL)."""
    return st.one_of(
        st.from_regex(r"k[0-9]{1,6}", fullmatch=True),
        st.sampled_from(SQL_LOOKING),
        st.text(_NO_NUL, min_size=1, max_size=30),
    )


@st.composite
def rows(
    draw: st.DrawFn,
    contract: SheetContract,
    *,
    min_size: int = 0,
    max_size: int = 8,
    hostile: bool = True,
    keyed: bool = True,
) -> list[dict[str, Any]]:
    """Input rows for ``contract``: values for some of its columns, some extra fields,
    and (with ``keyed``) an explicit ``_key`` on each row (repeats allowed)."""
    count = draw(st.integers(min_value=min_size, max_value=max_size))
    values = json_values(hostile=hostile)
    out = []
    for _ in range(count):
        row: dict[str, Any] = {}
        for column in contract.columns:
            if draw(st.booleans()):
                row[column.id] = draw(values)
        extra = draw(
            st.dictionaries(
                st.text(_NO_NUL, min_size=1, max_size=10).filter(
                    lambda s: s not in _SYSTEM_COLUMNS
                ),
                values,
                max_size=2,
            )
        )
        row.update({k: v for k, v in extra.items() if k not in row})
        if keyed:
            row["_key"] = draw(row_keys())
        out.append(row)
    return out


def page_requests(*, max_limit: int = READ_PAGE_MAX_ROWS) -> st.SearchStrategy[PageRequest]:
    """Valid page requests."""
    return st.builds(
        PageRequest,
        limit=st.integers(min_value=1, max_value=max_limit),
        offset=st.integers(min_value=0, max_value=10**6),
    )


def page_request_batches(
    *, max_limit: int = READ_PAGE_MAX_ROWS
) -> st.SearchStrategy[list[PageRequest]]:
    """1 to ``READ_BATCH_MAX_PAGES`` page requests."""
    return st.lists(page_requests(max_limit=max_limit), min_size=1, max_size=READ_BATCH_MAX_PAGES)


def fault_specs(
    actions: tuple[str, ...] = ACTIONS, kinds: frozenset[str] | None = None
) -> st.SearchStrategy[FaultSpec]:
    """One fault the gateway's header arms: an action, a kind, a count of 1 to 3."""
    chosen = sorted(FAULT_KINDS if kinds is None else kinds)
    return st.builds(
        FaultSpec,
        action=st.sampled_from(actions),
        kind=st.sampled_from(chosen),
        count=st.integers(min_value=1, max_value=3),
    )


def gateway_fault_schedules(
    actions: tuple[str, ...] = ACTIONS, kinds: frozenset[str] | None = None, max_size: int = 6
) -> st.SearchStrategy[list[FaultSpec]]:
    """Several faults, armed together in one header value."""
    return st.lists(fault_specs(actions, kinds), max_size=max_size)


#: Slow answers take whole seconds plus this odd fraction, so an answer never
#: lands exactly on an attempt or call deadline (sums of whole milliseconds).
ODD_FRACTION = 0.000123


def transport_faults(*, lost: bool = False) -> st.SearchStrategy[tuple[Any, ...]]:
    """One request's fault as a fake transport plays it (see ``models.predict_call``).

    With ``lost``, also ``("lost",)``: the gateway applied the request and the
    answer never arrived (the client sees a reset).
    """
    kinds = [
        st.just(("ok",)),
        st.tuples(st.just("status"), st.sampled_from([502, 503, 504])),
        st.tuples(
            st.just("backpressure"),
            st.none() | st.integers(0, 10_000) | st.integers(10_000, 10**12),
        ),
        st.just(("connect",)),
        st.just(("reset",)),
        st.just(("hang",)),
        st.just(("drip",)),
        st.just(("truncated",)),
        st.just(("malformed",)),
        st.tuples(st.just("slow"), st.integers(0, 40).map(lambda s: s + ODD_FRACTION)),
        st.just(("413",)),
        st.just(("unsupported",)),
    ]
    if lost:
        kinds.append(st.just(("lost",)))
    return st.one_of(*kinds)


def bad_numbers() -> st.SearchStrategy[Any]:
    """Numbers no limit, offset, version or count accepts: negative, non-finite, fractional,
    huge, booleans and numeric strings."""
    return st.one_of(
        st.integers(max_value=-1),
        st.sampled_from([math.nan, math.inf, -math.inf, 0.5, -0.0001, 1e300, 2**200, True]),
        st.floats(allow_nan=True).filter(lambda f: not (math.isfinite(f) and f.is_integer())),
        st.sampled_from(["1", "", "0x10", "1e3", " 7 "]),
    )


def wrong_types() -> st.SearchStrategy[Any]:
    """Values of the wrong type for nearly any field."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**20), max_value=10**20),
        _finite_floats(),
        hostile_text(max_size=20),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        st.sampled_from([b"bytes", object(), (1, 2), {1, 2}, frozenset()]),
    )


def bad_json_bodies() -> st.SearchStrategy[bytes]:
    """Request bodies that are not a JSON object: malformed, truncated, wrong top-level
    type, invalid UTF-8, NaN literals, very deep nesting."""
    valid = encode_body(m.unstructure(m.SummaryRequest(play_name="p", table_namespace="ns")))
    return st.one_of(
        st.binary(max_size=64),
        st.integers(min_value=0, max_value=len(valid) - 1).map(lambda n: valid[:n]),
        st.sampled_from(
            [
                b"",
                b"null",
                b"[]",
                b'"action"',
                b"12",
                b'{"action": NaN}',
                b'{"action": Infinity}',
                b"\xff\xfe{}",
                b'{"action": "\\ud800"}',
                b"[" * 100_000,
                b'{"a":' * 50_000,
                b'{"action": 1}',
                b'{"action": ""}',
                b'{"action": null}',
                b'{"action": ["runtime_sheet_summary"]}',
                # An integer past Python's 4,300-digit parsing limit.
                b'{"action": "runtime_sheet_read_rows", "n": ' + b"9" * 5_000 + b"}",
            ]
        ),
    )


# --- the wire classes ---------------------------------------------------------------------

_WIRE_SCALARS = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
_WIRE_VALUES = st.recursive(
    _WIRE_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_NON_EMPTY = st.text(min_size=1, max_size=12).filter(lambda s: s.strip() != "")
#: Members whose rule their type does not say: an admission's rows carry a string _key.
_KEYED_ROWS = st.lists(
    st.fixed_dictionaries({"_key": st.text(max_size=6)}, optional={"email": st.text(max_size=6)}),
    max_size=3,
)
_FIELD_RULES: dict[str, st.SearchStrategy[Any]] = {
    "pending_rows": _KEYED_ROWS,
    "completed_rows": _KEYED_ROWS,
}


def _json_for(tp: Any, metadata: Any = None) -> st.SearchStrategy[Any]:
    """Decoded JSON that a member of type ``tp`` accepts (bounds from its metadata)."""
    meta = dict(metadata or {})
    origin: Any = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return _WIRE_VALUES
    if tp is str:
        if str(meta.get("pattern", "")).startswith("^"):  # a whole-string pattern
            return st.from_regex(meta["pattern"], fullmatch=True)
        return _NON_EMPTY if meta.get("minLength") else st.text(max_size=12)
    if tp is bool:
        return st.booleans()
    if tp is int:
        low = meta.get("minimum", BIGINT_MIN)
        high = meta.get("maximum") or BIGINT_MAX
        return st.integers(low, high)
    if tp is float:
        return st.floats(meta.get("minimum", 0), 1e9, allow_nan=False)
    if origin is Literal:
        return st.sampled_from(args)
    if origin is list:
        return st.lists(
            _json_for(args[0]), min_size=meta.get("minItems", 0), max_size=meta.get("maxItems") or 3
        )
    if origin is dict:
        values = _WIRE_VALUES if args[1] is Any else st.integers(1, 10)
        return st.dictionaries(st.text(max_size=6), values, max_size=3)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a not in (type(None), m.Absent)]
        strategy = _json_for(inner, meta)
        return st.none() | strategy if type(None) in args else strategy
    if attrs.has(tp):
        return wire_json(tp)
    raise TypeError(f"no strategy for {tp!r}")


def wire_json(cls: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The decoded JSON of a ``cls`` message (a request or answer class of
    ``protocol/m.py``): every required member, some optional ones, under
    their wire names, each within the bounds the converter enforces."""
    fields = attrs.fields(attrs.resolve_types(cls))

    def member(field: attrs.Attribute[Any]) -> st.SearchStrategy[Any]:
        rule = _FIELD_RULES.get(field.name)
        return rule if rule is not None else _json_for(field.type, field.metadata)

    required = {m.wire_name(f): member(f) for f in fields if f.default is attrs.NOTHING}
    optional = {
        m.wire_name(f): member(f)
        for f in fields
        if f.default is not attrs.NOTHING and f.name != "action"
    }
    for field in fields:
        if field.name == "action" and field.default is not attrs.NOTHING:
            required["action"] = st.just(field.default)  # a request's own action
    return st.fixed_dictionaries(required, optional=optional)


def wire_messages(cls: type[T]) -> st.SearchStrategy[T]:
    """``cls`` messages, read by the converter from :func:`wire_json`; write one with
    ``m.unstructure``."""
    return wire_json(cls).map(lambda raw: m.structure(raw, cls))
