"""The seed's own runtime, run by node against ``sheetplane serve``.

The seed's ``runtime-api.ts`` (0.1.2, the whole file) is extracted from the
seed file ``002_c27eafc2708e3093.txt`` (``prepare.find_seed``) at test time and
run under node 20 with stand-ins for the modules it imports
(``tests/seed_runtime/``, built by ``tests/seed_runtime/prepare.py``). One
node process runs every case of ``tests/seed_runtime/play-runtime/interop-driver.ts``
against one ``sheetplane serve`` on the suite's Postgres, on the road the seed uses: the gateway for
``ensure_sheet`` and ``resolve_play``, scoped sessions minted by
``create_db_session`` with public-key encryption for everything else. Each
case is one test here.

Cross-reads, both ways: before node starts, sheetplane's runtime writes a
sheet on each of its roads, which the seed then reads and re-admits; after
node ends, sheetplane's runtime reads every sheet the seed wrote on each of its
roads. The rows must agree, up to the row shape stated in docs/parity.md; the
driver compares whole rows, so a row the seed reads carries no column of
sheetplane's own (its versions are in ``seq``, on the seed's system-column list).

The module's work is done once per test run (one node process, plus ``npm
ci`` the first time in a clone): its result is shared by the pytest workers
through a file under ``build/tmp/seed-runtime/``. The tests skip, saying why,
only when the seed file or node is absent.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from _serve_helpers import secret_file_options, serving
from seed_runtime import prepare
from sheetplane.runtime import CompleteRow, ContractColumn, FailRow, SheetContract, open_runtime

pytestmark = pytest.mark.heavy(15)

TOKEN = "tok-seed-interop-5b1e"
PLAY = "seed-interop"
RUN = "run-interop"
PLAY_REF = "interop-ref"
PLAY_ID = "play-interop-1"
CONTRACT = SheetContract(
    (
        ContractColumn("name", "name", "input", field="name"),
        ContractColumn("company", "company", "input", field="company"),
        ContractColumn("email", "email", "output"),
    )
)
#: The contract as the seed's runtime takes it (``PlaySheetContract``).
CONTRACT_WIRE = {
    "columns": [
        {"id": c.id, "sqlName": c.sql_name, "source": c.source, "field": c.field}
        for c in CONTRACT.columns
    ]
}
#: The system fields a sheetplane ``output`` row carries beside its columns and
#: the seed's ``mapRuntimePostgresRow`` leaves out of ``data`` (docs/parity.md).
SHEETPLANE_ROW_FIELDS = ("_key", "_status", "_error", "_input_index")
ROADS = ("direct", "gateway_only")
FAILURE = "provider down"
#: The cases whose sheets (the seed's admission, completion, upsert, append and
#: replace, under ``CONTRACT``) sheetplane reads back and compares.
READ_BACK = (
    "startRuntimeSheetDataset",
    "completeRuntimeMapRows",
    "upsertRuntimeRows",
    "appendRuntimeRows",
    "replaceRuntimeRows",
    "seedWritesSheetplaneReads",
    "upsertInputIndexWithinTheCall",
)
NODE_TIMEOUT_S = 120

#: Every case of the driver, by name: the seed's exported functions (the
#: dataset's operations one by one), the seed's side of the cross-reads, and
#: the seed's side of stated differences (docs/parity.md).
SEED_CASES = (
    "resolveRuntimeReferencedPlay",
    "ensureRuntimeSheet",
    "startRuntimeSheetDataset",
    "completeRuntimeMapRows",
    "upsertRuntimeRows",
    "appendRuntimeRows",
    "replaceRuntimeRows",
    "persistRuntimeCsvDataset",
    "prewarmRuntimePostgresSessions",
    "datasetCount",
    "datasetPeek",
    "datasetMaterialize",
    "datasetIterate",
    "resolveRuntimeSheetContract",
    "seedWritesSheetplaneReads",
    "sheetplaneWritesSeedReads",
    "seedReadmitsSheetplaneRows",
    "startRuntimeSheetDatasetWithoutPoolCache",
    "columnFieldPerPath",
    "upsertInputIndexWithinTheCall",
    "readmissionMergeTakesTheStoredNull",
    "seedReadmitsAFailedRow",
    "versionColumnsInTheRuntimesRows",
)


# --- the run ------------------------------------------------------------------------------


def _input_rows(tag: str) -> list[dict[str, Any]]:
    return [{"name": f"{tag}{i}", "company": tag.upper()} for i in range(4)]


def _seed_shape(row: dict[str, Any]) -> dict[str, Any]:
    """A sheetplane ``output`` row as the seed's ``mapRuntimePostgresRow`` gives its data."""
    return {name: value for name, value in row.items() if name not in SHEETPLANE_ROW_FIELDS}


def _email(row: dict[str, Any]) -> dict[str, Any]:
    return {"email": f"{row['name']}@x.example"}


def _runtime(base_url: str, org: str, road: str) -> Any:
    return open_runtime(
        base_url=base_url,
        token=TOKEN,
        org_id=org,
        play_name=PLAY,
        run_id=RUN,
        strategy=road,  # type: ignore[arg-type]
    )


async def _sheetplane_writes(base_url: str, org: str, prefix: str) -> dict[str, Any]:
    """On each road: admit four rows, complete two, read the sheet back."""
    sheets: dict[str, Any] = {}
    for road in ROADS:
        namespace = f"{prefix}-sp-{road}"
        rows = _input_rows(road[:3])
        async with _runtime(base_url, org, road) as rt:
            writer = rt.writer(namespace, CONTRACT)
            admission = await writer.start(rows)
            pending = await admission.pending().materialize()
            await writer.complete([CompleteRow(r["_key"], _email(r)) for r in pending[1:3]])
            read = await rt.dataset(namespace).materialize()
        sheets[road] = {"tableNamespace": namespace, "rows": read, "inputRows": rows}
    return sheets


async def _sheetplane_fails_a_row(base_url: str, org: str, prefix: str) -> dict[str, Any]:
    """Admit three rows and fail the middle one, for the seed to admit again."""
    namespace = f"{prefix}-sp-failed"
    rows = _input_rows("fail")[:3]
    async with _runtime(base_url, org, "direct") as rt:
        writer = rt.writer(namespace, CONTRACT)
        admission = await writer.start(rows)
        pending = await admission.pending().materialize()
        await writer.fail([FailRow(pending[1]["_key"], FAILURE)])
    return {"tableNamespace": namespace, "inputRows": rows, "failedKey": pending[1]["_key"]}


async def _sheetplane_reads(base_url: str, org: str, cases: dict[str, Any]) -> dict[str, Any]:
    """Each sheet a passing case of ``READ_BACK`` wrote, read by sheetplane on each road."""
    reads: dict[str, Any] = {}
    for road in ROADS:
        async with _runtime(base_url, org, road) as rt:
            for name in READ_BACK:
                if not cases.get(name, {}).get("ok"):
                    continue
                dataset = rt.dataset(cases[name]["detail"]["tableNamespace"])
                read = {"rows": await dataset.materialize(), "count": await dataset.count()}
                reads.setdefault(name, {})[road] = read
    return reads


async def _run(database_url: str, work: Path) -> dict[str, Any]:
    bundle = prepare.build_bundle()
    org = f"org-{uuid.uuid4().hex[:12]}"
    prefix = f"i{uuid.uuid4().hex[:8]}"
    plays = work / "plays"
    plays.mkdir()
    (plays / "interop.json").write_text(
        json.dumps(
            {
                "orgId": org,
                "playId": PLAY_ID,
                "name": PLAY_REF,
                "sourceCode": "export default async () => 1;",
                "codeFormat": "function",
            }
        )
    )
    options = secret_file_options(work, database_url, {TOKEN: org})
    async with serving(*options, "--plays", str(plays), tmp_path=work) as served:
        sheets = await _sheetplane_writes(served.base_url, org, prefix)
        failed = await _sheetplane_fails_a_row(served.base_url, org, prefix)
        config = work / "config.json"
        config.write_text(
            json.dumps(
                {
                    "baseUrl": served.base_url,
                    "token": TOKEN,
                    "orgId": org,
                    "playName": PLAY,
                    "runId": RUN,
                    "prefix": prefix,
                    "contract": CONTRACT_WIRE,
                    "playRef": PLAY_REF,
                    "playId": PLAY_ID,
                    "sheetplaneSheets": sheets,
                    "failedSheet": failed,
                }
            )
        )
        with trio.fail_after(NODE_TIMEOUT_S):
            node = await trio.run_process(
                [prepare.node_executable(), str(bundle), str(config)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert node.returncode == 0, node.stderr.decode(errors="replace")[-4000:]
        cases: dict[str, Any] = json.loads(node.stdout)["cases"]
        reads = await _sheetplane_reads(served.base_url, org, cases)
        async with _runtime(served.base_url, org, "direct") as rt:
            after = await rt.dataset(failed["tableNamespace"], "all").materialize()
    return {
        "cases": cases,
        "sheetplane_sheets": sheets,
        "sheetplane_reads": reads,
        "failed_sheet": {**failed, "after": after},
    }


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def interop(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The run's results: computed by the first worker that needs them, read by the others."""
    try:
        prepare.find_seed()
        prepare.node_executable()
    except prepare.SeedUnavailable as exc:
        pytest.skip(str(exc))
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    shared = None if run_id is None else prepare.WORK_ROOT / f"results-{run_id}.json"
    with _locked(prepare.WORK_ROOT / ".results-lock"):
        if shared is not None and shared.exists():
            return json.loads(shared.read_text())
        database_url = request.getfixturevalue("database_url")
        results = trio.run(_run, database_url, tmp_path_factory.mktemp("seed-interop"))
        if shared is not None:
            for old in prepare.WORK_ROOT.glob("results-*.json"):
                old.unlink()
            shared.write_text(json.dumps(results))
        return results


def _passed(interop: Any, name: str) -> dict[str, Any]:
    result = interop["cases"].get(name)
    assert result is not None, f"the driver did not run {name}"
    assert result["ok"], result["error"]
    return dict(result.get("detail") or {})


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SEED_CASES)
def test_seed_runtime_function(interop: Any, name: str) -> None:
    _passed(interop, name)


@pytest.mark.parametrize("road", ROADS)
@pytest.mark.parametrize("case", READ_BACK)
def test_sheetplane_reads_back_what_the_seed_wrote(interop: Any, case: str, road: str) -> None:
    seed = _passed(interop, case)
    read = interop["sheetplane_reads"][case][road]
    assert [_seed_shape(row) for row in read["rows"]] == seed["rows"]
    assert read["count"] == len(seed["rows"])


@pytest.mark.parametrize("road", ROADS)
def test_the_seed_reads_back_what_sheetplane_wrote(interop: Any, road: str) -> None:
    seed = _passed(interop, "sheetplaneWritesSeedReads")
    written = interop["sheetplane_sheets"][road]
    assert seed["read"][road] == [_seed_shape(row) for row in written["rows"]]


def test_the_seeds_readmission_leaves_a_failed_row_as_it_was(interop: Any) -> None:
    """A stated difference (docs/parity.md, ``startRuntimeSheetDataset``): the
    runtime re-admits a failed row (it is to map again) but leaves its
    ``_status``, ``_error``, ``_run_id`` and version; sheetplane's re-admission
    resets it to ``pending`` under the new run and version, as
    ``tests/test_store_admission.py::test_every_admission_takes_a_new_version_and_readmits_open_rows``
    shows."""
    _passed(interop, "seedReadmitsAFailedRow")
    sheet = interop["failed_sheet"]
    rows = {row["_key"]: row for row in sheet["after"]}
    failed = rows.pop(sheet["failedKey"])
    assert (failed["_status"], failed["_error"], failed["_run_id"]) == ("failed", FAILURE, RUN)
    assert failed["_write_version"] == 1
    assert [(row["_status"], row["_run_id"]) for row in rows.values()] == [("pending", RUN)] * 2


def test_the_seed_is_extracted_verbatim() -> None:
    try:
        seed = prepare.find_seed()
    except prepare.SeedUnavailable as exc:
        pytest.skip(str(exc))
    text = seed.read_text(encoding="utf-8")
    runtime = prepare.extract_runtime(text)
    added = [line for line in text.split("\n") if line.startswith("+")]
    assert runtime.split("\n")[:-1] == [line[1:] for line in added]
    assert runtime.startswith("import { createHash } from 'node:crypto';\n")
    assert "export function resolveRuntimeSheetContract(" in runtime
    with pytest.raises(ValueError, match="declares"):
        prepare.extract_runtime(text.rsplit("\n+", 1)[0])
