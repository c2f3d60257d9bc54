"""docs/parity.md is true row by row: a row that says sheetplane behaves as the
runtime does ("same") names the test that shows it (tests/test_docs_self_contained.py
checks that every test it names exists)."""

from __future__ import annotations

import re
from pathlib import Path

PARITY = Path(__file__).resolve().parent.parent / "docs" / "parity.md"
SAME = re.compile(r"\bsame\b", re.IGNORECASE)
CITED_TEST = re.compile(r"(?:(?:property_)?tests/[A-Za-z0-9_]+\.py)?::test_[A-Za-z0-9_]+")


def _rows() -> list[tuple[int, list[str]]]:
    rows = []
    for number, line in enumerate(PARITY.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("| ") and not line.startswith("| ---"):
            rows.append((number, [cell.strip() for cell in line.strip().strip("|").split("|")]))
    return rows


def test_every_same_row_names_its_test() -> None:
    headers = {"runtime", "runtime message"}
    unproven = [
        f"docs/parity.md:{number} {cells[0]}"
        for number, cells in _rows()
        if cells[0] not in headers and SAME.search(cells[-1]) and not CITED_TEST.search(cells[-1])
    ]
    assert unproven == []


def test_the_table_has_rows() -> None:
    assert len(_rows()) > 100
