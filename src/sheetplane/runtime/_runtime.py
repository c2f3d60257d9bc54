"""The runtime: a run's data plane, and ``open_runtime``, the block that owns it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final, cast

import attrs
import trio

from .. import _checks as checks
from .. import protocol as m
from .._attempts import Attempt, AttemptStatus, ShareClaim, ShareLease
from .._groups import raise_single
from .._ints import check_int
from .._map import (
    UNKNOWN_OUTPUTS,
    MapFn,
    MapProgress,
    MapReport,
    OutputKeys,
    UnknownOutputs,
    check_map_options,
    map_span,
    trace_report,
)
from .._types import (
    BIGINT_MAX,
    EVERY_ROW,
    ROW_MODES,
    AdmittedPart,
    ResolvedPlay,
    RowFilter,
    RowMode,
    SheetContract,
    SheetRef,
)
from .._workers import AttemptTally, run_attempt
from ..admission import AdmissionInput, KeyedRoad
from ..budgets import DATASET_PREVIEW_ROWS, READ_PAGE_MAX_ROWS
from ..dataset import Dataset, DatasetDescriptor, DatasetKind, InMemoryDataset
from ..errors import GatewayActionMissingError, InvalidInputError
from ..gateway.client import GatewayClient, gateway_urls
from ..names import normalize_play_name, normalize_table_namespace
from ..pages import (
    AdmissionRoad,
    DirectAdmissions,
    DirectKeyedWrites,
    DirectRoad,
    DirectShareRoad,
    DirectWrites,
    GatewayAdmissions,
    GatewayKeyedWrites,
    GatewayRoad,
    GatewayShareRoad,
    GatewayWrites,
    KeyedWrites,
    PageReader,
    Plays,
    ReadScope,
    RoadStats,
    ShareRoad,
    SheetRoad,
    TerminalWrites,
    WorkReceipts,
)
from ..sessions import PreloadedSession, SessionManager
from ._context import RuntimeContext, Strategy
from ._receipts import ReceiptRecorder
from ._writer import RowWriter, WriteTally, WriteTarget

__all__ = ["Runtime", "RuntimeStats", "open_runtime"]


def _check_unknown_outputs(unknown_outputs: object) -> None:
    if unknown_outputs not in UNKNOWN_OUTPUTS:
        raise InvalidInputError(
            f"unknown_outputs must be one of {list(UNKNOWN_OUTPUTS)}, got {unknown_outputs!r}"
        )


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
        self._tally = WriteTally()
        self.share_lease = ShareLease()
        """How ``map_attempt``'s workers keep their shares' leases (``budgets``'
        ``SHARE_LEASE_*``); tests and benchmarks set a shorter one to see a takeover."""
        self.attempt_tally = AttemptTally()
        """What this runtime's last ``map`` or ``map_attempt`` did as a worker (rows,
        shares, takeovers, renewals)."""

    def __repr__(self) -> str:
        c = self.context
        return f"<Runtime play={c.play_name!r} run={c.run_id!r} strategy={c.strategy}>"

    def _sheet(self, table_namespace: str) -> SheetRef:
        return SheetRef(self.context.org_id, self.context.play_name, table_namespace)

    def road(
        self,
        table_namespace: str,
        which: RowFilter = EVERY_ROW,
    ) -> SheetRoad:
        """The road this runtime's strategy reads ``which`` rows of ``table_namespace``
        through."""
        table_namespace = normalize_table_namespace(table_namespace)
        if which.row_mode not in ROW_MODES:
            raise InvalidInputError(f"row_mode must be 'output' or 'all', got {which.row_mode!r}")
        run_id = checks.optional_text("run_id", which.run_id)
        c = self.context
        scope = ReadScope.for_token(
            base_url=c.base_url,
            token=c.token,
            org_id=c.org_id,
            play_name=c.play_name,
            run_id=run_id,
            table_namespace=table_namespace,
            row_mode=which.row_mode,
            admitted=which.admitted,
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
        up to ``page_rows`` rows held at a time. Its descriptors: kind ``map``,
        the sheet's ``dataset_id`` and ``backing``, no preview rows.
        """
        road = self.road(table_namespace, RowFilter(run_id=run_id, row_mode=row_mode))
        descriptor = self._descriptor("map", road)
        return Dataset(self.reader, road, page_rows=page_rows, descriptor=descriptor)

    def admitted_dataset(self, table_namespace: str, admitted: AdmittedPart) -> Dataset:
        """A lazy dataset over one admission's pending or completed rows (each carrying
        ``__deeplineRowKey`` beside ``_key``)."""
        road = KeyedRoad(self.road(table_namespace, RowFilter(admitted=admitted)))
        return Dataset(self.reader, road, descriptor=self._descriptor("map", road))

    def _descriptor(
        self,
        kind: DatasetKind,
        road: SheetRoad,
        *,
        rows: Sequence[Mapping[str, Any]] = (),
        source_label: str | None = None,
        backed: bool = True,
    ) -> DatasetDescriptor:
        scope = road.scope
        assert isinstance(scope, ReadScope)
        return DatasetDescriptor.of_sheet(
            kind,
            scope.play_name,
            scope.table_namespace,
            preview_rows=rows[:DATASET_PREVIEW_ROWS],
            source_label=source_label,
            backed=backed,
        )

    async def persist_csv_dataset(
        self,
        namespace: str,
        contract: SheetContract,
        rows: Sequence[Mapping[str, Any]],
        source_label: str | None = None,
    ) -> Dataset | InMemoryDataset:
        """Admit ``rows`` (a CSV a runner was handed) into the sheet ``namespace`` and
        answer a ``csv`` dataset of it: the runtime's ``persistRuntimeCsvDataset``.

        The rows are admitted as ``writer(namespace, contract).start(rows)`` admits
        them (a new write version). When every row fits the preview (at most
        ``DATASET_PREVIEW_ROWS``), the answer is an ``InMemoryDataset`` of the rows
        as given, read without another request (``backing`` None); otherwise it is
        a ``Dataset`` read from the sheet, backed by it. Either way ``dataset_id`` is
        the sheet's, ``preview_rows`` the first rows given and ``source_label`` the
        label given.
        """
        # Any size, as start admits it; start refuses a row that is not a mapping.
        checked = cast(Sequence[Mapping[str, Any]], checks.sequence("rows", rows, "row objects"))
        if source_label is not None and not isinstance(source_label, str):
            raise InvalidInputError(f"source_label must be a string or None, got {source_label!r}")
        await self.writer(namespace, contract).start(checked)
        road = self.road(namespace)
        if len(checked) <= DATASET_PREVIEW_ROWS:
            held = self._descriptor(
                "csv", road, rows=checked, source_label=source_label, backed=False
            )
            return InMemoryDataset(checked, descriptor=held)
        backed = self._descriptor("csv", road, rows=checked, source_label=source_label)
        return Dataset(self.reader, road, descriptor=backed)

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
        table_namespace = normalize_table_namespace(table_namespace)
        if not isinstance(contract, SheetContract):
            raise InvalidInputError(f"contract must be a SheetContract, got {contract!r}")
        if write_version is not None:
            check_int("write_version", write_version, 0, BIGINT_MAX)
        c = self.context
        sheet = self._sheet(table_namespace)
        admitted = partial(self.admitted_dataset, table_namespace)
        admissions, terminal, keyed = self._write_roads(sheet, contract, admitted)
        target = WriteTarget(
            sheet=sheet,
            contract=contract,
            run_id=c.run_id,
            client=self.client,
            admissions=admissions,
            terminal=terminal,
            keyed=keyed,
            plays=self.plays,
            admitted=admitted,
            tally=self._tally,
        )
        return RowWriter(target, write_version)

    def _write_roads(
        self, sheet: SheetRef, contract: SheetContract, admitted: Callable[[AdmittedPart], Dataset]
    ) -> tuple[AdmissionRoad, TerminalWrites, KeyedWrites]:
        """The roads of a writer's admissions, terminal and keyed writes: this strategy's,
        picked here."""
        c = self.context
        if c.strategy == "direct":
            return (
                DirectAdmissions(
                    self.client, self.sessions, sheet, contract, c.run_id, c.user_email, admitted
                ),
                DirectWrites(self.sessions, sheet, contract, c.run_id, c.user_email),
                DirectKeyedWrites(self.sessions, sheet, contract, c.run_id, c.user_email),
            )
        namespace = sheet.table_namespace
        return (
            GatewayAdmissions(self.client, namespace, contract),
            GatewayWrites(self.client, namespace, contract, c.run_id),
            GatewayKeyedWrites(self.client, namespace, contract, c.run_id),
        )

    @property
    def work_receipts(self) -> WorkReceipts:
        """The road of the run's work receipts: the gateway on both strategies, as no
        session role is granted the receipts tables (pages/_receipts.py)."""
        return self.client

    @property
    def plays(self) -> Plays:
        """The road of the play-level operations (ensure a sheet, resolve a play): the
        gateway on both strategies, as no session role may create tables or read the
        registry (pages/_plays.py)."""
        return self.client

    def receipts(self) -> ReceiptRecorder:
        """A recorder of work receipts for this run."""
        return ReceiptRecorder(self.work_receipts, self.context.run_id)

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
        unknown_outputs: UnknownOutputs = "fail",
        strict_inputs: bool = False,
    ) -> MapReport:
        """Admit ``rows`` on ``namespace`` and map ``fn`` (``async (row) -> outputs``) over
        the rows to map; every outcome is written, fenced by the admission's version.

        It is the admission and then ``map_attempt`` of its attempt with this one
        worker: other processes may join with ``map_attempt(admission.attempt, ...)``.

        ``rows``: a sequence, iterable or async iterable of row mappings.
        At most ``concurrency`` ``fn`` calls run at once. ``fn`` returning its
        outputs (a mapping by contract column id) completes the row; raising an
        ``Exception`` fails it with the message; any other ``BaseException``
        stops the map and propagates. Terminal writes leave in batches of up
        to ``batch_rows`` rows, after at most ``flush_seconds``; rows read
        ahead and results not yet written are capped (``MAP_*`` and ``SHARE_*``
        budgets), so memory does not grow with the sheet. ``receipts=True`` runs
        each row's ``fn`` through ``once`` (key ``map/{namespace}/{row key}``), so
        a rerun reuses every finished call. ``progress(MapProgress)`` is called
        as rows settle.

        ``fn``'s outputs are keyed by contract column id (a column's ``sql_name``
        is accepted too). A key that names no column of ``contract`` fails its
        row with an error naming the key and the contract's outputs; with
        ``unknown_outputs="raise"`` the map raises ``InvalidInputError`` at the
        first instead (the rows already written stay written).

        ``strict_inputs=True`` refuses an admission whose rows carry no value for
        an input column of ``contract`` in any row (``InvalidInputError``, nothing
        admitted); by default that is one warning (``RowWriter.start``).

        When a write finds the attempt superseded, every ``fn`` call still
        running is cancelled at once, no further call starts, and this raises
        ``AttemptSupersededError``. Cancelling ``map`` cancels everything it
        started.
        """
        namespace = normalize_table_namespace(namespace)
        self._check_map(fn, concurrency, batch_rows, flush_seconds, progress, receipts)
        _check_unknown_outputs(unknown_outputs)
        started = trio.current_time()
        with map_span("sheetplane.map", namespace, concurrency, batch_rows) as span:
            writer = self.writer(namespace, contract)
            await self._check_map_actions(writer, receipts)
            admission = await writer.start(rows, strict_inputs=strict_inputs)
            rows_mapped, completed, failed, reused = await self._work(
                admission.attempt,
                writer,
                fn,
                total=admission.pending_count,
                concurrency=concurrency,
                batch_rows=batch_rows,
                flush_seconds=flush_seconds,
                receipts=receipts,
                progress=progress,
                unknown_outputs=unknown_outputs,
            )
            del rows_mapped
            report = MapReport(
                write_version=admission.write_version,
                admitted=admission.pending_count + admission.completed_count,
                pending=admission.pending_count,
                completed=completed,
                failed=failed,
                reused=reused,
                elapsed_seconds=trio.current_time() - started,
            )
            trace_report(span, report)
        return report

    async def map_attempt(
        self,
        attempt: Attempt,
        contract: SheetContract,
        fn: MapFn,
        *,
        concurrency: int = 16,
        batch_rows: int = 500,
        flush_seconds: float = 0.25,
        receipts: bool = False,
        progress: Callable[[MapProgress], object] | None = None,
        unknown_outputs: UnknownOutputs = "fail",
    ) -> MapReport:
        """Map ``fn`` over ``attempt``'s pending rows together with every other worker
        of it, in this process or any other (``sheetplane._workers``).

        The runtime must be opened for the attempt's play and run. The worker
        claims a share of the rows at a time under a lease it renews while it
        maps them, writes every outcome fenced by the attempt's version as
        ``map`` does, and returns when no share of the attempt is left to claim
        and its own are written. The report counts this worker's rows
        (``pending``: the rows handed to its ``fn`` calls). The options are
        ``map``'s.

        A worker that dies leaves its shares to the others once their leases end
        (``SHARE_LEASE_TTL_MS``); only its rows not yet written are mapped again,
        and with ``receipts=True`` not even those whose call had finished.

        Raises ``AttemptSupersededError`` (every ``fn`` call cancelled, nothing more
        written) once a newer admission of the sheet exists, found by a write, a
        claim or a renewal; ``LeaseLostError`` when a share's lease could not be
        renewed in time (its calls were cancelled before the lease could end);
        ``InvalidInputError`` for bad options or an attempt of another play or run,
        or of no admission.
        """
        if not isinstance(attempt, Attempt):
            raise InvalidInputError(f"attempt must be a sheetplane.Attempt, got {attempt!r}")
        c = self.context
        if (attempt.play_name, attempt.run_id) != (normalize_play_name(c.play_name), c.run_id):
            raise InvalidInputError(
                f"attempt is of play {attempt.play_name!r}, run {attempt.run_id!r}; this "
                f"runtime is opened for play {c.play_name!r}, run {c.run_id!r}"
            )
        self._check_map(fn, concurrency, batch_rows, flush_seconds, progress, receipts)
        _check_unknown_outputs(unknown_outputs)
        started = trio.current_time()
        namespace = attempt.table_namespace
        with map_span("sheetplane.map_attempt", namespace, concurrency, batch_rows) as span:
            writer = self.writer(namespace, contract, write_version=attempt.write_version)
            await self._check_map_actions(writer, receipts)
            status = await self.attempt_status(attempt)
            rows, completed, failed, reused = await self._work(
                attempt,
                writer,
                fn,
                total=status.pending,
                concurrency=concurrency,
                batch_rows=batch_rows,
                flush_seconds=flush_seconds,
                receipts=receipts,
                progress=progress,
                unknown_outputs=unknown_outputs,
            )
            report = MapReport(
                write_version=attempt.write_version,
                admitted=rows,
                pending=rows,
                completed=completed,
                failed=failed,
                reused=reused,
                elapsed_seconds=trio.current_time() - started,
            )
            trace_report(span, report)
        return report

    async def attempt_status(self, attempt: Attempt) -> AttemptStatus:
        """Where ``attempt`` stands: its rows ``pending`` (and of those ``claimed``),
        ``enriched`` and ``failed``, the ``workers`` holding a live share, and whether
        it was ``superseded``. ``InvalidInputError`` for an attempt of no admission."""
        if not isinstance(attempt, Attempt):
            raise InvalidInputError(f"attempt must be a sheetplane.Attempt, got {attempt!r}")
        return await self.share_road(attempt.table_namespace).status(attempt.write_version)

    def share_road(self, table_namespace: str) -> ShareRoad:
        """The road this runtime's strategy claims the shares of ``table_namespace``'s
        attempts through."""
        table_namespace = normalize_table_namespace(table_namespace)
        if self.context.strategy == "direct":
            return DirectShareRoad(
                self.sessions, self._sheet(table_namespace), user_email=self.context.user_email
            )
        return GatewayShareRoad(self.client, table_namespace)

    def _check_map(
        self,
        fn: object,
        concurrency: object,
        batch_rows: object,
        flush_seconds: object,
        progress: object,
        receipts: object,
    ) -> None:
        check_map_options(fn, concurrency, batch_rows, flush_seconds, progress)
        checks.flag("receipts", receipts)

    async def _work(
        self,
        attempt: Attempt,
        writer: RowWriter,
        fn: MapFn,
        *,
        total: int,
        concurrency: int,
        batch_rows: int,
        flush_seconds: float,
        receipts: bool,
        progress: Callable[[MapProgress], object] | None,
        unknown_outputs: UnknownOutputs,
    ) -> tuple[int, int, int, int]:
        """One worker on ``attempt`` (``run_attempt``), writing through ``writer``."""
        namespace = attempt.table_namespace

        async def rows_of(claim: ShareClaim) -> list[dict[str, Any]]:
            assert claim.first_index is not None and claim.last_index is not None
            part = AdmittedPart(
                attempt.write_version, "unsettled", claim.first_index, claim.last_index
            )
            return await self.admitted_dataset(namespace, part).materialize()

        self.attempt_tally = AttemptTally()
        return await run_attempt(
            attempt,
            self.share_road(namespace),
            rows_of,
            fn,
            complete=writer.complete_mapped,
            fail=writer.fail_mapped,
            concurrency=concurrency,
            batch_rows=batch_rows,
            flush_seconds=flush_seconds,
            lease=self.share_lease,
            total=total,
            once=self.receipts().once_reused if receipts else None,
            progress=progress,
            output_keys=OutputKeys.of(writer.contract),
            unknown_outputs=unknown_outputs,
            tally=self.attempt_tally,
        )

    async def _check_map_actions(self, writer: RowWriter, receipts: bool) -> None:
        """Raise ``GatewayActionMissingError`` before ``map`` admits anything when the
        gateway lacks an action the map would need mid-way: those its terminal writes'
        and its shares' roads send, and the receipt actions with ``receipts``. Asked
        once per client."""
        shares = self.share_road(writer.table_namespace)
        needed = [*writer.actions, *shares.actions]
        if receipts:
            needed.append(m.action_of(m.ClaimWorkReceiptRequest))
        for action in needed:
            if not await self.client.probe_action(action):
                raise GatewayActionMissingError(action, f"map on the {self.context.strategy} road")

    async def resolve_play(self, ref: str) -> ResolvedPlay | None:
        """The play ``ref`` names (its id, else its name) in the run's org, or None.

        Through the gateway, retried on the resolve-play ladder
        (``RESOLVE_PLAY_RETRY_DELAYS_MS``). Another org's plays are never found.
        """
        return await self.plays.resolve_play(checks.text("ref", ref))

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
            fenced_rows=self._tally.fenced_rows,
            sessions_minted=self.sessions.minted,
        )


def _client(
    context: RuntimeContext,
    headers: Mapping[str, str] | None,
    protection_bypass_token: str | None,
) -> GatewayClient:
    """The run's gateway client (``headers`` checked: a mapping of strings to strings)."""
    if headers is not None and not (
        isinstance(headers, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise InvalidInputError("headers must be a mapping of strings to strings")
    return GatewayClient(
        context.base_url,
        context.token,
        base_urls=context.base_urls,
        play_name=context.play_name,
        org_id=context.org_id,
        user_email=context.user_email,
        headers=headers,
        protection_bypass_token=protection_bypass_token,
    )


@asynccontextmanager
async def open_runtime(
    *,
    base_url: str | Sequence[str],
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
    disable_postgres_pool_cache: bool = False,
    protection_bypass_token: str | None = None,
    base_urls: Sequence[str] | None = None,
) -> AsyncIterator[Runtime]:
    """Open a run's data plane: ``async with open_runtime(...) as rt:``.

    ``base_url`` is the gateway's URL, or a sequence of URLs of one deployment
    (``base_urls`` adds more): a call that cannot reach one, or meets one draining,
    tries the next at once, and after a round of them all backs off (capped,
    jittered) within its budget; the client stays on the last URL that answered.

    Every argument is checked before anything connects (``InvalidInputError`` names
    the bad one). ``headers`` go with every gateway request (tests arm faults with
    them). The block owns the gateway client, the session manager (its pools and
    their tasks) and the page reader (its nursery runs every batch read).

    ``protection_bypass_token`` (the runtime's ``vercelProtectionBypassToken``)
    goes with every gateway request as the ``x-vercel-protection-bypass``
    header; it is a secret, kept out of every repr, log and error message.
    ``disable_postgres_pool_cache`` (the runtime's ``disablePostgresPoolCache``)
    opens a pool for each direct-road operation and closes it after, instead of
    keeping one pool per scoped session for the block's lifetime: for hosts
    where a connection must not outlive the request that opened it.

    With ``prewarm`` (the default), every usable preloaded session is opened and
    checked (``SELECT 1``) before the block starts, retrying transient connection
    errors on ``POSTGRES_PREWARM_RETRY_DELAYS_MS``; one that cannot be reached
    raises ``SessionPrewarmError`` naming its identity.

    Leaving the block normally lets queued reads finish, then closes every
    pool and the HTTP client. Leaving it by an exception, or by cancellation,
    cancels queued and running reads (their statements are cancelled on the
    server), closes every pool and the client, and re-raises; an error raised
    in the block comes out as itself, not wrapped in an exception group.
    """
    urls = gateway_urls(base_url, base_urls)
    context = RuntimeContext(
        base_url=urls[0],
        base_urls=urls[1:],
        token=token,
        org_id=org_id,
        play_name=play_name,
        run_id=run_id,
        strategy=strategy,
        preloaded_sessions=preloaded_sessions,
        unwrap_key=unwrap_key,
        user_email=user_email,
    )
    checks.flag("prewarm", prewarm)
    checks.flag("disable_postgres_pool_cache", disable_postgres_pool_cache)
    client = _client(context, headers, protection_bypass_token)
    try:
        async with (
            client,
            SessionManager(
                client,
                preloaded=context.preloaded_sessions,
                unwrap_key=context.unwrap_key,
                cache_pools=not disable_postgres_pool_cache,
            ) as sessions,
            PageReader() as reader,
        ):
            if prewarm:
                await sessions.prewarm()
            yield Runtime(context, client, sessions, reader)
    except BaseExceptionGroup as group:
        raise_single(group)
