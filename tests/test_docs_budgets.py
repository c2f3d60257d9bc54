"""docs/budgets.md states each budget's value as the code derives it."""

from __future__ import annotations

import re
from pathlib import Path

from sheetplane import budgets

DOC = Path(__file__).resolve().parents[1] / "docs" / "budgets.md"
ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]+)` \| ([^|]+) \|", re.MULTILINE)
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _stated(text: str) -> object:
    """A table cell's value: ``47,500``, ``16 MiB``, ``(250, 500, 1,000)``."""
    text = text.strip().replace("`", "")
    if text.startswith("("):
        return tuple(
            int(part) for part in re.findall(r"\d[\d,]*", text.replace(", ", ";").replace(",", ""))
        )
    number, _, unit = text.partition(" ")
    value = float(number.replace(",", ""))
    return value * UNITS[unit] if unit in UNITS else value


def test_every_budget_in_the_docs_table_has_the_codes_value() -> None:
    rows = ROW.findall(DOC.read_text(encoding="utf-8"))
    named = [(name, cell) for name, cell in rows if hasattr(budgets, name)]
    assert len(named) > 80  # the tables are read, not skipped
    wrong = {
        name: (cell.strip(), getattr(budgets, name))
        for name, cell in named
        if _stated(cell) != getattr(budgets, name)
    }
    assert wrong == {}
