"""``sheetplane serve``: run the reference gateway until interrupted.

With no ``--database-url`` (and no ``SHEETPLANE_DATABASE_URL``) it starts a
throwaway embedded Postgres and stops it on exit. The first line on stdout is
``listening on http://HOST:PORT`` (flushed), printed once the socket listens
and the store is open. SIGINT or SIGTERM shuts down gracefully.

Executor tokens come from ``--token TOKEN=ORG`` (repeatable) and from
``SHEETPLANE_GATEWAY_TOKENS`` (comma-separated ``TOKEN=ORG`` pairs), which
keeps them out of the process list.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from functools import partial
from typing import Final

import trio

from ...errors import InvalidInputError
from ...store.embedded import EmbeddedPostgres, database_url_from_env
from ._auth import parse_token_pairs
from ._config import GatewayConfig
from ._serve import serve

__all__ = ["TOKENS_ENV", "add_serve_parser", "run_serve"]

#: Environment variable with comma-separated ``TOKEN=ORG`` pairs.
TOKENS_ENV: Final = "SHEETPLANE_GATEWAY_TOKENS"


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
        help="Postgres URL (default: $SHEETPLANE_DATABASE_URL, else an embedded Postgres)",
    )
    parser.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TOKEN=ORG",
        help="an executor token and the org it acts for (repeatable)",
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


def _tokens(cli_pairs: list[str]) -> dict[str, str]:
    env_pairs = [p for p in os.environ.get(TOKENS_ENV, "").split(",") if p.strip()]
    return parse_token_pairs([*env_pairs, *cli_pairs])


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
        tokens = _tokens(args.token)
    except InvalidInputError as exc:
        print(f"sheetplane serve: {exc}", file=sys.stderr)
        return 2
    if not tokens:
        print(
            "sheetplane serve: no executor token (--token TOKEN=ORG): every request gets 401",
            file=sys.stderr,
        )
    with contextlib.ExitStack() as stack:
        url = args.database_url or database_url_from_env()
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url
        config = GatewayConfig(
            database_url=url,
            tokens=tokens,
            allow_test_faults=args.allow_test_faults,
            legacy=args.legacy,
        )
        trio.run(_serve_until_signalled, config, args.host, args.port)
    return 0
