"""The domain values every part shares: sheet refs, contracts, rows to write,
results, page requests and pages. Plain, frozen, and free of I/O.

They live below every road so that ``store``, ``gateway``, ``pages``,
``sessions`` and ``runtime`` all take their values from one place, and the
HTTP client can use them without importing the store (or psycopg).
``sheetplane.pages`` re-exports ``PageRequest`` and ``Page``.
"""

from __future__ import annotations

import datetime
import secrets
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeVar, get_args

import attrs

from ._ints import check_int, is_int
from .budgets import DB_SESSION_RENEWAL_WINDOW_MS, READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS
from .errors import InvalidInputError
from .identity import ROW_KEY_FIELD
from .names import normalize_play_name, normalize_table_namespace

RowStatus = Literal["pending", "running", "enriched", "failed", "stale"]
RowMode = Literal["output", "all"]
StaleReason = Literal[
    "newer_write_version", "older_write_version", "already_terminal", "unreported"
]
ColumnSource = Literal["input", "mapField", "output"]
#: In the one canonical order: from the least privilege to the most on the sheet's
#: rows, then ``rows.admit`` (the direct road's admission in one transaction: new rows
#: stamped with the version its transaction took, ``store/_direct.py``), then
#: ``rows.stage`` (staged admission's chunks: insert-only on the staging tables,
#: nothing on the rows) and ``rows.claim`` (an attempt's shares: only the sheet's
#: share functions, ``store/_shares.py``).
Operation = Literal[
    "rows.read",
    "rows.append",
    "rows.upsert",
    "rows.replace",
    "rows.admit",
    "rows.stage",
    "rows.claim",
]
LogicalTable = Literal["sheet_rows", "dataset_rows", "play_output"]

#: Every operation a session may be granted, in the one canonical order.
OPERATIONS: Final[tuple[Operation, ...]] = get_args(Operation)
#: The logical tables of a sheet namespace a session may target.
LOGICAL_TABLES: Final[tuple[LogicalTable, ...]] = get_args(LogicalTable)
#: Why a terminal write left a row alone.
STALE_REASONS: Final[frozenset[StaleReason]] = frozenset(get_args(StaleReason))
#: How a read shapes its rows.
ROW_MODES: Final[tuple[RowMode, ...]] = get_args(RowMode)
#: The benign stale reason: the row was already terminal at this very version.
BENIGN_STALE_REASONS: Final[frozenset[StaleReason]] = frozenset({"already_terminal"})

#: The range of a Postgres ``bigint``: write versions, offsets, input indexes and
#: session limits are stored as one.
BIGINT_MIN: Final = -(2**63)
BIGINT_MAX: Final = 2**63 - 1
#: The largest Postgres ``integer``: a chunk's ``seq`` and a receipt's ``run_attempt``
#: are stored as one, so the wire and the store refuse a larger value (400, not 500).
INTEGER_MAX: Final = 2**31 - 1


def canonical_operations(operations: Iterable[object]) -> tuple[Operation, ...] | None:
    """``operations`` as a set in the canonical order, or None when one is not an operation."""
    wanted = set()
    for op in operations:
        if not isinstance(op, str) or op not in OPERATIONS:
            return None
        wanted.add(op)
    return tuple(op for op in OPERATIONS if op in wanted)


@attrs.frozen
class SheetRef:
    """Which sheet: an org's play's table namespace. The play name and the namespace
    are held normalised (``sheetplane.names``): they are the sheet's identity."""

    org_id: str
    """The owning organisation."""
    play_name: str = attrs.field(converter=normalize_play_name)
    """The play whose sheet this is (normalised)."""
    table_namespace: str = attrs.field(converter=normalize_table_namespace)
    """The sheet's namespace within the play (normalised)."""


#: The sheet table's system columns, in table order, the seed runtime's list: every row
#: read carries some of them (``_key``, ``_status``, ...), so no contract column may take
#: one as its id or name. ``seq`` holds the row's write and admitted versions.
SYSTEM_COLUMNS: Final[tuple[str, ...]] = (
    "_key",
    "_status",
    "_run_id",
    "_error",
    "_stage",
    "_provider",
    "_input_index",
    "_created_at",
    "_updated_at",
    "_cell_meta",
    "seq",
)

_COLUMN_SOURCES: Final = get_args(ColumnSource)


def _column_text(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A column's ``id`` and ``sql_name``: a string with a character that is not
    whitespace, and no system column. The one statement of the rule: the gateway
    reads a contract into ``ContractColumn``s and answers this refusal 400."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(
            f"ContractColumn.{attribute.name} must be a non-empty string "
            f"(not only whitespace), got {value!r}"
        )
    if value in SYSTEM_COLUMNS:
        raise InvalidInputError(
            f"ContractColumn.{attribute.name} {value!r} is a system column of every sheet "
            f"(reads carry it): name the column otherwise"
        )


def _column_source(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in _COLUMN_SOURCES:
        raise InvalidInputError(
            f"ContractColumn.source must be one of {list(_COLUMN_SOURCES)}, got {value!r}"
        )


def _column_field(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidInputError(
            f"ContractColumn.field must be a non-empty string or None, got {value!r}"
        )


@attrs.frozen
class ContractColumn:
    """One column of a sheet contract: ``ContractColumn(id, sql_name, source, field=None)``.

    A map's ``fn`` returns its outputs keyed by column ``id`` (the ``sql_name``
    is accepted too), and reads return rows keyed by ``id``.
    """

    id: str = attrs.field(validator=_column_text)
    """The column's id in the play: the key of its value in rows read and in outputs."""
    sql_name: str = attrs.field(validator=_column_text)
    """Its physical name; a name starting with ``_`` is never a physical column."""
    source: ColumnSource = attrs.field(validator=_column_source)
    """Where its value comes from: the input row (``input``), a field the map sets
    (``mapField``) or the map's outputs (``output``)."""
    field: str | None = attrs.field(default=None, validator=_column_field)
    """The row field it reads, when it differs from ``id``."""

    @property
    def is_physical(self) -> bool:
        """Whether the sheet table has a jsonb column for it."""
        return not self.sql_name.startswith("_")

    @property
    def lookup_names(self) -> tuple[str, ...]:
        """Names a row may carry the column's value under, in order of preference.

        ``field`` (the row field an input column reads), then the column ``id``,
        then its ``sql_name``. Never ``__deeplineRowKey``: a row's own key is
        stripped from its data, whatever the contract calls its columns.
        """
        names = [self.field] if self.field else []
        names += [self.id, self.sql_name]
        return tuple(name for name in dict.fromkeys(names) if name != ROW_KEY_FIELD)


def _contract_columns(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, tuple):
        raise InvalidInputError(
            "SheetContract takes a tuple of ContractColumn "
            f"(SheetContract((ContractColumn(...), ...))), got {type(value).__name__}"
        )
    seen: set[str] = set()
    for index, column in enumerate(value):
        if not isinstance(column, ContractColumn):
            raise InvalidInputError(
                f"SheetContract.columns[{index}] must be a ContractColumn, got {column!r}"
            )
        if column.id in seen:
            raise InvalidInputError(f"SheetContract has two columns with the id {column.id!r}")
        seen.add(column.id)


@attrs.frozen
class SheetContract:
    """The columns a play declares for its sheet: ``SheetContract((column, ...))``.

    Checked when built: a tuple of ``ContractColumn`` with distinct ids, none
    named as a system column (``SYSTEM_COLUMNS``); anything else raises
    ``InvalidInputError`` before any request is sent.
    """

    columns: tuple[ContractColumn, ...] = attrs.field(default=(), validator=_contract_columns)
    """In declaration order."""


@attrs.frozen
class InlineAdmission:
    """What a one-request admission (``start_dataset``, ``start_sheet_dataset``) did,
    with its rows inline: what the seed wire shape answers."""

    inserted: int
    """Rows inserted as new ``pending`` rows."""
    skipped: int
    """Input rows not admitted: duplicates within the input and already-enriched rows."""
    pending_rows: tuple[dict[str, Any], ...]
    """Rows this attempt must map, each carrying ``_key``, in input order."""
    completed_rows: tuple[dict[str, Any], ...]
    """Already-enriched rows merged with their stored outputs, each carrying ``_key``."""
    write_version: int
    """This admission's write version; terminal writes must carry it."""
    table_namespace: str
    """The sheet's namespace."""


AdmittedPartName = Literal["pending", "completed", "unsettled"]
ADMITTED_PARTS: Final[tuple[AdmittedPartName, ...]] = get_args(AdmittedPartName)


@attrs.frozen
class AdmittedPart:
    """A read filter: one admission's pending or completed rows.

    ``pending``: the rows the admission at ``write_version`` admitted or
    re-admitted for mapping (they carry that version, whatever their status
    since); ``completed``: the already-enriched input rows it kept, which keep
    their older version. Both are stamped ``(seq).admitted_version = write_version``
    by the admission; a later admission of the same row takes it over.
    ``unsettled``: the ``pending`` rows not yet written terminal (still
    ``pending`` or ``running``): what a worker of the attempt still has to map.

    ``first_index`` and ``last_index`` (both or neither) narrow any part to the
    rows whose ``_input_index`` lies between them: one share of the attempt.
    """

    write_version: int
    """The admission's write version."""
    part: AdmittedPartName
    """``pending``, ``completed`` or ``unsettled``."""
    first_index: int | None = None
    """The first ``_input_index`` of the rows read (None: no range)."""
    last_index: int | None = None
    """The last ``_input_index`` of the rows read (None: no range)."""

    def __attrs_post_init__(self) -> None:
        if not is_int(self.write_version) or not 1 <= self.write_version <= BIGINT_MAX:
            raise InvalidInputError(
                f"write_version must be a positive bigint, got {self.write_version!r}"
            )
        if self.part not in ADMITTED_PARTS:
            raise InvalidInputError(
                f"part must be one of {list(ADMITTED_PARTS)}, got {self.part!r}"
            )
        if (self.first_index is None) != (self.last_index is None):
            raise InvalidInputError("first_index and last_index go together (both or neither)")
        if self.first_index is not None and self.last_index is not None:
            check_int("first_index", self.first_index, BIGINT_MIN, BIGINT_MAX)
            check_int("last_index", self.last_index, self.first_index, BIGINT_MAX)


@attrs.frozen
class RowFilter:
    """Which rows a store read sees and how it shapes them; the default is every row,
    contract columns only.

    The store checks it where a read enters (``InvalidInputError`` for a bad field);
    reads that return keys or a count ignore ``row_mode``.
    """

    run_id: str | None = None
    """Only the rows this run stamped, or None for every run's."""
    row_mode: RowMode = "output"
    """``output`` (contract columns) or ``all`` (every system column too)."""
    admitted: AdmittedPart | None = None
    """One admission's pending or completed rows only, or None for every row."""


#: Every row, contract columns only: the reads' default filter.
EVERY_ROW: Final[RowFilter] = RowFilter()


@attrs.frozen
class AdmissionCounts:
    """What an admission did, in a size that does not grow with its input."""

    write_version: int
    """The admission's write version; terminal writes must carry it."""
    inserted: int
    """Rows inserted as new ``pending`` rows."""
    skipped: int
    """Input rows not admitted: duplicates within the input and already-enriched rows."""
    pending_count: int
    """Rows this attempt must map (new and re-admitted)."""
    completed_count: int
    """Already-enriched input rows, kept with their outputs."""
    table_namespace: str
    """The sheet's namespace."""


@attrs.frozen
class CompleteRow:
    """One row's successful map output."""

    key: str
    """The row key."""
    data: Mapping[str, Any]
    """Output values by contract column id or sql name."""
    cell_meta_patch: Mapping[str, Any] | None = None
    """Merged into ``_cell_meta``."""


@attrs.frozen
class FailRow:
    """One row's map failure."""

    key: str
    """The row key."""
    error: str
    """What went wrong, stored in ``_error``."""
    data: Mapping[str, Any] | None = None
    """Partial outputs, if any."""


@attrs.frozen
class StaleRow:
    """A row a terminal write did not touch, and why."""

    key: str
    """The row key."""
    reason: StaleReason
    """Why the row was not written."""
    row_version_stamp: int | None
    """The row's stored write version, when the row exists."""


@attrs.frozen
class TerminalWriteResult:
    """What ``complete_map_rows`` or ``fail_map_rows`` did."""

    committed_keys: tuple[str, ...]
    """Keys written (or replayed identically) at this version."""
    stale_rows: tuple[StaleRow, ...]
    """Keys not written, with their reasons."""
    updated: int
    """Rows whose stored state changed."""

    @property
    def stale_keys(self) -> tuple[str, ...]:
        """The keys of ``stale_rows``."""
        return tuple(row.key for row in self.stale_rows)


@attrs.frozen
class WriteResult:
    """What ``append_rows``, ``upsert_rows`` or ``replace_rows`` did."""

    written: int
    """Rows inserted or changed."""
    replayed: bool
    """True when the idempotency key had already been applied and nothing was written."""


@attrs.frozen
class Summary:
    """A sheet's status counters."""

    total: int
    queued: int
    running: int
    completed: int
    failed: int


@attrs.frozen
class Receipt:
    """A completed unit of work, recorded once."""

    key: str
    result: Any
    run_id: str
    completed_at: str
    """ISO 8601."""


@attrs.frozen
class ReceiptCompletion:
    """The receipt and whether this call wrote it."""

    receipt: Receipt
    completion_disposition: Literal["persisted", "existing"]


CodeFormat = Literal["function", "cjs_module", "esm_module"]
CODE_FORMATS: tuple[CodeFormat, ...] = ("function", "cjs_module", "esm_module")


def _code_format(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and value not in CODE_FORMATS:
        raise InvalidInputError(f"code_format must be one of {CODE_FORMATS} or None, got {value!r}")


def _play_text(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidInputError(f"{attribute.name} must be a non-empty string, got {value!r}")


def _snapshot(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise InvalidInputError(f"contract_snapshot must be a mapping or None, got {value!r}")


@attrs.frozen
class ResolvedPlay:
    """A play a reference resolved to (``resolve_play``): its id and how to run it."""

    play_id: str = attrs.field(validator=_play_text)
    """The play's stable id."""
    source_code: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    """The play's source, when it is shipped as text."""
    artifact: Any = None
    """A built artifact (any JSON), when it is shipped built."""
    code_format: CodeFormat | None = attrs.field(default=None, validator=_code_format)
    """How the code is packaged: ``function``, ``cjs_module`` or ``esm_module``."""
    contract_snapshot: Mapping[str, Any] | None = attrs.field(default=None, validator=_snapshot)
    """The sheet contract the play was built against, as JSON."""


#: A lease token's random bytes (``secrets.token_urlsafe``: 43 characters).
LEASE_TOKEN_BYTES = 32


def new_lease_token() -> str:
    """A fresh secret lease token for a work receipt claim."""
    return secrets.token_urlsafe(LEASE_TOKEN_BYTES)


@attrs.frozen
class ReceiptClaim:
    """The answer to a claim of a work receipt's lease (``claim_work_receipt``)."""

    acquired: bool
    """Whether the caller holds the lease now (newly taken, taken over, or renewed)."""
    holder: str | None
    """Who holds the lease now (None once the work is completed, or when no one does)."""
    expires_at: str | None
    """When the current lease expires, ISO 8601 on the gateway's clock (None once completed)."""
    receipt: Receipt | None
    """The completed receipt, when the work is already done (then ``acquired`` is False)."""
    lease_token: str | None = attrs.field(default=None, repr=False)
    """The lease's secret, to the claimant only and only when ``acquired``: renewing,
    releasing and a fenced completion need it (a holder's name is not enough). A
    secret: never in a repr, a log or an error."""


def _non_negative_int(name: str, minimum: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
        check_int(name, value, minimum)

    return check


@attrs.frozen
class PageRequest:
    """One page to read: ``limit`` rows starting at ``offset`` in the sheet's read order."""

    limit: int = attrs.field(validator=_non_negative_int("limit", 1))
    """Rows to read, at least 1."""
    offset: int = attrs.field(validator=_non_negative_int("offset", 0))
    """Rows to skip, at least 0."""


@attrs.frozen
class RowCursor:
    """Where a keyset read stopped: the read-order position of the last row returned."""

    input_index: int | None
    """The row's ``_input_index`` (None sorts after every number)."""
    created_at: datetime.datetime
    """The row's ``_created_at``."""
    key: str
    """The row's ``_key``."""


@attrs.frozen
class Page:
    """The rows of one page, with the ``limit`` and ``offset`` that were requested."""

    rows: tuple[dict[str, Any], ...]
    """At most ``limit`` rows, each a JSON object, in the sheet's read order."""
    limit: int
    """The requested limit."""
    offset: int
    """The requested offset."""


#: The pages every road serves: ``limit`` from 1 to ``READ_PAGE_MAX_ROWS`` rows, ``offset``
#: within a Postgres ``bigint``. ``check_page_request`` holds a ``PageRequest`` to them, and
#: the wire's classes (``protocol/_messages.py``) a request's members.
PAGE_LIMITS: Final = (1, READ_PAGE_MAX_ROWS)
PAGE_OFFSETS: Final = (0, BIGINT_MAX)


def check_page_limit(limit: object) -> int:
    """A page's row limit: an integer from 1 to ``READ_PAGE_MAX_ROWS``."""
    return check_int("limit", limit, *PAGE_LIMITS)


class CheckedPage(PageRequest):
    """A ``PageRequest`` after its one check on a road: ``limit`` within ``PAGE_LIMITS``
    and ``offset`` within ``PAGE_OFFSETS``.

    Making one is the check (``CheckedPage(limit, offset)``, or
    ``check_page_request`` of a caller's ``PageRequest``); the wire decoder
    (``decoded_page_batch``) makes them from pages a request's wire class
    held to the same rules. A road handed one reads it without checking it
    again (``check_page_request`` gives it back as it is), and a client writes
    it without running the wire class's rules again. It equals and hashes as
    the ``PageRequest`` of the same ``limit`` and ``offset``; pickled or
    copied, it is checked again where it is read back.
    """

    __slots__ = ()

    def __init__(self, limit: object, offset: object) -> None:
        object.__setattr__(self, "limit", check_page_limit(limit))
        object.__setattr__(self, "offset", check_int("offset", offset, *PAGE_OFFSETS))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PageRequest):
            return (self.limit, self.offset) == (other.limit, other.offset)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = PageRequest.__hash__

    def __repr__(self) -> str:
        return f"PageRequest(limit={self.limit!r}, offset={self.offset!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (CheckedPage, (self.limit, self.offset))


def check_page_request(request: object) -> CheckedPage:
    """A ``PageRequest`` every road can serve, checked once where it enters a road:
    ``limit`` at most ``READ_PAGE_MAX_ROWS`` and ``offset`` within a Postgres
    ``bigint``; else ``InvalidInputError``. A ``CheckedPage`` comes back as it is."""
    if isinstance(request, CheckedPage):
        return request
    if not isinstance(request, PageRequest):
        raise InvalidInputError(f"page request must be a PageRequest, got {request!r}")
    return CheckedPage(request.limit, request.offset)


#: What only this module's makers of ``CheckedPages`` hold.
_CHECKED: Final = object()


class CheckedPages(tuple[CheckedPage, ...]):
    """A batch read's pages after their one check on a road: 1 to ``READ_BATCH_MAX_PAGES``
    ``CheckedPage``s.

    Only ``check_page_batch`` (the client's and the store's check of the
    ``PageRequest``s a caller passes) and ``decoded_page_batch`` (the reference
    gateway's, of the pages a request's wire class has checked) make one; a
    road handed one reads it without checking it again. Pickled, it is
    checked again where it is read back.
    """

    __slots__ = ()

    def __new__(cls, pages: Iterable[CheckedPage], key: object) -> CheckedPages:
        if key is not _CHECKED:
            raise TypeError("CheckedPages are made by check_page_batch, not directly")
        return super().__new__(cls, pages)

    def __reduce__(self) -> tuple[Any, ...]:
        return (check_page_batch, (list(self),))


def check_page_batch(pages: object) -> CheckedPages:
    """A batch read's pages, checked once where they enter a road (the client, the
    store): 1 to ``READ_BATCH_MAX_PAGES`` ``check_page_request``s; else
    ``InvalidInputError``. Pages already checked come back as they are."""
    if isinstance(pages, CheckedPages):
        return pages
    if isinstance(pages, str | bytes) or not isinstance(pages, Sequence):
        raise InvalidInputError("pages must be a sequence of PageRequest")
    requests = [check_page_request(request) for request in pages]
    if not 1 <= len(requests) <= READ_BATCH_MAX_PAGES:
        # The runtime's text, word for word (the gateway's check says the same).
        raise InvalidInputError(
            f"Runtime dataset read batch requires 1-{READ_BATCH_MAX_PAGES} pages."
        )
    return CheckedPages(requests, _CHECKED)


def decoded_page_batch(pages: Iterable[tuple[int, int]]) -> CheckedPages:
    """The ``(limit, offset)`` pages of a decoded request as ``CheckedPages``, not
    checked again: for the wire decoder only (``protocol/_domain.page_batch_of``),
    whose classes held them to ``PAGE_LIMITS``, ``PAGE_OFFSETS`` and the batch's
    count as they were read."""
    return CheckedPages((_decoded_page(limit, offset) for limit, offset in pages), _CHECKED)


def _decoded_page(limit: int, offset: int) -> CheckedPage:
    return unchecked(CheckedPage, limit=limit, offset=offset)


A = TypeVar("A")


def unchecked(cls: type[A], **fields: Any) -> A:
    """The frozen attrs value ``cls(**fields)`` made the way attrs' own initialiser sets
    a frozen value's members, without running its validators: for values a check
    already held to the same rules (a decoded message's pages, a checked batch
    written to the wire). Every field must be given."""
    names = {field.name for field in attrs.fields(typing.cast(Any, cls))}
    if set(fields) != names:
        raise TypeError(f"{cls.__name__} needs exactly {sorted(names)}, got {sorted(fields)}")
    value = object.__new__(cls)
    for name, member in fields.items():
        object.__setattr__(value, name, member)
    return value


# --- scoped DB sessions -------------------------------------------------------------

_MS_PER_SECOND: Final = 1000


def _optional_positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A limit: None (not limited) or a positive ``bigint``, as the wire carries it."""
    if value is not None and (not is_int(value) or not 1 <= value <= BIGINT_MAX):
        raise InvalidInputError(
            f"{attribute.name} must be a positive integer (at most {BIGINT_MAX}) or None, "
            f"got {value!r}"
        )


@attrs.frozen
class SessionLimits:
    """Advisory limits of a session; ``None`` means not limited."""

    max_rows: int | None = attrs.field(default=None, validator=_optional_positive)
    """Rows one use of the session may touch."""
    max_bytes: int | None = attrs.field(default=None, validator=_optional_positive)
    """Bytes one use of the session may move."""
    max_requests: int | None = attrs.field(default=None, validator=_optional_positive)
    """Requests the session may serve."""

    def satisfies(self, requested: SessionLimits) -> bool:
        """Whether a session with these limits may serve a request for ``requested``.

        A limit this session does not set satisfies any request.
        """
        for field in attrs.fields(SessionLimits):
            want, have = getattr(requested, field.name), getattr(self, field.name)
            if want is not None and have is not None and have < want:
                return False
        return True


@attrs.frozen
class PostgresTables:
    """The physical names a session's role is granted on."""

    schema: str
    sheet_table: str
    event_table: str
    summary_table: str
    column_summary_table: str


@attrs.frozen
class DbSession:
    """An open scoped session: its identity, its expiry and its (decrypted) URL."""

    org_id: str
    play_name: str
    table_namespace: str
    logical_table: str
    operations: tuple[str, ...]
    limits: SessionLimits
    expires_at: str
    """``expiresAt`` exactly as the gateway sent it."""
    expires_at_epoch: float
    """The same instant in seconds since the epoch."""
    postgres: PostgresTables
    postgres_url: str = attrs.field(repr=False)
    """The scoped URL, with its password. A secret: never logged, never in a repr."""

    def remaining_ms(self, now_epoch: float) -> float:
        """Milliseconds until expiry at wall time ``now_epoch``."""
        return (self.expires_at_epoch - now_epoch) * _MS_PER_SECOND

    def reusable(self, now_epoch: float) -> bool:
        """Whether more than the renewal window remains."""
        return self.remaining_ms(now_epoch) > DB_SESSION_RENEWAL_WINDOW_MS
