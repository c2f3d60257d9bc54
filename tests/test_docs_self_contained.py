"""The project's files cite only documents the repository holds."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("src", "tests", "property_tests", "docs", "examples", "README.md", "conftest.py")
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini"}

# Spelled in pieces so this file does not match itself.
OUTSIDE = re.compile(
    "|".join((r"\bDESIGN" + r"\.md\b", r"\.\./" + "shared", r"\bshared/" + "seeds"))
)
DOC_LINK = re.compile(r"\bdocs/([A-Za-z0-9_\-]+\.md)\b")


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return sorted(found)


def test_no_file_cites_a_document_outside_the_repository() -> None:
    citing = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert citing == []


def test_every_cited_doc_exists() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)} -> docs/{doc}"
        for path in _files()
        for doc in DOC_LINK.findall(path.read_text(encoding="utf-8"))
        if not (ROOT / "docs" / doc).is_file()
    )
    assert missing == []


TEST_CITE = re.compile(r"(?<![\w/])((?:property_)?tests/[A-Za-z0-9_]+\.py)?::([A-Za-z0-9_]+)")


def test_every_test_a_doc_cites_exists() -> None:
    missing = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            cited_file: str | None = None
            for match in TEST_CITE.finditer(line):
                cited_file = match.group(1) or cited_file
                if cited_file is None:
                    continue
                path = ROOT / cited_file
                name = match.group(2)
                if not path.is_file() or f"def {name}(" not in path.read_text(encoding="utf-8"):
                    missing.append(f"docs/{doc.name}:{number}: {cited_file}::{name}")
    assert missing == []
