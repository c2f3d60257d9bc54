"""The fixed slice of the chaos campaign that CI runs (``property_tests/chaos.py``).

10,000 virtual-time schedules and 50 real ones, from fixed seeds so a failure
names a schedule seed that ``python -m property_tests.chaos --only SEED``
replays. ``--campaign`` adds a long run on a fresh seed (printed).

Each slice is run as interleaved parts (part ``i`` takes every ``PARTS``-th
schedule from ``i``), so the test runner's workers share it: together the parts
run exactly the slice's schedules, and each part must meet every fault kind.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from .chaos import Figures, run_real_campaign, run_virtual_campaign, schedule_seeds

SLICE_SEED = 20261130
VIRTUAL_SCHEDULES = 10_000
REAL_SCHEDULES = 50
VIRTUAL_PARTS = 4
REAL_PARTS = 5


def _record(figures: Figures, name: str) -> None:
    path = os.environ.get("SHEETPLANE_RELIABILITY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"suite": name, **figures.to_json()}) + "\n")


def _check(figures: Figures) -> None:
    assert figures.losses == 0 and figures.duplicates == 0
    assert figures.rows_checked > 0


def _part(seeds: list[int], part: int, parts: int) -> list[int]:
    return seeds[part::parts]


def test_the_parts_run_the_whole_slice_once() -> None:
    for count, parts, kind in (
        (VIRTUAL_SCHEDULES, VIRTUAL_PARTS, "virtual"),
        (REAL_SCHEDULES, REAL_PARTS, "real"),
    ):
        seeds = schedule_seeds(SLICE_SEED, count, kind)
        shares = [_part(seeds, part, parts) for part in range(parts)]
        assert sorted(s for share in shares for s in share) == sorted(seeds)
        assert len(set(seeds)) == count


@pytest.mark.heavy(45)
@pytest.mark.parametrize("part", range(VIRTUAL_PARTS))
def test_virtual_slice_of_ten_thousand_schedules(part: int) -> None:
    figures = Figures(SLICE_SEED)
    seeds = _part(schedule_seeds(SLICE_SEED, VIRTUAL_SCHEDULES, "virtual"), part, VIRTUAL_PARTS)
    run_virtual_campaign(seeds, figures)
    _record(figures, "chaos_slice_virtual")
    assert figures.virtual_schedules == len(seeds)
    _check(figures)
    # The schedules did meet every kind of fault, supersession and cancellation.
    for kind in ("502", "503", "504", "backpressure", "reset", "lost", "hang", "413"):
        assert figures.faults[f"virtual:{kind}"] > 0, kind
    assert figures.outcomes["superseded"] > 0 and figures.outcomes["cancelled"] > 0


@pytest.mark.heavy(30)
@pytest.mark.parametrize("part", range(REAL_PARTS))
def test_real_slice_of_fifty_schedules(sheetplane_database_url: str, part: int) -> None:
    figures = Figures(SLICE_SEED)
    seeds = _part(schedule_seeds(SLICE_SEED, REAL_SCHEDULES, "real"), part, REAL_PARTS)
    run_real_campaign(seeds, figures, sheetplane_database_url)
    _record(figures, "chaos_slice_real")
    assert figures.real_schedules == len(seeds)
    _check(figures)
    assert figures.faults["real:pg_terminate_backend"] > 0
    assert figures.outcomes["real:done"] >= len(seeds)


@pytest.mark.slow
def test_long_campaign_on_a_fresh_seed(sheetplane_database_url: str) -> None:
    seed = random.SystemRandom().getrandbits(32)
    print(f"chaos campaign seed {seed}")
    figures = Figures(seed)
    run_virtual_campaign(schedule_seeds(seed, 100_000, "virtual"), figures)
    run_real_campaign(schedule_seeds(seed, 300, "real"), figures, sheetplane_database_url)
    _record(figures, "chaos_campaign")
    _check(figures)


@pytest.mark.heavy(10)
def test_a_seed_replays_the_same_virtual_history() -> None:
    seeds = schedule_seeds(SLICE_SEED, 300, "replay")
    first, second = Figures(SLICE_SEED), Figures(SLICE_SEED)
    run_virtual_campaign(seeds, first)
    run_virtual_campaign(seeds, second)
    first.virtual_seconds = second.virtual_seconds = 0.0
    assert first.to_json() == second.to_json()
    assert schedule_seeds(SLICE_SEED, 300, "replay") == seeds
    assert schedule_seeds(SLICE_SEED + 1, 300, "replay") != seeds
