"""``sheetplane bench wire``: the JSON codec of the gateway road, against the standard library.

One batch-read answer as the gateway sends it (4 pages of 5,000 rows of the
benchmark company sheet, each row as the store returns it: its columns plus
``_key``, ``_status`` and a timestamp) is encoded and decoded in one process,
alternating the two codecs run by run:

* **stdlib**: ``json.dumps(separators=(",", ":"), ensure_ascii=False)`` and
  ``json.loads``, what both sides used before;
* **wire**: ``protocol._wire.encode_body`` / ``decode_body`` (orjson writes, msgspec reads, with the
  standard library where orjson would read or write otherwise).

It also times ``json_byte_length_up_to`` over the same pages (what the server
measures every batch with) and the wire classes' structuring of the answer
(``m.structure``, what the client checks every answer with), so the
figures say where the road's CPU goes. Medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import protocol as m
from .._plain import PlainHelpFormatter
from ..budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS
from ..protocol import decode_body, encode_body
from ..sizes import json_byte_length_up_to
from ._common import make_rows

__all__ = ["main"]


def _answer() -> dict[str, Any]:
    rows = make_rows(READ_BATCH_MAX_PAGES * READ_PAGE_MAX_ROWS)
    for row in rows:
        row.update(_key=row["id"], _status="enriched", _updated_at="2026-12-01T09:00:00+00:00")
    pages = [
        {"rows": rows[i : i + READ_PAGE_MAX_ROWS], "limit": READ_PAGE_MAX_ROWS, "offset": i}
        for i in range(0, len(rows), READ_PAGE_MAX_ROWS)
    ]
    return {"pages": pages}


def _stdlib_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _time_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench wire", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument(
        "--repeats", type=int, default=9, help="runs of each codec; medians (default 9)"
    )
    args = parser.parse_args(argv)
    answer = _answer()
    body = _stdlib_dumps(answer)
    assert decode_body(encode_body(answer)) == json.loads(body) == answer
    cls = m.ANSWERS["runtime_sheet_read_rows_batch"]
    cases: dict[str, Callable[[], object]] = {
        "encode stdlib": lambda: _stdlib_dumps(answer),
        "encode wire": lambda: encode_body(answer),
        "decode stdlib": lambda: json.loads(body),
        "decode wire": lambda: decode_body(body),
        "measure (json_byte_length_up_to)": lambda: json_byte_length_up_to(
            answer["pages"], 1 << 30
        ),
        "structure (wire classes)": lambda: m.structure(answer, cls),
    }
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):  # interleaved: load on the machine hits every case alike
        for name, fn in cases.items():
            runs[name].append(_time_ms(fn))
    medians = {name: statistics.median(times) for name, times in runs.items()}
    rows = READ_BATCH_MAX_PAGES * READ_PAGE_MAX_ROWS
    print(
        f"wire benchmark: one batch answer, {rows:,} rows, {len(body):,} bytes, "
        f"median of {args.repeats}"
    )
    print(f"{'case':<36}{'median ms':>12}{'MB/s':>10}")
    for name, ms in medians.items():
        print(f"{name:<36}{ms:>12.1f}{len(body) / ms / 1000:>10.1f}")
    print(
        f"encode wire / stdlib: {medians['encode stdlib'] / medians['encode wire']:.1f}x faster; "
        f"decode wire / stdlib: {medians['decode stdlib'] / medians['decode wire']:.1f}x faster"
    )
    for name, times in runs.items():
        print(f"  {name}: {[round(t, 1) for t in times]} ms")
    return 0
