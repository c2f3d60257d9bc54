"""Hypothesis profiles for the whole repository.

``dev`` (the default) explores: every run draws new examples and remembers
failures in ``.hypothesis/``. ``ci`` (``.ci/run`` sets
``SHEETPLANE_HYPOTHESIS_PROFILE=ci``) is derandomized, so a CI run gates on the
same examples every time and a red build is a regression, not a new draw; it
sets no per-example deadline, since CI shares two cores between three workers and
a deadline there measures the machine's load, not the code;
exploring further is the job of local runs and ``--campaign``.

``--campaign`` (both suites) also runs the long campaigns: tests marked
``slow``, and the longer settings of tests that read the option.

Tests marked ``heavy(seconds)`` (tens of seconds each on the two-core CI
machine) are collected first, longest first. ``pytest-xdist``'s work stealing
hands each worker a contiguous share of the collection and steals from the end
of the longest queue, so the long tests start at once on the first worker while
the short ones fill the other workers' time, instead of a long test starting
last and running alone at the end (longest processing time first).
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
    items[:] = sorted(items, key=_heaviest_first)  # stable: the rest keep their order
    if config.getoption("--campaign"):
        return
    skip = pytest.mark.skip(reason="a long campaign: run with --campaign")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _heaviest_first(item: pytest.Item) -> float:
    heavy = item.get_closest_marker("heavy")
    return -float(heavy.args[0]) if heavy is not None else 0.0
