"""The source's shape, read from its syntax trees: what a reviewer would otherwise check by eye.

``lint-imports`` (pyproject.toml) keeps each package's private modules its own;
these keep each module's private names its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sheetplane

SOURCE = Path(sheetplane.__file__).parent

#: Private names a module may read on another module's objects, each with why.
#: ``Batch`` (``batching/_core.py``) is handed to the user's ``execute``; its
#: underscored fields belong to the batcher, its core and its shell (the class says so).
SHARED_PRIVATE: dict[str, frozenset[str]] = {
    "batching/_shell.py": frozenset({"_done", "_scope"}),
}


#: A named tuple's methods: public, underscored only to keep clear of its fields.
NAMED_TUPLE_API = frozenset({"_asdict", "_fields", "_field_defaults", "_make", "_replace"})


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(SOURCE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(SOURCE.rglob("*.py"))
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, assignments, slots, and
    the attributes its methods set on ``self`` or ``cls``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    names.add(target.attr)
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                assert node.value is not None
                names |= {
                    c.value
                    for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    return names


def _foreign_modules(tree: ast.Module) -> set[str]:
    """Names bound by ``import x`` of a module outside sheetplane (the standard
    library's own private names, such as ``argparse._SubParsersAction``, are its API)."""
    return {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if not alias.name.startswith("sheetplane")
    }


def _is_module(path: str, node: ast.ImportFrom, name: str) -> bool:
    """Whether ``from ... import name`` imports a module (a private module is the
    package's own: ``lint-imports`` checks those)."""
    if node.level == 0:
        parts = (node.module or "").split(".")
        if parts[0] != "sheetplane":
            return False
        base = SOURCE.joinpath(*parts[1:])
    else:
        base = (SOURCE / path).parent
        for _ in range(node.level - 1):
            base = base.parent
        base = base.joinpath(*(node.module or "").split(".")) if node.module else base
    target = base / name
    return target.with_suffix(".py").exists() or target.is_dir()


def test_no_module_reads_another_modules_private_names() -> None:
    found: list[str] = []
    for path, tree in _modules():
        own = _own_names(tree) | SHARED_PRIVATE.get(path, frozenset()) | NAMED_TUPLE_API
        foreign = _foreign_modules(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found += [
                    f"{path}:{node.lineno} imports {alias.name}"
                    for alias in node.names
                    if _private(alias.name) and not _is_module(path, node, alias.name)
                ]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                value = node.value
                if isinstance(value, ast.Name) and (
                    value.id in ("self", "cls") or value.id in foreign
                ):
                    continue
                if node.attr not in own:
                    found.append(f"{path}:{node.lineno} reads {ast.unparse(node)}")
    assert found == []


#: Functions over ``MAX_FUNCTION_LINES`` that are declarative tables, each with what it holds.
DECLARATIVE = {
    ("budgets.py", "_check"): "the relations between budgets, one line each",
    ("gateway/server/_command.py", "add_serve_parser"): "the command's options, one each",
    ("store/_guards.py", "guard_ddl"): "the guard functions and triggers, statement by statement",
    ("store/_schema.py", "_ddl"): "the sheet's DDL, statement by statement",
    ("store/_schema.py", "_staging_ddl"): "the staging tables' DDL",
    ("store/_shares.py", "_bodies"): "the share functions' SQL bodies",
}

MAX_FUNCTION_LINES = 80


def test_no_function_is_over_80_lines_but_declarative_tables() -> None:
    long = {
        (path, node.name)
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert long - set(DECLARATIVE) == set()
