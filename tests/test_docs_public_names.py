"""Examples and docs use sheetplane's public names only: no file under examples/ or docs/
(nor a python block of a document there, or of README.md) imports a private module
(``sheetplane._types``, ``sheetplane.store._pool``...) or a private name of a module."""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^([ \t]*)```python\n(.*?)^[ \t]*```", re.S | re.M)


def sources() -> Iterator[tuple[str, str]]:
    """(where, python source) of every .py file and markdown python block scanned."""
    for folder in ("examples", "docs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, match in enumerate(BLOCK.finditer(path.read_text(encoding="utf-8")), 1):
            where = f"{path.relative_to(ROOT)} python block {number}"
            yield where, textwrap.dedent(match[2])


def _tree(source: str) -> ast.AST:
    """The block's syntax tree; a block of signatures (``f(a, *, b=...)``, not Python)
    is read for its import statements alone."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        return compile(source, "<block>", "exec", flags)
    except SyntaxError:
        lines = [line for line in source.splitlines() if re.match(r"(from|import) \S", line)]
        return compile("\n".join(lines), "<block imports>", "exec", flags)


def private_imports(source: str) -> list[str]:
    tree = _tree(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            names = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] != "sheetplane":
                continue
            if any(part.startswith("_") for part in parts[1:]):
                found.append(module)
            found += [f"{module}.{n}" for n in names if n.startswith("_")]
    return found


def test_examples_and_docs_import_no_private_sheetplane_module() -> None:
    scanned = list(sources())
    assert any(where.startswith("examples/") for where, _ in scanned)
    assert any("runner-guide.md" in where for where, _ in scanned)
    offending = {where: found for where, source in scanned if (found := private_imports(source))}
    assert offending == {}


def test_the_check_finds_a_private_import() -> None:
    assert private_imports("from sheetplane._types import SheetRef") == ["sheetplane._types"]
    assert private_imports("import sheetplane.store._pool") == ["sheetplane.store._pool"]
    assert private_imports("from sheetplane import _map") == ["sheetplane._map"]
    assert private_imports("from sheetplane import SheetRef\nimport trio") == []
