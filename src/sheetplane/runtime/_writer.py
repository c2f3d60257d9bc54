"""A sheet's writer for one attempt of the run, and the target it writes to."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs
import trio

from .. import _checks as checks
from .. import _tracing
from .._inputs import watch_inputs
from .._json import encode_body
from .._superseded import superseded_error
from .._types import (
    AdmittedPart,
    CompleteRow,
    FailRow,
    SheetContract,
    SheetRef,
    TerminalWriteResult,
    WriteResult,
)
from ..admission import Admission, AdmissionInput, check_input
from ..dataset import Dataset
from ..errors import (
    AttemptSupersededError,
    InvalidInputError,
)
from ..gateway.client import GatewayClient
from ..pages import AdmissionRoad, KeyedWrites, Plays, TerminalWrites
from ._admit import admit

__all__ = ["RowWriter", "WriteTally", "WriteTarget"]

_Row = TypeVar("_Row", CompleteRow, FailRow)


@attrs.define
class WriteTally:
    """What a runtime's writers have counted, shared by all of them."""

    fenced_rows: int = 0
    """Rows terminal writes found superseded (``AttemptSupersededError``)."""


@attrs.frozen
class WriteTarget:
    """Where one writer's rows go: the sheet, its contract, and the roads to it."""

    sheet: SheetRef
    """The sheet written."""
    contract: SheetContract
    """The contract every write carries."""
    run_id: str
    """The run stamped on admitted rows and carried by terminal writes."""
    client: GatewayClient
    """The gateway (which ways of admission it serves; a whole admission)."""
    admissions: AdmissionRoad
    """The admissions' road (at once, each staged chunk, a whole admission's parts;
    picked as ``terminal`` is)."""
    terminal: TerminalWrites
    """The terminal writes' road (the runtime picks it by its strategy)."""
    keyed: KeyedWrites
    """The keyed writes' road (append, upsert, replace; picked as ``terminal`` is)."""
    plays: Plays
    """The play-level operations (``upsert``'s ensure of the sheet)."""
    admitted: Callable[[AdmittedPart], Dataset]
    """A lazy dataset over one part of an admission of this sheet."""
    tally: WriteTally
    """The runtime's counters, bumped by the fence."""


def _write_attributes(rows: Sequence[_Row], road: str) -> dict[str, str | int]:
    """A terminal write's span attributes: its kind, its rows and its road."""
    return {
        "sheetplane.write.kind": "complete" if type(rows[0]) is CompleteRow else "fail",
        "sheetplane.write.rows": len(rows),
        "sheetplane.road": road,
    }


def _upsert_key(sheet: SheetRef, run_id: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """The runtime's upsert idempotency key: SHA-1 of ``play:namespace:run:<rows JSON>``
    (an identity of the write, not a secret)."""
    prefix = f"{sheet.play_name}:{sheet.table_namespace}:{run_id}:".encode()
    material = prefix + encode_body([dict(row) for row in rows])
    return hashlib.sha1(material, usedforsecurity=False).hexdigest()


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

    def __init__(self, target: WriteTarget, version: int | None) -> None:
        self._target = target
        self.table_namespace: Final = target.sheet.table_namespace
        self.contract: Final = target.contract
        self._write_version = version
        self._superseded: AttemptSupersededError | None = None

    def __repr__(self) -> str:
        return f"<RowWriter {self.table_namespace!r} write_version={self._write_version}>"

    @property
    def actions(self) -> tuple[str, ...]:
        """The gateway actions this writer's terminal writes send (a map probes them)."""
        return self._target.terminal.actions

    @property
    def write_version(self) -> int | None:
        """The attempt's write version: from ``start``, or given to ``Runtime.writer``."""
        return self._write_version

    async def start(self, rows: AdmissionInput, *, strict_inputs: bool = False) -> Admission:
        """Admit ``rows`` under a new write version (a new attempt).

        ``rows``: a sequence, any iterable or any async iterable of row
        mappings, of any size. Rows are deduplicated by key (the first
        occurrence is kept) and keep their input order; ``admission.pending()``
        reads the rows to map and ``admission.completed()`` the already-enriched
        ones, lazily. The input goes in as one write version, committed whole,
        the way ``runtime/_admit.py`` chooses: a sequence on the direct road in
        one transaction straight into the sheet (staged from its start instead
        if it outruns ``DIRECT_ADMISSION_HOLD_MS``), otherwise staged in chunks
        (see ``sheetplane.admission``); memory holds a couple of chunks,
        whatever the input's size.

        A bad row raises ``InvalidInputError`` naming its position in the input
        (a bad first chunk is refused before any request). If it raises, or is
        cancelled, before the commit, nothing is committed and the admission is
        aborted (a bounded, shielded call); the writer keeps its previous attempt.

        If the admission's staging rows are lost (a database restart empties the
        unlogged staging table), the next chunk (or the commit) finds it. A
        sequence (``rows`` a ``Sequence``) is then admitted again from its start,
        once, as a new admission; any other input (an iterator, a generator, an
        async iterable: what was read cannot be read again) raises
        ``AdmissionStateError`` saying so, with nothing committed: start again
        with the input from its beginning.

        An input column of the contract that no row carries a value for (rows keyed
        ``name`` against a column ``company``, say) is logged as one warning naming
        the column and the row count; with ``strict_inputs=True`` the admission
        raises ``InvalidInputError`` instead, with nothing committed
        (``sheetplane._inputs``).
        """
        check_input(rows)
        checks.flag("strict_inputs", strict_inputs)
        t = self._target
        with _tracing.span(
            "sheetplane.admission",
            {
                "sheetplane.table_namespace": t.sheet.table_namespace,
                "sheetplane.road": t.terminal.road,
            },
        ) as span:
            admission = await self._start(rows, strict_inputs)
            span.set_attributes(
                {
                    "sheetplane.write_version": admission.write_version,
                    "sheetplane.admission.inserted": admission.inserted,
                    "sheetplane.admission.skipped": admission.skipped,
                    "sheetplane.admission.pending": admission.pending_count,
                    "sheetplane.admission.completed": admission.completed_count,
                }
            )
        return admission

    async def _start(self, rows: AdmissionInput, strict_inputs: bool) -> Admission:
        t = self._target
        rows = watch_inputs(rows, t.contract, t.sheet.table_namespace, strict=strict_inputs)
        admission = await admit(t, rows)
        self._write_version = admission.write_version
        self._superseded = None
        return admission

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
        checked = checks.complete_rows(rows)
        return await self._terminal(checked, self._target.terminal.complete_map_rows)

    async def fail(self, rows: Sequence[FailRow]) -> TerminalWriteResult:
        """Record map failures, fenced by the attempt's write version.

        Raises ``AttemptSupersededError`` when any row is superseded.
        """
        checked = checks.fail_rows(rows)
        return await self._terminal(checked, self._target.terminal.fail_map_rows)

    async def complete_mapped(self, rows: Sequence[CompleteRow]) -> TerminalWriteResult:
        """``complete`` of a batch ``map`` built: each row's outputs already passed the
        store's check and the batch is within ``MAP_WRITE_BATCH_MAX_BYTES``, so the
        argument checks (a second measure of every row) are not run again."""
        return await self._terminal(rows, self._target.terminal.complete_map_rows)

    async def fail_mapped(self, rows: Sequence[FailRow]) -> TerminalWriteResult:
        """``fail`` of a batch ``map`` built (its errors cut to ``MAX_ERROR_TEXT_BYTES``)."""
        return await self._terminal(rows, self._target.terminal.fail_map_rows)

    async def _terminal(
        self,
        checked: Sequence[_Row],
        write: Callable[..., Awaitable[TerminalWriteResult]],
    ) -> TerminalWriteResult:
        """Send checked terminal rows down the writer's road under the attempt's write
        version, then apply the fence."""
        version = self._version()
        if not checked:
            await trio.lowlevel.checkpoint()
            return TerminalWriteResult((), (), 0)
        road = self._target.terminal.road
        with _tracing.span("sheetplane.write", _write_attributes(checked, road)) as span:
            result = await write(checked, write_version=version)
            span.set_attribute("sheetplane.write.stale_rows", len(result.stale_rows))
            return self._fence(result, version, len({row.key for row in checked}))

    def _fence(
        self, result: TerminalWriteResult, version: int, submitted: int
    ) -> TerminalWriteResult:
        error = superseded_error(
            result,
            table_namespace=self.table_namespace,
            run_id=self._target.run_id,
            write_version=version,
            submitted_rows=submitted,
        )
        if error is not None:
            self._target.tally.fenced_rows += len(error.superseded_rows)
            self._superseded = error
            raise error
        return result

    async def append(
        self, rows: Sequence[Mapping[str, Any]], *, idempotency_key: str
    ) -> WriteResult:
        """Append rows; a retry with the same ``idempotency_key`` writes nothing."""
        checked = checks.row_mappings("rows", rows)
        key = checks.text("idempotency_key", idempotency_key)
        return await self._target.keyed.append_rows(checked, idempotency_key=key)

    async def upsert(
        self,
        rows: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        key_field: str | None = None,
        skip_ensure_sheet: bool = True,
    ) -> WriteResult:
        """Insert or update rows by key; idempotent per ``idempotency_key``.

        As the runtime's ``upsertRuntimeRows``: without an ``idempotency_key``
        the key is the SHA-1 hex of ``play:namespace:run:`` and the rows'
        compact JSON, so the same rows upserted again in the same run write
        nothing; with ``skip_ensure_sheet=False`` the sheet is ensured first
        (``Plays.ensure_sheet``: creating the sheet and any new contract column),
        otherwise the write goes straight to its road.
        """
        checked = checks.row_mappings("rows", rows)
        field = checks.optional_text("key_field", key_field)
        checks.flag("skip_ensure_sheet", skip_ensure_sheet)
        target = self._target
        key = (
            _upsert_key(target.sheet, target.run_id, checked)
            if idempotency_key is None
            else checks.text("idempotency_key", idempotency_key)
        )
        if not skip_ensure_sheet:
            await target.plays.ensure_sheet(target.sheet.table_namespace, target.contract)
        return await target.keyed.upsert_rows(checked, idempotency_key=key, key_field=field)

    async def replace(
        self, rows: Sequence[Mapping[str, Any]], *, idempotency_key: str
    ) -> WriteResult:
        """Replace every row of the sheet; idempotent per ``idempotency_key``."""
        checked = checks.row_mappings("rows", rows)
        key = checks.text("idempotency_key", idempotency_key)
        return await self._target.keyed.replace_rows(checked, idempotency_key=key)
