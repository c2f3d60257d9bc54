"""The runtime's constants, read from the seed files, against sheetplane's budgets.

docs/parity.md's "Constants" table says which of sheetplane's budgets keep the
runtime's values; this reads each value from the seed's own text (the 0.1.2
``runtime-api.ts`` and the lines the 0.3.129 diff adds or shows) and compares.
The test skips, saying why, only when the seed files are absent.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from seed_runtime import prepare
from sheetplane import budgets as b
from sheetplane._types import STALE_REASONS, SYSTEM_COLUMNS

#: The 0.3.128 -> 0.3.129 diff of the same file.
LATER_SEED = "000_b5a6e996656cb267.txt"


def _texts() -> dict[str, str]:
    try:
        first = prepare.find_seed()
        later = prepare.find_seed(name=LATER_SEED)
    except prepare.SeedUnavailable as exc:
        pytest.skip(str(exc))
    lines = later.read_text(encoding="utf-8").split("\n")
    shown = "\n".join(line[1:] for line in lines if line[:1] in ("+", " "))
    return {"0.1.2": prepare.extract_runtime(first.read_text(encoding="utf-8")), "0.3.129": shown}


def _value(expression: str) -> Any:
    """An integer expression of the seed (``12 * 1024``, ``5_000``) or a list of them."""
    text = expression.strip()
    if text.startswith("[") and text.endswith("]"):
        return tuple(_value(item) for item in text[1:-1].split(",") if item.strip())
    product = 1
    for factor in text.split("*"):
        factor = factor.strip().replace("_", "")
        assert factor.isdigit(), f"not an integer expression: {expression!r}"
        product *= int(factor)
    return product


#: (version, the seed's name, a pattern capturing its value, sheetplane's value).
CONSTANTS = [
    ("0.1.2", "DIRECT_POSTGRES_BATCH_SIZE", None, b.POSTGRES_WRITE_CHUNK_ROWS),
    ("0.1.2", "DIRECT_POSTGRES_BATCH_SIZE", None, b.READ_PAGE_MAX_ROWS),
    ("0.1.2", "RUNTIME_DB_SESSION_TTL_SECONDS", None, b.DB_SESSION_TTL_MS // 1000),
    ("0.1.2", "RUNTIME_DB_SESSION_RENEWAL_WINDOW_MS", None, b.DB_SESSION_RENEWAL_WINDOW_MS),
    ("0.1.2", "RUNTIME_API_MAX_ATTEMPTS", None, b.MAX_ATTEMPTS),
    ("0.1.2", "RUNTIME_API_DEFAULT_RETRY_AFTER_MS", None, b.DEFAULT_RETRY_AFTER_MS),
    ("0.1.2", "RUNTIME_API_REQUEST_TIMEOUT_MS", None, b.REQUEST_TIMEOUT_MS),
    ("0.1.2", "RUNTIME_POSTGRES_PREWARM_MAX_ATTEMPTS", None, b.POSTGRES_PREWARM_MAX_ATTEMPTS),
    (
        "0.1.2",
        "RUNTIME_POSTGRES_PREWARM_RETRY_DELAYS_MS",
        r"RUNTIME_POSTGRES_PREWARM_RETRY_DELAYS_MS = (\[[^\]]*\])",
        b.POSTGRES_PREWARM_RETRY_DELAYS_MS,
    ),
    (
        "0.1.2",
        "RUNTIME_POSTGRES_CONNECT_RETRY_DELAYS_MS",
        r"RUNTIME_POSTGRES_CONNECT_RETRY_DELAYS_MS = (\[[^\]]*\])",
        b.POSTGRES_CONNECT_RETRY_DELAYS_MS,
    ),
    (
        "0.1.2",
        "pool maxConnections",
        r"maxConnections: (\d+),\n\s+idleTimeoutMs: 15_000",
        b.DB_SESSION_MAX_CONNECTIONS,
    ),
    (
        "0.1.2",
        "preview rows",
        r"initialPreviewRows: input\.rows\.slice\(0, (\d+)\)",
        b.DATASET_PREVIEW_ROWS,
    ),
    ("0.3.129", "RUNTIME_API_DEFAULT_RETRY_AFTER_MS", None, b.DEFAULT_RETRY_AFTER_MS),
    (
        "0.3.129",
        "RUNTIME_SHEET_READ_BATCH_MAX_RESPONSE_BYTES",
        None,
        b.READ_BATCH_MAX_RESPONSE_BYTES,
    ),
    ("0.3.129", "transport ceiling", r": (16 \* 1024 \* 1024);", b.TRANSPORT_CEILING_BYTES),
    ("0.3.129", "transport ceiling", r": (16 \* 1024 \* 1024);", b.ACTION_MAX_RESPONSE_BYTES),
    ("0.3.129", "RUNTIME_SHEET_READ_BATCH_MAX_PAGES", None, b.READ_BATCH_MAX_PAGES),
    ("0.3.129", "RUNTIME_SHEET_READ_BATCH_MAX_IN_FLIGHT", None, b.READ_BATCH_MAX_IN_FLIGHT),
    (
        "0.3.129",
        "RUNTIME_SHEET_READ_BATCH_MAX_RETAINED_PAGES",
        None,
        b.READ_BATCH_MAX_RETAINED_PAGES,
    ),
    (
        "0.3.129",
        "RUNTIME_SHEET_READ_BATCH_MAX_RETAINED_REQUEST_BYTES",
        None,
        b.READ_BATCH_MAX_RETAINED_REQUEST_BYTES,
    ),
    ("0.3.129", "maxBatchBytes", r"maxBatchBytes: ([\d *]+),", b.READ_BATCH_MAX_REQUEST_BYTES),
    ("0.3.129", "RUNTIME_SHEET_READ_BATCH_FLUSH_MS", None, b.READ_BATCH_FLUSH_MS),
]


@pytest.mark.parametrize(
    ("version", "name", "pattern", "ours"),
    [pytest.param(*row, id=f"{row[0]}-{row[1]}-{i}") for i, row in enumerate(CONSTANTS)],
)
def test_a_kept_constant_has_the_runtimes_value(
    version: str, name: str, pattern: str | None, ours: Any
) -> None:
    text = _texts()[version]
    regex = pattern or rf"const {name} = ([^;]+);"
    match = re.search(regex, text)
    assert match is not None, f"{name} is not in the {version} seed"
    assert _value(match.group(1)) == ours


def test_the_queue_wait_is_the_runtimes_formula() -> None:
    text = _texts()["0.3.129"]
    match = re.search(r"RUNTIME_SHEET_READ_BATCH_MAX_QUEUE_WAIT_MS =\s*([^;]+);", text)
    assert match is not None
    assert " ".join(match.group(1).split()) == (
        "RUNTIME_API_REQUEST_TIMEOUT_MS * (RUNTIME_API_RETRY_DELAYS_MS.length + 1) +"
        " RUNTIME_API_RETRY_DELAYS_MS.reduce((total, delay) => total + delay, 0)"
    )
    assert (
        b.REQUEST_TIMEOUT_MS * (len(b.RETRY_DELAYS_MS) + 1) + sum(b.RETRY_DELAYS_MS)
        == b.MAX_QUEUE_WAIT_MS
    )


def test_the_stale_reasons_are_the_runtimes_four() -> None:
    text = _texts()["0.3.129"]
    match = re.search(r"RUNTIME_MAP_ROWS_STALE_REASONS[^=]*=\s*new Set\(\[([^\]]*)\]", text)
    assert match is not None
    assert set(re.findall(r"'([a-z_]+)'", match.group(1))) == set(STALE_REASONS)


def test_the_system_columns_are_the_runtimes_list_in_its_order() -> None:
    """``isSystemSheetColumn``'s names are the rows table's system columns, no more:
    the runtime's ``SELECT *`` rows drop every column of sheetplane's own."""
    text = _texts()["0.1.2"]
    match = re.search(r"function isSystemSheetColumn\([^)]*\)[^{]*\{(.*?)return true;", text, re.S)
    assert match is not None
    assert tuple(re.findall(r"case '([a-z_]+)':", match.group(1))) == SYSTEM_COLUMNS
