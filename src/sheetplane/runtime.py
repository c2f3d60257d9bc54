"""The runner-facing entry point: one block that holds a run's context and its parts.

::

    async with sheetplane.open_runtime(
        base_url=..., token=..., org_id=..., play_name=..., run_id=...,
        strategy="direct",            # or "gateway_only"
    ) as rt:
        writer = rt.writer("leads", contract)
        admission = await writer.start(rows)            # always through the gateway
        await writer.complete([CompleteRow(key, outputs), ...])
        async for row in rt.dataset("leads"):
            ...
        await rt.receipts().complete("send-42", {"ok": True})

``open_runtime`` opens, inside its block, a ``GatewayClient`` (HTTP), a
``SessionManager`` (scoped Postgres sessions, their pools and the tasks that
close them) and a ``PageReader`` (the batcher whose nursery runs every batch
read). Nothing it starts outlives the block.

Which road each operation takes:

=====================================  ==========================  =====================
operation                              ``direct``                  ``gateway_only``
=====================================  ==========================  =====================
dataset reads                          scoped session (rows.read)  gateway
``start``: begin, commit                gateway                     gateway
``start``: the input's chunks          scoped session (rows.stage,  gateway
                                       COPY into staging)
``complete`` / ``fail``                scoped session              gateway
                                       (rows.read + rows.upsert)
``append`` / ``upsert`` / ``replace``  scoped session              scoped session
receipts                               gateway                     gateway
=====================================  ==========================  =====================

Admission is staged (see ``sheetplane.admission``): the input goes in chunks
into the sheet's staging area, by ``COPY`` on a scoped session on ``direct``
and by request on ``gateway_only``, and the gateway commits it whole on both
strategies: deciding what an attempt owns is the gateway's job. The gateway
has no action for ``append``, ``upsert`` and ``replace``, so they always write through a session the
gateway mints for exactly that operation, as the runtime this library
re-creates does. Receipts live outside every sheet, where no session role is
granted, so they go through the gateway too.
"""

from __future__ import annotations

import secrets
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, Final, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

import attrs
import trio

from . import crypto
from ._groups import single_leaf
from ._leases import Lease, acquire_lease, hold_lease, run_once
from ._map import MapFn, MapProgress, MapReport, check_map_options, run_map
from ._recovery import retry_idempotent
from ._types import (
    BIGINT_MAX,
    AdmittedPart,
    CompleteRow,
    ContractColumn,
    FailRow,
    ReceiptClaim,
    ReceiptCompletion,
    ResolvedPlay,
    RowMode,
    SheetContract,
    SheetRef,
    TerminalWriteResult,
    WriteResult,
)
from .admission import Admission, AdmissionInput, StagedAdmission, check_input
from .budgets import POSTGRES_WRITE_CHUNK_ROWS, READ_PAGE_MAX_ROWS, TRANSPORT_CEILING_BYTES
from .dataset import Dataset
from .errors import AttemptSupersededError, InvalidInputError
from .gateway.client import GatewayClient
from .pages import DirectRoad, GatewayRoad, PageReader, ReadScope, RoadStats, SheetRoad
from .sessions import AccessShape, PreloadedSession, SessionLimits, SessionManager
from .sizes import json_byte_length_up_to
from .store import SheetStore, superseded_error

__all__ = [
    "Admission",
    "CompleteRow",
    "ContractColumn",
    "FailRow",
    "MapProgress",
    "MapReport",
    "ReceiptCompletion",
    "ReceiptRecorder",
    "ResolvedPlay",
    "RowWriter",
    "Runtime",
    "RuntimeContext",
    "RuntimeStats",
    "SheetContract",
    "Strategy",
    "TerminalWriteResult",
    "WriteResult",
    "open_runtime",
]

Strategy = Literal["direct", "gateway_only"]
STRATEGIES: Final = ("direct", "gateway_only")

_Row = TypeVar("_Row", CompleteRow, FailRow)
_Row_contra = TypeVar("_Row_contra", contravariant=True)
_At_contra = TypeVar("_At_contra", contravariant=True)


class _TerminalWrite(Protocol[_At_contra, _Row_contra]):
    """``complete_map_rows`` or ``fail_map_rows`` of the store (at a ``SheetRef``)
    or of the gateway client (at a table namespace)."""

    def __call__(
        self,
        at: _At_contra,
        contract: SheetContract,
        rows: Sequence[_Row_contra],
        /,
        *,
        run_id: str,
        write_version: int | None,
    ) -> Awaitable[TerminalWriteResult]: ...


# --- argument checks ----------------------------------------------------------------------


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidInputError(f"{name} must be a non-empty string without NUL, got {value!r}")
    return value


def _optional_text(name: str, value: object) -> str | None:
    return None if value is None else _text(name, value)


def _json_value(name: str, value: object) -> None:
    """Refuse what the wire cannot carry: not JSON, NaN/Infinity, or past the transport ceiling."""
    try:
        measured = json_byte_length_up_to(value, TRANSPORT_CEILING_BYTES)
    except TypeError as exc:
        raise InvalidInputError(f"{name} must be JSON-serialisable: {exc}") from None
    if measured.exceeded:
        raise InvalidInputError(f"{name} is larger than {TRANSPORT_CEILING_BYTES} bytes as JSON")


def _sequence(name: str, rows: object, what: str) -> Sequence[object]:
    """``rows`` if it is a sequence (and not text or a single mapping), else a typed error."""
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
        raise InvalidInputError(f"{name} must be a sequence of {what}, got {rows!r}")
    return rows


def _rows(name: str, rows: object) -> list[Mapping[str, Any]]:
    checked: list[Mapping[str, Any]] = []
    for index, row in enumerate(_sequence(name, rows, "row objects")):
        if not isinstance(row, Mapping):
            raise InvalidInputError(f"{name}[{index}] must be a mapping, got {row!r}")
        checked.append(row)
    _json_value(name, [dict(row) for row in checked])
    return checked


def _complete_rows(rows: object) -> list[CompleteRow]:
    checked = []
    for index, row in enumerate(_sequence("rows", rows, "CompleteRow")):
        if not isinstance(row, CompleteRow):
            raise InvalidInputError(f"rows[{index}] must be a CompleteRow, got {row!r}")
        _text(f"rows[{index}].key", row.key)
        if not isinstance(row.data, Mapping):
            raise InvalidInputError(f"rows[{index}].data must be a mapping, got {row.data!r}")
        if row.cell_meta_patch is not None and not isinstance(row.cell_meta_patch, Mapping):
            raise InvalidInputError(f"rows[{index}].cell_meta_patch must be a mapping or None")
        checked.append(row)
    _json_value("rows", [[row.data, row.cell_meta_patch] for row in checked])
    return checked


def _fail_rows(rows: object) -> list[FailRow]:
    checked = []
    for index, row in enumerate(_sequence("rows", rows, "FailRow")):
        if not isinstance(row, FailRow):
            raise InvalidInputError(f"rows[{index}] must be a FailRow, got {row!r}")
        _text(f"rows[{index}].key", row.key)
        if not isinstance(row.error, str):
            raise InvalidInputError(f"rows[{index}].error must be a string, got {row.error!r}")
        if row.data is not None and not isinstance(row.data, Mapping):
            raise InvalidInputError(f"rows[{index}].data must be a mapping or None")
        checked.append(row)
    _json_value("rows", [[row.error, row.data] for row in checked])
    return checked


# --- the context ------------------------------------------------------------------------------


def _base_url(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    text = _text(attribute.name, value)
    try:
        parts = urlsplit(text.strip())
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a malformed bracketed host
        valid = False
    if not valid:
        raise InvalidInputError(f"base_url must be an http(s) URL with a host, got {value!r}")


def _nonempty(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    _text(attribute.name, value)


def _token(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError("token must be a non-empty string")


def _strategy(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in STRATEGIES:
        raise InvalidInputError(f"strategy must be one of {STRATEGIES}, got {value!r}")


def _preloaded(value: object) -> tuple[PreloadedSession, ...]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidInputError(f"preloaded_sessions must be a sequence, got {value!r}")
    for index, item in enumerate(value):
        if not isinstance(item, PreloadedSession):
            raise InvalidInputError(
                f"preloaded_sessions[{index}] must be a PreloadedSession, got {item!r}"
            )
    return tuple(value)


def _optional_email(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    _optional_text(attribute.name, value)


@attrs.frozen
class RuntimeContext:
    """Everything a run's data plane is authorised by. The token is never in its repr."""

    base_url: str = attrs.field(validator=_base_url)
    """The runtime gateway's base URL."""
    token: str = attrs.field(repr=False, validator=_token)
    """The executor token (a secret)."""
    org_id: str = attrs.field(validator=_nonempty)
    """The organisation the run belongs to."""
    play_name: str = attrs.field(validator=_nonempty)
    """The play being run."""
    run_id: str = attrs.field(validator=_nonempty)
    """The run: stamped on admitted rows, and carried by terminal writes and receipts."""
    strategy: Strategy = attrs.field(default="direct", validator=_strategy)
    """``direct`` (reads and terminal writes on scoped sessions) or ``gateway_only``."""
    preloaded_sessions: tuple[PreloadedSession, ...] = attrs.field(
        default=(), converter=_preloaded, repr=False
    )
    """Sessions a harness minted ahead of the run (used before minting new ones)."""
    unwrap_key: bytes | None = attrs.field(
        default=None, repr=False, validator=crypto.optional_unwrap_key
    )
    """The harness key that opens preloaded sessions' URLs (a secret)."""
    user_email: str | None = attrs.field(default=None, validator=_optional_email)
    """The user on whose behalf the run acts, if any."""


@attrs.frozen
class RuntimeStats:
    """A snapshot of what a runtime has done, for reports and tests."""

    page_reads: int
    """Random-access page reads (``peek``/``at``) the page reader has executed."""
    reader_batches: int
    """Batches the page reader formed from them."""
    peak_retained_request_bytes: int
    """The most request bytes the page reader ever held (its cap is 64 KiB)."""
    batch_requests: int
    """Batch read requests sent on the road (the splitter's retries included)."""
    keyset_reads: int
    """Sequential keyset reads sent."""
    offset_reads: int
    """Sequential reads sent by offset (a gateway without keyset reads)."""
    splits: int
    """Reads answered too large, each followed by smaller reads."""
    fenced_rows: int
    """Rows terminal writes found superseded (``AttemptSupersededError``)."""
    sessions_minted: int
    """Scoped DB sessions minted through the gateway."""


# --- writers and receipts ---------------------------------------------------------------------


class RowWriter:
    """Writes one sheet's rows for one attempt of the run. Get one with ``Runtime.writer``.

    ``start`` admits rows and takes the admission's write version; ``complete``
    and ``fail`` carry that version and are fenced by it. When a terminal
    write finds a row superseded (any stale reason but ``already_terminal``)
    it raises ``AttemptSupersededError`` (after the rows that were still this
    attempt's have been written), and every later ``complete``/``fail`` of
    this writer raises it again without writing: the attempt must stop. A new
    ``start`` begins a new attempt.

    Cancellation: a call cancelled mid-write either wrote everything or
    nothing on the direct road (one transaction, rolled back); on the gateway
    road the outcome is unknown, as with any cut request, and a retry is safe
    (a replay at the same version is idempotent).
    """

    def __init__(
        self, runtime: Runtime, table_namespace: str, contract: SheetContract, version: int | None
    ) -> None:
        self._runtime = runtime
        self.table_namespace: Final = table_namespace
        self.contract: Final = contract
        self._write_version = version
        self._superseded: AttemptSupersededError | None = None

    def __repr__(self) -> str:
        return f"<RowWriter {self.table_namespace!r} write_version={self._write_version}>"

    @property
    def write_version(self) -> int | None:
        """The attempt's write version: from ``start``, or given to ``Runtime.writer``."""
        return self._write_version

    async def start(self, rows: AdmissionInput) -> Admission:
        """Admit ``rows`` under a new write version (a new attempt).

        ``rows``: a sequence, any iterable or any async iterable of row
        mappings, of any size. Rows are deduplicated by key (the first
        occurrence is kept) and keep their input order; ``admission.pending()``
        reads the rows to map and ``admission.completed()`` the already-enriched
        ones, lazily. The input is staged in chunks and committed whole, as one
        write version (see ``sheetplane.admission``): memory holds a couple of
        chunks, whatever the input's size.

        A bad row raises ``InvalidInputError`` naming its position in the input
        (a bad first chunk is refused before any request). If it raises, or is
        cancelled, before the commit, nothing is committed and the admission is
        aborted (a bounded, shielded call); the writer keeps its previous attempt.
        """
        check_input(rows)
        rt = self._runtime
        staged = StagedAdmission(
            client=rt.client,
            sessions=rt.sessions,
            sheet=rt._sheet(self.table_namespace),
            contract=self.contract,
            run_id=rt.context.run_id,
            direct=rt.context.strategy == "direct",
            user_email=rt.context.user_email,
        )
        counts = await staged.run(rows)
        self._write_version = counts.write_version
        self._superseded = None
        return Admission.from_counts(counts, partial(rt._admitted_dataset, self.table_namespace))

    def _version(self) -> int:
        if self._superseded is not None:
            raise self._superseded
        if self._write_version is None:
            raise InvalidInputError(
                "this writer has no attempt: call start() first, or pass write_version"
            )
        return self._write_version

    async def complete(self, rows: Sequence[CompleteRow]) -> TerminalWriteResult:
        """Record map outputs, fenced by the attempt's write version.

        Raises ``AttemptSupersededError`` when any row is superseded.
        """
        checked = _complete_rows(rows)
        return await self._terminal(
            checked, lambda store: store.complete_map_rows, self._runtime.client.complete_map_rows
        )

    async def fail(self, rows: Sequence[FailRow]) -> TerminalWriteResult:
        """Record map failures, fenced by the attempt's write version.

        Raises ``AttemptSupersededError`` when any row is superseded.
        """
        checked = _fail_rows(rows)
        return await self._terminal(
            checked, lambda store: store.fail_map_rows, self._runtime.client.fail_map_rows
        )

    async def _terminal(
        self,
        checked: Sequence[_Row],
        on_store: Callable[[SheetStore], _TerminalWrite[SheetRef, _Row]],
        on_gateway: _TerminalWrite[str, _Row],
    ) -> TerminalWriteResult:
        """Send checked terminal rows down the runtime's road (the store directly,
        or the gateway) under the attempt's write version, then apply the fence."""
        version = self._version()
        if not checked:
            await trio.lowlevel.checkpoint()
            return TerminalWriteResult((), (), 0)
        rt, ns = self._runtime, self.table_namespace
        if rt.context.strategy == "direct":

            async def attempt() -> TerminalWriteResult:
                async with rt._terminal_store(ns, self.contract, len(checked)) as store:
                    return await on_store(store)(
                        rt._sheet(ns),
                        self.contract,
                        checked,
                        run_id=rt.context.run_id,
                        write_version=version,
                    )

            # A replay by write version: safe to send again after a lost connection.
            result = await retry_idempotent(attempt)
        else:
            result = await on_gateway(
                ns, self.contract, checked, run_id=rt.context.run_id, write_version=version
            )
        return self._fence(result, version, len({row.key for row in checked}))

    def _fence(
        self, result: TerminalWriteResult, version: int, submitted: int
    ) -> TerminalWriteResult:
        error = superseded_error(
            result,
            table_namespace=self.table_namespace,
            run_id=self._runtime.context.run_id,
            write_version=version,
            submitted_rows=submitted,
        )
        if error is not None:
            self._runtime._fenced_rows += len(error.superseded_rows)
            self._superseded = error
            raise error
        return result

    async def append(
        self, rows: Sequence[Mapping[str, Any]], *, idempotency_key: str
    ) -> WriteResult:
        """Append rows; a retry with the same ``idempotency_key`` writes nothing."""
        checked = _rows("rows", rows)
        key = _text("idempotency_key", idempotency_key)
        sheet = self._runtime._sheet(self.table_namespace)
        return await self._direct_write(
            "rows.append",
            len(checked),
            lambda store: store.append_rows(sheet, checked, idempotency_key=key),
        )

    async def upsert(
        self,
        rows: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str,
        key_field: str | None = None,
    ) -> WriteResult:
        """Insert or update rows by key; idempotent per ``idempotency_key``."""
        checked = _rows("rows", rows)
        key = _text("idempotency_key", idempotency_key)
        field = _optional_text("key_field", key_field)
        sheet = self._runtime._sheet(self.table_namespace)
        return await self._direct_write(
            "rows.upsert",
            len(checked),
            lambda store: store.upsert_rows(sheet, checked, idempotency_key=key, key_field=field),
        )

    async def replace(
        self, rows: Sequence[Mapping[str, Any]], *, idempotency_key: str
    ) -> WriteResult:
        """Replace every row of the sheet; idempotent per ``idempotency_key``."""
        checked = _rows("rows", rows)
        key = _text("idempotency_key", idempotency_key)
        sheet = self._runtime._sheet(self.table_namespace)
        return await self._direct_write(
            "rows.replace",
            len(checked),
            lambda store: store.replace_rows(sheet, checked, idempotency_key=key),
        )

    async def _direct_write(
        self, operation: str, rows: int, write: Callable[[SheetStore], Awaitable[WriteResult]]
    ) -> WriteResult:
        """Run ``write`` on a session store for ``operation``; keyed by an idempotency
        key, so it is retried after a lost connection (``retry_idempotent``)."""

        async def attempt() -> WriteResult:
            async with self._runtime._write_store(self, operation, rows) as store:
                return await write(store)

        return await retry_idempotent(attempt)


class _GatewayReceipts:
    """The gateway as a lease backend (``sheetplane._leases.ReceiptBackend``) for one run."""

    def __init__(self, client: GatewayClient, run_id: str) -> None:
        self._client = client
        self._run_id = run_id

    async def claim(self, key: str, holder: str) -> ReceiptClaim:
        return await self._client.claim_work_receipt(key, holder)

    async def complete(self, key: str, result: Any, holder: str) -> ReceiptCompletion:
        return await self._client.complete_work_receipt(key, result, self._run_id, holder=holder)

    async def release(self, key: str, holder: str) -> bool:
        return await self._client.release_work_receipt(key, holder)


class ReceiptRecorder:
    """Records work receipts for the run, through the gateway. Get one with ``Runtime.receipts``.

    ``complete`` records a result once. ``claim`` takes the key's lease and
    keeps it alive while its block runs; ``once`` runs a unit of work at most
    once across attempts and processes. Every claim is a new holder
    (``run_id:`` and a random suffix), so two blocks never share a lease,
    even in one process.

    Cancellation: a cancelled ``complete`` may or may not have been recorded;
    calling it again is safe (the first writer's receipt wins). A cancelled
    ``claim`` block or ``once`` releases its lease (shielded, bounded by
    ``WORK_RECEIPT_RELEASE_TIMEOUT_MS``).
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._backend = _GatewayReceipts(runtime.client, runtime.context.run_id)

    async def complete(
        self, key: str, result: Any, *, run_attempt: int | None = None
    ) -> ReceiptCompletion:
        """Record ``key`` once: ``persisted`` if this call wrote it, else ``existing``
        with the first writer's receipt."""
        key = _text("key", key)
        _json_value("result", result)
        if run_attempt is not None and (
            isinstance(run_attempt, bool) or not isinstance(run_attempt, int) or run_attempt < 0
        ):
            raise InvalidInputError(f"run_attempt must be an integer >= 0, got {run_attempt!r}")
        rt = self._runtime
        return await rt.client.complete_work_receipt(
            key, result, rt.context.run_id, run_attempt=run_attempt
        )

    def _holder(self) -> str:
        return f"{self._runtime.context.run_id}:{secrets.token_hex(8)}"

    @asynccontextmanager
    async def claim(self, key: str) -> AsyncIterator[Lease]:
        """``async with recorder.claim(key) as lease:`` hold ``key``'s lease while the block runs.

        Raises ``LeaseHeldError`` (``holder``, ``expires_at``) when another
        holder's lease is live, and ``ReceiptCompletedError`` (``receipt``)
        when the work is done; neither runs the block. Inside, a keeper task
        renews the lease every ``WORK_RECEIPT_LEASE_RENEWAL_MS``; if a
        renewal is refused or cannot land in time, the body is cancelled
        before the lease expires and the block raises ``LeaseLostError``.
        ``await lease.complete(result)`` records the receipt, fenced by the
        lease. Leaving without completing releases the lease.
        """
        key = _text("key", key)
        lease = await acquire_lease(self._backend, key, self._holder())
        async with hold_lease(lease):
            yield lease

    async def once(self, key: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``fn`` (``async () -> JSON value``) at most once for ``key`` across attempts
        and processes, and return its result, or the result already recorded.

        While another holder holds the key's lease this waits for that
        holder's receipt (or for the lease to expire, then takes it over),
        polling every ``WORK_RECEIPT_ONCE_POLL_MS`` for at most
        ``WORK_RECEIPT_ONCE_WAIT_MS``; past that it raises ``LeaseHeldError``.
        ``fn`` raising releases the lease and propagates; a lost lease raises
        ``LeaseLostError``. If cancelled, ``fn`` is cancelled and the lease released.
        """
        result, _reused = await self._once(key, fn)
        return result

    async def _once(self, key: str, fn: Callable[[], Awaitable[Any]]) -> tuple[Any, bool]:
        key = _text("key", key)
        if not callable(fn):
            raise InvalidInputError(f"fn must be an async callable, got {fn!r}")
        return await run_once(self._backend, key, self._holder(), fn)


# --- the runtime ------------------------------------------------------------------------------


class Runtime:
    """A run's data plane, live inside ``open_runtime``'s block."""

    def __init__(
        self,
        context: RuntimeContext,
        client: GatewayClient,
        sessions: SessionManager,
        reader: PageReader,
    ) -> None:
        self.context: Final = context
        self.client: Final = client
        self.sessions: Final = sessions
        self.reader: Final = reader
        self.road_stats: Final = RoadStats()
        self._fenced_rows = 0

    def __repr__(self) -> str:
        c = self.context
        return f"<Runtime play={c.play_name!r} run={c.run_id!r} strategy={c.strategy}>"

    def _sheet(self, table_namespace: str) -> SheetRef:
        return SheetRef(self.context.org_id, self.context.play_name, table_namespace)

    def road(
        self,
        table_namespace: str,
        *,
        row_mode: RowMode = "output",
        run_id: str | None = None,
        admitted: AdmittedPart | None = None,
    ) -> SheetRoad:
        """The road this runtime's strategy reads ``table_namespace`` through (limited to
        one admission's pending or completed rows with ``admitted``)."""
        _text("table_namespace", table_namespace)
        if row_mode not in ("output", "all"):
            raise InvalidInputError(f"row_mode must be 'output' or 'all', got {row_mode!r}")
        run_id = _optional_text("run_id", run_id)
        c = self.context
        scope = ReadScope.for_token(
            base_url=c.base_url,
            token=c.token,
            org_id=c.org_id,
            play_name=c.play_name,
            run_id=run_id,
            table_namespace=table_namespace,
            row_mode=row_mode,
            admitted=admitted,
        )
        if c.strategy == "direct":
            return DirectRoad(self.sessions, scope, user_email=c.user_email, stats=self.road_stats)
        return GatewayRoad(self.client, scope, stats=self.road_stats)

    def dataset(
        self,
        table_namespace: str,
        row_mode: RowMode = "output",
        *,
        run_id: str | None = None,
        page_rows: int = READ_PAGE_MAX_ROWS,
    ) -> Dataset:
        """A lazy dataset over the sheet ``table_namespace``, read through this strategy's road.

        ``run_id`` limits it to the rows one run stamped (None: every row).
        Random access (``at``, ``peek``) is batched by the runtime's page
        reader; ``async for`` and ``materialize`` read by keyset, one page of
        up to ``page_rows`` rows held at a time.
        """
        road = self.road(table_namespace, row_mode=row_mode, run_id=run_id)
        return Dataset(self.reader, road, page_rows=page_rows)

    def _admitted_dataset(self, table_namespace: str, admitted: AdmittedPart) -> Dataset:
        """A lazy dataset over one admission's pending or completed rows."""
        return Dataset(self.reader, self.road(table_namespace, admitted=admitted))

    def writer(
        self,
        table_namespace: str,
        contract: SheetContract,
        *,
        write_version: int | None = None,
    ) -> RowWriter:
        """A writer for ``table_namespace`` under ``contract``.

        ``write_version`` resumes an attempt admitted elsewhere (another
        process, or another runtime of this run); otherwise ``start`` begins one.
        """
        _text("table_namespace", table_namespace)
        if not isinstance(contract, SheetContract):
            raise InvalidInputError(f"contract must be a SheetContract, got {contract!r}")
        if write_version is not None and (
            isinstance(write_version, bool)
            or not isinstance(write_version, int)
            or not 0 <= write_version <= BIGINT_MAX
        ):
            raise InvalidInputError(
                f"write_version must be an integer from 0 to {BIGINT_MAX} or None, "
                f"got {write_version!r}"
            )
        return RowWriter(self, table_namespace, contract, write_version)

    def receipts(self) -> ReceiptRecorder:
        """A recorder of work receipts for this run."""
        return ReceiptRecorder(self)

    async def map(
        self,
        namespace: str,
        contract: SheetContract,
        rows: AdmissionInput,
        fn: MapFn,
        *,
        concurrency: int = 16,
        batch_rows: int = 500,
        flush_seconds: float = 0.25,
        receipts: bool = False,
        progress: Callable[[MapProgress], object] | None = None,
    ) -> MapReport:
        """Admit ``rows`` on ``namespace`` and map ``fn`` (``async (row) -> outputs``) over
        the rows to map; every outcome is written, fenced by the admission's version.

        ``rows``: a sequence, iterable or async iterable of row mappings.
        At most ``concurrency`` ``fn`` calls run at once. ``fn`` returning its
        outputs (a mapping by contract column id) completes the row; raising an
        ``Exception`` fails it with the message; any other ``BaseException``
        stops the map and propagates. Terminal writes leave in batches of up
        to ``batch_rows`` rows, after at most ``flush_seconds``; rows read
        ahead and results not yet written are capped (``MAP_*`` budgets), so
        memory does not grow with the sheet. ``receipts=True`` runs each row's
        ``fn`` through ``once`` (key ``map/{namespace}/{row key}``), so a rerun
        reuses every finished call. ``progress(MapProgress)`` is called as
        rows settle.

        When a write finds the attempt superseded, every ``fn`` call still
        running is cancelled at once, no further call starts, and this raises
        ``AttemptSupersededError``. Cancelling ``map`` cancels everything it
        started.
        """
        _text("namespace", namespace)
        check_map_options(fn, concurrency, batch_rows, flush_seconds, progress)
        if not isinstance(receipts, bool):
            raise InvalidInputError(f"receipts must be a bool, got {receipts!r}")
        started = trio.current_time()
        writer = self.writer(namespace, contract)
        admission = await writer.start(rows)
        completed, failed, reused = await run_map(
            admission.pending(),
            fn,
            total=admission.pending_count,
            complete=writer.complete,
            fail=writer.fail,
            concurrency=concurrency,
            batch_rows=batch_rows,
            flush_seconds=flush_seconds,
            once=self.receipts()._once if receipts else None,
            namespace=namespace,
            progress=progress,
        )
        return MapReport(
            write_version=admission.write_version,
            admitted=admission.pending_count + admission.completed_count,
            pending=admission.pending_count,
            completed=completed,
            failed=failed,
            reused=reused,
            elapsed_seconds=trio.current_time() - started,
        )

    async def resolve_play(self, ref: str) -> ResolvedPlay | None:
        """The play ``ref`` names (its id, else its name) in the run's org, or None.

        Through the gateway, retried on the resolve-play ladder
        (``RESOLVE_PLAY_RETRY_DELAYS_MS``). Another org's plays are never found.
        """
        return await self.client.resolve_play(_text("ref", ref))

    def stats(self) -> RuntimeStats:
        """A snapshot of the runtime's counters."""
        reader = self.reader.stats()
        road = self.road_stats
        return RuntimeStats(
            page_reads=reader.values,
            reader_batches=reader.batches,
            peak_retained_request_bytes=reader.peak_retained_bytes,
            batch_requests=road.batch_reads,
            keyset_reads=road.keyset_reads,
            offset_reads=road.offset_reads,
            splits=road.too_large,
            fenced_rows=self._fenced_rows,
            sessions_minted=self.sessions.minted,
        )

    # --- scoped sessions for writes ---------------------------------------------------------

    def _terminal_store(
        self, table_namespace: str, contract: SheetContract, rows: int
    ) -> AbstractAsyncContextManager[SheetStore]:
        shape = AccessShape(
            table_namespace=table_namespace,
            operations=("rows.read", "rows.upsert"),
            limits=SessionLimits(max_rows=_session_rows(rows)),
            contract=contract,
            user_email=self.context.user_email,
        )
        return self.sessions.store(shape)

    def _write_store(
        self, writer: RowWriter, operation: str, rows: int
    ) -> AbstractAsyncContextManager[SheetStore]:
        shape = AccessShape(
            table_namespace=writer.table_namespace,
            operations=(operation,),
            limits=SessionLimits(max_rows=_session_rows(rows)),
            contract=writer.contract,
            user_email=self.context.user_email,
        )
        return self.sessions.store(shape)


def _session_rows(rows: int) -> int:
    """A write session's ``max_rows``: ``rows`` rounded up to whole write chunks.

    The limit is part of the session's cache key, so the exact row count would
    mint a session (a role, an RSA round trip) for every distinct batch size a
    map's flushes produce; whole chunks let every write of up to one chunk
    share one session, and the limit still bounds what one write may touch.
    """
    chunks = -(-max(rows, 1) // POSTGRES_WRITE_CHUNK_ROWS)
    return chunks * POSTGRES_WRITE_CHUNK_ROWS


@asynccontextmanager
async def open_runtime(
    *,
    base_url: str,
    token: str,
    org_id: str,
    play_name: str,
    run_id: str,
    strategy: Strategy = "direct",
    preloaded_sessions: Sequence[PreloadedSession] = (),
    unwrap_key: bytes | None = None,
    user_email: str | None = None,
    headers: Mapping[str, str] | None = None,
    prewarm: bool = True,
) -> AsyncIterator[Runtime]:
    """Open a run's data plane: ``async with open_runtime(...) as rt:``.

    Every argument is checked before anything connects (``InvalidInputError``
    names the bad one). ``headers`` go with every gateway request (tests arm
    the reference gateway's faults with them). The block owns the gateway
    client, the session manager (its pools and their tasks) and the page
    reader (its nursery runs every batch read).

    With ``prewarm`` (the default), every usable preloaded session is opened
    and checked (``SELECT 1``) before the block starts, retrying transient
    connection errors on ``POSTGRES_PREWARM_RETRY_DELAYS_MS``; a session that
    cannot be reached raises ``SessionPrewarmError`` naming its identity.

    Leaving the block normally lets queued reads finish, then closes every
    pool and the HTTP client. Leaving it by an exception, or by cancellation,
    cancels queued and running reads (their statements are cancelled on the
    server), closes every pool and the client, and re-raises; an error raised
    in the block comes out as itself, not wrapped in an exception group.
    """
    context = RuntimeContext(
        base_url=base_url,
        token=token,
        org_id=org_id,
        play_name=play_name,
        run_id=run_id,
        strategy=strategy,
        preloaded_sessions=preloaded_sessions,
        unwrap_key=unwrap_key,
        user_email=user_email,
    )
    if headers is not None and not (
        isinstance(headers, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise InvalidInputError("headers must be a mapping of strings to strings")
    if not isinstance(prewarm, bool):
        raise InvalidInputError(f"prewarm must be a bool, got {prewarm!r}")
    client = GatewayClient(
        context.base_url,
        context.token,
        play_name=context.play_name,
        org_id=context.org_id,
        user_email=context.user_email,
        headers=headers,
    )
    try:
        async with (
            client,
            SessionManager(
                client, preloaded=context.preloaded_sessions, unwrap_key=context.unwrap_key
            ) as sessions,
            PageReader() as reader,
        ):
            if prewarm:
                await sessions.prewarm()
            yield Runtime(context, client, sessions, reader)
    except BaseExceptionGroup as group:
        single = single_leaf(group)
        if single is None:
            raise
        raise single from single.__cause__
