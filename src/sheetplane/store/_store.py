"""``SheetStore``: the one object every road (direct runner, gateway, demo) uses.

It owns a ``TrioPool`` and turns a ``SheetRef`` into physical names once per
call; the work itself lives in the private modules (``_schema``, ``_reads``,
``_admission``, ``_writes``, ``_fencing``, ``_receipts``).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from .. import budgets
from .._types import (
    AdmissionCounts,
    AdmittedPart,
    CompleteRow,
    FailRow,
    InlineAdmission,
    Page,
    PageRequest,
    ReceiptClaim,
    ReceiptCompletion,
    ResolvedPlay,
    RowMode,
    SheetContract,
    SheetRef,
    Summary,
    TerminalWriteResult,
    WriteResult,
)
from . import _admission, _fencing, _plays, _reads, _receipts, _schema, _staging, _writes
from ._names import SheetNames, receipt_names, sheet_names
from ._pool import TrioPool, open_pool
from ._quotas import StoreQuotas
from ._reads import JsonPage, RowCursor
from ._rowdata import physical_columns
from ._staging import EncodedChunk

__all__ = ["SheetStore", "open_store"]

#: Layouts this store has ensured, remembered so writes skip the catalog check.
_ENSURED_CACHE_ENTRIES = 4096


class SheetStore:
    """A sheet store on one Postgres database. Create with ``open_store``.

    Every method runs on the store's pool: it may raise ``PoolSaturatedError``
    only where an acquire timeout is given (never here), ``StoreUnavailableError``,
    ``StatementTimeoutError`` or ``StoreError``; bad arguments raise
    ``InvalidInputError`` before anything is read or written. A cancelled call
    cancels its statement on the server and rolls its transaction back.
    """

    def __init__(self, pool: TrioPool, *, quotas: StoreQuotas | None = None) -> None:
        self.pool = pool
        self.quotas = StoreQuotas() if quotas is None else quotas
        """What one org may keep (``_quotas``): new sheets and receipt tables past it
        raise ``SheetCapError``."""
        self._ensured: OrderedDict[tuple[SheetNames, frozenset[tuple[str, str]]], None] = (
            OrderedDict()
        )
        self._receipts_ensured: OrderedDict[SheetNames, None] = OrderedDict()

    def __repr__(self) -> str:
        return f"<SheetStore {self.pool!r}>"

    # --- layout -------------------------------------------------------------------------

    async def ensure_sheet(self, sheet: SheetRef, contract: SheetContract) -> None:
        """Create the sheet's tables and any new contract columns (idempotent)."""
        names = sheet_names(sheet)
        await _schema.ensure_sheet(
            self.pool, names, sheet, contract, max_sheets=self.quotas.max_sheets_per_org
        )
        self._remember(names, contract)

    async def _ensure_cached(self, sheet: SheetRef, contract: SheetContract) -> SheetNames:
        names = sheet_names(sheet)
        key = (names, _column_key(contract))
        if key in self._ensured:
            self._ensured.move_to_end(key)
            return names
        await _schema.ensure_sheet(
            self.pool, names, sheet, contract, max_sheets=self.quotas.max_sheets_per_org
        )
        self._remember(names, contract)
        return names

    async def _ensure_if_exists(self, sheet: SheetRef, contract: SheetContract) -> SheetNames:
        """Like ``_ensure_cached``, but a sheet that does not exist stays absent: a
        terminal write to it cannot apply and must create nothing."""
        names = sheet_names(sheet)
        if (names, _column_key(contract)) in self._ensured:
            return await self._ensure_cached(sheet, contract)
        if await self.pool.run(functools.partial(_schema.sheet_exists, names=names)):
            return await self._ensure_cached(sheet, contract)
        return names

    def _remember(self, names: SheetNames, contract: SheetContract) -> None:
        self._ensured[(names, _column_key(contract))] = None
        while len(self._ensured) > _ENSURED_CACHE_ENTRIES:
            self._ensured.popitem(last=False)

    # --- writes -------------------------------------------------------------------------

    async def start_dataset(
        self,
        sheet: SheetRef,
        rows: Sequence[Mapping[str, Any]],
        run_id: str,
        contract: SheetContract,
        *,
        key_field: str | None = None,
        check: Callable[[InlineAdmission], None] | None = None,
    ) -> InlineAdmission:
        """Admit ``rows`` for the attempt ``run_id`` under a new write version.

        Ensures the sheet's layout for ``contract`` first. ``check`` sees the
        admission inside its transaction, before the commit: whatever it raises
        rolls the admission back (the gateway refuses an answer too large to send).
        """
        names = await self._ensure_cached(sheet, contract)
        return await _admission.start_dataset(
            self.pool, names, sheet, rows, run_id, contract, key_field=key_field, check=check
        )

    # --- staged admission (see store/_staging.py) ----------------------------------------

    async def begin_admission(
        self, sheet: SheetRef, contract: SheetContract, admission_id: str, run_id: str
    ) -> None:
        """Register a staged admission (idempotent); ensures the sheet's layout first."""
        names = await self._ensure_cached(sheet, contract)
        await _staging.begin_admission(self.pool, names, admission_id, run_id, quotas=self.quotas)

    async def stage_chunk(
        self,
        sheet: SheetRef,
        admission_id: str,
        seq: int,
        first_position: int,
        chunk: EncodedChunk,
        *,
        check_state: bool = True,
    ) -> bool:
        """Stage one encoded chunk; False when it had been staged before (a replay)."""
        return await _staging.stage_chunk(
            self.pool,
            sheet_names(sheet),
            admission_id,
            seq,
            first_position,
            chunk,
            check_state=check_state,
            quotas=self.quotas if check_state else None,
        )

    async def commit_admission(
        self,
        sheet: SheetRef,
        contract: SheetContract,
        admission_id: str,
        run_id: str,
        *,
        chunks: int,
        rows: int,
    ) -> AdmissionCounts:
        """Commit a staged admission as one new write version (a replay answers the same)."""
        names = await self._ensure_cached(sheet, contract)
        return await _staging.commit_admission(
            self.pool,
            names,
            sheet.table_namespace,
            admission_id,
            run_id,
            physical_columns(contract),
            chunks=chunks,
            rows=rows,
        )

    async def sweep_admissions(self) -> int:
        """Expire every sheet's abandoned admissions (the reaper); how many."""
        return await _staging.sweep_admissions(self.pool, self.quotas.admission_lifetime_ms)

    async def abort_admission(self, sheet: SheetRef, admission_id: str) -> bool:
        """Drop an open staged admission's rows; False if it was not open."""
        return await _staging.abort_admission(self.pool, sheet_names(sheet), admission_id)

    async def append_rows(
        self, sheet: SheetRef, rows: Sequence[Mapping[str, Any]], *, idempotency_key: str
    ) -> WriteResult:
        """Append rows; a retry with the same ``idempotency_key`` writes nothing."""
        return await _writes.append_rows(
            self.pool, sheet_names(sheet), rows, idempotency_key=idempotency_key
        )

    async def upsert_rows(
        self,
        sheet: SheetRef,
        rows: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        key_field: str | None = None,
    ) -> WriteResult:
        """Insert or update rows by key; idempotent per ``idempotency_key``."""
        return await _writes.upsert_rows(
            self.pool,
            sheet_names(sheet),
            rows,
            idempotency_key=idempotency_key,
            key_field=key_field,
        )

    async def replace_rows(
        self, sheet: SheetRef, rows: Sequence[Mapping[str, Any]], *, idempotency_key: str
    ) -> WriteResult:
        """Replace every row of the sheet; idempotent per ``idempotency_key``."""
        return await _writes.replace_rows(
            self.pool, sheet_names(sheet), rows, idempotency_key=idempotency_key
        )

    async def complete_map_rows(
        self,
        sheet: SheetRef,
        contract: SheetContract,
        rows: Sequence[CompleteRow],
        *,
        run_id: str,
        write_version: int | None,
    ) -> TerminalWriteResult:
        """Mark rows enriched with their outputs, fenced by ``write_version``.

        On a sheet never admitted every key is stale and nothing is created."""
        names = await self._ensure_if_exists(sheet, contract)
        return await _fencing.complete_map_rows(
            self.pool, names, contract, rows, run_id=run_id, write_version=write_version
        )

    async def fail_map_rows(
        self,
        sheet: SheetRef,
        contract: SheetContract,
        rows: Sequence[FailRow],
        *,
        run_id: str,
        write_version: int | None,
    ) -> TerminalWriteResult:
        """Mark rows failed with their errors, fenced by ``write_version``."""
        names = await self._ensure_if_exists(sheet, contract)
        return await _fencing.fail_map_rows(
            self.pool, names, contract, rows, run_id=run_id, write_version=write_version
        )

    async def _receipt_names(self, org_id: str, play_name: str) -> SheetNames:
        names = receipt_names(org_id, play_name)
        if names not in self._receipts_ensured:
            await _schema.ensure_receipts(
                self.pool, names, max_tables=self.quotas.max_receipt_tables_per_org
            )
            self._receipts_ensured[names] = None
            while len(self._receipts_ensured) > _ENSURED_CACHE_ENTRIES:
                self._receipts_ensured.popitem(last=False)
        return names

    async def claim_work_receipt(
        self, org_id: str, play_name: str, key: str, holder: str
    ) -> ReceiptClaim:
        """Claim ``key`` for ``holder`` for ``WORK_RECEIPT_LEASE_TTL_MS``."""
        _receipts.check_claim(key, holder)
        names = await self._receipt_names(org_id, play_name)
        return await _receipts.claim_work_receipt(self.pool, names, key, holder)

    async def release_work_receipt(
        self, org_id: str, play_name: str, key: str, holder: str
    ) -> bool:
        """Give up ``holder``'s lease on ``key``; True when it held one."""
        _receipts.check_claim(key, holder)
        names = await self._receipt_names(org_id, play_name)
        return await _receipts.release_work_receipt(self.pool, names, key, holder)

    async def complete_work_receipt(
        self,
        org_id: str,
        play_name: str,
        key: str,
        result: Any,
        run_id: str,
        *,
        run_attempt: int | None = None,
        holder: str | None = None,
    ) -> ReceiptCompletion:
        """Record a work receipt once: ``persisted`` if this call wrote it, else ``existing``.

        With ``holder``, the completion is fenced by that holder's claim. Bad
        arguments raise ``InvalidInputError`` before the receipts table is created.
        """
        _receipts.check_completion(key, result, run_id, run_attempt=run_attempt, holder=holder)
        names = await self._receipt_names(org_id, play_name)
        return await _receipts.complete_work_receipt(
            self.pool, names, key, result, run_id, run_attempt=run_attempt, holder=holder
        )

    # --- plays ----------------------------------------------------------------------------

    async def register_play(
        self, org_id: str, play: ResolvedPlay, *, name: str | None = None
    ) -> None:
        """Register ``play`` for ``org_id`` (replacing the play of that id), under ``name``."""
        await _plays.register_play(self.pool, org_id, play, name=name)

    async def resolve_play(self, org_id: str, play_ref: str) -> ResolvedPlay | None:
        """``org_id``'s play whose id, else whose name, is ``play_ref``; None if neither."""
        return await _plays.resolve_play(self.pool, org_id, play_ref)

    # --- reads --------------------------------------------------------------------------

    async def read_rows(
        self,
        sheet: SheetRef,
        request: PageRequest,
        *,
        run_id: str | None = None,
        row_mode: RowMode = "output",
        admitted: AdmittedPart | None = None,
    ) -> Page:
        """One page in read order (raises ``ReadBatchTooLargeError`` past the byte budget)."""
        return await _reads.read_rows(
            self.pool,
            sheet_names(sheet),
            request,
            run_id=run_id,
            row_mode=row_mode,
            admitted=admitted,
        )

    async def read_rows_batch(
        self,
        sheet: SheetRef,
        pages: Sequence[PageRequest],
        *,
        run_id: str | None = None,
        row_mode: RowMode = "output",
        admitted: AdmittedPart | None = None,
    ) -> list[Page]:
        """1 to 4 pages under one snapshot; ``ReadBatchTooLargeError`` past the byte budget."""
        return await _reads.read_rows_batch(
            self.pool,
            sheet_names(sheet),
            pages,
            run_id=run_id,
            row_mode=row_mode,
            admitted=admitted,
        )

    async def read_rows_batch_json(
        self,
        sheet: SheetRef,
        pages: Sequence[PageRequest],
        *,
        run_id: str | None = None,
        row_mode: RowMode = "output",
        admitted: AdmittedPart | None = None,
    ) -> list[JsonPage]:
        """``read_rows_batch`` with each row as its compact JSON bytes (the gateway's answer)."""
        return await _reads.read_rows_batch_json(
            self.pool,
            sheet_names(sheet),
            pages,
            run_id=run_id,
            row_mode=row_mode,
            admitted=admitted,
        )

    async def read_rows_after_json(
        self,
        sheet: SheetRef,
        cursor: RowCursor | None,
        limit: int,
        *,
        run_id: str | None = None,
        row_mode: RowMode = "output",
        admitted: AdmittedPart | None = None,
    ) -> tuple[list[bytes], RowCursor | None]:
        """``read_rows_after`` with each row as its compact JSON bytes (the gateway's answer)."""
        return await _reads.read_rows_after_json(
            self.pool,
            sheet_names(sheet),
            cursor,
            limit,
            run_id=run_id,
            row_mode=row_mode,
            admitted=admitted,
        )

    async def read_rows_after(
        self,
        sheet: SheetRef,
        cursor: RowCursor | None,
        limit: int,
        *,
        run_id: str | None = None,
        row_mode: RowMode = "output",
        admitted: AdmittedPart | None = None,
    ) -> tuple[list[dict[str, Any]], RowCursor | None]:
        """Keyset page: up to ``limit`` rows after ``cursor``, and the next cursor (None at end)."""
        return await _reads.read_rows_after(
            self.pool,
            sheet_names(sheet),
            cursor,
            limit,
            run_id=run_id,
            row_mode=row_mode,
            admitted=admitted,
        )

    async def read_row_keys(
        self,
        sheet: SheetRef,
        request: PageRequest,
        *,
        run_id: str | None = None,
        admitted: AdmittedPart | None = None,
    ) -> list[str]:
        """The keys of one page, in read order."""
        return await _reads.read_row_keys(
            self.pool, sheet_names(sheet), request, run_id=run_id, admitted=admitted
        )

    async def count(
        self,
        sheet: SheetRef,
        *,
        run_id: str | None = None,
        admitted: AdmittedPart | None = None,
    ) -> int:
        """Rows in the sheet (or stamped with ``run_id``, or in one admission's part)."""
        return await _reads.count(self.pool, sheet_names(sheet), run_id=run_id, admitted=admitted)

    async def read_rows_by_keys(
        self, sheet: SheetRef, keys: Sequence[str], *, row_mode: RowMode = "output"
    ) -> list[dict[str, Any]]:
        """The stored rows among ``keys``, in read order."""
        return await _reads.read_rows_by_keys(
            self.pool, sheet_names(sheet), keys, row_mode=row_mode
        )

    async def summary(self, sheet: SheetRef) -> Summary:
        """The sheet's status counters."""
        return await _reads.summary(self.pool, sheet_names(sheet))


def _column_key(contract: SheetContract) -> frozenset[tuple[str, str]]:
    return frozenset((c.sql_name, c.id) for c in contract.columns if c.is_physical)


@asynccontextmanager
async def open_store(
    database_url: str,
    *,
    max_connections: int = budgets.STORE_POOL_MAX_CONNECTIONS,
    statement_timeout_ms: int = budgets.POSTGRES_STATEMENT_TIMEOUT_MS,
    connect_timeout_ms: int = budgets.POSTGRES_CONNECT_TIMEOUT_MS,
    connect_retry_delays_ms: Sequence[int] = budgets.POSTGRES_CONNECT_RETRY_DELAYS_MS,
    quotas: StoreQuotas | None = None,
) -> AsyncIterator[SheetStore]:
    """Open a ``SheetStore`` on ``database_url`` (a secret: never logged); closed on exit.

    Raises ``StoreUnavailableError`` when the server cannot be reached along the
    connect ladder or refuses the credentials.
    """
    async with open_pool(
        database_url,
        max_connections=max_connections,
        statement_timeout_ms=statement_timeout_ms,
        connect_timeout_ms=connect_timeout_ms,
        connect_retry_delays_ms=connect_retry_delays_ms,
    ) as pool:
        yield SheetStore(pool, quotas=quotas)
