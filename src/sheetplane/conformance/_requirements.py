"""The requirements a runtime gateway is judged by: named, numbered, each with its source.

Every requirement quotes the sentence it comes from: the seed runtime's code
(the TypeScript runtime the gateway serves; what its client relies on) or the
gateway documentation (docs/gateway.md, for what sheetplane adds). The order
of :data:`REQUIREMENTS` is the order checks run and the order
``sheetplane conformance --list`` prints; ids never change meaning.

``profile`` says which profile a requirement belongs to: ``seed`` (what the
seed's runtime relies on) or ``sheetplane`` (every action sheetplane adds);
``--profile sheetplane`` runs both. ``slow`` requirements take real time (big
bodies, a stalled body) and are skipped under ``--quick``; ``needs_token_b``
ones need a second org's token (``--token-b``) and are skipped without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import attrs

__all__ = ["PROFILES", "REQUIREMENTS", "Profile", "Requirement", "by_id", "selected"]

Profile = Literal["seed", "sheetplane"]
PROFILES: Final = ("seed", "sheetplane")

_SEED_RUNTIME: Final = "seed runtime-api.ts"
_DOCS: Final = "docs/gateway.md"


@attrs.frozen
class Requirement:
    """One numbered requirement."""

    id: str
    """``SP-<AREA>-<n>``; stable."""
    title: str
    """What a conforming gateway does, in one sentence."""
    source: str
    """The sentence it comes from, quoted, and where."""
    profile: Profile
    """The profile it belongs to."""
    slow: bool = False
    """Takes real time; skipped under ``--quick``."""
    needs_token_b: bool = False
    """Needs a second org's token; skipped without ``--token-b``."""

    def line(self) -> str:
        """Its ``--list`` line: id, profile, title."""
        flags = "".join(
            (" [slow]" if self.slow else "", " [token-b]" if self.needs_token_b else "")
        )
        return f"{self.id} ({self.profile}{flags}): {self.title}"


def _seed(id: str, title: str, sentence: str, **flags: bool) -> Requirement:
    return Requirement(id, title, f"{_SEED_RUNTIME}: {sentence}", "seed", **flags)


def _docs(id: str, title: str, sentence: str, **flags: bool) -> Requirement:
    return Requirement(id, title, f"{_DOCS}: {sentence}", "sheetplane", **flags)


REQUIREMENTS: Final[tuple[Requirement, ...]] = (
    # --- the route, its errors -----------------------------------------------------------
    _seed(
        "SP-AUTH-1",
        "a request without a valid executor token answers 401 with a JSON error body",
        "authorization: Bearer <executor token> ... 401 without a valid token",
    ),
    _seed(
        "SP-ERR-1",
        "an unknown action answers 400 whose error says 'Unsupported runtime data-plane action'",
        "isRuntimeSheetDatasetReadBatchUnsupportedError: "
        "/Unsupported runtime data-plane action/i.test(error.message)",
    ),
    _seed(
        "SP-ERR-2",
        "a malformed request answers 400 with a JSON body whose 'error' is a string",
        "typeof parsed?.error === 'string' ? parsed.error : ... "
        "(errors: a JSON body {error, code?, details?, retry_after_ms?}; "
        "400 for a malformed request)",
    ),
    # --- sheets and admission ------------------------------------------------------------
    _seed(
        "SP-SHEET-1",
        "ensure_sheet answers {ok: true}, and again for a sheet that exists",
        "action: 'ensure_sheet' ... -> {ok: true}",
    ),
    _seed(
        "SP-ADMIT-1",
        "start_sheet_dataset answers inserted, skipped, pendingRows, completedRows, "
        "tableNamespace and writeVersion, counting the rows it inserted",
        "action: 'start_sheet_dataset' -> {inserted, skipped, pendingRows, completedRows, "
        "tableNamespace, writeVersion}",
    ),
    _seed(
        "SP-ADMIT-2",
        "every row of pendingRows carries its key as a string _key, in input order",
        "every row object in pendingRows and completedRows carries its key as _key",
    ),
    _seed(
        "SP-ADMIT-3",
        "a row repeated in one admission is admitted once and counted in skipped",
        "Every admission (start_sheet_dataset) ... dedupe, input order",
    ),
    _seed(
        "SP-ADMIT-4",
        "every admission of a sheet takes a new, greater writeVersion",
        "Every admission takes a new write version, increasing per sheet",
    ),
    # --- reads ---------------------------------------------------------------------------
    _seed(
        "SP-READ-1",
        "runtime_sheet_read_rows answers {rows, limit, offset} echoing the request, "
        "at most limit rows, each a JSON object",
        "action: 'runtime_sheet_read_rows' ... -> { rows: Record<string, unknown>[]; "
        "limit: number; offset: number }",
    ),
    _seed(
        "SP-READ-2",
        "pages read in turn return every admitted row once, in input order",
        "Read order: _input_index ASC NULLS LAST, _created_at ASC, _key ASC",
    ),
    _seed(
        "SP-READ-3",
        "a batch of N pages answers N pages in request order",
        "Runtime dataset batch response must contain ${requestedPages.length} correlated "
        "page result(s).",
    ),
    _seed(
        "SP-READ-4",
        "each batch page echoes its requested limit and offset and holds at most limit "
        "rows, each a JSON object",
        "result.limit !== requested.limit || result.offset !== requested.offset || "
        "result.rows.length > requested.limit -> 'is not correlated to its requested "
        "offset and limit'",
    ),
    _seed(
        "SP-READ-5",
        "a batch page holds exactly the rows a single-page read of the same limit and offset holds",
        "the client then reads page by page with runtime_sheet_read_rows "
        "(the fallback must return the same rows)",
    ),
    _seed(
        "SP-READ-6",
        "a page past the end answers no rows and still echoes its limit and offset",
        "A half that comes back short means the data ended.",
    ),
    _seed(
        "SP-READ-7",
        "a batch of no pages, or of more than 4, is refused 400",
        "RUNTIME_SHEET_READ_BATCH_MAX_PAGES = 4 (runtime_sheet_read_rows_batch: 1-4 pages)",
    ),
    _seed(
        "SP-READ-8",
        "runtime_sheet_read_row_keys answers {keys, limit, offset}: the keys of the same "
        "page of rows, in read order",
        "action: 'runtime_sheet_read_row_keys'; input: "
        "Parameters<typeof readRuntimeSheetDatasetRowKeys>[1]",
    ),
    _seed(
        "SP-READ-9",
        "a read limited to a runId returns only the rows that run admitted",
        "runtime_sheet_read_rows: {input: {tableNamespace, runId?, ...}}; reads can be "
        "limited to one run_id",
    ),
    _seed(
        "SP-READ-10",
        "a batch read over the 12 MiB response budget answers 413 "
        "runtime_sheet_read_batch_too_large with a numeric observed_bytes past the budget",
        "response.status === 413 && parsed?.code === 'runtime_sheet_read_batch_too_large' "
        "-> RuntimeSheetDatasetReadBatchTooLargeError(parsed.observed_bytes)",
    ),
    # --- budgets -------------------------------------------------------------------------
    _seed(
        "SP-BUDGET-1",
        "a batch whose pages hold more than 12 MiB is refused 413 within 30 s",
        "RUNTIME_SHEET_READ_BATCH_MAX_RESPONSE_BYTES = 12 * 1024 * 1024 ... "
        "it is enforced on both sides of the hop",
        slow=True,
    ),
    _seed(
        "SP-BUDGET-2",
        "a request body declared over 16 MiB is refused 413 within 30 s without being read whole",
        "One gateway dataset-read response must fit below the 16 MiB request/response "
        "transport ceiling",
        slow=True,
    ),
    _seed(
        "SP-BUDGET-3",
        "a request whose body stalls is answered or closed within 30 s (REQUEST_TIMEOUT_MS)",
        "const RUNTIME_API_REQUEST_TIMEOUT_MS = 30_000",
        slow=True,
    ),
    _seed(
        "SP-BP-1",
        "a 503 back-pressure answer carries code runtime_postgres_admission_backpressure "
        "and a non-negative integer retry_after_ms, and the request succeeds when retried",
        "response.status === 503 && parsed?.code === 'runtime_postgres_admission_backpressure' "
        "(retried after retry_after_ms)",
    ),
    # --- scoped sessions -----------------------------------------------------------------
    _seed(
        "SP-SESS-1",
        "create_db_session answers expiresAt (ISO 8601, in the future, within the 10 minute "
        "TTL), playName, target, operations, limits, postgres table names and an "
        "encryptedPostgresUrl, never a clear URL when a key was sent",
        "-> {expiresAt, playName, target: {orgId, tableNamespace, logicalTable}, "
        "operations, limits, postgres: {...}, postgresUrl | encryptedPostgresUrl}",
    ),
    _seed(
        "SP-SESS-2",
        "the encryptedPostgresUrl is an RSA-OAEP-256 + A256GCM JWE that decrypts with the "
        "key sent, bound to the session's identity as its additional data",
        "decryptDbSessionPostgresUrlWithPrivateKey({encrypted, ..., "
        "aad: dbSessionPostgresUrlAad(sessionWithoutUrl)})",
    ),
    _seed(
        "SP-SESS-3",
        "the scoped role reads its sheet's table as the session names it",
        "operations: ['rows.read'] ... Direct Postgres sheet IO is required.",
    ),
    _seed(
        "SP-SESS-4",
        "a rows.read role can neither write its sheet's table nor read another sheet's",
        "operations: DbSessionOperation[] (the session's rights are its operations, "
        "on its target only)",
    ),
    _seed(
        "SP-SESS-5",
        "a rows.upsert role can update an output column of its sheet's rows",
        "operations: ['rows.read', 'rows.upsert']",
    ),
    # --- plays ---------------------------------------------------------------------------
    _seed(
        "SP-PLAY-1",
        "resolve_play of a reference no play has answers {play: null}",
        "action: 'resolve_play' (ResolvedPlay | None)",
    ),
    _seed(
        "SP-TENANT-1",
        "another org's token reads none of the rows of a sheet of the same play and namespace",
        "Every action acts on the caller's own org (the token's)",
        needs_token_b=True,
    ),
    # --- sheetplane: terminal writes and fencing -----------------------------------------
    _docs(
        "SP-WRITE-1",
        "runtime_sheet_complete_map_rows at the current writeVersion commits every key "
        "({committedKeys, staleKeys: [], staleRows: [], updated}) and the row reads back enriched",
        "runtime_sheet_complete_map_rows ... -> {committedKeys, staleKeys, staleRows: "
        "[{key, reason, rowVersionStamp}], updated}",
    ),
    _docs(
        "SP-WRITE-2",
        "a write from a stale attempt (an older writeVersion) commits nothing and names "
        "the row stale with reason newer_write_version and the row's version",
        "A stale row is reported with a reason: newer_write_version, older_write_version, "
        "already_terminal ... or unreported",
    ),
    _docs(
        "SP-WRITE-3",
        "a write naming a writeVersion newer than the row's is stale with reason "
        "older_write_version",
        "A stale row is reported with a reason: ... older_write_version",
    ),
    _docs(
        "SP-WRITE-4",
        "a write to a key the sheet does not hold is stale with reason newer_write_version "
        "and a null rowVersionStamp",
        "a terminal write to a sheet never admitted answers every key stale",
    ),
    _docs(
        "SP-WRITE-5",
        "the same completion replayed at the same version is committed again and updates nothing",
        "a replay at the same version with different values (409 write_conflict)",
    ),
    _docs(
        "SP-WRITE-6",
        "a different terminal result at the same version is refused 409 write_conflict "
        "and writes nothing",
        "409 write_conflict: a replay at the same version with different values",
    ),
    _docs(
        "SP-WRITE-7",
        "a write without writeVersion to an enriched row is stale with reason already_terminal",
        "already_terminal (the one benign reason)",
    ),
    _docs(
        "SP-WRITE-8",
        "runtime_sheet_fail_map_rows answers the same shape and the next admission "
        "re-admits the failed row",
        "existing rows that are stale, pending, running or failed are re-admitted",
    ),
    _docs(
        "SP-WRITE-9",
        "an enriched row is not re-admitted: it comes back in completedRows with its _key",
        "an enriched row is not re-admitted, keeps its version, and comes back in completedRows",
    ),
    _docs(
        "SP-SUM-1",
        "runtime_sheet_summary counts {total, queued, running, completed, failed} "
        "as the rows stand",
        "runtime_sheet_summary: {tableNamespace} -> {total, queued, running, completed, failed}",
    ),
    # --- sheetplane: receipts and leases -------------------------------------------------
    _docs(
        "SP-RCPT-1",
        "the first complete_work_receipt of a key answers completionDisposition persisted "
        "and its receipt {key, result, runId, completedAt}",
        "completionDisposition: persisted (this call wrote it)",
    ),
    _docs(
        "SP-RCPT-2",
        "a later completion of the same key answers existing with the first writer's "
        "result and runId",
        "existing (an earlier writer won; its row is returned)",
    ),
    _docs(
        "SP-LEASE-1",
        "claim_work_receipt of a free key answers acquired true, the holder and a future expiresAt",
        "claim_work_receipt: {key, holder} -> {acquired, holder, expiresAt}",
    ),
    _docs(
        "SP-LEASE-2",
        "a claim by another holder while the lease is live answers acquired false naming "
        "the live holder",
        "otherwise acquired: false naming the live holder and its expiresAt",
    ),
    _docs(
        "SP-LEASE-3",
        "a completion with a holder while another holder's lease is live is refused 409 "
        "work_receipt_fenced and writes nothing",
        "with holder, refused 409 work_receipt_fenced (nothing written) while another "
        "holder's unexpired lease owns the key",
    ),
    _docs(
        "SP-LEASE-4",
        "release_work_receipt by the holder answers released true and frees the key for "
        "another holder",
        "release_work_receipt: {released}: gives up holder's lease so the next holder need "
        "not wait for its expiry",
    ),
    _docs(
        "SP-LEASE-5",
        "a claim of completed work answers acquired false with the receipt",
        "on completed work acquired: false, holder/expiresAt null and the receipt",
    ),
    # --- sheetplane: staged admission ----------------------------------------------------
    _docs(
        "SP-STAGE-1",
        "begin, stage and commit admit the staged rows whole, answering the counts, "
        "readable in input order",
        "commit_sheet_admission -> {admissionId, writeVersion, inserted, skipped, "
        "pendingCount, completedCount, tableNamespace}",
    ),
    _docs(
        "SP-STAGE-2",
        "a chunk staged again answers staged false and a commit made again answers the same counts",
        "staged: false for a chunk staged before ... a commit made before answers the same "
        "counts and writes nothing",
    ),
    _docs(
        "SP-STAGE-3",
        "abort answers aborted true for an open admission, false after, and a chunk for "
        "it is then refused 409",
        "abort_sheet_admission -> {aborted}: drops an open admission's staging rows "
        "(false when it was not open)",
    ),
    # --- sheetplane: plays, operating routes ---------------------------------------------
    _docs(
        "SP-PLAY-2",
        "a play registered with register_play resolves by its id and by its name",
        "resolve_play: the token's org's play whose id, else whose name, is playRef",
    ),
    _docs(
        "SP-PLAY-3",
        "another org's token never resolves the play",
        "another org's play is never found",
        needs_token_b=True,
    ),
    _docs(
        "SP-OPS-1",
        "GET /healthz answers 200 and the runtime route's openapi.json is an OpenAPI 3.1 "
        "document naming every action",
        "GET /api/v2/plays/internal/runtime/openapi.json: the OpenAPI 3.1 document",
    ),
    # --- shares of an attempt (many workers) ----------------------------------------------
    _docs(
        "SP-SHARE-1",
        "claim_sheet_share divides an admitted attempt's pending rows into shares in input "
        "order, then answers none naming how many shares are still held",
        "claim_sheet_share: {tableNamespace, writeVersion, holder, leaseToken, ttlMs, maxRows}"
        " -> {outcome, share?, firstIndex?, lastIndex?, takenOver, live, retryAfterMs?}",
    ),
    _docs(
        "SP-SHARE-2",
        "renew_sheet_share answers renewed with the claim's lease token and lost with "
        "another; release_sheet_share of a share whose rows are unwritten leaves it "
        "claimable at once (takenOver true)",
        "a renewal or release needs the share's lease token; a share is done only when "
        "none of its rows is left unsettled",
    ),
    _docs(
        "SP-SHARE-3",
        "after a newer admission, claims and renewals of the older attempt answer superseded",
        "once a newer admission exists, claims and renewals answer superseded",
    ),
    _docs(
        "SP-SHARE-4",
        "sheet_attempt_status counts the attempt's pending, claimed, enriched and failed "
        "rows and the workers holding a live share",
        "sheet_attempt_status: {tableNamespace, writeVersion} -> {pending, claimed, enriched,"
        " failed, workers, superseded}",
    ),
    # --- the model-based phase -----------------------------------------------------------
    _docs(
        "SP-MODEL-1",
        "random sequences of admissions, reads, terminal writes from current and stale "
        "attempts, receipts and claims answer as the reference model "
        "(sheetplane.testing.models) does",
        "Every admission takes a new write version ... Terminal writes carry the admission's "
        "write version ... insert-or-return-the-winner idempotency",
    ),
)

_BY_ID: Final[Mapping[str, Requirement]] = {r.id: r for r in REQUIREMENTS}
assert len(_BY_ID) == len(REQUIREMENTS), "requirement ids are unique"


def by_id(requirement_id: str) -> Requirement:
    """The requirement named ``requirement_id`` (``KeyError`` when none is)."""
    return _BY_ID[requirement_id]


def selected(profile: Profile) -> tuple[Requirement, ...]:
    """The requirements ``--profile profile`` checks, in order."""
    if profile == "seed":
        return tuple(r for r in REQUIREMENTS if r.profile == "seed")
    return REQUIREMENTS
