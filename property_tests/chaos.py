"""Seeded chaos: fault schedules end to end, in virtual time and against the real thing.

Run it as::

    python -m property_tests.chaos --schedules 50 --virtual 10000 --seed 1234

It prints its seed first; the same seed replays the same schedules (each
schedule's own seed is drawn from it, and a failure names that one, which
``--only SEED`` replays alone). Two campaigns:

* **virtual** (``--virtual N``, ``property_tests/_chaos_virtual.py``): runners
  on the real ``GatewayClient`` and ``RowWriter`` against a fake gateway in
  memory, under ``trio.testing.MockClock``: thousands of schedules a minute.
* **real** (``--schedules N``, ``property_tests/_chaos_real.py``): runners
  through ``open_runtime`` on both roads against the reference gateway and an
  embedded Postgres (or ``SHEETPLANE_DATABASE_URL``), with the gateway's fault
  header and ``pg_terminate_backend`` on live sessions.

Invariants checked after every schedule: no row lost or duplicated; the final
sheet equals the serial history of accepted writes (the plain ``SheetModel``);
summaries equal the row counts; every superseded writer stopped with
``AttemptSupersededError``; every wait ended within its derived budget; no
task, thread, connection or database role leaked. ``--json PATH`` writes the
figures (schedules, faults by kind, rows checked, losses, duplicates, time).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import trio
import trio.testing

from ._chaos_virtual import draw_schedule, run_virtual_schedule


@attrs.define
class Figures:
    """What a campaign did, for docs/reliability.md."""

    seed: int
    virtual_schedules: int = 0
    real_schedules: int = 0
    faults: Counter[str] = attrs.field(factory=Counter)
    rows_checked: int = 0
    requests: int = 0
    losses: int = 0
    duplicates: int = 0
    outcomes: Counter[str] = attrs.field(factory=Counter)
    roles_reaped: int = 0
    notes: list[str] = attrs.field(factory=list)
    virtual_seconds: float = 0.0
    real_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self, recurse=False),
            "faults": dict(sorted(self.faults.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
        }


def schedule_seeds(seed: int, count: int, salt: str) -> list[int]:
    """The seeds of ``count`` schedules, drawn from the campaign seed (per campaign)."""
    rng = random.Random(f"{seed}:{salt}")
    return [rng.getrandbits(48) for _ in range(count)]


def run_virtual_campaign(seeds: Sequence[int], figures: Figures) -> None:
    """Every schedule in one trio run on a virtual clock, one after another."""

    async def main() -> None:
        for schedule_seed in seeds:
            report = await run_virtual_schedule(draw_schedule(schedule_seed))
            figures.virtual_schedules += 1
            figures.faults.update({f"virtual:{k}": v for k, v in report.faults.items()})
            figures.rows_checked += report.rows_checked
            figures.requests += report.requests
            figures.losses += report.losses
            figures.duplicates += report.duplicates
            figures.outcomes.update(o.result for o in report.outcomes)

    began = time.perf_counter()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    figures.virtual_seconds += time.perf_counter() - began


def run_real_campaign(seeds: Sequence[int], figures: Figures, database_url: str | None) -> None:
    from ._chaos_real import run_real_schedules

    began = time.perf_counter()
    run_real_schedules(seeds, figures, database_url)
    figures.real_seconds += time.perf_counter() - began


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m property_tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="campaign seed (random if left out)")
    parser.add_argument("--schedules", type=int, default=10, help="real schedules")
    parser.add_argument("--virtual", type=int, default=1000, help="virtual-time schedules")
    parser.add_argument("--only", type=int, default=None, help="replay one schedule seed")
    parser.add_argument("--real-only", action="store_true", help="with --only: a real schedule")
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    print(f"chaos seed {seed}", flush=True)
    figures = Figures(seed)
    if args.only is not None:
        virtual_seeds, real_seeds = ([], [args.only]) if args.real_only else ([args.only], [])
    else:
        virtual_seeds = schedule_seeds(seed, args.virtual, "virtual")
        real_seeds = schedule_seeds(seed, args.schedules, "real")
    if virtual_seeds:
        run_virtual_campaign(virtual_seeds, figures)
        print(
            f"virtual: {figures.virtual_schedules} schedules, {figures.requests} requests, "
            f"{figures.rows_checked} rows checked in {figures.virtual_seconds:.1f} s",
            flush=True,
        )
    if real_seeds:
        run_real_campaign(real_seeds, figures, args.database_url)
        print(
            f"real: {figures.real_schedules} schedules in {figures.real_seconds:.1f} s", flush=True
        )
    print(json.dumps(figures.to_json(), indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(figures.to_json(), out, indent=2)
    return 0 if figures.losses == 0 and figures.duplicates == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
