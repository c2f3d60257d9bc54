"""Where sheetplane's client and runtime follow the seed's runtime, and where they
differ on purpose (docs/parity.md states each difference and its reason).

Followed: the error texts and fields of ``RuntimeSheetDatasetReadBatchTooLargeError``
and ``RuntimeApiResponseTooLargeError``, the 1-to-4-pages text, an uncached
pool one connection wide, and a one-request admission that outlives the 30 s
request timeout. Stated: a 413 on a single-page read splits it as a batch's
does, and upsert's keys, dedupe and input indexes.
"""

from __future__ import annotations

import errno
import json
import uuid
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg import errors as pg_errors

from _runtime_helpers import CONTRACT, ORG, CountingGateway
from _store_helpers import set_status, stored_rows
from sheetplane import (
    InvalidInputError,
    ReadBatchTooLargeError,
    ResponseTooLargeError,
)
from sheetplane._types import (
    CompleteRow,
    ContractColumn,
    SheetContract,
    SheetRef,
    WriteResult,
    check_page_batch,
)
from sheetplane.budgets import (
    ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS,
    DB_SESSION_MAX_CONNECTIONS,
    READ_BATCH_MAX_RESPONSE_BYTES,
    REQUEST_TIMEOUT_MS,
)
from sheetplane.gateway.client import GatewayClient
from sheetplane.identity import derive_row_identity
from sheetplane.pages import PageRequest
from sheetplane.runtime import open_runtime
from sheetplane.sessions import AccessShape
from sheetplane.store import SheetStore, is_transient_connect_error
from sheetplane.store._rowdata import column_lookup_names

BASE = "http://gateway.test"


def _client(handler: Any) -> GatewayClient:
    return GatewayClient(
        BASE, "tok-differences-1", play_name="p", transport=httpx.MockTransport(handler)
    )


# --- followed: the seed's texts ---------------------------------------------------------


def test_read_batch_too_large_reads_as_the_runtimes_error() -> None:
    # RuntimeSheetDatasetReadBatchTooLargeError(observedBytes), 0.3.129.
    error = ReadBatchTooLargeError(13_000_000)
    assert str(error) == (
        "Runtime dataset read batch exceeds the 12582912 byte decoded response budget"
        " (observed at least 13000000 bytes)."
    )
    assert (error.code, error.observed_bytes) == ("runtime_sheet_read_batch_too_large", 13_000_000)


def test_response_too_large_has_the_runtimes_fields_and_text() -> None:
    # RuntimeApiResponseTooLargeError(action, limitBytes, observedBytes), 0.3.129.
    error = ResponseTooLargeError("runtime_sheet_read_rows_batch", 12_582_912, 12_582_913)
    assert (error.action, error.limit_bytes, error.observed_bytes) == (
        "runtime_sheet_read_rows_batch",
        12_582_912,
        12_582_913,
    )
    assert str(error) == (
        "Runtime API runtime_sheet_read_rows_batch response exceeds the 12582912 byte"
        " decoded-body budget (observed at least 12582913 bytes)."
    )


@pytest.mark.parametrize("pages", [0, 5])
def test_a_batch_of_no_pages_or_too_many_reads_as_the_runtimes_error(pages: int) -> None:
    with pytest.raises(InvalidInputError) as excinfo:
        check_page_batch([PageRequest(limit=1, offset=i) for i in range(pages)])
    assert str(excinfo.value) == "Runtime dataset read batch requires 1-4 pages."


# --- followed: a one-request admission may wait past 30 s ---------------------------------


async def test_a_one_request_admission_outlives_the_request_timeout(autojump_clock: Any) -> None:
    """The runtime keeps an admission's caller alive past 30 s, since a healthy
    admission may queue behind others of its sheet; one attempt waits 45 s here."""
    seen: list[tuple[float, dict[str, Any]]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append((trio.current_time(), dict(request.extensions["timeout"])))
        await trio.sleep(REQUEST_TIMEOUT_MS / 1000 + 15)
        body = json.loads(request.content)
        return httpx.Response(
            200,
            json={
                "inserted": 1,
                "skipped": 0,
                "pendingRows": [{"_key": "k1", "text": "a"}],
                "completedRows": [],
                "tableNamespace": body["tableNamespace"],
                "writeVersion": 1,
            },
        )

    async with _client(handler) as client:
        admitted = await client.start_sheet_dataset("leads", CONTRACT, [{"text": "a"}], "run-1")
    assert admitted.inserted == 1
    assert len(seen) == 1  # one attempt, not cut at 30 s and sent again
    assert seen[0][1]["read"] == ADMISSION_COMMIT_ATTEMPT_TIMEOUT_MS / 1000


# --- followed: an uncached pool is one connection wide ------------------------------------


@pytest.mark.parametrize(("disable", "width"), [(False, DB_SESSION_MAX_CONNECTIONS), (True, 1)])
async def test_an_uncached_pool_is_one_connection_wide_as_the_runtimes(
    runtime_gateway: CountingGateway, disable: bool, width: int
) -> None:
    """The runtime's request-local pool (``disablePostgresPoolCache``) has
    ``maxConnections: 1``; its cached pool 4, as sheetplane's session pool."""
    async with open_runtime(
        base_url=runtime_gateway.base_url,
        token=runtime_gateway.token,
        org_id=ORG,
        play_name=f"pools-{uuid.uuid4().hex[:8]}",
        run_id="run-1",
        disable_postgres_pool_cache=disable,
    ) as rt:
        await rt.writer("leads", CONTRACT).start([{"text": "a b"}])
        shape = AccessShape(table_namespace="leads", operations=("rows.read",))
        async with rt.sessions.store(shape) as store:
            assert store.pool.max_connections == width
        assert await rt.dataset("leads").count() == 1


# --- followed: plain writes stamp the caller's run id --------------------------------------


async def test_append_upsert_and_replace_stamp_the_runs_id(
    runtime_gateway: CountingGateway,
) -> None:
    """The runtime's writes insert ``_run_id = $4`` (the caller's run): a read
    limited to the run finds what the run appended, upserted or replaced."""
    play = f"run-ids-{uuid.uuid4().hex[:8]}"

    def runtime(run_id: str) -> Any:
        return open_runtime(
            base_url=runtime_gateway.base_url,
            token=runtime_gateway.token,
            org_id=ORG,
            play_name=play,
            run_id=run_id,
        )

    async with runtime("run-a") as rt:
        writer = rt.writer("leads", CONTRACT)
        await writer.append([{"text": "appended"}], idempotency_key="a1")
        await writer.upsert([{"text": "upserted"}])
        of_run = await rt.dataset("leads", run_id="run-a").materialize()
        assert sorted(row["text"] for row in of_run) == ["appended", "upserted"]
        assert await rt.dataset("leads", run_id="run-b").count() == 0
    async with runtime("run-b") as rt:
        await rt.writer("other", CONTRACT).replace([{"text": "replaced"}], idempotency_key="r1")
        assert [r["text"] for r in await rt.dataset("other", run_id="run-b").materialize()] == [
            "replaced"
        ]


async def test_an_upsert_revives_a_stale_row_under_its_run(
    store: SheetStore, sheet: SheetRef
) -> None:
    """The runtime's upsert sets a revived stale row's ``_run_id`` to the caller's."""
    await store.start_dataset(sheet, [{"text": "a"}], "run-1", CONTRACT)
    [key] = await stored_rows(store, sheet)
    await set_status(store, sheet, key, "stale")
    await store.upsert_rows(sheet, [{"text": "a"}], idempotency_key="u1", run_id="run-2")
    row = (await stored_rows(store, sheet))[key]
    assert (row["_status"], row["_run_id"]) == ("pending", "run-2")


# --- stated: a 413 on a single-page read --------------------------------------------------


async def test_a_413_on_a_single_page_read_is_read_batch_too_large(autojump_clock: Any) -> None:
    """The runtime maps the 413 to its too-large error for the batch action only;
    sheetplane also for ``runtime_sheet_read_rows`` (the fallback on a gateway
    without the batch action), so the page is split instead of failing."""

    async def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["action"] == "runtime_sheet_read_rows"
        return httpx.Response(
            413, json={"error": "too large", "code": "runtime_sheet_read_batch_too_large"}
        )

    async with _client(handler) as client:
        with pytest.raises(ReadBatchTooLargeError) as excinfo:
            await client.read_rows("leads", PageRequest(limit=10, offset=0))
    assert excinfo.value.observed_bytes == READ_BATCH_MAX_RESPONSE_BYTES + 1


# --- stated: upsert ----------------------------------------------------------------------


async def test_upsert_keys_a_row_by_its_own_key_before_its_content(
    store: SheetStore, sheet: SheetRef
) -> None:
    """The runtime keys an upserted row by its derived identity only; sheetplane
    takes ``key_field``, else the row's own ``_key``, else the identity, so a row
    read back from the sheet and upserted with new values updates itself."""
    await store.ensure_sheet(sheet, CONTRACT)
    await store.append_rows(sheet, [{"text": "a"}], idempotency_key="a1")
    [key] = await stored_rows(store, sheet)
    result = await store.upsert_rows(
        sheet, [{"_key": key, "text": "b"}, {"text": "b"}], idempotency_key="u1"
    )
    stored = await stored_rows(store, sheet)
    assert result == WriteResult(2, False)  # one row changed, one inserted
    assert stored[key]["text"] == "b"
    assert derive_row_identity({"text": "b"}, sheet.table_namespace) in stored
    assert len(stored) == 2


# --- stated: which row field fills a column ------------------------------------------------

#: A contract whose column names all differ: an input column read from ``name``,
#: an output column whose id is not its sql name.
NAMED = SheetContract(
    (
        ContractColumn("fullName", "full_name", "input", field="name"),
        ContractColumn("score", "score_col", "output"),
    )
)


async def test_one_rule_fills_a_column_on_every_path(store: SheetStore, sheet: SheetRef) -> None:
    """The runtime takes a column's value from a different row field per path: its
    admission reads the sql name (``payload -> sqlName``); its append, upsert,
    replace and completion an input column's field (else id, else sql name) and
    an output column's sql name. Each row below would store null there. sheetplane
    reads the field, else the id, else the sql name, on every path."""
    assert column_lookup_names(NAMED.columns[0]) == ("name", "fullName", "full_name")
    assert column_lookup_names(NAMED.columns[1]) == ("score", "score_col")
    admission = await store.start_dataset(sheet, [{"name": "Ada"}], "run-1", NAMED)
    key = admission.pending_rows[0]["_key"]
    await store.complete_map_rows(
        sheet, NAMED, [CompleteRow(key, {"score": 3})], run_id="run-1", write_version=1
    )
    await store.append_rows(sheet, [{"fullName": "Bo"}], idempotency_key="a1")
    stored = await stored_rows(store, sheet)
    assert (stored[key]["full_name"], stored[key]["score_col"]) == ("Ada", 3)
    assert [row["full_name"] for k, row in stored.items() if k != key] == ["Bo"]


# --- stated: transient connect errors ------------------------------------------------------

#: ``isTransientRuntimePostgresConnectionError``'s codes and messages (0.1.2).
RUNTIME_TRANSIENT = [
    OSError(errno.ECONNRESET, "ECONNRESET"),
    OSError(errno.ETIMEDOUT, "ETIMEDOUT"),
    OSError(errno.ECONNREFUSED, "ECONNREFUSED"),
    pg_errors.AdminShutdown("terminating connection due to administrator command"),
    psycopg.OperationalError("Connection terminated unexpectedly"),
    psycopg.OperationalError("connection timeout expired"),
    psycopg.OperationalError("connection timed out"),
    psycopg.OperationalError("connection closed"),
    psycopg.OperationalError("connection reset by peer"),
]
#: What sheetplane also retries (stated): a crash or start-up of the server, and
#: the connection-exception class (08xxx) libpq reports for a lost socket.
ALSO_TRANSIENT = [
    pg_errors.CrashShutdown("terminating connection because of crash of another server process"),
    pg_errors.CannotConnectNow("the database system is starting up"),
    pg_errors.ConnectionFailure("connection failure"),
    psycopg.OperationalError("server closed the connection unexpectedly"),
    psycopg.OperationalError("the database system is shutting down"),
]


@pytest.mark.parametrize("error", RUNTIME_TRANSIENT + ALSO_TRANSIENT, ids=repr)
def test_the_runtimes_transient_connect_errors_and_the_stated_extras_are_retried(
    error: BaseException,
) -> None:
    assert is_transient_connect_error(error)


@pytest.mark.parametrize(
    "error",
    [
        pg_errors.InvalidPassword("password authentication failed"),
        pg_errors.InsufficientPrivilege("permission denied"),
        OSError(errno.ENOENT, "no such file"),
    ],
    ids=repr,
)
def test_other_connect_errors_are_not_retried(error: BaseException) -> None:
    assert not is_transient_connect_error(error)
