"""The sheetplane pytest plugin: a real Postgres and a running reference gateway as fixtures.

Installed with the package (the ``pytest11`` entry point ``sheetplane``), so
any suite can ask for these fixtures by name; every name starts with
``sheetplane_`` so none clashes with a suite's own:

``sheetplane_database_url`` (session)
    A superuser URL of a real Postgres: ``SHEETPLANE_DATABASE_URL`` when set,
    else one embedded server for the whole test session, removed afterwards.
    A secret: never print it.
``sheetplane_store``
    An open ``SheetStore`` on that database.
``sheetplane_sheet``
    A ``SheetRef`` no other test uses.
``sheetplane_gateway``
    A reference gateway serving on ``127.0.0.1`` (a free port) for the test,
    with test faults allowed and a harness unwrap key: a
    :class:`GatewayHandle` with ``base_url``, ``token``, ``org_id``,
    ``fault_header(...)`` and ``client(...)``.
``sheetplane_seed_gateway``
    The same, serving only the runtime's own actions
    (:mod:`sheetplane.testing.seed_gateway`): every other action is answered
    400 "Unsupported runtime data-plane action", as the runtime's gateway does.
``sheetplane_strategy``
    The road ``sheetplane_runtime`` takes: ``"direct"`` unless the test
    parametrizes it (``@pytest.mark.parametrize("sheetplane_strategy",
    ["direct", "gateway_only"])``).
``sheetplane_runtime``
    An open runtime context (``sheetplane.open_runtime``) on that gateway for
    the chosen road.

The async fixtures need ``pytest-trio`` (``trio_mode = true``, or mark the
tests ``@pytest.mark.trio``). The plugin imports no Hypothesis; strategies
live in :mod:`sheetplane.testing.strategies`.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import pytest

if TYPE_CHECKING:
    from .._types import SheetRef
    from ..gateway.client import GatewayClient
    from ..gateway.faults import FaultSpec
    from ..gateway.server import RunningGateway
    from ..store import SheetStore

# The library is imported inside the fixtures, not here: pytest loads this
# plugin in every run of an environment that has sheetplane installed, and a
# run that asks for none of these fixtures should not pay for (or depend on)
# the gateway, the store or the embedded Postgres.

__all__ = ["GatewayHandle", "SecretURL"]

#: The play every fixture-made client and runtime acts for unless told otherwise.
DEFAULT_PLAY = "sheetplane-test-play"


@attrs.frozen
class GatewayHandle:
    """A running reference gateway, as a test sees it."""

    base_url: str
    """``http://127.0.0.1:PORT``."""
    token: str = attrs.field(repr=False)
    """The executor token it accepts (a secret)."""
    org_id: str
    """The org that token names."""
    unwrap_key: bytes = attrs.field(repr=False)
    """The harness key preloaded sessions are sealed under (a secret)."""
    running: RunningGateway = attrs.field(repr=False)
    """The server itself: its state, store and fault schedule."""

    def fault_header(
        self, specs: Iterable[FaultSpec], *, nonce: str | None = None
    ) -> dict[str, str]:
        """Request headers that arm ``specs`` (a fresh ``nonce`` by default, so they arm anew)."""
        from ..gateway.faults import FAULT_HEADER, format_fault_header

        nonce = uuid.uuid4().hex if nonce is None else nonce
        return {FAULT_HEADER: format_fault_header(specs, nonce=nonce)}

    def client(
        self,
        play_name: str = DEFAULT_PLAY,
        *,
        faults: Iterable[FaultSpec] = (),
        **options: Any,
    ) -> GatewayClient:
        """A ``GatewayClient`` for ``play_name``, arming ``faults`` with its first request.

        Use it as ``async with handle.client(...) as client:``.
        """
        from ..gateway.client import GatewayClient

        specs = tuple(faults)
        headers = dict(options.pop("headers", None) or {})
        if specs:
            headers.update(self.fault_header(specs))
        return GatewayClient(
            self.base_url,
            self.token,
            play_name=play_name,
            org_id=self.org_id,
            headers=headers or None,
            **options,
        )


class SecretURL(str):
    """A database URL whose ``repr`` names no part of it. It is the URL everywhere
    else (``str``, formatting, psycopg); pytest and Hypothesis print a failing
    test's arguments by ``repr``, and this one carries a password."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<database URL, redacted>"


@pytest.fixture(scope="session")
def sheetplane_database_url() -> Iterator[str]:
    """A superuser URL of a real Postgres (a secret: never print it; its repr is
    redacted, since pytest shows a failing test's arguments by repr)."""
    from ..store.embedded import EmbeddedPostgres, database_url_from_env

    url = database_url_from_env()
    if url is not None:
        yield SecretURL(url)
        return
    # Not durable (fsync and synchronous commit off): the data is removed when the
    # session ends and nothing crashes this server, so flushing buys nothing.
    with EmbeddedPostgres(durable=False) as server:
        yield SecretURL(server.url)


@pytest.fixture
async def sheetplane_store(sheetplane_database_url: str) -> AsyncIterator[SheetStore]:
    """An open ``SheetStore`` on the test database."""
    from ..store import open_store

    async with open_store(sheetplane_database_url) as store:
        yield store


@pytest.fixture
def sheetplane_sheet() -> SheetRef:
    """A sheet no other test uses."""
    from .._types import SheetRef

    tag = uuid.uuid4().hex
    return SheetRef(f"org-{tag}", f"play-{tag}", f"ns-{tag}")


@pytest.fixture
async def sheetplane_gateway(sheetplane_database_url: str) -> AsyncIterator[GatewayHandle]:
    """A reference gateway with test faults allowed, for one test."""
    from ..gateway.server import running_gateway

    token = f"tok-{secrets.token_urlsafe(18)}"
    org_id = f"org-{uuid.uuid4().hex[:12]}"
    unwrap_key = secrets.token_bytes(32)
    async with running_gateway(
        sheetplane_database_url,
        tokens={token: org_id},
        allow_test_faults=True,
        unwrap_key=unwrap_key,
    ) as running:
        yield GatewayHandle(running.base_url, token, org_id, unwrap_key, running)


@pytest.fixture
async def sheetplane_seed_gateway(sheetplane_database_url: str) -> AsyncIterator[GatewayHandle]:
    """A gateway that serves only the runtime's own actions (``testing.seed_gateway``),
    answering every other one 400 "Unsupported runtime data-plane action", for one test."""
    from .seed_gateway import running_seed_gateway

    token = f"tok-{secrets.token_urlsafe(18)}"
    org_id = f"org-{uuid.uuid4().hex[:12]}"
    unwrap_key = secrets.token_bytes(32)
    async with running_seed_gateway(
        sheetplane_database_url, tokens={token: org_id}, unwrap_key=unwrap_key
    ) as running:
        yield GatewayHandle(running.base_url, token, org_id, unwrap_key, running)


@pytest.fixture
def sheetplane_strategy() -> str:
    """The road ``sheetplane_runtime`` takes; parametrize it to run a test on both."""
    return "direct"


@pytest.fixture
async def sheetplane_runtime(
    sheetplane_gateway: GatewayHandle, sheetplane_strategy: str
) -> AsyncIterator[Any]:
    """An open runtime (``sheetplane.open_runtime``) on the test's gateway, for the
    ``sheetplane_strategy`` road, with a run id no other test uses."""
    from ..runtime import open_runtime

    async with open_runtime(
        base_url=sheetplane_gateway.base_url,
        token=sheetplane_gateway.token,
        org_id=sheetplane_gateway.org_id,
        play_name=DEFAULT_PLAY,
        run_id=f"run-{uuid.uuid4().hex[:12]}",
        strategy=sheetplane_strategy,  # type: ignore[arg-type]
        unwrap_key=sheetplane_gateway.unwrap_key,
    ) as runtime:
        yield runtime
