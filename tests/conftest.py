"""Shared fixtures. Postgres is real: ``SHEETPLANE_DATABASE_URL`` if set, else one
embedded server per test session, started here without durability (see
``sheetplane_database_url``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from _batching_helpers import ENTRY_POINTS
from sheetplane._types import SheetRef
from sheetplane.store import SheetStore, open_store
from sheetplane.store.embedded import EmbeddedPostgres, database_url_from_env
from sheetplane.testing.plugin import SecretURL

if TYPE_CHECKING:
    from _runtime_helpers import CountingGateway


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[EmbeddedPostgres | None]:
    """The session's embedded server, or None when ``SHEETPLANE_DATABASE_URL`` names one.

    It runs with ``durable=False`` (``fsync``, ``synchronous_commit`` and
    ``full_page_writes`` off) for speed: this suite throws the data away when
    it ends and never crashes this server. The crash test
    (``tests/test_store_durability.py``) starts its own durable server, as
    every other embedded server is by default.
    """
    if database_url_from_env() is not None:
        yield None
        return
    with EmbeddedPostgres(durable=False) as server:
        yield server


@pytest.fixture(scope="session")
def sheetplane_database_url(embedded_server: EmbeddedPostgres | None) -> str:
    """The session's Postgres, overriding the plugin's (a secret: never print it;
    its repr is redacted)."""
    if embedded_server is None:
        url = database_url_from_env()
        assert url is not None
        return SecretURL(url)
    return SecretURL(embedded_server.url)


@pytest.fixture
def server_log(embedded_server: EmbeddedPostgres | None) -> Path | None:
    """The embedded server's log file (None on an external server)."""
    if embedded_server is None:
        return None
    return embedded_server.data_directory / "server.log"


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


@pytest.fixture(params=ENTRY_POINTS)
def entry_point(request: pytest.FixtureRequest) -> str:
    """Which of the batcher's two entry points a test submits through: ``submit``, or
    ``submit_nowait`` awaited through its ``Pending`` (``_batching_helpers.submitter``)."""
    return str(request.param)


@pytest.fixture(scope="module")
def session_roles_reaped(database_url: str) -> Iterator[None]:
    """Drop every session role when the module ends (its runtimes minted them; they
    would otherwise stay live for a session TTL and show in later role counts)."""
    yield
    from _runtime_helpers import reap_session_roles

    reap_session_roles(database_url)


@pytest.fixture
async def runtime_gateway(
    database_url: str, session_roles_reaped: None
) -> AsyncIterator[CountingGateway]:
    """A reference gateway on loopback that counts its requests, for runtime tests
    (``_runtime_helpers.counting_gateway``); the module's session roles are reaped."""
    from _runtime_helpers import counting_gateway

    async with counting_gateway(database_url) as gateway:
        yield gateway
