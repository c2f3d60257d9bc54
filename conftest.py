"""Hypothesis profiles for the whole repository.

``dev`` (the default) explores: every run draws new examples and remembers
failures in ``.hypothesis/``. ``ci`` (``.ci/run`` sets
``SHEETPLANE_HYPOTHESIS_PROFILE=ci``) is derandomized, so a CI run gates on the
same examples every time and a red build is a regression, not a new draw; it
sets no per-example deadline, since CI shares two cores between two workers and
a deadline there measures the machine's load, not the code;
exploring further is the job of local runs and ``--campaign``.

``--campaign`` (both suites) also runs the long campaigns: tests marked
``slow``, and the longer settings of tests that read the option.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("dev")
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("SHEETPLANE_HYPOTHESIS_PROFILE", "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--campaign",
        action="store_true",
        default=False,
        help="also run the long campaigns (tests marked slow, longer rounds)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--campaign"):
        return
    skip = pytest.mark.skip(reason="a long campaign: run with --campaign")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
