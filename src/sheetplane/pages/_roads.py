"""The two real roads to a sheet: a scoped Postgres session, or the gateway over HTTP.

Both implement ``SheetRoad`` for one ``ReadScope`` and read the same rows in
the same order (``_input_index ASC NULLS LAST, _created_at ASC, _key ASC``):

* ``DirectRoad`` asks the ``SessionManager`` for a session shaped like the
  read (``rows.read``, ``max_rows`` = the rows the read may return: the sum of
  a batch's page limits, or a keyset read's limit) and reads through the
  store on that session's pool, so Postgres itself enforces what the role
  may see.
* ``GatewayRoad`` reads with ``GatewayClient``: batch reads with
  ``runtime_sheet_read_rows_batch`` (page by page on a gateway that predates
  it), sequential reads by keyset with ``runtime_sheet_read_rows`` and
  ``input.after``, by growing offsets only on a gateway that ignores
  ``after``.

Each road keeps ``RoadStats`` (reads sent, pages read, reads answered too
large), which the runtime and the demo report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .._recovery import retry_idempotent
from .._types import CheckedPage, Page, PageRequest, RowCursor, SheetRef
from ..budgets import READ_PAGE_MAX_ROWS
from ..errors import InvalidInputError, ReadBatchTooLargeError, SessionError
from ..gateway.client import GatewayClient
from ..sessions import AccessShape, SessionLimits, SessionManager, batch_read_shape
from ._reader import ReadScope

if TYPE_CHECKING:
    from ..store import SheetStore

__all__ = ["DirectRoad", "GatewayCursor", "GatewayRoad", "RoadStats"]


@attrs.define
class RoadStats:
    """What one road (or several sharing this object) has sent; plain counters."""

    batch_reads: int = 0
    """``read_batch`` calls: one batch request each (the splitter's retries included)."""
    pages_read: int = 0
    """Pages those calls asked for."""
    keyset_reads: int = 0
    """Sequential reads sent by keyset (``read_after``)."""
    offset_reads: int = 0
    """Sequential reads sent by offset because the gateway ignored ``after``."""
    counts: int = 0
    """``count`` calls."""
    too_large: int = 0
    """Reads answered ``ReadBatchTooLargeError`` (each one makes the caller split)."""


class _ScopedRoad:
    """What both roads share: the checked ``ReadScope`` and the ``RoadStats`` they keep."""

    def __init__(self, scope: ReadScope, stats: RoadStats | None) -> None:
        if not isinstance(scope, ReadScope):
            raise InvalidInputError(f"scope must be a ReadScope, got {scope!r}")
        self._scope = scope
        self.stats = RoadStats() if stats is None else stats

    def __repr__(self) -> str:
        scope = self._scope
        return f"<{type(self).__name__} {scope.table_namespace!r} run={scope.run_id!r}>"

    @property
    def scope(self) -> ReadScope:
        """The authority scope of every read."""
        return self._scope


class DirectRoad(_ScopedRoad):
    """Reads one sheet through scoped DB sessions minted (or preloaded) by ``sessions``.

    Every read runs on the pool of a session shaped like it; the manager
    caches sessions and pools per shape. A session minted for another org's or
    play's tables than ``scope`` names raises ``SessionError`` before anything
    is read. If cancelled, the statement is cancelled on the server and the
    connection goes back to its pool clean (see ``TrioPool``).
    """

    def __init__(
        self,
        sessions: SessionManager,
        scope: ReadScope,
        *,
        user_email: str | None = None,
        stats: RoadStats | None = None,
    ) -> None:
        super().__init__(scope, stats)
        self._sessions = sessions
        self._user_email = user_email
        self._sheet = SheetRef(scope.org_id, scope.play_name, scope.table_namespace)
        # The direct road alone needs the store (and psycopg): a gateway_only runner
        # never loads it.
        from ..store import sheet_names

        self._names = sheet_names(self._sheet)

    def _shape(self, max_rows: int | None) -> AccessShape:
        return AccessShape(
            table_namespace=self._scope.table_namespace,
            operations=("rows.read",),
            limits=SessionLimits(max_rows=max_rows),
            user_email=self._user_email,
        )

    async def _checked_session(self, shape: AccessShape) -> None:
        session = await self._sessions.session(shape)
        tables = session.postgres
        if (tables.schema, tables.sheet_table) != (self._names.schema, self._names.sheet_table):
            raise SessionError(
                "the DB session was minted for other tables than this sheet's "
                f"(namespace {self._scope.table_namespace!r})"
            )

    async def read_batch(self, pages: Sequence[PageRequest]) -> list[Page]:
        """The pages under one snapshot, on a session with ``max_rows`` = their limits' sum."""
        requests = list(pages)
        shape = batch_read_shape(self._scope.table_namespace, requests, user_email=self._user_email)
        self.stats.batch_reads += 1
        self.stats.pages_read += len(requests)
        await self._checked_session(shape)

        async def attempt() -> list[Page]:
            async with self._sessions.store(shape) as store:
                return await store.read_rows_batch(self._sheet, requests, which=self._scope.which)

        try:
            # Reads change nothing: retried after a lost connection (``retry_idempotent``).
            return await retry_idempotent(attempt)
        except ReadBatchTooLargeError:
            self.stats.too_large += 1
            raise

    async def read_after(
        self, cursor: object | None, limit: int
    ) -> tuple[list[dict[str, Any]], object | None]:
        """Up to ``limit`` rows after ``cursor`` (a ``RowCursor``; None: from the start).

        Raises ``ReadBatchTooLargeError`` as soon as the rows would exceed
        ``READ_BATCH_MAX_RESPONSE_BYTES`` (the store measures them as they
        decode), as a gateway would answer 413.
        """
        if cursor is not None and not isinstance(cursor, RowCursor):
            raise InvalidInputError(f"cursor must be a RowCursor or None, got {cursor!r}")
        page = CheckedPage(limit, 0)  # the read's one check: the store takes it as it is
        shape = self._shape(page.limit)
        self.stats.keyset_reads += 1
        await self._checked_session(shape)

        async def attempt() -> tuple[list[dict[str, Any]], RowCursor | None]:
            store: SheetStore
            async with self._sessions.store(shape) as store:
                return await store.read_rows_after(
                    self._sheet, cursor, page, which=self._scope.which
                )

        try:
            return await retry_idempotent(attempt)
        except ReadBatchTooLargeError:
            self.stats.too_large += 1
            raise

    async def count(self) -> int:
        """How many rows the scope reads (``count(*)``, limited to the scope's run)."""
        shape = self._shape(None)
        self.stats.counts += 1
        await self._checked_session(shape)

        async def attempt() -> int:
            async with self._sessions.store(shape) as store:
                return await store.count(self._sheet, which=self._scope.which)

        return await retry_idempotent(attempt)


@attrs.frozen
class GatewayCursor:
    """Where a gateway road's sequential read stopped."""

    after: dict[str, Any] | None
    """The gateway's ``nextAfter`` to send back; None when reading by offset."""
    offset: int
    """Rows read so far: the offset a gateway without keyset reads is asked for."""


class GatewayRoad(_ScopedRoad):
    """Reads one sheet through the runtime gateway with ``client``.

    Batch reads fall back to single-page reads on a gateway without the batch
    action (inside ``GatewayClient.read_rows_batch``); sequential reads go by
    keyset and fall back to offsets on a gateway that ignores ``after``.
    Cancellation: a read cancelled mid-request closes its connection; reads
    are side-effect free, so nothing is left half done.
    """

    def __init__(
        self, client: GatewayClient, scope: ReadScope, *, stats: RoadStats | None = None
    ) -> None:
        super().__init__(scope, stats)
        self._client = client

    async def read_batch(self, pages: Sequence[PageRequest]) -> list[Page]:
        """The pages in one ``runtime_sheet_read_rows_batch`` request."""
        requests = list(pages)
        self.stats.batch_reads += 1
        self.stats.pages_read += len(requests)
        try:
            return await self._client.read_rows_batch(
                self._scope.table_namespace,
                requests,
                run_id=self._scope.run_id,
                row_mode=self._scope.row_mode,
                admitted=self._scope.admitted,
            )
        except ReadBatchTooLargeError:
            self.stats.too_large += 1
            raise

    async def read_after(
        self, cursor: object | None, limit: int
    ) -> tuple[list[dict[str, Any]], object | None]:
        """Up to ``limit`` rows after ``cursor`` (a ``GatewayCursor``; None: from the start)."""
        if cursor is not None and not isinstance(cursor, GatewayCursor):
            raise InvalidInputError(f"cursor must be a GatewayCursor or None, got {cursor!r}")
        scope, client = self._scope, self._client
        # The read's one check of ``limit`` is the client's (the page it makes, or this
        # road's CheckedPage, which the client takes as it is).
        try:
            if cursor is not None and cursor.after is None:
                # This gateway ignored ``after`` before: go on by offset.
                self.stats.offset_reads += 1
                page = await client.read_rows(
                    scope.table_namespace,
                    CheckedPage(limit, cursor.offset),
                    run_id=scope.run_id,
                    row_mode=scope.row_mode,
                    admitted=scope.admitted,
                )
                rows, next_after, keyset = list(page.rows), None, False
            else:
                self.stats.keyset_reads += 1
                answer = await client.read_rows_after(
                    scope.table_namespace,
                    None if cursor is None else cursor.after,
                    limit,
                    0 if cursor is None else cursor.offset,
                    run_id=scope.run_id,
                    row_mode=scope.row_mode,
                    admitted=scope.admitted,
                )
                rows, next_after, keyset = list(answer.rows), answer.next_after, answer.keyset
        except ReadBatchTooLargeError:
            self.stats.too_large += 1
            raise
        offset = (0 if cursor is None else cursor.offset) + len(rows)
        if keyset:
            return rows, None if next_after is None else GatewayCursor(next_after, offset)
        # The gateway ignored ``after`` (it predates keyset reads, or a rolling
        # fleet sent this request to an older one): the rows answer the offset
        # sent, which is still the right page, and the rest goes by offset.
        more = len(rows) == limit
        return rows, GatewayCursor(None, offset) if more else None

    async def count(self) -> int:
        """How many rows the scope reads.

        The whole sheet's count is the summary's ``total`` (one request); with
        a run or admission filter there is no count action, so the keys it
        selects are read page by page (``READ_PAGE_MAX_ROWS`` keys a request).
        """
        scope, client = self._scope, self._client
        self.stats.counts += 1
        if scope.run_id is None and scope.admitted is None:
            return (await client.summary(scope.table_namespace)).total
        total = 0
        while True:
            keys = await client.read_row_keys(
                scope.table_namespace,
                CheckedPage(READ_PAGE_MAX_ROWS, total),
                run_id=scope.run_id,
                admitted=scope.admitted,
            )
            total += len(keys)
            if len(keys) < READ_PAGE_MAX_ROWS:
                return total
