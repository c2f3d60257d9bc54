"""Helpers for tests on a server with few connection slots: take every slot a
plain role may take, as another tenant would, and count the server's refusals."""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from sheetplane.store.embedded import EmbeddedPostgres

#: What Postgres logs when it refuses a connection for lack of slots.
REFUSALS = ("too many clients", "remaining connection slots are reserved")


def refusals(server: EmbeddedPostgres) -> int:
    """How many connects the server has refused for lack of slots (its log)."""
    log = (server.data_directory / "server.log").read_text(errors="replace")
    return sum(log.count(refusal) for refusal in REFUSALS)


@contextlib.contextmanager
def hogging_every_slot(
    server: EmbeddedPostgres, max_connections: int
) -> Iterator[list[psycopg.Connection[Any]]]:
    """Fill every connection slot a non-superuser may take, as another tenant would:
    connections of a plain role, closed when the block ends (or earlier by the test)."""
    role, password = f"hog_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(12)
    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
    url = make_conninfo(server.url, user=role, password=password)
    hog: list[psycopg.Connection[Any]] = []
    try:
        # Until Postgres refuses one: then every slot but the superusers' is taken.
        for _ in range(max_connections):
            try:
                hog.append(psycopg.connect(url, autocommit=True))
            except psycopg.OperationalError as exc:
                assert any(refusal in str(exc) for refusal in REFUSALS), exc
                break
        yield hog
    finally:
        for conn in hog:
            conn.close()
