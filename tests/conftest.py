"""Shared fixtures. Postgres is real: ``SHEETPLANE_DATABASE_URL`` if set, else one
embedded server per test session."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from sheetplane.store import SheetStore, open_store
from sheetplane.store._types import SheetRef
from sheetplane.store.embedded import EmbeddedPostgres, database_url_from_env


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A superuser URL of a real Postgres (a secret: never print it)."""
    url = database_url_from_env()
    if url is not None:
        yield url
        return
    with EmbeddedPostgres() as server:
        yield server.url


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
