"""One handler per runtime data-plane action: validate the camelCase request, call
the store, answer the camelCase shape docs/protocol.md gives.

A handler raises :class:`ActionError` (or ``InvalidInputError``) for a bad
request; the app turns every error into a JSON body without a stack trace.
Every action acts on the caller's own org (the token's): the sheet is
``SheetRef(org_id, playName, tableNamespace)``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs
import psycopg

from ... import crypto
from ... import protocol as m
from ..._redact import Redactor
from ..._threads import run_sync
from ..._types import (
    OPERATIONS,
    InlineAdmission,
    LogicalTable,
    Operation,
    SheetContract,
    SheetRef,
    canonical_operations,
)
from ...budgets import (
    ADMISSION_CHUNK_BYTES,
    ADMISSION_CHUNK_ROWS,
    DB_SESSION_CAP_RETRY_AFTER_MS,
    TRANSPORT_CEILING_BYTES,
)
from ...errors import AdmissionTooLargeError, InvalidInputError, StoreError
from ...protocol import SERVED_LOGICAL_TABLES, UNSUPPORTED_ACTION_TEXT, Code, EncodedChunk
from ...sizes import json_byte_length_up_to
from ...store import JsonPage, SheetStore
from ..faults import FaultSchedule
from ._auth import TokenTable
from ._chunks import checked_chunk, chunk_of
from ._config import GatewayConfig
from ._http import ActionError, EncodedAnswer, bad_request
from ._metrics import GatewayMetrics
from ._mintqueue import MintQueues
from ._plays import play_of
from ._roles import (
    MintedRole,
    SessionCapReachedError,
    SessionCaps,
    create_session_role,
    scoped_url,
)
from ._watchdog import ReaperProgress

__all__ = ["HANDLERS", "Call", "GatewayState", "mint_preloaded_session", "unsupported"]

_MS_PER_SECOND: Final = 1_000


@attrs.define(eq=False)
class GatewayState:
    """What one running gateway holds: its config, store, tokens, faults and reaper."""

    config: GatewayConfig
    store: SheetStore
    tokens: TokenTable
    faults: FaultSchedule
    reaper: ReaperProgress
    metrics: GatewayMetrics = attrs.field(factory=GatewayMetrics)
    """The gateway's Prometheus metrics: count with ``call.state.metrics.<name>``."""
    redact: Redactor = attrs.field(factory=Redactor)
    """What a logged text passes through: the gateway's secrets removed (``Operations``)."""
    caps: SessionCaps = attrs.field(factory=SessionCaps)
    """The session caps in force, the org connection budget resolved at startup."""
    mint_queues: MintQueues = attrs.field(factory=MintQueues)
    """Mints waiting for room in their org's connection budget, one fair queue per org."""


@attrs.frozen
class Call:
    """One authenticated request."""

    state: GatewayState
    org_id: str
    """The token's org."""
    body: Mapping[str, Any]
    """The parsed JSON body."""
    token_id: str | None = None
    """The token's id in the session ledger (never the token itself)."""
    undecoded: Mapping[str, bytes] | None = None
    """A staged chunk's ``rows`` and ``keys`` arrays as they arrived (``_chunks``)."""


Handler = Callable[[Call], Awaitable[Any]]


def unsupported(action: str) -> ActionError:
    """The answer of a gateway that does not know ``action``."""
    return ActionError(400, Code.UNSUPPORTED_ACTION, f"{UNSUPPORTED_ACTION_TEXT}: {action}")


# --- request parsing: the wire classes ----------------------------------------------------

R = TypeVar("R", bound=m.Request)


def _read(call: Call, cls: type[R]) -> R:
    """The request as ``cls`` (400 naming the bad member otherwise)."""
    try:
        return m.structure(call.body, cls)
    except m.WireError as exc:
        raise bad_request(str(exc)) from None


def _sheet(call: Call, play_name: str, table_namespace: str) -> SheetRef:
    return SheetRef(org_id=call.org_id, play_name=play_name, table_namespace=table_namespace)


def _page_body(page: JsonPage) -> bytes:
    return m.page_body(page.rows, page.limit, page.offset)


# --- sheet actions -------------------------------------------------------------------------


async def ensure_sheet(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract?, userEmail?}`` → ``{ok: true}``."""
    request = _read(call, m.EnsureSheetRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    await call.state.store.ensure_sheet(sheet, m.contract_of(request.sheet_contract))
    return m.unstructure(m.OkAnswer())


async def start_sheet_dataset(call: Call) -> dict[str, Any]:
    """Admission: ``{tableNamespace, sheetContract, rows, runId}`` →
    ``{inserted, skipped, pendingRows, completedRows, tableNamespace, writeVersion}``."""
    request = _read(call, m.StartSheetDatasetRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    contract = m.contract_of(request.sheet_contract)
    store = call.state.store
    await store.ensure_sheet(sheet, contract)

    def answer(admission: InlineAdmission) -> dict[str, Any]:
        # The namespace as the request spelled it, as the runtime answers its input's.
        return m.admission_answer(attrs.evolve(admission, table_namespace=request.table_namespace))

    admission = await store.start_dataset(
        sheet,
        request.rows,
        request.run_id,
        contract,
        check=lambda admission: _fits_one_answer(answer(admission)),
    )
    call.state.metrics.admissions.inc()
    return answer(admission)


def _fits_one_answer(answer: dict[str, Any]) -> None:
    """Refuse, before the commit, an admission whose answer would pass the ceiling.

    Runs inside the admission's transaction: ``AdmissionTooLargeError`` rolls
    it back, so the caller is never told "too large" about rows that were
    committed anyway. The answer is measured as the compact JSON the app
    sends, stopping at the ceiling.
    """
    measured = json_byte_length_up_to(answer, TRANSPORT_CEILING_BYTES)
    if measured.exceeded:
        raise AdmissionTooLargeError(measured.bytes)


async def runtime_sheet_complete_map_rows(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, runId, writeVersion?, rows: [{key, data,
    cellMetaPatch?}]}`` → ``{committedKeys, staleKeys, staleRows, updated}``."""
    request = _read(call, m.CompleteMapRowsRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    rows = m.complete_rows_of(request.rows)
    result = await call.state.store.complete_map_rows(
        sheet,
        m.contract_of(request.sheet_contract),
        rows,
        run_id=request.run_id,
        write_version=request.write_version,
    )
    return m.terminal_write_answer(result, legacy=call.state.config.legacy)


async def runtime_sheet_fail_map_rows(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, runId, writeVersion?, rows: [{key, error,
    data?}]}`` → the same shape as complete."""
    request = _read(call, m.FailMapRowsRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    rows = m.fail_rows_of(request.rows)
    result = await call.state.store.fail_map_rows(
        sheet,
        m.contract_of(request.sheet_contract),
        rows,
        run_id=request.run_id,
        write_version=request.write_version,
    )
    return m.terminal_write_answer(result, legacy=call.state.config.legacy)


async def runtime_sheet_summary(call: Call) -> dict[str, Any]:
    """``{tableNamespace}`` → ``{total, queued, running, completed, failed}``."""
    request = _read(call, m.SummaryRequest)
    summary = await call.state.store.summary(
        _sheet(call, request.play_name, request.table_namespace)
    )
    return m.summary_answer(summary)


async def complete_work_receipt(call: Call) -> dict[str, Any]:
    """``{key, result, runId, runAttempt?, holder?, leaseToken?}`` →
    ``{receipt: {key, result, runId, completedAt}, completionDisposition}``.

    While a live lease owns the key, only its holder with its lease token
    completes; anyone else is refused 409 ``work_receipt_fenced`` and nothing
    is written.
    """
    request = _read(call, m.CompleteWorkReceiptRequest)
    completion = await call.state.store.complete_work_receipt(
        call.org_id,
        request.play_name,
        request.key,
        request.result,
        request.run_id,
        run_attempt=request.run_attempt,
        holder=request.holder,
        lease_token=request.lease_token,
    )
    return m.receipt_answer(completion)


async def claim_work_receipt(call: Call) -> dict[str, Any]:
    """``{key, holder, leaseToken?}`` → ``{acquired, holder, expiresAt, receipt?, leaseToken?}``.

    Takes (or renews, for the same holder with its lease token) the key's lease
    for ``WORK_RECEIPT_LEASE_TTL_MS`` on the database's clock; acquired, the
    answer carries the lease token, to this caller only. Not acquired while
    another live lease holds the key (``holder``/``expiresAt`` name it, never
    its token) or once the work is completed (``receipt`` is the completed
    receipt; ``holder`` and ``expiresAt`` are null).
    """
    request = _read(call, m.ClaimWorkReceiptRequest)
    claim = await call.state.store.claim_work_receipt(
        call.org_id,
        request.play_name,
        request.key,
        request.holder,
        lease_token=request.lease_token,
    )
    return m.claim_answer(claim)


async def release_work_receipt(call: Call) -> dict[str, Any]:
    """``{key, holder, leaseToken}`` → ``{released}``: gives up ``holder``'s lease so
    another holder need not wait for it to expire (false when ``holder`` held none
    with that token)."""
    request = _read(call, m.ReleaseWorkReceiptRequest)
    released = await call.state.store.release_work_receipt(
        call.org_id, request.play_name, request.key, request.holder, request.lease_token
    )
    return m.unstructure(m.ReleaseAnswer(released=released))


# --- plays ---------------------------------------------------------------------------


async def resolve_play(call: Call) -> dict[str, Any]:
    """``{playRef}`` → ``{play: {playId, sourceCode, artifact, codeFormat,
    contractSnapshot} | null}``: the token's org's play whose id, else whose
    name, is ``playRef``. Another org's play is never found."""
    request = _read(call, m.ResolvePlayRequest)
    play = await call.state.store.resolve_play(call.org_id, request.play_ref)
    return m.resolved_play_answer(play)


async def register_play(call: Call) -> dict[str, Any]:
    """``{play: {playId, name?, sourceCode?, artifact?, codeFormat?, contractSnapshot?}}``
    → ``{playId}``: registers (or replaces) a play of the token's org."""
    request = _read(call, m.RegisterPlayRequest)
    definition = play_of(request.play, call.org_id)
    await call.state.store.register_play(call.org_id, definition.play, name=definition.name)
    return m.unstructure(m.RegisterPlayAnswer(play_id=definition.play.play_id))


# --- reads -----------------------------------------------------------------------------


async def runtime_sheet_read_rows(call: Call) -> EncodedAnswer:
    """``{input: {tableNamespace, runId?, rowMode?, limit, offset, after?}}`` →
    ``{rows, limit, offset}``.

    With ``after`` (null, or the ``nextAfter`` of the previous answer) the page
    is read by keyset instead of offset and the answer adds ``nextAfter``
    (null once the sheet has no more rows); a legacy gateway ignores ``after``.
    """
    message = _read(call, m.ReadRowsRequest)
    spec = message.input
    sheet = _sheet(call, message.play_name, spec.table_namespace)
    pages = m.page_batch_of([spec])
    (request,) = pages
    store = call.state.store
    which = m.row_filter_of(spec)
    if spec.after is m.ABSENT or call.state.config.legacy:
        (page,) = await store.read_rows_batch_json(sheet, pages, which=which)
        return EncodedAnswer(_page_body(page))
    try:
        cursor = m.row_cursor_of(spec.after)
    except m.WireError as exc:
        raise bad_request(str(exc)) from None
    # The store measures the rows as Postgres writes them and raises
    # ReadBatchTooLargeError (answered 413) past READ_BATCH_MAX_RESPONSE_BYTES.
    rows, next_cursor = await store.read_rows_after_json(sheet, cursor, request, which=which)
    next_after = m.row_cursor_wire(next_cursor)
    return EncodedAnswer(m.page_body(rows, request.limit, request.offset, next_after=next_after))


async def runtime_sheet_read_rows_batch(call: Call) -> EncodedAnswer:
    """``{input: {tableNamespace, runId?, rowMode?, pages: [{limit, offset}]}}`` →
    ``{pages: [{rows, limit, offset}]}``, positional; 413 over the response budget."""
    message = _read(call, m.ReadRowsBatchRequest)
    spec = message.input
    sheet = _sheet(call, message.play_name, spec.table_namespace)
    pages = await call.state.store.read_rows_batch_json(
        sheet, m.page_batch_of(spec.pages), which=m.row_filter_of(spec)
    )
    # The envelope the store's budget counted around the pages (protocol/_splice.py).
    return EncodedAnswer(m.pages_body(_page_body(page) for page in pages))


async def runtime_sheet_read_row_keys(call: Call) -> dict[str, Any]:
    """``{input: {tableNamespace, runId?, limit, offset}}`` → ``{keys, limit, offset}``."""
    message = _read(call, m.ReadRowKeysRequest)
    spec = message.input
    sheet = _sheet(call, message.play_name, spec.table_namespace)
    (request,) = m.page_batch_of([spec])
    keys = await call.state.store.read_row_keys(sheet, request, which=m.row_filter_of(spec))
    answer = m.ReadRowKeysAnswer(keys=list(keys), limit=request.limit, offset=request.offset)
    return m.unstructure(answer)


# --- scoped sessions -------------------------------------------------------------------------


def _ttl_ms(ttl_seconds: float | None, ceiling_ms: int) -> int:
    """The session's lifetime: what was asked for, at most the ceiling. Compared in
    seconds first: a large value times 1000 may not be an exact integer."""
    if ttl_seconds is None or ttl_seconds >= ceiling_ms / _MS_PER_SECOND:
        return ceiling_ms
    return int(ttl_seconds * _MS_PER_SECOND)


@attrs.frozen
class _Minted:
    answer: m.CreateDbSessionAnswer
    """The answer without its URL (neither ``postgresUrl`` nor the envelope yet)."""
    url: str = attrs.field(repr=False)
    aad: bytes


async def _mint(
    state: GatewayState,
    sheet: SheetRef,
    logical_table: LogicalTable,
    operations: Sequence[Operation],
    limits: m.SessionLimitsWire,
    contract: SheetContract,
    ttl_ms: int,
    token_id: str | None = None,
    *,
    as_asked: tuple[str, str],
) -> _Minted:
    """Ensure the sheet, create its scoped role, and build the answer without a URL.

    The answer (and the AAD its URL is sealed with) names the play and the
    namespace ``as_asked``, as the request spelled them: the role is the
    normalised ``sheet``'s, and a caller that matches sessions by the names it
    sent (the runtime compares the play name exactly) finds its own.

    429 (nothing created) when the org or the token holds its cap of live sessions.
    """
    play_name, table_namespace = as_asked
    await state.store.ensure_sheet(sheet, contract)
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=ttl_ms)

    async def attempt() -> MintedRole:
        return await create_session_role(
            state.store,
            sheet,
            operations,
            expires,
            bounds=state.config.session_bounds(),
            caps=state.caps,
            token_id=token_id,
        )

    try:
        # Past the org's connection budget the mint waits its turn in the org's
        # queue (reclaiming idle roles) rather than answering 429 at once.
        minted = await state.mint_queues.mint(sheet.org_id, attempt)
    except SessionCapReachedError as exc:
        raise ActionError(
            429, Code.SESSION_CAP, str(exc), retry_after_ms=DB_SESSION_CAP_RETRY_AFTER_MS
        ) from None
    state.metrics.sessions_minted.inc()
    answer = m.CreateDbSessionAnswer(
        expires_at=minted.expires_at,
        play_name=play_name,
        target=m.SessionTargetAnswer(
            org_id=sheet.org_id,
            table_namespace=table_namespace,
            logical_table=logical_table,
        ),
        operations=list(minted.operations),
        limits=m.copy_fields(limits, m.SessionLimitsAnswer),
        postgres=m.copy_fields(minted.names, m.PostgresTablesWire),
    )
    aad = crypto.session_aad(
        org_id=sheet.org_id,
        play_name=play_name,
        table_namespace=table_namespace,
        logical_table=logical_table,
        operations=minted.operations,
        expires_at=minted.expires_at,
    )
    url = scoped_url(state.config.database_url, minted.role, minted.password)
    return _Minted(answer, url, aad)


async def create_db_session(call: Call) -> dict[str, Any]:
    """Mint a scoped Postgres role and answer its URL encrypted to the caller's key.

    ``{target: {tableNamespace, logicalTable}, operations, limits?, sheetContract?,
    ttlSeconds?, userEmail?, postgresUrlEncryption?: {alg, publicKeyJwk}}``.
    """
    request = _read(call, m.CreateDbSessionRequest)
    target = request.target
    sheet = _sheet(call, request.play_name, target.table_namespace)
    logical_table = target.logical_table
    if logical_table not in SERVED_LOGICAL_TABLES:
        raise bad_request(f"target.logicalTable must be one of {list(SERVED_LOGICAL_TABLES)}")
    operations = canonical_operations(request.operations)
    assert operations  # the wire class allows only operations, at least one
    limits = m.SessionLimitsWire() if request.limits is None else request.limits
    contract = m.contract_of(request.sheet_contract)
    ttl_ms = _ttl_ms(request.ttl_seconds, call.state.config.session_ttl_ms)
    encryption = request.postgres_url_encryption
    if encryption is not None:
        # Check the key before a role exists for it (InvalidInputError → 400).
        crypto.check_public_jwk(encryption.public_key_jwk)
    elif not call.state.config.allow_plain_session_urls:
        raise ActionError(
            400,
            Code.ENCRYPTION_REQUIRED,
            "postgresUrlEncryption is required: "
            "this gateway never sends a Postgres URL in the clear",
        )
    minted = await _mint(
        call.state,
        sheet,
        logical_table,
        operations,
        limits,
        contract,
        ttl_ms,
        call.token_id,
        as_asked=(request.play_name, target.table_namespace),
    )
    if encryption is None:
        return m.unstructure(attrs.evolve(minted.answer, postgres_url=minted.url))
    envelope = crypto.encrypt_postgres_url(minted.url, encryption.public_key_jwk, minted.aad)
    return _sealed_answer(minted, envelope)


def _sealed_answer(minted: _Minted, envelope: Mapping[str, str]) -> dict[str, Any]:
    """The answer with its URL sealed in ``envelope`` (a flattened JWE)."""
    sealed = m.EnvelopeWire(**envelope)
    return m.unstructure(attrs.evolve(minted.answer, encrypted_postgres_url=sealed))


async def mint_preloaded_session(
    state: GatewayState,
    *,
    org_id: str,
    play_name: str,
    table_namespace: str,
    operations: Sequence[str],
    logical_table: LogicalTable = "sheet_rows",
    limits: Mapping[str, int] | None = None,
    contract: SheetContract | None = None,
    ttl_ms: int | None = None,
) -> dict[str, Any]:
    """A ``create_db_session`` answer minted ahead of a run (the harness path).

    Its ``encryptedPostgresUrl`` is sealed under the gateway's symmetric
    ``unwrap_key`` (JWE ``A256KW`` + ``A256GCM``) with the same AAD as a normal
    session, so a runner holding that key can open it. Raises
    ``InvalidInputError`` when the gateway has no unwrap key.
    """
    key = state.config.unwrap_key
    if key is None:
        raise InvalidInputError("this gateway has no unwrap key for preloaded sessions")
    if logical_table not in SERVED_LOGICAL_TABLES:
        raise InvalidInputError(f"logical_table must be one of {list(SERVED_LOGICAL_TABLES)}")
    ops = canonical_operations(operations)
    if not ops:
        raise InvalidInputError(f"operations must be drawn from {list(OPERATIONS)}")
    try:
        wire_limits = m.structure(dict(limits or {}), m.SessionLimitsWire)
    except m.WireError as exc:
        raise InvalidInputError(f"limits: {exc}") from None
    ceiling = state.config.session_ttl_ms
    sheet = SheetRef(org_id=org_id, play_name=play_name, table_namespace=table_namespace)
    minted = await _mint(
        state,
        sheet,
        logical_table,
        ops,
        wire_limits,
        contract or SheetContract(),
        ceiling if ttl_ms is None else min(ttl_ms, ceiling),
        as_asked=(play_name, table_namespace),
    )
    return _sealed_answer(minted, crypto.encrypt_with_unwrap_key(minted.url, key, minted.aad))


# --- staged admission ---------------------------------------------------------------


async def begin_sheet_admission(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, admissionId, runId, userEmail?}`` →
    ``{admissionId, chunkRows, chunkBytes}``: registers a staged admission
    (idempotent), after expiring the sheet's abandoned ones."""
    request = _read(call, m.BeginAdmissionRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    contract = m.contract_of(request.sheet_contract)
    await call.state.store.begin_admission(
        sheet, contract, request.admission_id, request.run_id, token_id=call.token_id
    )
    return m.unstructure(
        m.BeginAdmissionAnswer(
            admission_id=request.admission_id,
            chunk_rows=ADMISSION_CHUNK_ROWS,
            chunk_bytes=ADMISSION_CHUNK_BYTES,
        )
    )


async def stage_sheet_admission_chunk(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, admissionId, seq, firstPosition, keys?, rows}`` →
    ``{admissionId, seq, staged}``.

    Rows sent with their keys in a form the store accepts are staged as they
    arrived (``_chunks``); otherwise, or when Postgres refuses them, they are
    read, checked and keyed on a worker thread. A bad row answers 400 naming
    its position in the whole input and aborts the admission (its staging rows
    are dropped). A chunk staged before answers ``staged: false`` and writes
    nothing.
    """
    request = _read(call, m.StageAdmissionChunkRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    store = call.state.store

    async def stage(chunk: EncodedChunk) -> bool:
        return await store.stage_chunk(
            sheet, request.admission_id, request.seq, request.first_position, chunk
        )

    try:
        chunk, as_sent = await run_sync(
            chunk_of, request.rows, request.keys, call.undecoded, request.first_position
        )
        try:
            staged = await stage(chunk)
        except StoreError as exc:
            if not as_sent or not isinstance(exc.__cause__, _REFUSED_AS_SENT):
                raise
            # Postgres refused the rows as sent: read them, to stage them or name the bad one.
            chunk = await run_sync(
                checked_chunk, request.rows, request.keys, request.first_position
            )
            staged = await stage(chunk)
    except InvalidInputError:
        await store.abort_admission(sheet, request.admission_id)
        raise
    return m.unstructure(
        m.StageAdmissionChunkAnswer(
            admission_id=request.admission_id, seq=request.seq, staged=staged
        )
    )


#: What Postgres answers rows sent in a form it does not store: bad JSON, text it cannot
#: hold, a staging-table check (an array of objects and of non-empty string keys).
_REFUSED_AS_SENT: Final = (psycopg.errors.DataError, psycopg.errors.CheckViolation)


async def commit_sheet_admission(call: Call) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, admissionId, runId, chunks, rows}`` →
    ``{admissionId, writeVersion, inserted, skipped, pendingCount, completedCount,
    tableNamespace}``; a commit made before answers the same counts."""
    request = _read(call, m.CommitAdmissionRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    counts = await call.state.store.commit_admission(
        sheet,
        m.contract_of(request.sheet_contract),
        request.admission_id,
        request.run_id,
        chunks=request.chunks,
        rows=request.rows,
    )
    counts = attrs.evolve(counts, table_namespace=request.table_namespace)  # as spelled
    return m.unstructure(
        m.CommitAdmissionAnswer(admission_id=request.admission_id, **attrs.asdict(counts))
    )


async def abort_sheet_admission(call: Call) -> dict[str, Any]:
    """``{tableNamespace, admissionId}`` → ``{aborted}``: drops an open admission's
    staging rows (False when it was not open)."""
    request = _read(call, m.AbortAdmissionRequest)
    sheet = _sheet(call, request.play_name, request.table_namespace)
    aborted = await call.state.store.abort_admission(sheet, request.admission_id)
    return m.unstructure(m.AbortAdmissionAnswer(aborted=aborted))


# --- shares of an attempt (store/_shares.py) ------------------------------------------


async def claim_sheet_share(call: Call) -> dict[str, Any]:
    """``{tableNamespace, writeVersion, holder, leaseToken, ttlMs, maxRows}`` →
    ``{outcome, share?, firstIndex?, lastIndex?, takenOver, live, retryAfterMs?}``: a
    share of the attempt's pending rows under a lease of ``ttlMs`` on the database's
    clock; ``none`` when every share is held or done, ``superseded`` once a newer
    admission owns the rows. 400 when the sheet has no admission at ``writeVersion``."""
    request = _read(call, m.ClaimShareRequest)
    claim = await call.state.store.claim_share(
        _sheet(call, request.play_name, request.table_namespace),
        request.write_version,
        request.holder,
        request.lease_token,
        ttl_ms=request.ttl_ms,
        max_rows=request.max_rows,
    )
    return m.share_claim_answer(claim)


async def renew_sheet_share(call: Call) -> dict[str, Any]:
    """``{tableNamespace, writeVersion, share, leaseToken, ttlMs}`` → ``{outcome}``:
    ``renewed``, ``lost`` (not this token's share any more) or ``superseded``."""
    request = _read(call, m.RenewShareRequest)
    renewal = await call.state.store.renew_share(
        _sheet(call, request.play_name, request.table_namespace),
        request.write_version,
        request.share,
        request.lease_token,
        ttl_ms=request.ttl_ms,
    )
    return m.share_lease_answer(renewal)


async def release_sheet_share(call: Call) -> dict[str, Any]:
    """``{tableNamespace, writeVersion, share, leaseToken, finished}`` → ``{outcome}``:
    ``released`` (done when ``finished`` and none of its rows is left unsettled,
    otherwise free for another claim at once) or ``lost``."""
    request = _read(call, m.ReleaseShareRequest)
    released = await call.state.store.release_share(
        _sheet(call, request.play_name, request.table_namespace),
        request.write_version,
        request.share,
        request.lease_token,
        finished=request.finished,
    )
    return m.share_lease_answer(released)


async def sheet_attempt_status(call: Call) -> dict[str, Any]:
    """``{tableNamespace, writeVersion}`` → ``{pending, claimed, enriched, failed,
    workers, superseded}``."""
    request = _read(call, m.AttemptStatusRequest)
    status = await call.state.store.attempt_status(
        _sheet(call, request.play_name, request.table_namespace), request.write_version
    )
    return m.attempt_status_answer(status)


#: Every action this gateway answers, by name (each request class names its action).
HANDLERS: Final[Mapping[str, Handler]] = {
    m.action_of(request): handler
    for request, handler in (
        (m.EnsureSheetRequest, ensure_sheet),
        (m.StartSheetDatasetRequest, start_sheet_dataset),
        (m.CreateDbSessionRequest, create_db_session),
        (m.ReadRowsRequest, runtime_sheet_read_rows),
        (m.ReadRowsBatchRequest, runtime_sheet_read_rows_batch),
        (m.ReadRowKeysRequest, runtime_sheet_read_row_keys),
        (m.CompleteMapRowsRequest, runtime_sheet_complete_map_rows),
        (m.FailMapRowsRequest, runtime_sheet_fail_map_rows),
        (m.CompleteWorkReceiptRequest, complete_work_receipt),
        (m.ClaimWorkReceiptRequest, claim_work_receipt),
        (m.ReleaseWorkReceiptRequest, release_work_receipt),
        (m.ResolvePlayRequest, resolve_play),
        (m.RegisterPlayRequest, register_play),
        (m.SummaryRequest, runtime_sheet_summary),
        (m.BeginAdmissionRequest, begin_sheet_admission),
        (m.StageAdmissionChunkRequest, stage_sheet_admission_chunk),
        (m.CommitAdmissionRequest, commit_sheet_admission),
        (m.AbortAdmissionRequest, abort_sheet_admission),
        (m.ClaimShareRequest, claim_sheet_share),
        (m.RenewShareRequest, renew_sheet_share),
        (m.ReleaseShareRequest, release_sheet_share),
        (m.AttemptStatusRequest, sheet_attempt_status),
    )
}
assert set(HANDLERS) == set(m.ACTIONS), set(m.ACTIONS) ^ set(HANDLERS)

#: Actions a legacy gateway (``legacy=True``) does not know.
LEGACY_UNSUPPORTED: Final = frozenset({m.action_of(m.ReadRowsBatchRequest)})
