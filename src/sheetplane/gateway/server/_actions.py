"""The runtime data-plane actions, dispatched from the one exchange table.

Every action is the same three steps: decode the request (its class from
``protocol.EXCHANGES``), call the store, encode the answer (the camelCase
shape docs/protocol.md gives). :data:`STORE_CALLS` holds the last two for
every action that is only that; :data:`OWN_BEHAVIOUR` the few whose steps
differ, each with a line that says why.

A handler raises :class:`ActionError` (or ``InvalidInputError``) for a bad
request; the app turns every error into a JSON body without a stack trace.
Every action acts on the caller's own org (the token's): the sheet is
``SheetRef(org_id, playName, tableNamespace)``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar

import attrs
import psycopg

from ... import _tracing, crypto
from ... import protocol as m
from ..._redact import Redactor
from ..._threads import run_sync
from ..._types import (
    OPERATIONS,
    CompleteRow,
    FailRow,
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
from ...store import JsonPage, SheetStore, StorePlays, StoreReceipts, check_keyed_write
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


@attrs.frozen
class TerminalRead:
    """A complete or fail request as the store takes it: the request (its ``rows``
    left empty when they were read straight from the body) and its rows."""

    request: m.TerminalWriteRequest
    rows: list[CompleteRow] | list[FailRow]


def _read_terminal(
    call: Call,
    cls: type[m.CompleteMapRowsRequest] | type[m.FailMapRowsRequest],
) -> TerminalRead:
    """A terminal write's rows read straight from the decoded body into the store's
    rows, each checked once (``complete_rows_decoded``), and the rest of the request
    through its wire class. A body that is not in that plain form goes the wire
    classes' way whole, and the store checks its rows: the same answer to a bad row."""
    complete = cls is m.CompleteMapRowsRequest
    decoded = m.complete_rows_decoded if complete else m.fail_rows_decoded
    rows = decoded(call.body.get("rows"))
    if rows is not None:
        try:
            return TerminalRead(m.structure({**call.body, "rows": []}, cls), rows)
        except m.WireError:
            pass
    request = _read(call, cls)
    if isinstance(request, m.CompleteMapRowsRequest):
        return TerminalRead(request, m.complete_rows_of(request.rows))
    return TerminalRead(request, m.fail_rows_of(request.rows))


def _sheet(call: Call, play_name: str, table_namespace: str) -> SheetRef:
    return SheetRef(org_id=call.org_id, play_name=play_name, table_namespace=table_namespace)


def _page_body(page: JsonPage) -> bytes:
    return m.page_body(page.rows, page.limit, page.offset)


# --- sheet actions -------------------------------------------------------------------------


async def start_sheet_dataset(call: Call, request: m.StartSheetDatasetRequest) -> dict[str, Any]:
    """Admission: ``{tableNamespace, sheetContract, rows, runId}`` →
    ``{inserted, skipped, pendingRows, completedRows, tableNamespace, writeVersion}``."""
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


# --- reads -----------------------------------------------------------------------------


async def runtime_sheet_read_rows(call: Call, message: m.ReadRowsRequest) -> EncodedAnswer:
    """``{input: {tableNamespace, runId?, rowMode?, limit, offset, after?}}`` →
    ``{rows, limit, offset}``.

    With ``after`` (null, or the ``nextAfter`` of the previous answer) the page
    is read by keyset instead of offset and the answer adds ``nextAfter``
    (null once the sheet has no more rows); a legacy gateway ignores ``after``.
    """
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
        with _tracing.span("sheetplane.session.mint_queue"):  # its tries: the db spans
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


async def create_db_session(call: Call, request: m.CreateDbSessionRequest) -> dict[str, Any]:
    """Mint a scoped Postgres role and answer its URL encrypted to the caller's key.

    ``{target: {tableNamespace, logicalTable}, operations, limits?, sheetContract?,
    ttlSeconds?, userEmail?, postgresUrlEncryption?: {alg, publicKeyJwk}}``.
    """
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


async def stage_sheet_admission_chunk(
    call: Call, request: m.StageAdmissionChunkRequest
) -> dict[str, Any]:
    """``{tableNamespace, sheetContract, admissionId, seq, firstPosition, keys?, rows}`` →
    ``{admissionId, seq, staged}``.

    Rows sent with their keys in a form the store accepts are staged as they
    arrived (``_chunks``); otherwise, or when Postgres refuses them, they are
    read, checked and keyed on a worker thread. A bad row answers 400 naming
    its position in the whole input and aborts the admission (its staging rows
    are dropped). A chunk staged before answers ``staged: false`` and writes
    nothing.
    """
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


# --- the exchange table ---------------------------------------------------------------

#: A store call: the decoded request, and what the store answers.
StoreCall = Callable[[Call, Any], Awaitable[Any]]
#: An answer: the request, the store's result, and the body it is encoded to.
Encode = Callable[[Call, Any, Any], Any]


def _at(call: Call, request: Any) -> SheetRef:
    """The sheet a request names: the caller's org, its play and namespace."""
    return _sheet(call, request.play_name, request.table_namespace)


def _store(call: Call) -> SheetStore:
    return call.state.store


def _receipts(call: Call, request: m.Request) -> StoreReceipts:
    """The receipts of the request's play, in the caller's org."""
    return StoreReceipts(_store(call), call.org_id, request.play_name)


def _plays(call: Call, request: m.Request) -> StorePlays:
    """The play-level operations of the request's play, in the caller's org."""
    return StorePlays(_store(call), call.org_id, request.play_name)


def _terminal(call: Call, _: Any, result: Any) -> dict[str, Any]:
    return m.terminal_write_answer(result, legacy=call.state.config.legacy)


def _counts(_: Call, request: m.CommitAdmissionRequest, counts: Any) -> dict[str, Any]:
    counts = attrs.evolve(counts, table_namespace=request.table_namespace)  # as spelled
    answer = m.CommitAdmissionAnswer(admission_id=request.admission_id, **attrs.asdict(counts))
    return m.unstructure(answer)


async def _register_play(call: Call, request: m.RegisterPlayRequest) -> str:
    definition = play_of(request.play, call.org_id)
    await _plays(call, request).register_play(definition.play, name=definition.name)
    return definition.play.play_id


async def _read_row_keys(call: Call, message: m.ReadRowKeysRequest) -> dict[str, Any]:
    spec = message.input
    (request,) = m.page_batch_of([spec])
    sheet = _sheet(call, message.play_name, spec.table_namespace)
    keys = await _store(call).read_row_keys(sheet, request, which=m.row_filter_of(spec))
    return m.unstructure(
        m.ReadRowKeysAnswer(keys=list(keys), limit=request.limit, offset=request.offset)
    )


async def _keyed_write(
    call: Call, request: m.KeyedWriteRequest, write: Callable[..., Awaitable[Any]], **fields: Any
) -> Any:
    """An append, upsert or replace: the sheet ensured under the request's contract (as
    minting a session for the write ensures it), then ``write`` on it, stamped with the
    request's run."""
    sheet = _at(call, request)
    # Refused before the sheet is ensured, as the store refuses it: a refused write
    # creates nothing.
    await run_sync(
        partial(
            check_keyed_write,
            request.rows,
            idempotency_key=request.idempotency_key,
            run_id=request.run_id,
            key_field=fields.get("key_field"),
            by_key="key_field" in fields,
        )
    )
    await _store(call).ensure_sheet(sheet, m.contract_of(request.sheet_contract))
    return await write(
        sheet,
        request.rows,
        idempotency_key=request.idempotency_key,
        run_id=request.run_id,
        **fields,
    )


def _written(_: Call, __: Any, result: Any) -> dict[str, Any]:
    return m.keyed_write_answer(result)


#: Every action that is only decode, call the store, encode: its request class, the
#: store call, and the answer (docs/protocol.md gives each shape).
STORE_CALLS: Final[Mapping[type[m.Request], tuple[StoreCall, Encode]]] = {
    m.EnsureSheetRequest: (
        lambda c, r: _plays(c, r).ensure_sheet(r.table_namespace, m.contract_of(r.sheet_contract)),
        lambda c, r, _: m.unstructure(m.OkAnswer()),
    ),
    m.SummaryRequest: (
        lambda c, r: _store(c).summary(_at(c, r)),
        lambda c, r, summary: m.summary_answer(summary),
    ),
    # Their rows are read by ``_read_terminal`` (READERS).
    m.CompleteMapRowsRequest: (
        lambda c, t: _store(c).complete_map_rows(
            _at(c, t.request),
            m.contract_of(t.request.sheet_contract),
            t.rows,
            run_id=t.request.run_id,
            write_version=t.request.write_version,
        ),
        _terminal,
    ),
    m.FailMapRowsRequest: (
        lambda c, t: _store(c).fail_map_rows(
            _at(c, t.request),
            m.contract_of(t.request.sheet_contract),
            t.rows,
            run_id=t.request.run_id,
            write_version=t.request.write_version,
        ),
        _terminal,
    ),
    # Keyed writes: a replay of an idempotency key writes nothing (store/_writes.py).
    m.AppendRowsRequest: (
        lambda c, r: _keyed_write(c, r, _store(c).append_rows),
        _written,
    ),
    m.UpsertRowsRequest: (
        lambda c, r: _keyed_write(c, r, _store(c).upsert_rows, key_field=r.key_field),
        _written,
    ),
    m.ReplaceRowsRequest: (
        lambda c, r: _keyed_write(c, r, _store(c).replace_rows),
        _written,
    ),
    m.ReadRowsBatchRequest: (
        lambda c, r: _store(c).read_rows_batch_json(
            _sheet(c, r.play_name, r.input.table_namespace),
            m.page_batch_of(r.input.pages),
            which=m.row_filter_of(r.input),
        ),
        # The envelope the store's budget counted around the pages (protocol/_splice.py).
        lambda c, r, pages: EncodedAnswer(m.pages_body(_page_body(page) for page in pages)),
    ),
    m.ReadRowKeysRequest: (_read_row_keys, lambda c, r, answer: answer),
    # While a live lease owns the key, only its holder with its lease token completes;
    # anyone else is refused 409 work_receipt_fenced and nothing is written.
    m.CompleteWorkReceiptRequest: (
        lambda c, r: _receipts(c, r).complete_work_receipt(
            r.key,
            r.result,
            r.run_id,
            run_attempt=r.run_attempt,
            holder=r.holder,
            lease_token=r.lease_token,
        ),
        lambda c, r, completion: m.receipt_answer(completion),
    ),
    # Takes (or renews, for its holder with its token) the key's lease on the database's
    # clock; the token goes to this caller only, never to anyone the answer names.
    m.ClaimWorkReceiptRequest: (
        lambda c, r: _receipts(c, r).claim_work_receipt(r.key, r.holder, lease_token=r.lease_token),
        lambda c, r, claim: m.claim_answer(claim),
    ),
    m.ReleaseWorkReceiptRequest: (
        lambda c, r: _receipts(c, r).release_work_receipt(r.key, r.holder, r.lease_token),
        lambda c, r, released: m.unstructure(m.ReleaseAnswer(released=released)),
    ),
    # The token's org's play whose id, else whose name, is playRef; never another org's.
    m.ResolvePlayRequest: (
        lambda c, r: _plays(c, r).resolve_play(r.play_ref),
        lambda c, r, play: m.resolved_play_answer(play),
    ),
    m.RegisterPlayRequest: (
        _register_play,
        lambda c, r, play_id: m.unstructure(m.RegisterPlayAnswer(play_id=play_id)),
    ),
    # Registers a staged admission (idempotent), after expiring the sheet's abandoned ones.
    m.BeginAdmissionRequest: (
        lambda c, r: _store(c).begin_admission(
            _at(c, r),
            m.contract_of(r.sheet_contract),
            r.admission_id,
            r.run_id,
            token_id=c.token_id,
        ),
        lambda c, r, _: m.unstructure(
            m.BeginAdmissionAnswer(
                admission_id=r.admission_id,
                chunk_rows=ADMISSION_CHUNK_ROWS,
                chunk_bytes=ADMISSION_CHUNK_BYTES,
            )
        ),
    ),
    # A commit made before answers the same counts.
    m.CommitAdmissionRequest: (
        lambda c, r: _store(c).commit_admission(
            _at(c, r),
            m.contract_of(r.sheet_contract),
            r.admission_id,
            r.run_id,
            chunks=r.chunks,
            rows=r.rows,
        ),
        _counts,
    ),
    m.AbortAdmissionRequest: (
        lambda c, r: _store(c).abort_admission(_at(c, r), r.admission_id),
        lambda c, r, aborted: m.unstructure(m.AbortAdmissionAnswer(aborted=aborted)),
    ),
    # The shares of an attempt (store/_shares.py).
    m.ClaimShareRequest: (
        lambda c, r: _store(c).claim_share(
            _at(c, r),
            r.write_version,
            r.holder,
            r.lease_token,
            ttl_ms=r.ttl_ms,
            max_rows=r.max_rows,
        ),
        lambda c, r, claim: m.share_claim_answer(claim),
    ),
    m.RenewShareRequest: (
        lambda c, r: _store(c).renew_share(
            _at(c, r), r.write_version, r.share, r.lease_token, ttl_ms=r.ttl_ms
        ),
        lambda c, r, renewal: m.share_lease_answer(renewal),
    ),
    m.ReleaseShareRequest: (
        lambda c, r: _store(c).release_share(
            _at(c, r), r.write_version, r.share, r.lease_token, finished=r.finished
        ),
        lambda c, r, released: m.share_lease_answer(released),
    ),
    m.AttemptStatusRequest: (
        lambda c, r: _store(c).attempt_status(_at(c, r), r.write_version),
        lambda c, r, status: m.attempt_status_answer(status),
    ),
}

#: The actions whose steps differ from decode, call the store, encode: each says why.
OWN_BEHAVIOUR: Final[Mapping[type[m.Request], Callable[[Call, Any], Awaitable[Any]]]] = {
    # Ensures the sheet first, and refuses before its commit an answer past the ceiling.
    m.StartSheetDatasetRequest: start_sheet_dataset,
    # A keyset page (``after``) or an offset page, by what the request and gateway allow.
    m.ReadRowsRequest: runtime_sheet_read_rows,
    # Mints a Postgres role and seals its URL to the caller's key: a session, not a store call.
    m.CreateDbSessionRequest: create_db_session,
    # Stages the chunk's bytes as they arrived, and aborts the admission on a bad row.
    m.StageAdmissionChunkRequest: stage_sheet_admission_chunk,
}


#: Actions whose request is read otherwise than whole through its wire class.
READERS: Final[Mapping[type[m.Request], Callable[[Call], Any]]] = {
    m.CompleteMapRowsRequest: partial(_read_terminal, cls=m.CompleteMapRowsRequest),
    m.FailMapRowsRequest: partial(_read_terminal, cls=m.FailMapRowsRequest),
}


def _handler(cls: type[m.Request]) -> Handler:
    """The handler of ``cls``'s action: decode, then its row of the exchange table."""
    own = OWN_BEHAVIOUR.get(cls)
    if own is not None:

        async def behave(call: Call) -> Any:
            return await own(call, _read(call, cls))

        return behave
    store_call, encode = STORE_CALLS[cls]
    read = READERS.get(cls, partial(_read, cls=cls))

    async def exchange(call: Call) -> Any:
        request = read(call)
        return encode(call, request, await store_call(call, request))

    return exchange


#: Every action this gateway answers, by name, from the exchange table.
HANDLERS: Final[Mapping[str, Handler]] = {
    m.action_of(request): _handler(request) for request, _answer in m.EXCHANGES
}
assert not set(STORE_CALLS) & set(OWN_BEHAVIOUR)

#: Actions a legacy gateway (``legacy=True``) does not know.
LEGACY_UNSUPPORTED: Final = frozenset({m.action_of(m.ReadRowsBatchRequest)})
