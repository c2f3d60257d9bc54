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

The metrics token (GET /metrics needs "authorization: Bearer TOKEN"; without
one /metrics answers 404) comes from --metrics-token-file or
$SHEETPLANE_METRICS_TOKEN.

The first line on stdout is ``listening on http://HOST:PORT`` (flushed),
printed once the socket listens and the store is open (every worker's).
Logs go to stderr, one JSON object a line. SIGTERM or SIGINT drains: new
requests are answered 503 with retry_after_ms, requests in flight get the
drain budget to finish; the exit status is 0 when they all did, 1 when the
budget ran out and some were cancelled. A second signal cancels at once.

--workers N runs N worker processes on one listening socket, each with its
own Postgres pool of --db-connections / N connections; their session-role
reapers take turns under a lock no tenant can take.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import attrs
import psycopg
import trio
from prometheus_client.multiprocess import mark_process_dead

from ..._redact import Redactor
from ...budgets import (
    GATEWAY_BODY_READ_TIMEOUT_MS,
    GATEWAY_DB_CONNECTION_BUDGET,
    GATEWAY_DRAIN_BUDGET_MS,
    GATEWAY_KEEP_ALIVE_TIMEOUT_MS,
    GATEWAY_MAX_CONNECTIONS,
    GATEWAY_MIN_WORKER_POOL,
)
from ...errors import (
    DatabaseNotHardenedError,
    InvalidInputError,
    SheetplaneError,
    StoreUnavailableError,
)
from ...store.embedded import DATABASE_URL_ENV, EmbeddedPostgres, database_url_from_env
from ._auth import parse_token_pairs
from ._config import GatewayConfig
from ._logs import configure_logging
from ._metrics import MULTIPROCESS_DIR_ENV
from ._ops import Operations
from ._plays import PlayDefinition, load_plays
from ._serve import ServeOptions, bind_socket, serve

__all__ = ["METRICS_TOKEN_ENV", "TOKENS_ENV", "add_serve_parser", "run_serve"]

#: Environment variable with comma-separated ``TOKEN=ORG`` pairs.
TOKENS_ENV: Final = "SHEETPLANE_GATEWAY_TOKENS"

#: Environment variable with the bearer token ``GET /metrics`` requires.
METRICS_TOKEN_ENV: Final = "SHEETPLANE_METRICS_TOKEN"

#: The command that runs ``sheetplane`` with this interpreter (what workers run).
_SHEETPLANE: Final = (
    sys.executable,
    "-c",
    "import sys; from sheetplane.cli import main; sys.exit(main())",
)


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
        "--metrics-token-file",
        default=None,
        metavar="PATH",
        type=Path,
        help=f"read the /metrics bearer token from this file (default: ${METRICS_TOKEN_ENV})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes sharing one listening socket (default 1)",
    )
    parser.add_argument(
        "--db-connections",
        type=int,
        default=GATEWAY_DB_CONNECTION_BUDGET,
        metavar="N",
        help=(
            "Postgres connections all workers together may hold; each worker's pool is"
            f" N // workers, at least {GATEWAY_MIN_WORKER_POOL}"
            f" (default {GATEWAY_DB_CONNECTION_BUDGET})"
        ),
    )
    parser.add_argument(
        "--max-http-connections",
        type=int,
        default=GATEWAY_MAX_CONNECTIONS,
        metavar="N",
        help=(
            "HTTP connections one worker serves at once; more wait in the listen backlog"
            f" (default {GATEWAY_MAX_CONNECTIONS})"
        ),
    )
    parser.add_argument(
        "--keep-alive-timeout-ms",
        type=int,
        default=GATEWAY_KEEP_ALIVE_TIMEOUT_MS,
        metavar="MS",
        help=f"close an idle connection after this (default {GATEWAY_KEEP_ALIVE_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--body-read-timeout-ms",
        type=int,
        default=GATEWAY_BODY_READ_TIMEOUT_MS,
        metavar="MS",
        help=(
            "a request body must arrive within this, else 408"
            f" (default {GATEWAY_BODY_READ_TIMEOUT_MS})"
        ),
    )
    parser.add_argument(
        "--drain-budget-ms",
        type=int,
        default=GATEWAY_DRAIN_BUDGET_MS,
        metavar="MS",
        help=(
            "after SIGTERM, how long requests in flight may take to finish"
            f" (default {GATEWAY_DRAIN_BUDGET_MS})"
        ),
    )
    parser.add_argument(
        "--reaper-interval-ms",
        type=int,
        default=None,
        metavar="MS",
        help="how often expired session roles are dropped (default: the budgets' interval)",
    )
    parser.add_argument(
        "--org-db-connections",
        type=int,
        default=None,
        metavar="N",
        help=(
            "connections all DB sessions of one org may hold at once; the watchdog ends an"
            " org's newest past it (default: half of the server's max_connections left after"
            " reserved slots and the gateway's own, budgets.org_connection_budget)"
        ),
    )
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="bind with SO_REUSEPORT, so a new gateway can listen beside a draining one",
    )
    parser.add_argument("--worker-fd", type=int, default=None, help=argparse.SUPPRESS)
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
    try:
        return parse_token_pairs(pairs, source=source)
    except InvalidInputError as exc:
        raise ConfigurationError(str(exc)) from None


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


def _metrics_token(args: argparse.Namespace) -> str | None:
    if args.metrics_token_file is not None:
        token = _read_secret_file(args.metrics_token_file, "--metrics-token-file").strip()
        if not token:
            raise ConfigurationError(f"--metrics-token-file: {args.metrics_token_file} is empty")
        return token
    return os.environ.get(METRICS_TOKEN_ENV, "").strip() or None


def _pool_size(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise ConfigurationError(f"--workers must be >= 1, got {args.workers}")
    size = int(args.db_connections) // int(args.workers)
    if size < GATEWAY_MIN_WORKER_POOL:
        raise ConfigurationError(
            f"--db-connections {args.db_connections} cannot give {args.workers} workers"
            f" {GATEWAY_MIN_WORKER_POOL} connections each"
        )
    return size


def _serve_options(args: argparse.Namespace) -> ServeOptions:
    try:
        return ServeOptions(
            max_connections=args.max_http_connections,
            keep_alive_timeout_ms=args.keep_alive_timeout_ms,
            drain_budget_ms=args.drain_budget_ms,
            reuse_port=args.reuse_port,
        )
    except InvalidInputError as exc:
        raise ConfigurationError(str(exc)) from None


def _gateway_config(
    args: argparse.Namespace, secrets: dict[str, Any], plays: tuple[PlayDefinition, ...]
) -> GatewayConfig:
    extra: dict[str, Any] = {}
    if args.reaper_interval_ms is not None:
        extra["reaper_interval_ms"] = args.reaper_interval_ms
    if args.org_db_connections is not None:
        extra["session_max_connections_per_org"] = args.org_db_connections
    try:
        return GatewayConfig(
            database_url=secrets["database_url"],
            tokens=secrets["tokens"],
            metrics_token=secrets["metrics_token"],
            allow_test_faults=args.allow_test_faults,
            legacy=args.legacy,
            max_connections=_pool_size(args),
            body_read_timeout_ms=args.body_read_timeout_ms,
            plays=plays,
            **extra,
        )
    except InvalidInputError as exc:
        raise ConfigurationError(str(exc)) from None


async def _serve_until_signalled(
    config: GatewayConfig,
    options: ServeOptions,
    host: str,
    port: int,
    sock: socket.socket | None,
    redactor: Redactor,
) -> int:
    """Serve until SIGTERM/SIGINT, drain, and return the exit status (module docstring)."""
    ops = Operations(redactor=redactor)
    first = trio.Event()
    forced = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal forced
                async for _ in signals:
                    if first.is_set():
                        forced = True
                        nursery.cancel_scope.cancel()
                    first.set()

            async def serving(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
                await serve(
                    config,
                    host=host,
                    port=port,
                    shutdown_trigger=first.wait,
                    options=options,
                    ops=ops,
                    sock=sock,
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            base_url = await nursery.start(serving)
            print(f"listening on {base_url}", flush=True)
    return 1 if forced or ops.cancelled else 0


def _worker_argv(args: argparse.Namespace, fd: int) -> list[str]:
    """The command line of one worker: this command's options, no secret."""
    argv = [
        *_SHEETPLANE,
        "serve",
        "--worker-fd",
        str(fd),
        "--host",
        args.host,
        "--workers",
        str(args.workers),
        "--db-connections",
        str(args.db_connections),
        "--max-http-connections",
        str(args.max_http_connections),
        "--keep-alive-timeout-ms",
        str(args.keep_alive_timeout_ms),
        "--body-read-timeout-ms",
        str(args.body_read_timeout_ms),
        "--drain-budget-ms",
        str(args.drain_budget_ms),
    ]
    if args.reaper_interval_ms is not None:
        argv += ["--reaper-interval-ms", str(args.reaper_interval_ms)]
    if args.org_db_connections is not None:
        argv += ["--org-db-connections", str(args.org_db_connections)]
    if args.plays is not None:
        argv += ["--plays", str(args.plays)]
    for flag, on in (("--allow-test-faults", args.allow_test_faults), ("--legacy", args.legacy)):
        if on:
            argv.append(flag)
    return argv


async def _first_line(stream: trio.abc.ReceiveStream) -> str | None:
    buffer = b""
    while b"\n" not in buffer:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode()


async def _run_workers(
    args: argparse.Namespace, secrets: dict[str, Any], sock: socket.socket
) -> int:
    """``--workers N``: N worker processes serving one listening socket.

    The socket is bound by the caller (so port 0 resolves once) and inherited by every
    worker; the secrets reach each worker on its stdin, never in its argv or
    environment. SIGTERM/SIGINT are forwarded to every worker; a worker that
    exits on its own stops the others. The status is 0 when every worker exited 0.
    """
    os.set_inheritable(sock.fileno(), True)
    procs: list[trio.Process] = []
    signalled = False
    # The workers' metrics meet in one directory, so any worker's scrape answers for all.
    metrics_dir = tempfile.mkdtemp(prefix="sheetplane-metrics-")
    env = {**os.environ, MULTIPROCESS_DIR_ENV: metrics_dir}
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            for _ in range(args.workers):
                proc = await trio.lowlevel.open_process(
                    _worker_argv(args, sock.fileno()),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    pass_fds=(sock.fileno(),),
                    env=env,
                )
                procs.append(proc)
                assert proc.stdin is not None
                await proc.stdin.send_all(json.dumps(secrets).encode())
                await proc.stdin.aclose()
            lines = []
            for proc in procs:
                assert proc.stdout is not None
                lines.append(await _first_line(proc.stdout))
            if any(line is None for line in lines):
                print("sheetplane serve: a worker failed to start", file=sys.stderr)
                for proc in procs:
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGTERM)
                for proc in procs:
                    await proc.wait()
                return 1
            print(lines[0], flush=True)

            async with trio.open_nursery() as nursery:

                async def forward() -> None:
                    nonlocal signalled
                    async for signum in signals:
                        signalled = True
                        for proc in procs:
                            if proc.returncode is None:
                                proc.send_signal(signum)

                async def watch(proc: trio.Process) -> None:
                    await proc.wait()
                    mark_process_dead(proc.pid, metrics_dir)  # type: ignore[no-untyped-call]
                    if not signalled:
                        for other in procs:
                            if other.returncode is None:
                                other.send_signal(signal.SIGTERM)

                nursery.start_soon(forward)
                async with trio.open_nursery() as waiting:
                    for proc in procs:
                        waiting.start_soon(watch, proc)
                nursery.cancel_scope.cancel()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0 if signalled and all(proc.returncode == 0 for proc in procs) else 1


def _startup_failure(exc: BaseException) -> SheetplaneError | None:
    """The error in ``exc`` (through exception groups) that stops the gateway from
    starting for a reason its operator must fix: a database it refuses (not hardened, or
    a role that could not bound sessions) or one it cannot reach."""
    if isinstance(exc, DatabaseNotHardenedError | StoreUnavailableError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _startup_failure(inner)
            if found is not None:
                return found
    return None


def _refusing(run: Any) -> int:
    """``run()``, except that a database the gateway refuses is one line on stderr and
    status 2, and one it cannot reach one line and status 1 (no traceback, no secret:
    the store's errors carry none)."""
    try:
        return int(run())
    except BaseException as exc:
        failure = _startup_failure(exc)
        if failure is None:
            raise
        message = " ".join(str(failure).split())
        if isinstance(failure, StoreUnavailableError):
            print(f"sheetplane serve: cannot reach the database: {message}", file=sys.stderr)
            return 1
        print(f"sheetplane serve: the gateway cannot start: {message}", file=sys.stderr)
        return 2


def _listening_socket(args: argparse.Namespace) -> socket.socket | None:
    """The socket ``serve`` will listen on, bound before anything starts (so a taken port
    is said at once, not after an embedded Postgres has started); None if it cannot be
    bound, with one line on stderr saying why."""
    try:
        return bind_socket(args.host, args.port, reuse_port=args.reuse_port)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        print(
            f"sheetplane serve: cannot listen on {args.host}:{args.port}: {reason}", file=sys.stderr
        )
        return None


@attrs.frozen
class ServeSettings:
    """What ``sheetplane serve`` runs with, once its options, files and
    environment are read; ``messages`` are the lines it writes to stderr first."""

    secrets: dict[str, Any] = attrs.field(repr=False)
    """``tokens``, ``database_url`` (None: an embedded server), ``metrics_token``."""
    options: ServeOptions
    plays: tuple[PlayDefinition, ...]
    messages: tuple[str, ...]
    """Warnings about the command line: they name options, never a secret."""


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """Read the serve command's configuration (no socket, no database yet).

    Raises :class:`ConfigurationError` (or ``InvalidInputError``), whose message
    names the source (option, variable, file, pair position) and never a secret:
    the command prints it and exits 2.
    """
    if args.worker_fd is not None:
        secrets = json.loads(sys.stdin.read())
    else:
        secrets = {
            "tokens": _tokens(args),
            "database_url": _database_url(args),
            "metrics_token": _metrics_token(args),
        }
    options = _serve_options(args)
    plays = () if args.plays is None else load_plays(args.plays)
    _pool_size(args)
    messages: list[str] = []
    if args.worker_fd is None:
        messages += [f"warning: {w}" for w in command_line_secret_warnings(args)]
        if not secrets["tokens"]:
            messages.append("no executor token (--token TOKEN=ORG): every request gets 401")
    return ServeSettings(secrets, options, tuple(plays), tuple(messages))


def run_serve(args: argparse.Namespace) -> int:
    """Run ``sheetplane serve`` with parsed ``args``; return the exit status."""
    redactor = configure_logging()
    try:
        settings = serve_settings(args)
    except (ConfigurationError, InvalidInputError) as exc:
        print(f"sheetplane serve: {exc}", file=sys.stderr)
        return 2
    secrets, options, plays = settings.secrets, settings.options, settings.plays
    if args.worker_fd is not None:
        config = _gateway_config(args, secrets, plays)
        inherited = socket.socket(fileno=args.worker_fd)
        return _refusing(
            lambda: trio.run(
                _serve_until_signalled, config, options, args.host, args.port, inherited, redactor
            )
        )
    for message in settings.messages:
        print(f"sheetplane serve: {message}", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        bound = _listening_socket(args)
        if bound is None:
            return 1
        sock = bound
        stack.callback(sock.close)
        if secrets["database_url"] is None:
            secrets["database_url"] = stack.enter_context(EmbeddedPostgres()).url
        try:
            config = _gateway_config(args, secrets, plays)
        except ConfigurationError as exc:
            print(f"sheetplane serve: {exc}", file=sys.stderr)
            return 2
        if args.workers == 1:
            return _refusing(
                lambda: trio.run(
                    _serve_until_signalled, config, options, args.host, args.port, sock, redactor
                )
            )
        return trio.run(_run_workers, args, secrets, sock)
