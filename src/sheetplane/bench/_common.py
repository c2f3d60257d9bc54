"""What the store and gateway benchmarks read and write: one company sheet."""

from __future__ import annotations

from typing import Any

from .._types import ContractColumn, SheetContract

CONTRACT = SheetContract(
    (
        ContractColumn("id", "id", "input"),
        ContractColumn("name", "name", "input"),
        ContractColumn("domain", "domain", "input"),
        ContractColumn("employees", "employees", "input"),
        ContractColumn("score", "score", "output"),
    )
)


def make_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    """N distinct company rows, keyed by ``id`` (the rows ``start`` to ``start + n - 1``)."""
    return [
        {
            "id": f"c{i:07d}",
            "name": f"Company {i}",
            "domain": f"company-{i}.example",
            "employees": (i * 7919) % 10_000,
        }
        for i in range(start, start + n)
    ]
