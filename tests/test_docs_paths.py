"""Every module path and file the documents name exists (docs/*.md and README.md)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "sheetplane"
DOCUMENTS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

#: Documents whose dotted ``sheetplane.*`` names are not module paths: the span and
#: attribute names of the traces (``sheetplane.admission.chunk`` is a span).
SPAN_NAMES = {"tracing.md"}

#: Files the documents name that are not the repository's, each with why.
NOT_OURS = {
    "runtime-api.ts": "the seed's runtime, extracted from its seed file at test time",
    "002_c27eafc2708e3093.txt": "the seed file itself, in the seeds folder beside a checkout",
    "play-runtime/interop-driver.ts": "written to build/tmp by the interop test",
    "runner.py": "the file the runner guide asks its reader to save",
    "local.py": "the file the runner guide asks its reader to save",
}

FILE = re.compile(
    r"(?<![\w./-])((?:[A-Za-z0-9_.\-]+/)*[A-Za-z0-9_\-]+\.(?:py|md|toml|ts|json|yml|yaml|txt))"
    r"(?![\w/.])"
)
MODULE = re.compile(r"(?<![\w.])(sheetplane(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def _file_exists(name: str) -> bool:
    """A path from the repository's root, the package's or the tests' (as the documents
    write them), or a bare file name found anywhere in the repository."""
    roots = (ROOT, SOURCE, SOURCE.parent, ROOT / "tests", ROOT / "docs")
    if any((root / name).exists() for root in roots):
        return True
    return "/" not in name and any(".git" not in path.parts for path in ROOT.glob(f"**/{name}"))


def _module_claim(name: str) -> bool:
    """Whether a dotted name claims a module path: it goes through a module or package
    of sheetplane (``sheetplane.store._staging``, ``sheetplane.gateway.client``), or names
    a private part. Other dotted names (span names, ``sheetplane.read.rows``) are not."""
    second = name.split(".")[1]
    return (
        second.startswith("_") or (SOURCE / f"{second}.py").exists() or (SOURCE / second).is_dir()
    )


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attribute in parts[end:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_every_file_and_module_path_the_documents_name_exists() -> None:
    missing: list[str] = []
    for document in DOCUMENTS:
        for span in _code_spans(document.read_text(encoding="utf-8")):
            for match in FILE.finditer(span):
                name = match.group(1)
                if name not in NOT_OURS and not _file_exists(name):
                    missing.append(f"{document.name}: {name}")
            for match in MODULE.finditer(span) if document.name not in SPAN_NAMES else ():
                name = match.group(1)
                if _module_claim(name) and not _resolves(name):
                    missing.append(f"{document.name}: {name}")
    assert missing == []
