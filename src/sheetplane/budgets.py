"""Every size, time and lease budget of sheetplane, derived by visible arithmetic.

Durations are integer milliseconds (``_MS``); sizes are bytes (``_BYTES``).
Later modules import these names and never write a literal duration or size
of their own. The relations between budgets are asserted at import time (see
the bottom of this module) and exercised again by the property suite, so a
change that breaks one fails loudly instead of producing a call that can
outlive the lease or session it runs under.

``docs/budgets.md`` explains each value and why it was chosen.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB

# --- One gateway call ------------------------------------------------------

#: Per-attempt timeout of one gateway request: connect, send, and read the
#: whole body. Applied with ``trio.fail_after`` around the attempt, because
#: httpx's own timeouts are per network operation.
REQUEST_TIMEOUT_MS: Final = 30_000

#: Delays between attempts of one gateway call: a doubling ladder, so a call
#: makes ``len(RETRY_DELAYS_MS) + 1`` attempts at most.
RETRY_DELAYS_MS: Final = (250, 500, 1_000, 2_000)

#: Attempts one gateway call may make.
MAX_ATTEMPTS: Final = len(RETRY_DELAYS_MS) + 1

#: Retry-After used for back-pressure answers that carry none.
DEFAULT_RETRY_AFTER_MS: Final = RETRY_DELAYS_MS[-1]

#: The largest server-sent Retry-After honoured between two attempts. Larger
#: values are clamped to this, and every wait is clamped again to what remains
#: of the call's budget, so a server cannot stretch a call past
#: ``CALL_BUDGET_MS``.
MAX_RETRY_AFTER_MS: Final = 2 * RETRY_DELAYS_MS[-1]

#: The whole budget of one gateway call: every attempt at its timeout plus
#: every ladder delay between them.
CALL_BUDGET_MS: Final = REQUEST_TIMEOUT_MS * MAX_ATTEMPTS + sum(RETRY_DELAYS_MS)

#: A gateway call that cannot reach a gateway (refused, reset, DNS) does not
#: spend its ladder: a refused connect fails at once, so five attempts were
#: gone in 3.8 s while a restarted gateway needs a few. It tries every URL it
#: was given in turn, then waits a back-off that starts at the ladder's first
#: delay and doubles, capped at its last, each wait drawn between half and the
#: whole of that ("equal jitter", so a fleet's runners do not retry in step),
#: until the call's whole budget is spent.
GATEWAY_RECONNECT_BASE_MS: Final = RETRY_DELAYS_MS[0]
GATEWAY_RECONNECT_CAP_MS: Final = RETRY_DELAYS_MS[-1]

#: The longest a TCP connect to a gateway that has never answered this client
#: may take (an unreachable host drops the SYN instead of refusing it): a live
#: gateway's connect takes milliseconds, and this holds the kernel's first SYN
#: retransmissions (1 s, then 3 s), as Postgres' connect timeout does.
GATEWAY_FIRST_CONNECT_TIMEOUT_MS: Final = 5_000

#: A client none of whose gateway URLs has ever answered (refused, DNS,
#: unreachable) fails a call after this, with ``GatewayUnreachableError`` naming
#: the URLs and what was tried, instead of spending the whole ``CALL_BUDGET_MS``
#: on what is most likely a wrong URL: one connect at its timeout plus the
#: reconnect back-off's waits doubling up to its cap (the ladder's delays), so a
#: gateway started a few seconds after its runner is still met. Once any URL has
#: answered, the reconnect rules above hold for the client's life.
GATEWAY_FIRST_CONTACT_BUDGET_MS: Final = GATEWAY_FIRST_CONNECT_TIMEOUT_MS + sum(RETRY_DELAYS_MS)

#: The ladder of ``resolve_play``, the first call of a run, made while a gateway
#: may still be starting: the call ladder's doubling carried two rungs further.
#: (The runtime this re-creates names its own resolve-play ladder,
#: ``RUNTIME_API_RESOLVE_PLAY_RETRY_DELAYS_MS``, whose values lie outside the
#: seed's diff; these are this library's choice.)
RESOLVE_PLAY_RETRY_DELAYS_MS: Final = (
    *RETRY_DELAYS_MS,
    2 * RETRY_DELAYS_MS[-1],
    4 * RETRY_DELAYS_MS[-1],
)

#: The whole budget of one ``resolve_play`` call, by the same arithmetic.
RESOLVE_PLAY_CALL_BUDGET_MS: Final = REQUEST_TIMEOUT_MS * (
    len(RESOLVE_PLAY_RETRY_DELAYS_MS) + 1
) + sum(RESOLVE_PLAY_RETRY_DELAYS_MS)

#: The longest a value may wait in a ``BoundedBatchFunction`` lane before its
#: batch starts: one whole call budget. A lane that cannot start a batch in
#: that time is wedged, and its callers get ``LaneWedgedError``.
MAX_QUEUE_WAIT_MS: Final = REQUEST_TIMEOUT_MS * (len(RETRY_DELAYS_MS) + 1) + sum(RETRY_DELAYS_MS)

# --- Response sizes ----------------------------------------------------------

#: What one HTTP response may carry on this platform's transport.
TRANSPORT_CEILING_BYTES: Final = 16 * MiB

#: Decoded bytes a batch read may answer. The rest of the transport ceiling is
#: left for the envelope (page wrappers, echoed limits and offsets, headers).
READ_BATCH_MAX_RESPONSE_BYTES: Final = 12 * MiB

#: Room left under the transport ceiling for everything that is not row data.
RESPONSE_ENVELOPE_HEADROOM_BYTES: Final = TRANSPORT_CEILING_BYTES - READ_BATCH_MAX_RESPONSE_BYTES

#: Decoded bytes any other gateway action may answer.
ACTION_MAX_RESPONSE_BYTES: Final = TRANSPORT_CEILING_BYTES

#: The largest input row a write accepts, as compact JSON. A row must fit in
#: one page read with room to spare: half the batch-read budget is left for
#: the outputs a map writes beside it and the system fields a read adds.
MAX_ROW_BYTES: Final = READ_BATCH_MAX_RESPONSE_BYTES // 2

#: Longest row key (and idempotency key), in UTF-8 bytes. Chosen under
#: Postgres's B-tree entry limit (2,704 bytes with 8 KiB pages): keys are
#: indexed, and a key past that limit would fail inside the write as a store
#: error instead of being refused as bad input.
MAX_ROW_KEY_BYTES: Final = 2 * KiB

#: Longest org id, play name or table namespace, in characters (each is
#: sanitised and hashed into a physical name, and echoed in answers).
MAX_LOGICAL_NAME_CHARS: Final = 512

#: Longest run id, in UTF-8 bytes. Chosen: a run id names one attempt (a UUID
#: is 36 bytes), and it is stored on every row the attempt admits or writes, so
#: its cap multiplies by the sheet's rows. Work-receipt claim holders share it.
MAX_RUN_ID_BYTES: Final = 256

#: Longest error text one failed row stores, in UTF-8 bytes: a message with a
#: short traceback. Stored once per failed row.
MAX_ERROR_TEXT_BYTES: Final = 16 * KiB

#: Longest user email: RFC 5321's limits, 64 bytes of local part, ``@``, 255
#: of domain.
MAX_USER_EMAIL_BYTES: Final = 64 + 1 + 255

#: Longest of any other text a request carries (play names, namespaces,
#: logical tables, play references...): a logical name at four UTF-8 bytes a
#: character.
MAX_REQUEST_TEXT_BYTES: Final = 4 * MAX_LOGICAL_NAME_CHARS

#: Most columns one sheet contract may declare. A heap row must fit one 8 KiB
#: page (8,160 bytes): a jsonb column Postgres cannot compress takes at worst
#: about 24 bytes of the row (an 18-byte TOAST pointer, or a short value, plus
#: alignment), so 256 columns take about 6 KiB and leave the rest for the
#: system columns. Measured on Postgres 18: 350 columns of 200-byte values are
#: refused "row is too big"; 300 of any size fit.
MAX_CONTRACT_COLUMNS: Final = 256

#: Deepest nesting of a value a write stores (arrays and objects inside a row,
#: a map output, a cell-meta patch or a receipt result). Chosen: Python's json
#: encoder and decoder recurse once per level and fail at the interpreter's
#: recursion limit (1,000 by default), and a stored value travels back inside
#: a row, a page and an answer, so values stay far below that on every road.
MAX_JSON_DEPTH: Final = 256

#: Characters of one string that ``json_byte_length_up_to`` encodes at a time,
#: so measuring a huge string holds at most this slice's UTF-8 copy (4 bytes a
#: character at worst) and stops within one slice of the limit.
JSON_SIZE_SLICE_CHARS: Final = 64 * KiB

# --- The page reader's batcher ---------------------------------------------

#: Pages one batch read may carry (the gateway accepts 1 to 4).
READ_BATCH_MAX_PAGES: Final = 4

#: Batch reads in flight per page reader, all lanes together.
READ_BATCH_MAX_IN_FLIGHT: Final = 2

#: Pages queued or in flight per page reader: two full batches.
READ_BATCH_MAX_RETAINED_PAGES: Final = READ_BATCH_MAX_PAGES * READ_BATCH_MAX_IN_FLIGHT

#: Estimated request bytes one batch may carry.
READ_BATCH_MAX_REQUEST_BYTES: Final = 16 * KiB

#: Estimated request bytes queued or in flight per page reader.
READ_BATCH_MAX_RETAINED_REQUEST_BYTES: Final = READ_BATCH_MAX_REQUEST_BYTES * READ_BATCH_MAX_PAGES

#: Linger before a non-full batch of page reads dispatches.
READ_BATCH_FLUSH_MS: Final = 5

#: Rows one page read may ask for; larger limits are clamped.
READ_PAGE_MAX_ROWS: Final = 5_000

#: Rows a dataset's ``preview_rows`` holds (the runtime's first ten). A CSV
#: dataset with no more rows than this answers from the rows it holds.
DATASET_PREVIEW_ROWS: Final = 10

# --- Postgres ------------------------------------------------------------------

#: Rows per admission or write statement.
POSTGRES_WRITE_CHUNK_ROWS: Final = 5_000

#: Timeout of one TCP connect to Postgres.
POSTGRES_CONNECT_TIMEOUT_MS: Final = 5_000

#: Delays between connect attempts on transient errors (ECONNRESET,
#: ECONNREFUSED, ETIMEDOUT, SQLSTATE 57P01, "connection terminated/closed/reset").
POSTGRES_CONNECT_RETRY_DELAYS_MS: Final = (250, 750, 1_500)

#: The longest one connect to Postgres may take, and the longest a direct call
#: waits for a connection in all: every attempt of the ladder at its timeout
#: plus every delay. A refused or reset connect fails at once, so once the
#: ladder's rungs are spent connects go on at its last delay until this budget
#: is, riding through a restart of a few seconds; past it Postgres is reported
#: unreachable (``StoreUnavailableError``, stating the real wait). The direct
#: road's retries do not start another connect wait after a spent one: a call
#: finds Postgres down within one connect budget of meeting the outage.
POSTGRES_CONNECT_BUDGET_MS: Final = POSTGRES_CONNECT_TIMEOUT_MS * (
    len(POSTGRES_CONNECT_RETRY_DELAYS_MS) + 1
) + sum(POSTGRES_CONNECT_RETRY_DELAYS_MS)

#: The direct road's first connect, made before any of a runtime's scoped
#: sessions has reached Postgres: one connect at its timeout plus the ladder's
#: delays, then ``StoreUnavailableError`` naming the server (a session URL this
#: runner cannot reach, most likely), instead of the whole connect budget. Once
#: a session's Postgres has answered, every connect has ``POSTGRES_CONNECT_BUDGET_MS``.
POSTGRES_FIRST_CONNECT_BUDGET_MS: Final = POSTGRES_CONNECT_TIMEOUT_MS + sum(
    POSTGRES_CONNECT_RETRY_DELAYS_MS
)

#: How often a caller waiting for a pooled connection looks whether the pool's
#: connects are being refused the login (a wrong password; a scoped session's
#: role reclaimed or expired): such a refusal does not pass, so the caller
#: leaves then instead of waiting out the connect budget. The ladder's first rung.
POSTGRES_LOGIN_REFUSAL_CHECK_MS: Final = POSTGRES_CONNECT_RETRY_DELAYS_MS[0]

#: Delays between tries of prewarming one preloaded session (open a pool,
#: ``SELECT 1``) on transient connection errors: the seed's prewarm ladder,
#: the connect ladder's values. Each try connects once (no inner ladder).
POSTGRES_PREWARM_RETRY_DELAYS_MS: Final = (250, 750, 1_500)

#: Tries prewarming one preloaded session may make.
POSTGRES_PREWARM_MAX_ATTEMPTS: Final = len(POSTGRES_PREWARM_RETRY_DELAYS_MS) + 1

#: ``statement_timeout`` set on every sheetplane connection.
POSTGRES_STATEMENT_TIMEOUT_MS: Final = 20_000

#: Delays before a transaction Postgres aborted with ``40P01 deadlock_detected``
#: or ``40001 serialization_failure`` runs again (rolled back, from the start).
#: Short: the victim of a deadlock has already waited ``deadlock_timeout`` (1 s).
POSTGRES_CONFLICT_RETRY_DELAYS_MS: Final = (50, 200, 800)

#: A conflicted transaction is run again only if this little time has passed
#: since its first attempt began: the transaction's budget for retries, so
#: retrying adds at most this much to one store operation.
POSTGRES_CONFLICT_RETRY_WINDOW_MS: Final = 5_000

#: The longest one store operation can take: every connect attempt at its
#: timeout, every delay between them, the conflict-retry window, then one
#: statement at its timeout (the last attempt, started inside the window).
POSTGRES_OPERATION_BUDGET_MS: Final = (
    POSTGRES_CONNECT_BUDGET_MS + POSTGRES_CONFLICT_RETRY_WINDOW_MS + POSTGRES_STATEMENT_TIMEOUT_MS
)

#: Rows of a sheet's counter log (``store._counters``: the counting triggers
#: append one row per counter a statement changes) past which the reaper's pass
#: compacts it to one row per counter. A sheet has 5 status counters and at most
#: ``MAX_CONTRACT_COLUMNS`` column counters, so a compacted log holds at most
#: 261 rows; a read sums at most this many plus whatever was appended since the
#: last admission or pass (every admission compacts too).
COUNTER_LOG_COMPACT_ROWS: Final = 1_024

#: Connections of a ``SheetStore``'s pool unless its opener says otherwise
#: (``open_store``); the gateway sizes its own from
#: ``GATEWAY_DB_CONNECTION_BUDGET`` and a runner's session pools from
#: ``DB_SESSION_MAX_CONNECTIONS``.
STORE_POOL_MAX_CONNECTIONS: Final = 8

#: Longest wait for a pooled connection before the gateway answers 503
#: back-pressure instead of queueing further.
POSTGRES_POOL_ACQUIRE_TIMEOUT_MS: Final = POSTGRES_CONNECT_TIMEOUT_MS

#: Retry-After the gateway sends with pool back-pressure.
POSTGRES_BACKPRESSURE_RETRY_AFTER_MS: Final = RETRY_DELAYS_MS[1]

#: A cancelled store call re-sends its cancel request this often until the
#: worker thread returns: a request that lands between two statements of one
#: transaction cancels nothing, and the next statement must not run its course.
POSTGRES_CANCEL_RESEND_MS: Final = POSTGRES_CONNECT_RETRY_DELAYS_MS[0]

#: Longest ``initdb`` or a start/stop of the embedded server may take: two whole
#: store operations, generous for a loaded two-core CI machine.
EMBEDDED_POSTGRES_START_TIMEOUT_MS: Final = 2 * POSTGRES_OPERATION_BUDGET_MS

#: Connections the embedded server accepts: room for the many pools a test
#: session or the demo (direct road, gateway, scoped roles) opens at once.
EMBEDDED_POSTGRES_MAX_CONNECTIONS: Final = 200

# --- Staged admission ----------------------------------------------------------

#: Row bytes (compact JSON) one staged chunk request may carry: half the
#: transport ceiling. It holds the largest row a write accepts
#: (``MAX_ROW_BYTES``) and leaves the other half for the envelope (action,
#: names, contract, positions), which is checked to fit when a chunk is sent.
ADMISSION_CHUNK_BYTES: Final = TRANSPORT_CEILING_BYTES // 2

#: Room a staged chunk's envelope may take beside its rows.
ADMISSION_CHUNK_ENVELOPE_BYTES: Final = TRANSPORT_CEILING_BYTES - ADMISSION_CHUNK_BYTES

#: Rows one staged chunk may carry: four write statements' worth. It bounds
#: what the runner builds and the gateway parses per chunk when rows are small
#: (at about 100 bytes a row the byte budget alone would allow ~80,000).
ADMISSION_CHUNK_ROWS: Final = 4 * POSTGRES_WRITE_CHUNK_ROWS

#: Staged rows one statement of a commit admits (a range statement, or a first
#: admission's plain insert): ten write statements' worth, so each statement of
#: a million-row commit stays far under ``POSTGRES_STATEMENT_TIMEOUT_MS``.
ADMISSION_COMMIT_RANGE_ROWS: Final = 10 * POSTGRES_WRITE_CHUNK_ROWS

#: ``work_mem`` of a staged commit's transaction: a range's dedupe and order
#: sorts (``ADMISSION_COMMIT_RANGE_ROWS`` keys and positions, with the rows'
#: jsonb, a few hundred bytes a row at most for typical rows) stay in memory
#: instead of spilling to disk at Postgres' 4 MiB default.
ADMISSION_COMMIT_WORK_MEM_BYTES: Final = 32 * MiB

#: An admission that adds at least this many rows, and at least a tenth of its
#: sheet's rows (autovacuum's default analyze scale factor), analyzes the sheet
#: before it commits (``store._rowdata.analyze_if_grown``): a fifth of a write
#: statement's rows, so a map batch of ``MAP_MAX_BATCH_ROWS`` rows written right
#: after it is planned on what the sheet holds.
ADMISSION_ANALYZE_MIN_ROWS: Final = POSTGRES_WRITE_CHUNK_ROWS // 5

#: The statistics target of that ``ANALYZE`` (Postgres' default is 100): it
#: samples 300 times this many rows (3,000), which gives the planner the row
#: count and the statuses and versions just written; a million-row sheet took
#: 62-80 ms at this target and 0.67-1.9 s at 100 (load ~29). Autovacuum analyzes
#: again at the server's target once a tenth of the rows have changed.
ADMISSION_ANALYZE_STATISTICS_TARGET: Final = 10

#: An open staged admission with no chunk for this long is abandoned (its
#: runner died): the next admission of its sheet, or the reaper, expires it and
#: deletes its staging rows. A closed admission's record (kept so a retried
#: commit answers its counts) is forgotten this long after it closed.
ADMISSION_IDLE_MS: Final = 10 * 60 * 1_000

#: The per-attempt timeout of a staged commit: a million-row commit is one
#: transaction that may take longer than an ordinary request. A commit cut
#: short is retried (it is idempotent, and waits for the first to finish). A
#: one-request admission (``start_sheet_dataset``) takes it too: it may wait
#: behind other admissions of its sheet, and the runtime keeps its caller alive
#: past the 30 s request timeout for that.
ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS: Final = 4 * REQUEST_TIMEOUT_MS

#: The whole budget of a staged commit call: two whole attempts and the ladder.
ADMISSION_COMMIT_CALL_BUDGET_MS: Final = 2 * ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS + sum(
    RETRY_DELAYS_MS
)

#: An open admission lives at most this long however often it is fed (a chunk
#: extends only its idle expiry): six idle windows, an hour, several times what
#: a million-row input takes to stage. Past it the reaper expires it.
ADMISSION_MAX_LIFETIME_MS: Final = 6 * ADMISSION_IDLE_MS

#: Staged bytes (the staged chunks' keys and rows) one admission may hold: 256
#: full chunks, 2 GiB, past a million rows of 1 KiB. Past it the chunk is 413
#: ``runtime_admission_staging_too_large`` (not retried) and nothing is written.
ADMISSION_MAX_STAGED_BYTES: Final = 256 * ADMISSION_CHUNK_BYTES

#: Staged bytes one org's staging tables may hold on disk: two whole admissions
#: at once. One token staged 195 MB in 7.6 s (about 93 GB an hour) with nothing
#: refusing. Past it: 429 ``runtime_staging_quota`` with ``retry_after_ms``.
ORG_MAX_STAGED_BYTES: Final = 2 * ADMISSION_MAX_STAGED_BYTES

#: Staged bytes every org's staging tables together may hold on disk: eight
#: orgs' worth, 32 GiB; past it every org's next chunk waits (429). Read as the
#: orgs' counters summed, without a lock: chunks of other orgs in flight at once
#: can pass it by what their transactions hold (one per org, each at most
#: ``STAGING_MAX_TRANSACTION_BYTES``).
STAGING_MAX_TOTAL_BYTES: Final = 8 * ORG_MAX_STAGED_BYTES

#: Staged bytes one transaction may reserve on one org: every road writes one
#: chunk per transaction, and a chunk's request is at most the transport
#: ceiling, stored as ``jsonb`` at most six times its JSON (an array of one-digit
#: numbers, 12 bytes stored for 2, the largest ratio measured), so eight
#: ceilings leave room. It bounds what one org's transaction in flight hides from
#: the other orgs' reading of the total; past it 429 ``runtime_staging_quota``.
STAGING_MAX_TRANSACTION_BYTES: Final = 8 * TRANSPORT_CEILING_BYTES

#: Staged bytes one chunk record (a row of a sheet's chunk table) reserves on its
#: admission, its org and the total, as a staging row reserves its arrays: what
#: one costs on disk, primary key index included (152 bytes measured on Postgres
#: 18 over 300,000 records). A ``rows.stage`` role inserted 300,000 records
#: (44 MB) that counted against nothing; now they count as what they take.
STAGING_CHUNK_RECORD_BYTES: Final = 160

#: Admissions one org may hold open at once (``begin_sheet_admission``): a
#: runner holds one per ``start``; past it 429 ``runtime_staging_quota``.
ORG_MAX_OPEN_ADMISSIONS: Final = 64

#: Admissions one executor token may hold open at once: a quarter of its org's,
#: so one token (a runaway runner, a leaked token) leaves three quarters of its
#: org's admissions to the org's other tokens. A retried begin is not a new one.
TOKEN_MAX_OPEN_ADMISSIONS: Final = ORG_MAX_OPEN_ADMISSIONS // 4

#: The ``retry_after_ms`` of a staging quota's 429: the longest the client waits.
STAGING_QUOTA_RETRY_AFTER_MS: Final = MAX_RETRY_AFTER_MS

#: How long a runner that failed or was cancelled before its commit spends
#: aborting the admission (one best-effort call, shielded from the
#: cancellation): the longest ladder delay, so a cancelled runner stops promptly.
#: An admission it could not abort expires after ``ADMISSION_IDLE_MS``.
ADMISSION_ABORT_TIMEOUT_MS: Final = RETRY_DELAYS_MS[-1]

# --- What one org may keep --------------------------------------------------------

#: Tables one sheet is made of (its rows, events, summary, column summary,
#: counter log, lock, metadata, staging, admissions, chunk and shares tables).
SHEET_TABLES: Final = 11

#: Sheets one org may create (``ensure_sheet``, a first admission): each adds
#: ``SHEET_TABLES`` tables to the catalog and one sheet to every reaper pass, so
#: an unbounded org slows every org's DDL and sweep (150 sheets of one token
#: made 1,500 tables and the sweep 5x slower). Past it: 429 ``runtime_org_sheet_cap``.
MAX_SHEETS_PER_ORG: Final = 512

#: Plays' receipt tables one org may create (a first claim on a new play): one
#: table each, as many as the org may have sheets.
MAX_RECEIPT_TABLES_PER_ORG: Final = MAX_SHEETS_PER_ORG

#: So one org adds at most this many tables to the database's catalog.
ORG_MAX_TABLES: Final = MAX_SHEETS_PER_ORG * SHEET_TABLES + MAX_RECEIPT_TABLES_PER_ORG

# --- DB sessions ---------------------------------------------------------------

#: Lifetime of a scoped database session (and of its Postgres role).
DB_SESSION_TTL_MS: Final = 10 * 60 * 1_000

#: A cached session is reused only while more than this remains. It covers one
#: whole store operation, so a reused session outlives the longest operation
#: started on it.
DB_SESSION_RENEWAL_WINDOW_MS: Final = 60_000

#: How often the gateway drops expired session roles.
DB_SESSION_REAPER_INTERVAL_MS: Final = DB_SESSION_RENEWAL_WINDOW_MS

#: ``statement_timeout`` of every session role (a role default): the timeout
#: the store sets on its own connections, so a runner's statements are never
#: cut shorter than on any other road.
DB_SESSION_STATEMENT_TIMEOUT_MS: Final = POSTGRES_STATEMENT_TIMEOUT_MS

#: ``idle_in_transaction_session_timeout`` of every session role. The store's
#: write path runs its statements back to back on a worker thread, so an idle
#: gap inside one of its transactions is Python work between two statements
#: (milliseconds). A quarter of the statement timeout: a gateway DDL that waits
#: behind an idle session (its ``ALTER TABLE`` queues for the lock a ``SELECT``
#: left) outlives the idle limit and one watchdog pass with room to spare.
DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS: Final = POSTGRES_STATEMENT_TIMEOUT_MS // 4

#: A session transaction older than one whole store operation is not one the
#: store runs: the watchdog ends it even when each statement and gap is short,
#: so no chain of quick statements holds a lock for longer.
DB_SESSION_TRANSACTION_TIMEOUT_MS: Final = POSTGRES_OPERATION_BUDGET_MS

#: How often the gateway's watchdog looks for session backends past those
#: limits. A role may ``SET`` its own timeouts away, so the gateway ends such
#: backends itself (``pg_terminate_backend``), at most one interval late.
DB_SESSION_WATCHDOG_INTERVAL_MS: Final = DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS // 5

#: The longest the direct road's admission in one transaction (``store/_direct.py``)
#: holds its transaction, and with it the sheet's writer lock, before the runner rolls
#: it back (the road takes only sequences, which are then staged from their start;
#: a one-shot input is staged from the first). The runner checks it after each
#: chunk, so the transaction lasts at most this, one more chunk and the finish:
#: three quarters of the session's transaction timeout leaves a quarter (11.9 s)
#: for those, so the runner ends its
#: own transaction before the watchdog or Postgres does. What the hold costs others:
#: every writer of the sheet waits for it, as it waits for a staged commit (which may
#: hold the lock up to ``ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS``); a writer whose
#: ``LOCK`` waits past its statement timeout fails with ``StatementTimeoutError``.
DIRECT_ADMISSION_HOLD_MS: Final = DB_SESSION_TRANSACTION_TIMEOUT_MS * 3 // 4

#: Rows one ``COPY`` of the direct road's admission in one transaction carries (a
#: savepoint each; ``store/_direct.py``): two staged chunks. Each statement's end
#: costs the transaction a few milliseconds (its statement triggers, the
#: savepoint, the next piece's encoding while Postgres waits): at 300,000 rows,
#: 40,000-row chunks took 1.10 s against 1.15 s for 20,000 (A/B, load 0.8-1).
#: Bounded by the statement timeout and the idle-in-transaction timeout at the
#: per-row ceiling (checked below), and by the runner's memory (one chunk's text).
DIRECT_ADMISSION_CHUNK_ROWS: Final = 2 * ADMISSION_CHUNK_ROWS

#: ``work_mem`` of the direct road's admission transaction: each chunk's ``COPY``
#: keeps the rows it inserted for the statement triggers (counters, the admit
#: guard) in a tuplestore that spills to a temporary file past ``work_mem``. A
#: chunk of ``ADMISSION_CHUNK_ROWS`` rows of about 250 bytes is 5 MB, past
#: Postgres' 4 MiB default: spilling cost 60 ms of a 300,000-row admission's
#: 1.2 s (docs/benchmarks.md); ``DIRECT_ADMISSION_CHUNK_ROWS`` such rows are
#: 10 MB. The same as a staged commit's.
DIRECT_ADMISSION_WORK_MEM_BYTES: Final = ADMISSION_COMMIT_WORK_MEM_BYTES

#: A ceiling on the runner's work per input row on the direct road's one transaction
#: (check, key, encode, COPY): ten times the 6 µs measured on the 2-core development
#: machine at load 4. A chunk's ``COPY`` runs while the runner reads and encodes the
#: chunk (``DIRECT_ADMISSION_CHUNK_ROWS`` rows), and between two statements the transaction
#: is idle while it encodes the next chunk's first piece, so at this ceiling a chunk
#: stays well inside the statement timeout and a gap under the session's
#: idle-in-transaction timeout (both checked below). A sequence slower than that
#: (rows made on demand that wait on something) meets a timeout, and Postgres ends
#: the transaction: nothing is committed.
DIRECT_ADMISSION_ROW_CEILING_US: Final = 60

#: How long the reaper's sweep waits for a row lock while it expires one sheet's
#: admissions before it leaves the sheet to its next pass: half a watchdog
#: interval, several times a full chunk's own transaction (110 to 137 ms), so
#: only a transaction held open longer (a stage role sitting in one holds its
#: admission's and its org's rows) makes it skip, and the rest of that org's
#: sheets with it, so one org cannot hold the pass back from every other's.
ADMISSION_SWEEP_LOCK_WAIT_MS: Final = DB_SESSION_WATCHDOG_INTERVAL_MS // 2

#: Private memory (``RssAnon``) one session backend may hold before the
#: watchdog ends it: a role may ``SET work_mem`` / ``hash_mem_multiplier`` (or
#: ``ALTER ROLE current_user SET`` them) as high as it likes, and one hash
#: DISTINCT reached 1.6 GB. Chosen: twenty batch reads' worth, far above what
#: the store's own statements take (a page is at most READ_BATCH_MAX_RESPONSE_BYTES),
#: and the watchdog reads it every interval, so a backend is ended at most one
#: interval's growth past it.
DB_SESSION_MAX_BACKEND_MEMORY_BYTES: Final = 20 * READ_BATCH_MAX_RESPONSE_BYTES

#: A client backend still without a role this long after it began is a login
#: stalled in or after its authentication: the watchdog ends it (a superuser
#: gateway). A connect's own timeout: no client of the gateway waits longer.
DB_SESSION_LOGIN_TIMEOUT_MS: Final = POSTGRES_CONNECT_TIMEOUT_MS

#: Connections one session role may hold (``CONNECTION LIMIT``): a runner's
#: session store reads with at most ``READ_BATCH_MAX_IN_FLIGHT`` batch reads at
#: once, and as many again leaves room for a write beside them.
DB_SESSION_MAX_CONNECTIONS: Final = 2 * READ_BATCH_MAX_IN_FLIGHT

#: Private memory all of one org's session backends may hold together before the
#: watchdog ends the org's newest (the backend bound alone let an org hold its
#: whole connection budget at the bound each, 10-30 GiB): one session at full
#: width (``DB_SESSION_MAX_CONNECTIONS`` backends) at the backend bound each.
DB_SESSION_MAX_ORG_MEMORY_BYTES: Final = (
    DB_SESSION_MAX_CONNECTIONS * DB_SESSION_MAX_BACKEND_MEMORY_BYTES
)

#: A runner's session pool that no caller has used for this long closes its
#: connections (the session stays cached; the next use opens a pool again):
#: an org's connection budget is held by work, not by runners between uses
#: (25 runners each kept the pool they admitted with and no write session of
#: the org could be minted). Two watchdog passes: short next to any call's
#: budget, long next to the gap between one map's write batches.
DB_SESSION_POOL_IDLE_MS: Final = 2 * DB_SESSION_WATCHDOG_INTERVAL_MS

#: A mint waiting for its org's connection budget may reclaim a session role
#: of that org that holds no connection and was minted at least this long
#: ago: the pool idle timeout, time for the runner that minted it to open its
#: pool on a loaded machine. A role in use holds connections (its pool keeps
#: them for ``DB_SESSION_POOL_IDLE_MS`` after its last caller), so only a role
#: whose pool was released or went idle is taken; its runner mints anew on
#: next use (and a statement that meets its role gone, 42501, is retried on a
#: new session: nothing ran). A runner waiting for a connection slot holds no
#: connection either, so its role may be taken well inside its connect budget:
#: the login refused then (28P01) for a role the runner minted means "minted
#: anew through the queue", as often as it happens within the call's budget.
DB_SESSION_RECLAIM_AFTER_MS: Final = DB_SESSION_POOL_IDLE_MS

#: The longest a mint waits in its org's queue for room in the org's
#: connection budget before it is refused 429 (with ``retry_after_ms``; the
#: client retries it within its call budget): the action budget less one
#: connect timeout, left for the mint itself (``GATEWAY_ACTION_BUDGET_MS`` is
#: ``REQUEST_TIMEOUT_MS``; checked below).
DB_SESSION_MINT_QUEUE_MS: Final = REQUEST_TIMEOUT_MS - POSTGRES_CONNECT_TIMEOUT_MS

#: How often the head of an org's mint queue looks for room again.
DB_SESSION_MINT_POLL_MS: Final = DB_SESSION_WATCHDOG_INTERVAL_MS // 4

#: Live (unexpired) sessions one org may hold: a bound on the roles, grants and
#: ledger rows one org piles into the catalog (a probe minted 900 in 37 s). A
#: runner mints one session per access shape, and a shape carries its row
#: limits, so a busy runner holds many at once: one token of the real chaos
#: slice held more than 128 live sessions within one TTL.
DB_SESSION_MAX_LIVE_PER_ORG: Final = 1024

#: Live sessions one executor token may hold: half its org's, so two runners'
#: tokens of one org can each mint a full set.
DB_SESSION_MAX_LIVE_PER_TOKEN: Final = DB_SESSION_MAX_LIVE_PER_ORG // 2

#: Retry-After of a refused mint: one watchdog pass frees nothing, but a
#: session's renewal window is when a runner retires its old sessions.
DB_SESSION_CAP_RETRY_AFTER_MS: Final = MAX_RETRY_AFTER_MS

#: One org's share of the connections session roles may hold on the server, as
#: a divisor: half. While one org holds its whole budget, the other half is
#: left to every other org, so a tenant that opens connections on every one of
#: its sessions (up to ``DB_SESSION_MAX_LIVE_PER_ORG`` x
#: ``DB_SESSION_MAX_CONNECTIONS`` = 4,096 by role limits alone) never locks
#: another out of the server for longer than the watchdog takes to end its excess.
DB_SESSION_ORG_CONNECTION_SHARE: Final = 2


def org_connection_budget(max_connections: int, reserved_connections: int) -> int:
    """Connections all session roles of one org may hold at once on a server.

    ``max_connections`` less the slots only privileged roles may take
    (``superuser_reserved_connections`` + ``reserved_connections``) and the
    gateway deployment's own pool (``GATEWAY_DB_CONNECTION_BUDGET``), divided by
    ``DB_SESSION_ORG_CONNECTION_SHARE``; never less than one session's
    ``DB_SESSION_MAX_CONNECTIONS``, so one session always works at full width.
    Postgres's default 100 slots (3 reserved) give 44; the embedded server's
    200, 94. The gateway's watchdog ends an org's newest session backends past
    it, and a mint for an org already at it is refused 429.
    """
    sessions = max_connections - reserved_connections - GATEWAY_DB_CONNECTION_BUDGET
    return max(DB_SESSION_MAX_CONNECTIONS, sessions // DB_SESSION_ORG_CONNECTION_SHARE)


# --- Runtime.map ----------------------------------------------------------------

#: Rows ``map`` reads ahead of its ``fn`` calls: the keyset page of the
#: admission's pending rows the workers take rows from, and the next page, read
#: while they do (so no worker waits for a read but the first).
MAP_READ_AHEAD_ROWS: Final = 2 * READ_PAGE_MAX_ROWS

#: Estimated bytes of row data one terminal write batch of ``map`` may carry:
#: the read budget, so a write request leaves the same envelope headroom under
#: the transport ceiling as a read answer. One row larger than this (it is at
#: most ``MAX_ROW_BYTES``) is written alone.
MAP_WRITE_BATCH_MAX_BYTES: Final = READ_BATCH_MAX_RESPONSE_BYTES

#: Terminal write batches of ``map`` in flight at once (both kinds together):
#: as many as the write session's pool has connections, so Postgres writes
#: that many batches side by side while the next one fills.
MAP_WRITE_MAX_IN_FLIGHT: Final = DB_SESSION_MAX_CONNECTIONS

#: Results ``map`` retains (computed, not yet written) are capped at this many
#: batches of ``batch_rows``: the batches in flight plus one filling, so the
#: writes never starve and the results never pile up.
MAP_RETAINED_BATCHES: Final = MAP_WRITE_MAX_IN_FLIGHT + 1

#: Estimated result bytes ``map`` retains, by the same count of batches.
MAP_MAX_RETAINED_RESULT_BYTES: Final = MAP_RETAINED_BATCHES * MAP_WRITE_BATCH_MAX_BYTES

#: The largest ``batch_rows`` ``map`` accepts: one write statement's chunk.
MAP_MAX_BATCH_ROWS: Final = POSTGRES_WRITE_CHUNK_ROWS

# --- Operating the reference gateway ----------------------------------------------

#: The longest one action may run on the gateway: the caller's attempt timeout.
#: Past it no caller is waiting for the answer (the client has timed the
#: attempt out and retries it), so the gateway cancels the action and answers
#: 504 instead of finishing work nobody reads.
GATEWAY_ACTION_BUDGET_MS: Final = REQUEST_TIMEOUT_MS

#: The whole request body must arrive within this (else 408 and the connection
#: closes): half the caller's attempt timeout, leaving the other half for the
#: action and its answer. At the transport ceiling that asks for about 1.1 MB/s.
GATEWAY_BODY_READ_TIMEOUT_MS: Final = REQUEST_TIMEOUT_MS // 2

#: An idle keep-alive connection (and one that never completes its request
#: head) is closed after this. Chosen: httpx keeps idle connections for 5 s,
#: so a client's pooled connection is rarely closed under it.
GATEWAY_KEEP_ALIVE_TIMEOUT_MS: Final = 5_000

#: Open HTTP connections one gateway process serves at once; further
#: connections wait in the listen backlog until one closes. Chosen: each
#: connection may hold one body up to the transport ceiling while it is read.
GATEWAY_MAX_CONNECTIONS: Final = 256

#: Requests in flight (head read, answer not yet sent) one org may hold in one
#: gateway process: a quarter of the connections, so an org whose requests all
#: stall mid-body holds at most a quarter of the server; past it the next
#: request is answered 429 as soon as its head is read, before its body.
GATEWAY_MAX_REQUESTS_PER_ORG: Final = GATEWAY_MAX_CONNECTIONS // 4

#: Of those, what one token may hold: half its org's, so two tokens of an org
#: share it and one runaway token leaves the other half to its org.
GATEWAY_MAX_REQUESTS_PER_TOKEN: Final = GATEWAY_MAX_REQUESTS_PER_ORG // 2

#: Open connections one org may hold in one gateway process (counted from a
#: connection's first request until it closes): half the connections, so
#: the other half always serves the other orgs (and heads not yet read).
GATEWAY_MAX_CONNECTIONS_PER_ORG: Final = GATEWAY_MAX_CONNECTIONS // 2

#: Of those, what one token may hold: half its org's.
GATEWAY_MAX_CONNECTIONS_PER_TOKEN: Final = GATEWAY_MAX_CONNECTIONS_PER_ORG // 2

#: Connections one gateway client (one runner process) keeps to the gateway; its
#: further requests wait for one of them in the client. Four runner processes of
#: one token (``map_attempt`` workers share their play's token) together fill the
#: token's share of requests in flight instead of storming it with connections
#: that it refuses; more of them take turns (the client rides a 429 refusal for
#: the tenant's share within its call budget, ``gateway/_retry.py``).
GATEWAY_CLIENT_MAX_CONNECTIONS: Final = GATEWAY_MAX_REQUESTS_PER_TOKEN // 4

#: Retry-After of a request refused for its tenant's share: the first ladder
#: delay (its own requests in flight are finishing, or timing out, meanwhile).
GATEWAY_TENANT_RETRY_AFTER_MS: Final = RETRY_DELAYS_MS[0]

#: Connections the kernel queues for a gateway process past its cap (the
#: ``listen`` backlog); beyond it new connections are refused and retried.
GATEWAY_LISTEN_BACKLOG: Final = GATEWAY_MAX_CONNECTIONS // 2

#: ``/readyz`` is 200 only when the store answers ``SELECT 1`` within this: a
#: fifth of one connect attempt, so a probe finishes well inside the few
#: seconds a load balancer waits for it.
GATEWAY_READINESS_BUDGET_MS: Final = POSTGRES_CONNECT_TIMEOUT_MS // 5

#: Retry-After of the 503 a draining gateway answers: the first ladder delay
#: (another worker behind the load balancer can answer at once).
GATEWAY_DRAIN_RETRY_AFTER_MS: Final = RETRY_DELAYS_MS[0]

#: After SIGTERM, in-flight requests get this long to finish: a request that
#: had just started reading its body reads it, runs its whole action budget,
#: then has one connect timeout to cancel its statement and send its answer.
#: Past it what is left is cancelled and the process exits non-zero.
GATEWAY_DRAIN_BUDGET_MS: Final = (
    GATEWAY_BODY_READ_TIMEOUT_MS + GATEWAY_ACTION_BUDGET_MS + POSTGRES_CONNECT_TIMEOUT_MS
)

#: A connection that sends nothing for this long is closed, whatever it is
#: doing (Hypercorn's ``read_timeout``): longer than any request can take.
GATEWAY_READ_TIMEOUT_MS: Final = GATEWAY_DRAIN_BUDGET_MS

#: Postgres connections one gateway deployment holds, all its workers
#: together: the store's pool size for one worker. ``--workers N`` gives each
#: worker ``GATEWAY_DB_CONNECTION_BUDGET // N``.
GATEWAY_DB_CONNECTION_BUDGET: Final = 8

#: The smallest pool a worker may have: one connection for the role reaper's
#: pass and one for a request beside it.
GATEWAY_MIN_WORKER_POOL: Final = 2


# --- Leases ----------------------------------------------------------------------

#: A runner's lease on one sheet attempt. Renewed every
#: ``SHEET_ATTEMPT_LEASE_RENEWAL_MS``; a renewal that starts then and takes a
#: whole call budget still lands before the lease expires.
SHEET_ATTEMPT_LEASE_TTL_MS: Final = 2 * CALL_BUDGET_MS
SHEET_ATTEMPT_LEASE_RENEWAL_MS: Final = (SHEET_ATTEMPT_LEASE_TTL_MS - CALL_BUDGET_MS) // 2

#: A claim on one work receipt: the same derivation, so a claimant may make a
#: whole call (gateway or direct) under the claim and still renew it in time.
WORK_RECEIPT_LEASE_TTL_MS: Final = 2 * CALL_BUDGET_MS
WORK_RECEIPT_LEASE_RENEWAL_MS: Final = (WORK_RECEIPT_LEASE_TTL_MS - CALL_BUDGET_MS) // 2

#: How long before a lease's expiry the body of ``claim`` is cancelled when the
#: lease cannot be renewed. The runner counts the expiry from when it *sent*
#: the claim (the gateway's clock started it later, so the gateway's expiry is
#: no earlier), and stops the body this much before that: what the lease has
#: left once a renewal started on schedule has taken its whole call budget.
WORK_RECEIPT_LEASE_GUARD_MS: Final = (
    WORK_RECEIPT_LEASE_TTL_MS - WORK_RECEIPT_LEASE_RENEWAL_MS - CALL_BUDGET_MS
)

#: ``once`` waiting on another holder's lease asks again this often: the
#: ladder's longest delay, so a waiter costs the gateway one call per 2 s.
WORK_RECEIPT_ONCE_POLL_MS: Final = RETRY_DELAYS_MS[-1]

#: The longest ``once`` waits on another holder's lease. A lease seen held
#: expires within one TTL unless its holder is alive and renewing it; one
#: more poll then takes it over. Past this the holder is alive, and ``once``
#: raises ``LeaseHeldError``.
WORK_RECEIPT_ONCE_WAIT_MS: Final = WORK_RECEIPT_LEASE_TTL_MS + WORK_RECEIPT_ONCE_POLL_MS

#: A lease left without a completion (the body raised or was cancelled) is
#: released, shielded from cancellation, for at most one request timeout. A
#: release that does not land costs nothing but the wait: the lease expires.
WORK_RECEIPT_RELEASE_TIMEOUT_MS: Final = REQUEST_TIMEOUT_MS


# --- Shares: many workers on one attempt (``map_attempt``) ---------------------------

#: A worker's lease on one share of an attempt (a block of its pending rows). A
#: renewal is one request: sent every ``SHARE_LEASE_RENEWAL_MS``, it may take a
#: whole ``REQUEST_TIMEOUT_MS`` and still leave ``SHARE_LEASE_GUARD_MS`` before the
#: expiry, which is when the worker stops its share's fn calls if no renewal
#: landed. A dead worker's shares are claimed again one TTL after its last renewal.
SHARE_LEASE_TTL_MS: Final = 2 * REQUEST_TIMEOUT_MS
SHARE_LEASE_RENEWAL_MS: Final = (SHARE_LEASE_TTL_MS - REQUEST_TIMEOUT_MS) // 3
SHARE_LEASE_GUARD_MS: Final = SHARE_LEASE_TTL_MS - SHARE_LEASE_RENEWAL_MS - REQUEST_TIMEOUT_MS

#: The shortest lease a claim may ask for (tests and benchmarks ask for short ones
#: to see a takeover in seconds): a renewal, its guard and one store round trip fit.
SHARE_LEASE_MIN_TTL_MS: Final = 300

#: Rows in one share: ``SHARE_ROUNDS`` rounds of a worker's ``concurrency`` fn calls,
#: so the calls of a share's last round are a small part of it; at most one page.
SHARE_ROUNDS: Final = 16
SHARE_MAX_ROWS: Final = READ_PAGE_MAX_ROWS
#: A worker that hands a share's rows out to its calls in less than this claims twice
#: the rows next time (up to ``SHARE_MAX_ROWS``): fast calls pay a share's claim, read
#: and release over more rows, and a share still holds at most about twice this long
#: of the worker's calls, so the workers of an attempt still end close together.
SHARE_GROW_BELOW_MS: Final = 1_000

#: Shares a worker claims and reads ahead of the one its calls take rows from, so
#: its calls never wait for a claim and a read. It holds at most this many shares
#: ahead, one whose rows are going out and the ones whose last writes are landing;
#: its keeper renews each held share on its own schedule, one renewal per share in
#: flight, so holding one more share delays no other share's renewal.
SHARE_PREFETCH_SHARES: Final = 1
#: A worker claims the next share once the rows left in the current one would go out
#: to its calls in less than this many times its last claim and read took (at the
#: current share's pace): early enough that the next share's rows are there when
#: the current one's run out, late enough that slow calls hold no share long idle.
SHARE_PREFETCH_LEAD: Final = 8

#: A worker with nothing left to claim while other workers' shares are live asks
#: again this often (one of them may die; its share is then this worker's to take).
SHARE_POLL_MS: Final = RETRY_DELAYS_MS[1]


def _check() -> None:
    """The relations between budgets; a broken one fails the import (``-O`` cannot skip it)."""
    leases = (
        (SHEET_ATTEMPT_LEASE_TTL_MS, SHEET_ATTEMPT_LEASE_RENEWAL_MS),
        (WORK_RECEIPT_LEASE_TTL_MS, WORK_RECEIPT_LEASE_RENEWAL_MS),
    )
    relations = {
        "MAX_QUEUE_WAIT_MS == CALL_BUDGET_MS": MAX_QUEUE_WAIT_MS == CALL_BUDGET_MS,
        "the resolve-play ladder extends the call ladder": (
            RESOLVE_PLAY_RETRY_DELAYS_MS[: len(RETRY_DELAYS_MS)] == RETRY_DELAYS_MS
            and RESOLVE_PLAY_CALL_BUDGET_MS > CALL_BUDGET_MS
        ),
        "a reconnect back-off starts short and its cap is far inside a call": (
            0 < GATEWAY_RECONNECT_BASE_MS <= GATEWAY_RECONNECT_CAP_MS < CALL_BUDGET_MS // 8
        ),
        "a gateway never met fails fast: after one connect and a back-off up to its cap": (
            GATEWAY_FIRST_CONNECT_TIMEOUT_MS < REQUEST_TIMEOUT_MS
            and GATEWAY_FIRST_CONNECT_TIMEOUT_MS <= POSTGRES_CONNECT_TIMEOUT_MS
            and sum(RETRY_DELAYS_MS) < GATEWAY_FIRST_CONTACT_BUDGET_MS < CALL_BUDGET_MS // 8
        ),
        "the direct road's first connect fails fast, after one connect and the ladder": (
            POSTGRES_CONNECT_TIMEOUT_MS
            < POSTGRES_FIRST_CONNECT_BUDGET_MS
            < POSTGRES_CONNECT_BUDGET_MS
        ),
        "DEFAULT_RETRY_AFTER_MS <= MAX_RETRY_AFTER_MS < CALL_BUDGET_MS": (
            DEFAULT_RETRY_AFTER_MS <= MAX_RETRY_AFTER_MS < CALL_BUDGET_MS
        ),
        "0 < READ_BATCH_MAX_RESPONSE_BYTES < TRANSPORT_CEILING_BYTES": (
            0 < READ_BATCH_MAX_RESPONSE_BYTES < TRANSPORT_CEILING_BYTES
        ),
        "a row budget leaves room for its outputs in one page read": (
            0 < 2 * MAX_ROW_BYTES <= READ_BATCH_MAX_RESPONSE_BYTES
        ),
        "envelope headroom >= 1/8 of the transport ceiling": (
            RESPONSE_ENVELOPE_HEADROOM_BYTES >= TRANSPORT_CEILING_BYTES // 8
        ),
        "retained pages hold a full batch": READ_BATCH_MAX_RETAINED_PAGES >= READ_BATCH_MAX_PAGES,
        "retained request bytes hold a full batch": (
            READ_BATCH_MAX_RETAINED_REQUEST_BYTES >= READ_BATCH_MAX_REQUEST_BYTES
        ),
        "a reused session outlives the longest store operation": (
            DB_SESSION_RENEWAL_WINDOW_MS >= POSTGRES_OPERATION_BUDGET_MS
        ),
        "a DDL behind an idle session outlives the idle limit and one watchdog pass": (
            DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS + DB_SESSION_WATCHDOG_INTERVAL_MS
            < POSTGRES_STATEMENT_TIMEOUT_MS
        ),
        "a session statement may run as long as the store's own": (
            DB_SESSION_STATEMENT_TIMEOUT_MS >= POSTGRES_STATEMENT_TIMEOUT_MS
            and DB_SESSION_TRANSACTION_TIMEOUT_MS >= DB_SESSION_STATEMENT_TIMEOUT_MS
        ),
        "an org's connection budget is at least one session's, and half of what is left": (
            org_connection_budget(100, 3) == (100 - 3 - GATEWAY_DB_CONNECTION_BUDGET) // 2
            and org_connection_budget(0, 0) == DB_SESSION_MAX_CONNECTIONS
            and DB_SESSION_ORG_CONNECTION_SHARE >= 2
        ),
        "a queued mint ends inside its action; a fresh role outlives its first connect": (
            0 < DB_SESSION_MINT_POLL_MS < DB_SESSION_MINT_QUEUE_MS < GATEWAY_ACTION_BUDGET_MS
            and 0 < DB_SESSION_RECLAIM_AFTER_MS <= DB_SESSION_POOL_IDLE_MS
            and DB_SESSION_POOL_IDLE_MS < DB_SESSION_MINT_QUEUE_MS
        ),
        "a token holds at most its org's sessions": (
            0 < DB_SESSION_MAX_LIVE_PER_TOKEN <= DB_SESSION_MAX_LIVE_PER_ORG
        ),
        "a session lives past two renewal windows": (
            DB_SESSION_TTL_MS > 2 * DB_SESSION_RENEWAL_WINDOW_MS
        ),
        "a lease renewal lands before expiry even when it takes a whole call": all(
            renewal > 0 and renewal + CALL_BUDGET_MS <= ttl for ttl, renewal in leases
        ),
        "a drain outlives the longest action": GATEWAY_DRAIN_BUDGET_MS > GATEWAY_ACTION_BUDGET_MS,
        "a body is read within the caller's attempt": (
            GATEWAY_BODY_READ_TIMEOUT_MS < REQUEST_TIMEOUT_MS
        ),
        "no silent connection outlives a drain": GATEWAY_READ_TIMEOUT_MS >= GATEWAY_DRAIN_BUDGET_MS,
        "a readiness probe is shorter than one connect": (
            GATEWAY_READINESS_BUDGET_MS < POSTGRES_CONNECT_TIMEOUT_MS
        ),
        "one worker gets the whole connection budget": (
            GATEWAY_DB_CONNECTION_BUDGET >= GATEWAY_MIN_WORKER_POOL
        ),
        "a conflict retry starts inside its window": (
            POSTGRES_CONFLICT_RETRY_DELAYS_MS[0] < POSTGRES_CONFLICT_RETRY_WINDOW_MS
        ),
        "a lease outlives the longest store operation": all(
            ttl > POSTGRES_OPERATION_BUDGET_MS for ttl, _ in leases
        ),
        "a receipt lease's body stops strictly before its expiry, after a whole renewal call": (
            WORK_RECEIPT_LEASE_GUARD_MS > 0
            and WORK_RECEIPT_LEASE_RENEWAL_MS + CALL_BUDGET_MS + WORK_RECEIPT_LEASE_GUARD_MS
            <= WORK_RECEIPT_LEASE_TTL_MS
        ),
        "a map write batch fits a request with the envelope's headroom": (
            MAX_ROW_BYTES <= MAP_WRITE_BATCH_MAX_BYTES <= READ_BATCH_MAX_RESPONSE_BYTES
        ),
        "map retains its in-flight write batches plus one filling": (
            MAP_RETAINED_BATCHES == MAP_WRITE_MAX_IN_FLIGHT + 1
            and MAP_MAX_RETAINED_RESULT_BYTES >= MAP_WRITE_BATCH_MAX_BYTES
        ),
        "a map batch is at most one write chunk": MAP_MAX_BATCH_ROWS <= POSTGRES_WRITE_CHUNK_ROWS,
        "once waits past a whole lease before giving up": (
            WORK_RECEIPT_ONCE_WAIT_MS > WORK_RECEIPT_LEASE_TTL_MS > WORK_RECEIPT_ONCE_POLL_MS > 0
        ),
        "a share renewal lands before its guard even when it takes a whole request": (
            SHARE_LEASE_GUARD_MS > 0
            and SHARE_LEASE_RENEWAL_MS + REQUEST_TIMEOUT_MS + SHARE_LEASE_GUARD_MS
            <= SHARE_LEASE_TTL_MS
            and SHARE_LEASE_TTL_MS > POSTGRES_OPERATION_BUDGET_MS
        ),
        "a short share lease still holds a renewal and its guard": (
            0 < SHARE_LEASE_MIN_TTL_MS <= SHARE_LEASE_TTL_MS
        ),
        "a worker polls for a dead worker's share well inside a lease": (
            0 < SHARE_POLL_MS < SHARE_LEASE_TTL_MS
            and 0 < SHARE_ROUNDS <= SHARE_MAX_ROWS
            and 0 < SHARE_GROW_BELOW_MS < SHARE_LEASE_RENEWAL_MS
        ),
        "a worker reads no more rows ahead of its calls than map does, and a share of "
        "fast calls claimed ahead goes out before its first renewal falls due": (
            SHARE_PREFETCH_SHARES > 0
            and (1 + SHARE_PREFETCH_SHARES) * SHARE_MAX_ROWS <= MAP_READ_AHEAD_ROWS
            and (1 + SHARE_PREFETCH_SHARES) * 2 * SHARE_GROW_BELOW_MS <= SHARE_LEASE_RENEWAL_MS
            and SHARE_PREFETCH_LEAD >= 1
        ),
        "four runner processes of one token fit its share of requests in flight": (
            0 < 4 * GATEWAY_CLIENT_MAX_CONNECTIONS <= GATEWAY_MAX_REQUESTS_PER_TOKEN
        ),
        "a direct admission ends its own transaction first, and holds the writer lock no "
        "longer than a staged commit may": (
            DIRECT_ADMISSION_HOLD_MS + DB_SESSION_WATCHDOG_INTERVAL_MS
            < DB_SESSION_TRANSACTION_TIMEOUT_MS
            and DB_SESSION_TRANSACTION_TIMEOUT_MS - DIRECT_ADMISSION_HOLD_MS
            >= POSTGRES_STATEMENT_TIMEOUT_MS // 2
            and DIRECT_ADMISSION_HOLD_MS <= ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS
        ),
        "a direct admission's chunk is encoded well inside the idle-in-transaction timeout "
        "and its COPY statement's timeout": (
            DIRECT_ADMISSION_CHUNK_ROWS * DIRECT_ADMISSION_ROW_CEILING_US // 1_000
            + DB_SESSION_WATCHDOG_INTERVAL_MS
            < DB_SESSION_IDLE_IN_TRANSACTION_TIMEOUT_MS
            and DIRECT_ADMISSION_CHUNK_ROWS * DIRECT_ADMISSION_ROW_CEILING_US // 1_000
            <= DB_SESSION_STATEMENT_TIMEOUT_MS // 8
        ),
        "an admission's work_mem stays far under the backend memory the watchdog allows": (
            4 * max(DIRECT_ADMISSION_WORK_MEM_BYTES, ADMISSION_COMMIT_WORK_MEM_BYTES)
            <= DB_SESSION_MAX_BACKEND_MEMORY_BYTES
        ),
        "a staged chunk holds the largest row": MAX_ROW_BYTES <= ADMISSION_CHUNK_BYTES,
        "a staged chunk and its envelope fit the transport ceiling": (
            ADMISSION_CHUNK_BYTES + ADMISSION_CHUNK_ENVELOPE_BYTES <= TRANSPORT_CEILING_BYTES
        ),
        "an abandoned admission outlives a whole call of its runner": (
            ADMISSION_IDLE_MS > CALL_BUDGET_MS
        ),
        "an admission lives past its idle window; it holds at least one chunk": (
            ADMISSION_MAX_LIFETIME_MS > ADMISSION_IDLE_MS
            and ADMISSION_MAX_STAGED_BYTES >= ADMISSION_CHUNK_BYTES
            and ADMISSION_MAX_STAGED_BYTES <= ORG_MAX_STAGED_BYTES <= STAGING_MAX_TOTAL_BYTES
        ),
        "one transaction holds a whole chunk request as jsonb, and less than its org": (
            6 * TRANSPORT_CEILING_BYTES <= STAGING_MAX_TRANSACTION_BYTES < ORG_MAX_STAGED_BYTES
        ),
        "a token holds at least one open admission and fewer than its org": (
            1 <= TOKEN_MAX_OPEN_ADMISSIONS < ORG_MAX_OPEN_ADMISSIONS
        ),
        "a compacted counter log is shorter than the reaper's compaction threshold": (
            len(("total", "queued", "running", "completed", "failed")) + MAX_CONTRACT_COLUMNS
            < COUNTER_LOG_COMPACT_ROWS
        ),
    }
    broken = [name for name, holds in relations.items() if not holds]
    if broken:
        raise RuntimeError(f"sheetplane budgets are inconsistent: {broken}")


_check()
