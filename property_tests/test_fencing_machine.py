"""A Hypothesis state machine of fenced terminal writes against a real Postgres.

Several writers, each holding the write version of the admission that gave it
its rows, interleave admissions, completions, failures, identical and
conflicting replays, and legacy (unversioned) writes. A plain model beside the
sheet decides every outcome on its own; after each step the stored rows must
equal the model's, every stale key must carry the model's reason, no stored
value may come from a version other than the row's own stamp, and the summary
counters must equal ``SELECT _status, count(*) ... GROUP BY _status``. The model
is ``sheetplane.testing.models.SheetModel``, the one the chaos harness uses.

The store runs in one trio loop on a background thread for the whole test
(``trio.from_thread.run`` drives it), so each step is one real store call.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from sheetplane._types import (
    CompleteRow,
    ContractColumn,
    FailRow,
    SheetContract,
    SheetRef,
    StaleRow,
    TerminalWriteResult,
)
from sheetplane.errors import WriteConflictError
from sheetplane.store import SheetStore, open_store, sheet_names
from sheetplane.store._counters import status_counts
from sheetplane.store.embedded import EmbeddedPostgres, database_url_from_env
from sheetplane.testing.models import ModelWrite, SheetModel

T = TypeVar("T")

CONTRACT = SheetContract(
    (ContractColumn("id", "id", "input"), ContractColumn("score", "score", "output"))
)
KEYS = ("k0", "k1", "k2", "k3")
GHOST = "ghost"  # never admitted
COUNTER = {
    "pending": "queued",
    "stale": "queued",
    "running": "running",
    "enriched": "completed",
    "failed": "failed",
}


class Portal:
    """One open SheetStore living in a trio loop on its own thread."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self.store: SheetStore | None = None
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    def _serve(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        async with open_store(self._url, max_connections=2) as store:
            self.store = store
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        async def run() -> T:
            return await fn(*args, **kwargs)

        return trio.from_thread.run(run, trio_token=self._token)

    def close(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()


@pytest.fixture(scope="module")
def portal() -> Iterator[Portal]:
    url = database_url_from_env()
    server = None
    if url is None:
        # Not durable: the machine throws its data away and never crashes the server.
        server = EmbeddedPostgres(durable=False)
        server.start()
        url = server.url
    opened = Portal(url)
    try:
        yield opened
    finally:
        opened.close()
        if server is not None:
            server.stop()


class FencingMachine(RuleBasedStateMachine):
    writers = Bundle("writers")

    def __init__(self, portal: Portal) -> None:
        super().__init__()
        self.portal = portal
        assert portal.store is not None
        self.store = portal.store
        tag = uuid.uuid4().hex
        self.sheet = SheetRef(f"org-{tag}", "machine", f"ns-{tag}")
        self.names = sheet_names(self.sheet)
        portal.call(self.store.ensure_sheet, self.sheet, CONTRACT)
        self.model = SheetModel(columns=("id", "score"), input_columns=("id",))

    # --- the model decides (sheetplane.testing.models.SheetModel) -----------------------

    def terminal(self, writer: int | None, keys: list[str], status: str, value: str) -> None:
        error = value if status == "failed" else None
        data = {"score": value} if status == "enriched" else {}
        run_id = f"writer-{writer}"
        expected = self.model.terminal_write(
            [ModelWrite(key, status, data, error) for key in keys],  # type: ignore[arg-type]
            writer,
            run_id,
        )
        try:
            if status == "enriched":
                result: TerminalWriteResult = self.portal.call(
                    self.store.complete_map_rows,
                    self.sheet,
                    CONTRACT,
                    [CompleteRow(key, {"score": value}) for key in keys],
                    run_id=run_id,
                    write_version=writer,
                )
            else:
                result = self.portal.call(
                    self.store.fail_map_rows,
                    self.sheet,
                    CONTRACT,
                    [FailRow(key, value) for key in keys],
                    run_id=run_id,
                    write_version=writer,
                )
        except WriteConflictError:
            assert expected.conflict, expected
            return
        assert not expected.conflict, expected
        assert result.committed_keys == expected.committed
        assert result.stale_rows == tuple(StaleRow(*stale) for stale in expected.stale)  # type: ignore[arg-type]
        assert result.updated == expected.updated

    # --- rules -------------------------------------------------------------------------

    @rule(target=writers, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    def admit(self, keys: list[str]) -> int:
        admission = self.portal.call(
            self.store.start_dataset,
            self.sheet,
            [{"id": key} for key in keys],
            f"admit-{self.model.version + 1}",
            CONTRACT,
            key_field="id",
        )
        expected = self.model.admit(
            [(key, {"id": key}) for key in keys], f"admit-{self.model.version + 1}"
        )
        assert admission.write_version == expected.version
        assert tuple(r["_key"] for r in admission.pending_rows) == expected.pending_keys
        assert tuple(r["_key"] for r in admission.completed_rows) == expected.completed_keys
        assert [r.get("score") for r in admission.completed_rows] == [
            self.model.rows[key].values.get("score") for key in expected.completed_keys
        ]
        return expected.version

    @rule(
        writer=writers,
        keys=st.lists(st.sampled_from((*KEYS, GHOST)), min_size=1, max_size=3, unique=True),
        variant=st.integers(0, 1),
    )
    def complete(self, writer: int, keys: list[str], variant: int) -> None:
        self.terminal(writer, keys, "enriched", f"v{writer}-{variant}")

    @rule(
        writer=writers,
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
        variant=st.integers(0, 1),
    )
    def fail(self, writer: int, keys: list[str], variant: int) -> None:
        self.terminal(writer, keys, "failed", f"v{writer}-error-{variant}")

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
    def legacy_complete(self, keys: list[str]) -> None:
        self.terminal(None, keys, "enriched", "legacy")

    # --- invariants --------------------------------------------------------------------

    def stored(self) -> tuple[dict[str, tuple[Any, ...]], tuple[Any, ...], dict[str, int]]:
        names = self.names

        def read(conn: psycopg.Connection[Any]) -> Any:
            rows = conn.execute(
                sql.SQL("SELECT _key, _status, (seq).write_version, score, _error FROM {}").format(
                    names.ident("sheet_table")
                )
            ).fetchall()
            summary = tuple(status_counts(conn, names).values())
            grouped = dict(
                conn.execute(
                    sql.SQL("SELECT _status, count(*) FROM {} GROUP BY _status").format(
                        names.ident("sheet_table")
                    )
                ).fetchall()
            )
            return {row[0]: row[1:] for row in rows}, summary, grouped

        result: tuple[dict[str, tuple[Any, ...]], tuple[Any, ...], dict[str, int]]
        result = self.portal.call(self.store.pool.run, read)
        return result

    @invariant()
    def sheet_matches_the_model(self) -> None:
        rows, summary, grouped = self.stored()
        assert rows == {
            key: (row.status, row.version, row.values.get("score"), row.error)
            for key, row in self.model.rows.items()
        }
        # No value from a superseded version: a versioned value names the row's own stamp.
        for status, version, score, error in rows.values():
            for value in (score, error):
                if value is not None and value != "legacy":
                    assert value.startswith(f"v{version}-"), (status, version, value)
        recount = {"total": 0, "queued": 0, "running": 0, "completed": 0, "failed": 0}
        for status, count in grouped.items():
            recount[COUNTER[status]] += count
            recount["total"] += count
        assert dict(zip(recount, summary, strict=True)) == recount == self.model.summary()


def test_fencing_machine(portal: Portal) -> None:
    run_state_machine_as_test(
        lambda: FencingMachine(portal),
        settings=settings(
            max_examples=25,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
