"""Shared fixtures. Postgres is real: ``SHEETPLANE_DATABASE_URL`` if set, else one
embedded server per test session (the sheetplane pytest plugin's)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from sheetplane._types import SheetRef
from sheetplane.store import SheetStore, open_store


@pytest.fixture(scope="session")
def database_url(sheetplane_database_url: str) -> str:
    """A superuser URL of a real Postgres (a secret: never print it): the one the
    sheetplane pytest plugin started, so the session runs one server."""
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
