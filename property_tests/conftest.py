"""Options of the property suites: ``--campaign`` runs the long chaos campaign too."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--campaign",
        action="store_true",
        default=False,
        help="also run the long campaigns (tests marked slow)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--campaign"):
        return
    skip = pytest.mark.skip(reason="a long campaign: run with --campaign")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
