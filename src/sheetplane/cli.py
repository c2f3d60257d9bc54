"""The ``sheetplane`` command line.

``sheetplane demo`` runs the data plane end to end (``sheetplane.demo``);
``sheetplane bench NAME [ARGS...]`` runs ``sheetplane.bench.NAME.main(ARGS)``;
``sheetplane serve`` runs the reference gateway (``sheetplane.gateway.server._command``);
``sheetplane conformance URL --token T`` checks a gateway (``sheetplane.conformance``);
``sheetplane openapi`` prints the gateway's OpenAPI document (``sheetplane.protocol._openapi``).
Each subcommand is one parser plus one function that takes the parsed
arguments and returns the exit status; add a subcommand by adding both in
``build_parser``. Nothing in the package imports this module.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from .conformance._command import add_conformance_parser
from .demo import add_demo_parser
from .gateway.server._command import add_serve_parser


def bench_names() -> list[str]:
    """The benchmarks ``sheetplane bench`` can run: the public modules of ``sheetplane.bench``."""
    from . import bench

    return sorted(
        module.name
        for module in pkgutil.iter_modules(bench.__path__)
        if not module.name.startswith("_")
    )


def _run_bench(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"sheetplane.bench.{args.name}")
    status = module.main(args.args)
    return int(status or 0)


def _print_openapi(args: argparse.Namespace) -> int:
    import json

    from .protocol import openapi_document

    json.dump(openapi_document(), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="sheetplane",
        description="sheetplane: a trio-native sheet data plane under explicit budgets.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = commands.add_parser(
        "bench",
        help="run a benchmark (sheetplane bench NAME --help for its options)",
        description="Run one benchmark of sheetplane.bench; the arguments after NAME go to it.",
    )
    bench.add_argument("name", choices=bench_names(), metavar="NAME", help=", ".join(bench_names()))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    bench.set_defaults(run=_run_bench)

    add_conformance_parser(commands)
    add_demo_parser(commands)
    add_serve_parser(commands)

    openapi = commands.add_parser(
        "openapi",
        help="print the runtime gateway's OpenAPI 3.1 document",
        description="Print the OpenAPI 3.1 document of the runtime route, generated from the "
        "wire classes (the reference gateway serves the same at RUNTIME_PATH/openapi.json).",
    )
    openapi.set_defaults(run=_print_openapi)

    return parser


#: The status of a command whose reader went away (128 + SIGPIPE), as a shell reports it.
_PIPE_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand; return its status.

    A reader that stops early (``sheetplane openapi | head``) ends the command
    quietly with status 141, as a killed-by-SIGPIPE command would, instead of a
    ``BrokenPipeError`` traceback.
    """
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush
        # cannot fail too (the standard library's signal documentation does the same).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _PIPE_CLOSED
    return status


if __name__ == "__main__":
    sys.exit(main())
