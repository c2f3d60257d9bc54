"""Keyed writes on either road, behind one interface (``KeyedWrites``).

A sheet's ``append_rows``, ``upsert_rows`` and ``replace_rows`` each carry an
idempotency key: a replay of a key writes nothing and answers ``replayed``. They
go through a scoped session minted for exactly that operation straight to the
store on the direct road (``DirectKeyedWrites``) and through the gateway's
``runtime_sheet_append_rows``, ``runtime_sheet_upsert_rows`` and
``runtime_sheet_replace_rows`` on the other (``GatewayKeyedWrites``). Both take
the same arguments and answer the same ``WriteResult``; the runtime picks the
road once (``Runtime.writer``), and the writer never asks which one it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .._types import SheetContract, WriteResult
from ..gateway.client import GatewayClient
from ._writes import Road, SheetSessions

__all__ = ["DirectKeyedWrites", "GatewayKeyedWrites", "KeyedWrites"]

Rows = Sequence[Mapping[str, Any]]


class KeyedWrites(Protocol):
    """The keyed writes of one sheet, under one contract and run, on one road. Every
    write stamps the run on the rows it writes."""

    @property
    def road(self) -> Road:
        """Which road the writes take (for spans and logs, never for a decision)."""
        ...

    async def append_rows(self, rows: Rows, *, idempotency_key: str) -> WriteResult:
        """Insert ``rows`` as new pending rows, once per ``idempotency_key``."""
        ...

    async def upsert_rows(
        self, rows: Rows, *, idempotency_key: str, key_field: str | None
    ) -> WriteResult:
        """Insert new keys (by ``key_field``, else each row's identity) and merge the
        carried columns into existing rows, once per ``idempotency_key``."""
        ...

    async def replace_rows(self, rows: Rows, *, idempotency_key: str) -> WriteResult:
        """Replace every row of the sheet with ``rows``, once per ``idempotency_key``."""
        ...


class DirectKeyedWrites(SheetSessions):
    """Keyed writes through a scoped session for the one operation (``rows.append``,
    ``rows.upsert`` or ``rows.replace``) to the store (``SheetSessions``): keyed by an
    idempotency key, a write sent again after a lost connection writes once."""

    road: Road = "direct"

    async def append_rows(self, rows: Rows, *, idempotency_key: str) -> WriteResult:
        sheet, run_id = self._sheet, self._run_id
        return await self._on_session(
            ("rows.append",),
            len(rows),
            lambda store: store.append_rows(
                sheet, rows, idempotency_key=idempotency_key, run_id=run_id
            ),
        )

    async def upsert_rows(
        self, rows: Rows, *, idempotency_key: str, key_field: str | None
    ) -> WriteResult:
        sheet, run_id = self._sheet, self._run_id
        return await self._on_session(
            ("rows.upsert",),
            len(rows),
            lambda store: store.upsert_rows(
                sheet, rows, idempotency_key=idempotency_key, key_field=key_field, run_id=run_id
            ),
        )

    async def replace_rows(self, rows: Rows, *, idempotency_key: str) -> WriteResult:
        sheet, run_id = self._sheet, self._run_id
        return await self._on_session(
            ("rows.replace",),
            len(rows),
            lambda store: store.replace_rows(
                sheet, rows, idempotency_key=idempotency_key, run_id=run_id
            ),
        )


class GatewayKeyedWrites:
    """Keyed writes through the gateway (its own ladder retries them: a replay of the
    idempotency key writes nothing)."""

    road: Road = "gateway"

    def __init__(
        self, client: GatewayClient, table_namespace: str, contract: SheetContract, run_id: str
    ) -> None:
        self._client = client
        self._table_namespace = table_namespace
        self._contract = contract
        self._run_id = run_id

    async def append_rows(self, rows: Rows, *, idempotency_key: str) -> WriteResult:
        return await self._client.append_rows(
            self._table_namespace,
            self._contract,
            rows,
            idempotency_key=idempotency_key,
            run_id=self._run_id,
        )

    async def upsert_rows(
        self, rows: Rows, *, idempotency_key: str, key_field: str | None
    ) -> WriteResult:
        return await self._client.upsert_rows(
            self._table_namespace,
            self._contract,
            rows,
            idempotency_key=idempotency_key,
            key_field=key_field,
            run_id=self._run_id,
        )

    async def replace_rows(self, rows: Rows, *, idempotency_key: str) -> WriteResult:
        return await self._client.replace_rows(
            self._table_namespace,
            self._contract,
            rows,
            idempotency_key=idempotency_key,
            run_id=self._run_id,
        )
