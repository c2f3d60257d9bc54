"""Shared fixtures. Postgres is real: ``SHEETPLANE_DATABASE_URL`` if set, else one
embedded server per test session, started here without durability (see
``sheetplane_database_url``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from sheetplane._types import SheetRef
from sheetplane.store import SheetStore, open_store
from sheetplane.store.embedded import EmbeddedPostgres, database_url_from_env


@pytest.fixture(scope="session")
def sheetplane_database_url() -> Iterator[str]:
    """The session's Postgres, overriding the plugin's (a secret: never print it).

    The embedded server runs with ``durable=False`` (``fsync``,
    ``synchronous_commit`` and ``full_page_writes`` off) for speed: this
    suite throws the data away when it ends and never crashes this server.
    The crash test (``tests/test_store_durability.py``) starts its own
    durable server, as every other embedded server is by default.
    """
    url = database_url_from_env()
    if url is not None:
        yield url
        return
    with EmbeddedPostgres(durable=False) as server:
        yield server.url


@pytest.fixture(scope="session")
def database_url(sheetplane_database_url: str) -> str:
    """A superuser URL of a real Postgres (a secret: never print it): the one
    ``sheetplane_database_url`` started, so the session runs one server."""
    return sheetplane_database_url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SheetStore]:
    """An open SheetStore on the test database."""
    async with open_store(database_url) as opened:
        yield opened


@pytest.fixture
def sheet() -> SheetRef:
    """A sheet no other test uses."""
    tag = uuid.uuid4().hex
    return SheetRef(f"org-{tag}", f"play-{tag}", f"ns-{tag}")


@pytest.fixture
def namespace() -> str:
    """A table namespace no other test uses (the gateway tests' sheets)."""
    return f"ns_{uuid.uuid4().hex[:12]}"
