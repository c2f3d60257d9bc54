"""``sheetplane conformance``: its parser and what it runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._report import list_lines, result_line, summary_line, write_json, write_junit
from ._requirements import PROFILES
from ._runner import Options, run

__all__ = ["add_conformance_parser", "run_command"]


def add_conformance_parser(commands: Any) -> None:
    """Add ``conformance`` to the ``sheetplane`` subcommands."""
    parser = commands.add_parser(
        "conformance",
        help="check a runtime gateway against the numbered requirements",
        description="Check any HTTP gateway of the runtime API: one line per requirement "
        "(PASS, FAIL with its evidence, SKIP with why), then a summary; exit 0 only when "
        "no requirement fails. Writes only into sheets it creates under its namespace "
        "prefix. docs/conformance.md lists every requirement.",
    )
    parser.add_argument("url", nargs="?", metavar="URL", help="the gateway's base URL")
    parser.add_argument("--list", action="store_true", help="list the requirements and exit")
    parser.add_argument("--token", help="an executor token of the gateway")
    parser.add_argument("--token-b", help="an executor token of another org (isolation checks)")
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="sheetplane",
        help="seed: what the seed's runtime relies on; sheetplane (default): every sheetplane"
        " action, plus the model-based phase",
    )
    parser.add_argument(
        "--quick", action="store_true", help="skip the checks that take real time (budgets)"
    )
    parser.add_argument("--junit", type=Path, metavar="FILE", help="also write JUnit XML")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write a JSON report")
    parser.add_argument("--seed", type=int, help="the model phase's seed (printed when drawn)")
    parser.add_argument(
        "--examples", type=int, default=25, metavar="N", help="model phase examples (25)"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=30.0,
        help="stop drawing new model examples after this long (30)",
    )
    parser.add_argument(
        "--namespace-prefix",
        metavar="P",
        help="name prefix of everything written (default conformance_<random>)",
    )
    parser.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Run ``sheetplane conformance``; the exit status."""
    if args.list:
        for line in list_lines():
            print(line)
        return 0
    if not args.url or not args.token:
        print("sheetplane conformance: URL and --token are required (or --list)", file=sys.stderr)
        return 2
    options = Options(
        base_url=args.url,
        token=args.token,
        token_b=args.token_b,
        profile=args.profile,
        quick=args.quick,
        seed=args.seed,
        examples=args.examples,
        max_seconds=args.max_seconds,
        namespace_prefix=args.namespace_prefix,
    )
    report = run(options, on_result=lambda result: print(result_line(result), flush=True))
    if report.token_refused is not None:
        print(
            f"sheetplane conformance: the gateway refused the token (HTTP 401 at"
            f" {report.token_refused.id}); stopped before any further check",
            file=sys.stderr,
        )
        return 2
    print(summary_line(report))
    if args.junit is not None:
        write_junit(report, args.junit)
    if args.json is not None:
        write_json(report, args.json)
    return 0 if report.passed else 1
