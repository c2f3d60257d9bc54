"""The protocol package is importable without any I/O library."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import sheetplane.protocol

_IO_LIBRARIES = ("httpx", "httpcore", "starlette", "hypercorn", "psycopg", "psycopg_pool")


def test_importing_the_protocol_imports_no_http_server_or_database_library() -> None:
    modules = [
        f"sheetplane.protocol.{name}"
        for name in (
            "_wire",
            "_converter",
            "_messages",
            "_domain",
            "_errors",
            "_receive",
            "_splice",
            "_openapi",
            "_chunks",
        )
    ]
    probe = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in modules)
        + f"print(','.join(sorted(m for m in {_IO_LIBRARIES!r} if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
    assert sheetplane.protocol.__doc__ is not None


def _defined_public_names(module: ModuleType) -> set[str]:
    """The names a module defines at its top level (not imports), but private ones."""
    tree = ast.parse(inspect.getsource(module))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "TypeVar":
                continue
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {name for name in names if not name.startswith("_")}


def test_the_protocol_package_exports_every_public_name_of_its_modules() -> None:
    """Others import ``sheetplane.protocol``, never one of its private modules: each
    module's ``__all__`` holds every public name it defines, and the package
    exports all of them, sorted as ruff sorts ``__all__``."""
    exported: set[str] = set()
    for info in pkgutil.iter_modules(sheetplane.protocol.__path__):
        module = importlib.import_module(f"sheetplane.protocol.{info.name}")
        assert _defined_public_names(module) <= set(module.__all__), info.name
        exported |= set(module.__all__)
        for name in module.__all__:
            assert getattr(sheetplane.protocol, name) is getattr(module, name), name
    assert set(sheetplane.protocol.__all__) == exported
    assert len(sheetplane.protocol.__all__) == len(exported)


def test_every_action_is_named_once_by_its_request_class() -> None:
    from sheetplane import protocol as m
    from sheetplane.gateway.server._actions import HANDLERS

    assert tuple(m.action_of(request) for request, _ in m.EXCHANGES) == m.ACTIONS
    assert len(set(m.ACTIONS)) == len(m.ACTIONS)
    for action, request in m.REQUESTS.items():
        assert m.ANSWERS[action] is dict(m.EXCHANGES)[request]
    assert set(HANDLERS) == set(m.ACTIONS)


def test_two_converters_with_different_policies_do_not_share_rules() -> None:
    import attrs

    from sheetplane.protocol import WireConverter, WireError

    @attrs.frozen(kw_only=True)
    class Probe:
        name: str

    open_ = WireConverter(closed=frozenset(), uncapped=frozenset(), writes_nulls=frozenset())
    closed = WireConverter(
        closed=frozenset({Probe}), uncapped=frozenset(), writes_nulls=frozenset()
    )
    assert open_.structure({"name": "a", "extra": 1}, Probe) == Probe(name="a")
    with pytest.raises(WireError, match="extra"):
        closed.structure({"name": "a", "extra": 1}, Probe)


def test_read_cursor_converts_both_ways_in_the_protocol() -> None:
    """``input.after`` and ``nextAfter`` are read and written by the protocol package,
    and ``RowCursor`` is one class wherever it is imported from."""
    import datetime as dt

    import sheetplane.store
    from sheetplane import protocol as m
    from sheetplane._types import RowCursor

    assert sheetplane.store.RowCursor is RowCursor
    cursor = RowCursor(7, dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC), "k-7")
    wire = m.row_cursor_wire(cursor)
    assert wire == m.RowCursorWire(
        input_index=7, created_at="2026-01-02T03:04:05.000006+00:00", key="k-7"
    )
    assert m.row_cursor_of(m.structure(m.unstructure(wire), m.RowCursorWire)) == cursor
    assert m.row_cursor_wire(None) is None
    assert m.row_cursor_of(None) is None
    for created_at, key, fragment in [
        ("yesterday", "k", "input.after.createdAt must be an ISO 8601 timestamp"),
        ("2026-01-02T03:04:05", "k", "input.after.createdAt must carry a time zone"),
        ("2026-01-02T03:04:05+00:00", "a\x00b", "input.after.key must be text"),
        ("2026-01-02T03:04:05+00:00", "\ud800", "input.after.key must be text"),
    ]:
        bad = m.RowCursorWire(input_index=None, created_at=created_at, key=key)
        with pytest.raises(m.WireError, match=fragment):
            m.row_cursor_of(bad)
