"""Terminal writes on either road, behind one interface (``TerminalWrites``).

A sheet's ``complete_map_rows`` and ``fail_map_rows`` go through a scoped
session straight to the store on the direct road (``DirectWrites``) and
through the gateway on the other (``GatewayWrites``). Both take the same
arguments and answer the same ``TerminalWriteResult``, so the runtime's writer
calls its road and never asks which one it is: the runtime picks the road once,
as it does for reads (``Runtime.road``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeVar

from .. import protocol as m
from .._recovery import retry_idempotent
from .._types import (
    CompleteRow,
    FailRow,
    Operation,
    SheetContract,
    SheetRef,
    TerminalWriteResult,
)
from ..budgets import POSTGRES_WRITE_CHUNK_ROWS
from ..gateway.client import GatewayClient
from ..sessions import AccessShape, SessionLimits, SessionManager

if TYPE_CHECKING:
    from ..store import SheetStore

__all__ = [
    "DirectWrites",
    "GatewayWrites",
    "SheetSessions",
    "TerminalWrites",
    "session_rows",
]

Road = Literal["direct", "gateway"]

_Sheet = TypeVar("_Sheet", contravariant=True)
_Row = TypeVar("_Row", CompleteRow, FailRow)
_RowIn = TypeVar("_RowIn", CompleteRow, FailRow, contravariant=True)
_Result = TypeVar("_Result")


class _Write(Protocol[_Sheet, _RowIn]):
    """A store's or a client's ``complete_map_rows`` or ``fail_map_rows``: the sheet (a
    ``SheetRef``, or the client's namespace), its contract and the rows, fenced."""

    def __call__(
        self,
        sheet: _Sheet,
        contract: SheetContract,
        rows: Sequence[_RowIn],
        /,
        *,
        run_id: str,
        write_version: int | None,
    ) -> Awaitable[TerminalWriteResult]: ...


class TerminalWrites(Protocol):
    """The terminal writes of one sheet, under one contract and run, on one road."""

    @property
    def road(self) -> Road:
        """Which road the writes take (for spans and logs, never for a decision)."""
        ...

    @property
    def actions(self) -> tuple[str, ...]:
        """The gateway actions this road sends (a map probes them before it admits)."""
        ...

    async def complete_map_rows(
        self, rows: Sequence[CompleteRow], *, write_version: int | None
    ) -> TerminalWriteResult:
        """Record map outputs, fenced by ``write_version``; stale rows come back."""
        ...

    async def fail_map_rows(
        self, rows: Sequence[FailRow], *, write_version: int | None
    ) -> TerminalWriteResult:
        """Record map failures, fenced by ``write_version``; stale rows come back."""
        ...


def session_rows(rows: int) -> int:
    """A write session's ``max_rows``: ``rows`` rounded up to whole write chunks.

    The limit is part of the session's cache key, so the exact row count would
    mint a session (a role, an RSA round trip) for every distinct batch size a
    map's flushes produce; whole chunks let every write of up to one chunk
    share one session, and the limit still bounds what one write may touch.
    """
    chunks = -(-max(rows, 1) // POSTGRES_WRITE_CHUNK_ROWS)
    return chunks * POSTGRES_WRITE_CHUNK_ROWS


class SheetSessions:
    """What a direct road's writes of one sheet hold: the runtime's sessions, the sheet,
    its contract, the run stamped on what they write and the user the sessions name.
    Each write runs on a scoped session shaped for its operations and its rows, and is
    sent again after a lost connection (``retry_idempotent``): every direct write is a
    replay (by write version or by idempotency key), and cancelled mid-write its one
    transaction rolls back and nothing is written."""

    def __init__(
        self,
        sessions: SessionManager,
        sheet: SheetRef,
        contract: SheetContract,
        run_id: str,
        user_email: str | None,
    ) -> None:
        self._sessions = sessions
        self._sheet = sheet
        self._contract = contract
        self._run_id = run_id
        self._user_email = user_email

    def _shape(self, operations: tuple[Operation, ...], limits: SessionLimits) -> AccessShape:
        """The scoped session of ``operations`` on the sheet, under ``limits``."""
        return AccessShape(
            table_namespace=self._sheet.table_namespace,
            operations=operations,
            limits=limits,
            contract=self._contract,
            user_email=self._user_email,
        )

    async def _on_session(
        self,
        operations: tuple[Operation, ...],
        rows: int,
        write: Callable[[SheetStore], Awaitable[_Result]],
    ) -> _Result:
        shape = self._shape(operations, SessionLimits(max_rows=session_rows(rows)))

        async def attempt() -> _Result:
            async with self._sessions.store(shape) as store:
                return await write(store)

        return await retry_idempotent(attempt)


class DirectWrites(SheetSessions):
    """Terminal writes through a scoped session (``rows.read`` + ``rows.upsert``) to the
    store (``SheetSessions``)."""

    road: Road = "direct"
    actions: Final[tuple[str, ...]] = ()

    async def complete_map_rows(
        self, rows: Sequence[CompleteRow], *, write_version: int | None
    ) -> TerminalWriteResult:
        return await self._write(lambda store: store.complete_map_rows, rows, write_version)

    async def fail_map_rows(
        self, rows: Sequence[FailRow], *, write_version: int | None
    ) -> TerminalWriteResult:
        return await self._write(lambda store: store.fail_map_rows, rows, write_version)

    async def _write(
        self,
        write_of: Callable[[SheetStore], _Write[SheetRef, _Row]],
        rows: Sequence[_Row],
        write_version: int | None,
    ) -> TerminalWriteResult:
        """``write_of(store)`` on a session shaped for ``rows``."""
        return await self._on_session(
            ("rows.read", "rows.upsert"),
            len(rows),
            lambda store: write_of(store)(
                self._sheet,
                self._contract,
                rows,
                run_id=self._run_id,
                write_version=write_version,
            ),
        )


class GatewayWrites:
    """Terminal writes through the gateway (its own ladder retries them)."""

    road: Road = "gateway"
    actions: Final = (m.action_of(m.CompleteMapRowsRequest),)

    def __init__(
        self, client: GatewayClient, table_namespace: str, contract: SheetContract, run_id: str
    ) -> None:
        self._client = client
        self._table_namespace = table_namespace
        self._contract = contract
        self._run_id = run_id

    async def complete_map_rows(
        self, rows: Sequence[CompleteRow], *, write_version: int | None
    ) -> TerminalWriteResult:
        return await self._write(self._client.complete_map_rows, rows, write_version)

    async def fail_map_rows(
        self, rows: Sequence[FailRow], *, write_version: int | None
    ) -> TerminalWriteResult:
        return await self._write(self._client.fail_map_rows, rows, write_version)

    async def _write(
        self, write: _Write[str, _Row], rows: Sequence[_Row], write_version: int | None
    ) -> TerminalWriteResult:
        return await write(
            self._table_namespace,
            self._contract,
            rows,
            run_id=self._run_id,
            write_version=write_version,
        )
