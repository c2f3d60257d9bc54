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


def make_rows(n: int) -> list[dict[str, Any]]:
    """N distinct company rows, keyed by ``id``."""
    return [
        {
            "id": f"c{i:07d}",
            "name": f"Company {i}",
            "domain": f"company-{i}.example",
            "employees": (i * 7919) % 10_000,
        }
        for i in range(n)
    ]
