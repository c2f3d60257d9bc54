"""``SheetStore``: the one object every road (direct runner, gateway, demo) uses.

It owns a ``TrioPool`` and turns a ``SheetRef`` into physical names once per
call; the work itself lives in the private modules (``_schema``, ``_reads``,
``_admission``, ``_writes``, ``_fencing``, ``_receipts``).
"""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from .. import budgets
from .._types import (
    AdmissionCounts,
    CompleteRow,
    FailRow,
    InlineAdmission,
    ReceiptClaim,
    ReceiptCompletion,
    ResolvedPlay,
    SheetContract,
    SheetRef,
    TerminalWriteResult,
)
from ..protocol import EncodedChunk
from . import (
    _admission,
    _direct,
    _fencing,
    _plays,
    _quotas,
    _reads,
    _receipts,
    _schema,
    _shares,
    _staging,
    _writes,
)
from ._names import SheetNames, receipt_names, sheet_names
from ._pool import ConnectionRunner, open_pool
from ._quotas import StoreQuotas
from ._rowdata import physical_columns

__all__ = ["SheetStore", "open_store"]

P = ParamSpec("P")
R = TypeVar("R")

#: Layouts this store has ensured, remembered so writes skip the catalog check.
_ENSURED_CACHE_ENTRIES = 4096


def _on_sheet(
    work: Callable[Concatenate[ConnectionRunner, SheetNames, P], Awaitable[R]],
) -> Callable[Concatenate[SheetStore, SheetRef, P], Awaitable[R]]:
    """A ``SheetStore`` method that runs ``work(pool, names, ...)`` on the sheet's names.

    The method keeps ``work``'s name, documentation and signature, with ``(self,
    sheet)`` in place of ``(pool, names)``: the facade states nothing it forwards.
    """

    async def method(self: SheetStore, sheet: SheetRef, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await work(self.pool, sheet_names(sheet), *args, **kwargs)

    signature = inspect.signature(work)
    _pool, _names, *rest = signature.parameters.values()
    head = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("sheet", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="SheetRef"),
    ]
    method.__signature__ = signature.replace(parameters=[*head, *rest])  # type: ignore[attr-defined]
    method.__name__ = work.__name__
    method.__qualname__ = f"SheetStore.{work.__name__}"
    method.__doc__ = work.__doc__
    return method


class SheetStore:
    """A sheet store on one Postgres database. Create with ``open_store``.

    Every method runs on the store's pool: it may raise ``PoolSaturatedError``
    only where an acquire timeout is given (never here), ``StoreUnavailableError``,
    ``StatementTimeoutError`` or ``StoreError``; bad arguments raise
    ``InvalidInputError`` before anything is read or written. A cancelled call
    cancels its statement on the server and rolls its transaction back.
    """

    def __init__(self, pool: ConnectionRunner, *, quotas: StoreQuotas | None = None) -> None:
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

    # --- the direct road's admission in one transaction (store/_direct.py) ---------------

    async def admit_in_one_transaction(
        self,
        sheet: SheetRef,
        contract: SheetContract,
        rows: Iterable[object],
        run_id: str,
        *,
        hold_ms: int,
    ) -> _direct.DirectOutcome:
        """Admit ``rows`` in one transaction, new rows straight into the sheet (on a
        ``rows.admit`` session: the sheet exists, it is not ensured here)."""
        return await _direct.admit_in_one_transaction(
            self.pool,
            sheet_names(sheet),
            sheet.table_namespace,
            physical_columns(contract),
            rows,
            run_id,
            hold_ms=hold_ms,
        )

    # --- staged admission (see store/_staging.py) ----------------------------------------

    async def begin_admission(
        self,
        sheet: SheetRef,
        contract: SheetContract,
        admission_id: str,
        run_id: str,
        *,
        token_id: str | None = None,
    ) -> None:
        """Register a staged admission (idempotent); ensures the sheet's layout first.

        ``token_id`` names the begin's token (a digest, never the token) for its
        open-admission bound (``StoreQuotas.max_open_admissions_per_token``).
        """
        names = sheet_names(sheet)
        if not await self.pool.run(functools.partial(_schema.sheet_exists, names=names)):
            # A new sheet's begin is a new admission: refused at its bound before the
            # sheet's tables are made.
            await self.pool.run(
                functools.partial(
                    _quotas.check_admission_room,
                    quotas=self.quotas,
                    schema=names.schema,
                    token_id=token_id,
                )
            )
        names = await self._ensure_cached(sheet, contract)
        await _staging.begin_admission(
            self.pool, names, admission_id, run_id, quotas=self.quotas, token_id=token_id
        )

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

    abort_admission = _on_sheet(_staging.abort_admission)

    # Plain writes (store/_writes.py), idempotent per ``idempotency_key``.
    append_rows = _on_sheet(_writes.append_rows)
    upsert_rows = _on_sheet(_writes.upsert_rows)
    replace_rows = _on_sheet(_writes.replace_rows)

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

    # Shares of an attempt, claimed by its workers (store/_shares.py).
    claim_share = _on_sheet(_shares.claim_share)
    renew_share = _on_sheet(_shares.renew_share)
    release_share = _on_sheet(_shares.release_share)
    attempt_status = _on_sheet(_shares.attempt_status)

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
        self,
        org_id: str,
        play_name: str,
        key: str,
        holder: str,
        *,
        lease_token: str | None = None,
    ) -> ReceiptClaim:
        """Claim ``key`` for ``holder`` for ``WORK_RECEIPT_LEASE_TTL_MS``; acquired, the
        answer carries the lease's secret token (``lease_token`` renews, or names a
        new lease's token)."""
        _receipts.check_claim(key, holder)
        _receipts.check_lease_token(lease_token, required=False)
        names = await self._receipt_names(org_id, play_name)
        return await _receipts.claim_work_receipt(
            self.pool, names, key, holder, lease_token=lease_token
        )

    async def release_work_receipt(
        self, org_id: str, play_name: str, key: str, holder: str, lease_token: str | None
    ) -> bool:
        """Give up ``holder``'s lease on ``key``; True when it held one with ``lease_token``."""
        _receipts.check_claim(key, holder)
        _receipts.check_lease_token(lease_token, required=False)
        names = await self._receipt_names(org_id, play_name)
        return await _receipts.release_work_receipt(self.pool, names, key, holder, lease_token)

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
        lease_token: str | None = None,
    ) -> ReceiptCompletion:
        """Record a work receipt once: ``persisted`` if this call wrote it, else ``existing``.

        With ``holder`` and its ``lease_token``, the completion is fenced by that
        holder's claim. Bad arguments raise ``InvalidInputError`` before the
        receipts table is created.
        """
        _receipts.check_completion(
            key, result, run_id, run_attempt=run_attempt, holder=holder, lease_token=lease_token
        )
        names = await self._receipt_names(org_id, play_name)
        return await _receipts.complete_work_receipt(
            self.pool,
            names,
            key,
            result,
            run_id,
            run_attempt=run_attempt,
            holder=holder,
            lease_token=lease_token,
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

    # --- reads (see store/_reads.py: each takes the rows it sees as a ``RowFilter``) ------

    read_rows = _on_sheet(_reads.read_rows)
    read_rows_batch = _on_sheet(_reads.read_rows_batch)
    read_rows_batch_json = _on_sheet(_reads.read_rows_batch_json)
    read_rows_after = _on_sheet(_reads.read_rows_after)
    read_rows_after_json = _on_sheet(_reads.read_rows_after_json)
    read_row_keys = _on_sheet(_reads.read_row_keys)
    count = _on_sheet(_reads.count)
    read_rows_by_keys = _on_sheet(_reads.read_rows_by_keys)
    summary = _on_sheet(_reads.summary)


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
    open_connect_budget_ms: int | None = None,
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
        open_connect_budget_ms=open_connect_budget_ms,
    ) as pool:
        yield SheetStore(pool, quotas=quotas)
