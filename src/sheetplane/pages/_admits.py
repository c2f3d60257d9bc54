"""Admission on either road, behind one interface (``AdmissionRoad``).

The runtime's admission owner (``runtime/_admit.py``) chooses the way an
input goes in (whole, staged, or at once) and never asks which road it is on;
what differs between the roads is behind this interface:

* ``DirectAdmissions``: a first admission of a sequence goes in at once, in
  one transaction of a ``rows.admit`` session straight into the sheet
  (``store/_direct.py``); a staged chunk goes on a ``rows.stage`` session (one
  ``INSERT`` a chunk, sent again after a lost connection); a whole
  admission's parts are read from the sheet by the admission's version.
* ``GatewayAdmissions``: nothing goes in at once (an admission's chunks arrive
  in separate requests, possibly at different gateway processes, so no
  transaction spans them); a staged chunk goes in the gateway's
  ``runtime_sheet_stage_admission_chunk`` request; a whole admission's parts
  are the rows its answer holds (a gateway built to the runtime has no read
  filtered by admission).

The runtime picks the road once, with the writer's other roads
(``Runtime.writer``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .. import protocol as m
from .._types import AdmissionCounts, AdmittedPart, SheetContract, SheetRef
from ..budgets import ADMISSION_CHUNK_ROWS, DIRECT_ADMISSION_HOLD_MS, RETRY_DELAYS_MS
from ..errors import StoreUnavailableError
from ..gateway.client import GatewayClient
from ..protocol import EncodedChunk
from ..sessions import SessionLimits, SessionManager
from ._writes import Road, SheetSessions

if TYPE_CHECKING:
    from ..dataset import Dataset, InMemoryDataset

__all__ = ["BEGIN_ADMISSION", "AdmissionRoad", "DirectAdmissions", "GatewayAdmissions"]

#: The staged admission's first action: a gateway that does not serve it admits whole.
BEGIN_ADMISSION = m.action_of(m.BeginAdmissionRequest)

#: Opens a part of an admission of the sheet (its pending or completed rows) lazily.
OpenPart = Callable[[AdmittedPart], "Dataset"]


class AdmissionRoad(Protocol):
    """What one sheet's admissions, under one contract and run, do on one road."""

    @property
    def road(self) -> Road:
        """Which road the admissions take (for spans and logs, never for a decision)."""
        ...

    async def admit_at_once(self, rows: Sequence[Mapping[str, Any]]) -> AdmissionCounts | None:
        """Admit a sequence (which can be read again) the road's own way, if it has one;
        None when nothing was written and the sequence goes another way from its start.
        Its first chunk is checked before any request, as the staged way does it."""
        ...

    async def stage_chunk(
        self,
        admission_id: str,
        seq: int,
        first_position: int,
        rows: EncodedChunk,
        begin: Callable[[], Awaitable[None]],
    ) -> None:
        """Stage one chunk of a staged admission; ``begin`` registers the admission (a
        no-op once it has) and is awaited before the chunk is sent."""
        ...

    def staging_done(self) -> None:
        """The staged admission is over (committed or not): close what it held."""
        ...

    def whole_part(
        self, part: AdmittedPart, rows: tuple[dict[str, Any], ...]
    ) -> Dataset | InMemoryDataset:
        """A part of a whole admission, whose answer carried ``rows`` for it."""
        ...


def _check_first_chunk(rows: Sequence[Mapping[str, Any]]) -> None:
    for position, row in enumerate(rows[:ADMISSION_CHUNK_ROWS]):
        m.keyed_document(row, position)


class DirectAdmissions(SheetSessions):
    """Admissions through scoped sessions (``SheetSessions``): at once in one
    transaction, or staged chunk by chunk on a ``rows.stage`` session."""

    road: Road = "direct"

    def __init__(
        self,
        client: GatewayClient,
        sessions: SessionManager,
        sheet: SheetRef,
        contract: SheetContract,
        run_id: str,
        user_email: str | None,
        admitted: OpenPart,
    ) -> None:
        super().__init__(sessions, sheet, contract, run_id, user_email)
        self._client = client
        self._admitted = admitted

    def _release(self, operation: str) -> None:
        """Close the admission's sessions of ``operation`` on the sheet: not used again,
        their pools give their connections back to the org's budget now, not after the
        idle timeout."""
        namespace = self._sheet.table_namespace
        self._sessions.release(
            lambda shape: shape.table_namespace == namespace and shape.operations == (operation,)
        )

    async def admit_at_once(self, rows: Sequence[Mapping[str, Any]]) -> AdmissionCounts | None:
        """In one transaction (``store/_direct.py``), when the gateway stages (a gateway
        that admits only whole inputs has no write version to give): None when the
        sheet holds rows or the transaction ran past ``DIRECT_ADMISSION_HOLD_MS``."""
        # The first chunk is checked before any request, as the staged way does: an
        # input whose first chunk is bad is refused without one (and without a sheet).
        # It is checked on a worker thread while another makes the session's key (no
        # request either; RSA key generation releases the GIL), which the mint needs.
        self._sessions.prepare_key()
        await trio.to_thread.run_sync(_check_first_chunk, rows)
        served = self._client.serves(BEGIN_ADMISSION)
        if served is None:
            served = await self._client.probe_action(BEGIN_ADMISSION)
        if not served:
            return None
        try:
            async with self._sessions.store(self._shape(("rows.admit",), SessionLimits())) as store:
                outcome = await store.admit_in_one_transaction(
                    self._sheet,
                    self._contract,
                    rows,
                    self._run_id,
                    hold_ms=DIRECT_ADMISSION_HOLD_MS,
                )
        finally:
            self._release("rows.admit")
        return outcome if isinstance(outcome, AdmissionCounts) else None

    async def stage_chunk(
        self,
        admission_id: str,
        seq: int,
        first_position: int,
        rows: EncodedChunk,
        begin: Callable[[], Awaitable[None]],
    ) -> None:
        await begin()
        shape = self._shape(("rows.stage",), SessionLimits(max_rows=ADMISSION_CHUNK_ROWS))
        for delay_ms in (0, *RETRY_DELAYS_MS):
            await trio.sleep(delay_ms / 1000)
            try:
                async with self._sessions.store(shape) as store:
                    await store.stage_chunk(
                        self._sheet, admission_id, seq, first_position, rows, check_state=False
                    )
                return
            except StoreUnavailableError:
                # The connection went away mid-chunk: a chunk is recorded and
                # copied in one transaction, so sending it again applies it once.
                if delay_ms == RETRY_DELAYS_MS[-1]:
                    raise

    def staging_done(self) -> None:
        self._release("rows.stage")

    def whole_part(
        self, part: AdmittedPart, rows: tuple[dict[str, Any], ...]
    ) -> Dataset | InMemoryDataset:
        """Read from the sheet like a staged admission's part (by its version)."""
        return self._admitted(part)


class GatewayAdmissions:
    """Admissions through the gateway: staged chunk by chunk in its requests."""

    road: Road = "gateway"

    def __init__(
        self, client: GatewayClient, table_namespace: str, contract: SheetContract
    ) -> None:
        self._client = client
        self._table_namespace = table_namespace
        self._contract = contract

    async def admit_at_once(self, rows: Sequence[Mapping[str, Any]]) -> AdmissionCounts | None:
        """Never: the gateway road has no transaction across requests."""
        return None

    async def stage_chunk(
        self,
        admission_id: str,
        seq: int,
        first_position: int,
        rows: EncodedChunk,
        begin: Callable[[], Awaitable[None]],
    ) -> None:
        body = self._client.admission_chunk_body(
            self._table_namespace, self._contract, admission_id, seq, first_position, rows
        )
        await begin()
        await self._client.stage_admission_chunk(body)

    def staging_done(self) -> None:
        """Nothing held: the gateway's requests hold no session of the runner's."""

    def whole_part(
        self, part: AdmittedPart, rows: tuple[dict[str, Any], ...]
    ) -> Dataset | InMemoryDataset:
        """The rows the answer holds."""
        from ..dataset import InMemoryDataset

        return InMemoryDataset(rows)
