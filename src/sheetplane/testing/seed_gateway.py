"""The runtime's own gateway, made of the reference one: only the actions the seed calls.

The runtime sheetplane re-creates talks to its gateway with seven actions
(``SEED_ACTIONS``): it resolves plays, ensures sheets, admits a whole input
in one ``start_sheet_dataset``, mints scoped DB sessions and reads pages and
keys; every row write of a map goes over the scoped session. A gateway built
to that runtime answers anything else the way it answers an action it does
not know: 400 "Unsupported runtime data-plane action: <action>".

``running_seed_gateway`` is the reference server configured so
(``GatewayConfig.actions``), for a runner, a conformance check or a parity
test to meet such a gateway without one to hand::

    async with running_seed_gateway(database_url, tokens={token: org}) as gateway:
        async with sheetplane.open_runtime(base_url=gateway.base_url, ...) as rt:
            await rt.map(...)   # admits through start_sheet_dataset (docs/seed-gateway.md)

The pytest plugin's ``sheetplane_seed_gateway`` fixture is one of these.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

from .. import protocol as m

if TYPE_CHECKING:
    from ..gateway.server import RunningGateway

__all__ = ["SEED_ACTIONS", "running_seed_gateway"]

#: The actions the runtime's own gateway serves.
SEED_ACTIONS: Final = frozenset(
    m.action_of(request)
    for request in (
        m.ResolvePlayRequest,
        m.EnsureSheetRequest,
        m.StartSheetDatasetRequest,
        m.CreateDbSessionRequest,
        m.ReadRowsRequest,
        m.ReadRowsBatchRequest,
        m.ReadRowKeysRequest,
    )
)


@asynccontextmanager
async def running_seed_gateway(database_url: str, **options: Any) -> AsyncIterator[RunningGateway]:
    """The reference gateway serving only ``SEED_ACTIONS`` (``options``: the other
    ``GatewayConfig`` fields, e.g. ``tokens``), on loopback, until the block ends."""
    from ..gateway.server import running_gateway

    async with running_gateway(database_url, actions=SEED_ACTIONS, **options) as running:
        yield running
