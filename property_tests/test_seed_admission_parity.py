"""Any admission input, on either road, gives the same sheet on the runtime's whole path (one
``start_sheet_dataset``, on a gateway that serves only the runtime's actions) and on the
staged path: the same keys, read order, statuses, input indexes and counts, and the same
pending and completed rows, after any earlier admission whose rows were partly settled."""

from __future__ import annotations

import uuid
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sheetplane._types import CompleteRow, ContractColumn, FailRow, SheetContract, SheetRef
from sheetplane.gateway.server import running_gateway
from sheetplane.runtime import open_runtime
from sheetplane.store import open_store, sheet_names
from sheetplane.testing.seed_gateway import running_seed_gateway

ORG = "acme-parity"
TOKEN = f"tok-parity-{uuid.uuid4().hex[:8]}"
CONTRACT = SheetContract(
    (ContractColumn("text", "text", "input"), ContractColumn("words", "words", "output"))
)

keys = st.sampled_from(["a", "b", "c", "d", "e", "f"])
row = st.fixed_dictionaries(
    {"text": st.text(alphabet="xyz ", max_size=5)},
    optional={"_key": keys, "__deeplineRowKey": keys},
)
rows = st.lists(row, max_size=8)
outcome = st.sampled_from(["complete", "fail", "leave"])


async def _sheet(store: Any, sheet: SheetRef) -> list[tuple[Any, ...]]:
    from psycopg import sql

    names = sheet_names(sheet)

    def run(conn: Any) -> list[tuple[Any, ...]]:
        if conn.execute(
            "SELECT to_regclass(%s)", (names.ident("sheet_table").as_string(conn),)
        ).fetchone() == (None,):
            return []
        return conn.execute(
            sql.SQL(
                "SELECT _key, _status, _input_index, text, words FROM {} "
                "ORDER BY _input_index ASC NULLS LAST, _created_at ASC, _key ASC"
            ).format(names.ident("sheet_table"))
        ).fetchall()

    return list(await store.pool.run(run))


async def _admit_twice(
    url: str,
    base_url: str,
    road: str,
    prior: list[dict[str, Any]],
    settle: list[str],
    later: list[dict[str, Any]],
) -> tuple[Any, ...]:
    play = f"parity-{uuid.uuid4().hex[:10]}"
    sheet = SheetRef(ORG, play, "leads")
    async with (
        open_store(url) as store,
        open_runtime(
            base_url=base_url,
            token=TOKEN,
            org_id=ORG,
            play_name=play,
            run_id="run-1",
            strategy=road,  # type: ignore[arg-type]
        ) as rt,
    ):
        first = await rt.writer("leads", CONTRACT).start(prior)
        pending = [r["_key"] for r in await first.pending().materialize()]
        done = [
            CompleteRow(k, {"words": 1})
            for k, o in zip(pending, settle, strict=False)
            if o == "complete"
        ]
        failed = [FailRow(k, "no") for k, o in zip(pending, settle, strict=False) if o == "fail"]
        version = {"run_id": "run-1", "write_version": first.write_version}
        if done:
            await store.complete_map_rows(sheet, CONTRACT, done, **version)
        if failed:
            await store.fail_map_rows(sheet, CONTRACT, failed, **version)
        second = await rt.writer("leads", CONTRACT).start(later)
        parts = []
        for part in (second.pending(), second.completed()):
            parts.append(
                [
                    (r["_key"], r["__deeplineRowKey"], r.get("text"), r.get("words"))
                    for r in await part.materialize()
                ]
            )
        counts = (second.inserted, second.skipped, second.pending_count, second.completed_count)
        return counts, parts, await _sheet(store, sheet)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    road=st.sampled_from(["direct", "gateway_only"]),
    prior=rows,
    settle=st.lists(outcome, max_size=8),
    later=rows,
)
def test_the_whole_path_and_the_staged_path_make_the_same_sheet(
    sheetplane_database_url: str,
    road: str,
    prior: list[dict[str, Any]],
    settle: list[str],
    later: list[dict[str, Any]],
) -> None:
    url = sheetplane_database_url

    async def main() -> tuple[Any, Any]:
        async with (
            running_gateway(url, tokens={TOKEN: ORG}) as staged,
            running_seed_gateway(url, tokens={TOKEN: ORG}) as seed,
        ):
            one = await _admit_twice(url, staged.base_url, road, prior, settle, later)
            two = await _admit_twice(url, seed.base_url, road, prior, settle, later)
            return one, two

    staged_sheet, whole_sheet = trio.run(main)
    assert whole_sheet == staged_sheet
