"""``sheetplane serve``: run the reference gateway until interrupted.

Secrets stay out of the process list. The database URL comes from, in this
order: --database-url-file (a file holding the URL), --database-url, then
$SHEETPLANE_DATABASE_URL; with none of them it starts a throwaway embedded
Postgres and stops it on exit. Executor tokens (TOKEN=ORG pairs) are the
union of $SHEETPLANE_GATEWAY_TOKENS (comma-separated), --tokens-file (one
pair a line; blank lines and lines starting with # are skipped) and --token
(repeatable). A secret given on the command line (--token, or a
--database-url that carries a password) is visible to every local user in
ps: it is accepted, with a warning on stderr that names the option, never
the secret.

The first line on stdout is ``listening on http://HOST:PORT`` (flushed),
printed once the socket listens and the store is open. SIGINT or SIGTERM
shuts down gracefully.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Final

import psycopg
import trio

from ...errors import InvalidInputError
from ...store.embedded import DATABASE_URL_ENV, EmbeddedPostgres, database_url_from_env
from ._config import GatewayConfig
from ._plays import load_plays
from ._serve import serve

__all__ = ["TOKENS_ENV", "add_serve_parser", "run_serve"]

#: Environment variable with comma-separated ``TOKEN=ORG`` pairs.
TOKENS_ENV: Final = "SHEETPLANE_GATEWAY_TOKENS"


class ConfigurationError(Exception):
    """A bad ``serve`` configuration; its message names the source, never a secret."""


def add_serve_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve`` on the ``sheetplane`` command's subparsers."""
    parser = subparsers.add_parser(
        "serve",
        help="run the reference runtime gateway",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: a free one)")
    parser.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help=(
            f"Postgres URL (default: ${DATABASE_URL_ENV}, else an embedded Postgres);"
            " a password here is visible in ps: prefer the variable or --database-url-file"
        ),
    )
    parser.add_argument(
        "--database-url-file",
        default=None,
        metavar="PATH",
        type=Path,
        help="read the Postgres URL from this file (surrounding whitespace is stripped)",
    )
    parser.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TOKEN=ORG",
        help=(
            "an executor token and the org it acts for (repeatable); visible in ps:"
            f" prefer ${TOKENS_ENV} or --tokens-file"
        ),
    )
    parser.add_argument(
        "--tokens-file",
        default=None,
        metavar="PATH",
        type=Path,
        help="read TOKEN=ORG pairs from this file, one a line (# comments, blank lines skipped)",
    )
    parser.add_argument(
        "--plays",
        default=None,
        metavar="DIR",
        type=Path,
        help="register the play definitions of DIR/*.json (each an object or a list) at start",
    )
    parser.add_argument(
        "--allow-test-faults",
        action="store_true",
        help="honour the x-sheetplane-test-fault header (tests only)",
    )
    parser.add_argument(
        "--legacy",
        action="store_true",
        help="emulate a gateway without the batch read action and stale reasons",
    )
    parser.set_defaults(run=run_serve)


def _read_secret_file(path: Path, option: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{option}: cannot read {path}: {type(exc).__name__}") from None


def _token_pairs(source: str, pairs: Iterable[str]) -> dict[str, str]:
    """``TOKEN=ORG`` pairs from one source; a malformed one is named by position only."""
    tokens: dict[str, str] = {}
    for index, pair in enumerate(pairs, start=1):
        token, sep, org = pair.partition("=")
        if not sep or not token.strip() or not org.strip():
            raise ConfigurationError(f"{source} #{index} must have the form TOKEN=ORG")
        tokens[token.strip()] = org.strip()
    return tokens


def _file_lines(text: str) -> list[str]:
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]


def _tokens(args: argparse.Namespace) -> dict[str, str]:
    env_pairs = [p for p in os.environ.get(TOKENS_ENV, "").split(",") if p.strip()]
    tokens = _token_pairs(f"${TOKENS_ENV} pair", env_pairs)
    if args.tokens_file is not None:
        text = _read_secret_file(args.tokens_file, "--tokens-file")
        tokens.update(_token_pairs("--tokens-file line", _file_lines(text)))
    tokens.update(_token_pairs("--token", args.token))
    return tokens


def _carries_password(url: str) -> bool:
    try:
        return bool(psycopg.conninfo.conninfo_to_dict(url).get("password"))
    except psycopg.ProgrammingError:
        return True  # unparseable: assume the worst, the warning costs nothing


def _database_url(args: argparse.Namespace) -> str | None:
    if args.database_url_file is not None and args.database_url is not None:
        raise ConfigurationError("give --database-url or --database-url-file, not both")
    if args.database_url_file is not None:
        url = _read_secret_file(args.database_url_file, "--database-url-file").strip()
        if not url:
            raise ConfigurationError(f"--database-url-file: {args.database_url_file} is empty")
        return url
    if args.database_url is not None:
        return str(args.database_url)
    return database_url_from_env()


def command_line_secret_warnings(args: argparse.Namespace) -> list[str]:
    """One warning per option that put a secret in the process list (no secret in them)."""
    warnings = []
    if args.token:
        warnings.append(
            "--token puts executor tokens in the process list (ps);"
            f" use ${TOKENS_ENV} or --tokens-file"
        )
    if args.database_url is not None and _carries_password(args.database_url):
        warnings.append(
            "--database-url puts a password in the process list (ps);"
            f" use ${DATABASE_URL_ENV} or --database-url-file"
        )
    return warnings


async def _serve_until_signalled(config: GatewayConfig, host: str, port: int) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def stop() -> None:
            async for _ in signals:
                return

        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(
                partial(serve, config, host=host, port=port, shutdown_trigger=stop)
            )
            print(f"listening on {base_url}", flush=True)


def run_serve(args: argparse.Namespace) -> int:
    """Run ``sheetplane serve`` with parsed ``args``; return the exit status."""
    try:
        tokens = _tokens(args)
        url = _database_url(args)
        plays = () if args.plays is None else load_plays(args.plays)
    except (ConfigurationError, InvalidInputError) as exc:
        print(f"sheetplane serve: {exc}", file=sys.stderr)
        return 2
    for warning in command_line_secret_warnings(args):
        print(f"sheetplane serve: warning: {warning}", file=sys.stderr)
    if not tokens:
        print(
            "sheetplane serve: no executor token (--token TOKEN=ORG): every request gets 401",
            file=sys.stderr,
        )
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url
        try:
            config = GatewayConfig(
                database_url=url,
                tokens=tokens,
                allow_test_faults=args.allow_test_faults,
                legacy=args.legacy,
                plays=plays,
            )
        except InvalidInputError as exc:
            print(f"sheetplane serve: {exc}", file=sys.stderr)
            return 2
        trio.run(_serve_until_signalled, config, args.host, args.port)
    return 0
