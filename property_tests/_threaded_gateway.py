"""A reference gateway in its own thread and trio run, for suites that call it synchronously.

Hypothesis drives synchronous tests, and pytest-trio's async fixtures live for
one test; a gateway that serves a whole module of Hypothesis examples runs
in a thread instead. Callers talk to it over real HTTP (``base_url``) and read
the database directly with :func:`snapshot`, which counts what a request may
have written, in a database of their own (:func:`own_database`), so the
snapshot reads only what the suite itself made.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import psycopg
import trio
from psycopg import sql

from sheetplane.gateway.server import ROLE_PREFIX, RunningGateway, running_gateway

#: How long the thread may take to start the server or to stop it (seconds of
#: real time; the embedded Postgres and Hypercorn start in well under this).
START_STOP_SECONDS = 60


class TrioThread:
    """A trio run in its own thread holding what ``setup`` opened, for synchronous callers.

    ``with TrioThread(setup) as loop:`` runs ``await setup(stack)`` (an
    ``AsyncExitStack`` to enter context managers on) in the thread;
    ``loop.value`` is what it returned and ``loop.run(fn, *args)`` awaits
    ``fn(*args)`` in that run and returns its result (or raises its error).
    """

    name = "trio thread"

    def __init__(self, setup: Callable[[AsyncExitStack], Awaitable[Any]]) -> None:
        self._setup = setup
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self.value: Any = None

    def _main(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with AsyncExitStack() as stack:
                self.value = await self._setup(stack)
                self._ready.set()
                await self._stop.wait()

        try:
            trio.run(main)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(START_STOP_SECONDS) or self._error is not None:
            raise RuntimeError(f"the {self.name} did not start") from self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(START_STOP_SECONDS)
        if self._thread.is_alive():
            raise RuntimeError(f"the {self.name} did not stop")
        if self._error is not None:
            raise RuntimeError(f"the {self.name} failed") from self._error

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await fn(*args)`` inside the thread's trio run."""
        assert self._token is not None
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def failure(self) -> BaseException | None:
        """What ended the thread's trio run, if something did."""
        return self._error

    def alive(self) -> bool:
        """Whether the thread's trio run still goes on."""
        return self._thread.is_alive() and self._error is None


class ThreadedGateway(TrioThread):
    """``with ThreadedGateway(url, tokens=...) as gw:``; ``gw.base_url`` serves meanwhile."""

    name = "threaded gateway"

    def __init__(self, database_url: str, *, tokens: dict[str, str], **options: Any) -> None:
        async def serve(stack: AsyncExitStack) -> RunningGateway:
            gateway = await stack.enter_async_context(
                running_gateway(database_url, tokens=tokens, **options)
            )
            self.running = gateway
            self.base_url = gateway.base_url
            return gateway

        super().__init__(serve)
        self.base_url = ""
        self.running: RunningGateway | None = None


@contextmanager
def own_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database on the server of ``server_url`` (a superuser URL), as
    a URL; dropped on exit. A snapshot of it costs what the suite wrote, not what
    every earlier test of the session left on the shared server."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def snapshot(database_url: str) -> dict[str, Any]:
    """What exists and what it holds: schemas, relations and session roles, and the row
    count and a digest of the contents of every table in a sheetplane schema (``sp_...``)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        schemas = [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace ORDER BY 1")]
        relations = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
        ).fetchone()
        roles = [
            r[0]
            for r in conn.execute(
                "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s) ORDER BY 1",
                (ROLE_PREFIX,),
            )
        ]
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE starts_with(schemaname, 'sp_') "
            "ORDER BY 1, 2"
        ).fetchall()
        counts = {}
        for schema, table in tables:
            row = conn.execute(
                sql.SQL(
                    "SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) "
                    "FROM {} AS t"
                ).format(sql.Identifier(schema, table))
            ).fetchone()
            counts[f"{schema}.{table}"] = tuple(row) if row else None
        return {
            "schemas": schemas,
            "relations": relations[0] if relations else 0,
            "roles": roles,
            "rows": counts,
        }
