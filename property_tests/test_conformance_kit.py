"""The conformance kit judged by mutation: it passes the reference gateway and fails,
naming the right requirement, every gateway made wrong on purpose.

One reference gateway (in its own thread, on a database of its own) serves the
module; mutants wrap it in ``MutantTransport``. Each requirement has a PASS
(the whole-profile runs) and a FAIL (its mutant, run alone); the issue's
headline mutants run against the whole quick profile.
"""

from __future__ import annotations

import io
import json
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql

from sheetplane.cli import main
from sheetplane.conformance import REQUIREMENTS, Options, Report, run
from sheetplane.conformance._context import CHECKS
from sheetplane.conformance._report import list_lines, result_line, write_junit
from sheetplane.conformance._requirements import by_id, selected
from sheetplane.testing.seed_gateway import SEED_ACTIONS

from ._conformance_mutants import (
    HEADLINE,
    MutantTransport,
    Mutation,
    fake_server,
    headline,
    mutations,
    never_closes,
    ok_only,
    on_answer,
    reads_whole_body,
)
from ._threaded_gateway import ThreadedGateway, own_database

TOKEN_A = f"tok-a-{uuid.uuid4().hex}"
TOKEN_B = f"tok-b-{uuid.uuid4().hex}"
#: The test gateway closes a stalled body after this long; the kit allows three times it.
BODY_READ_TIMEOUT_MS = 500
STALL_LIMIT_MS = 3 * BODY_READ_TIMEOUT_MS
#: The timed checks' limit here: far above what they take, far below 30 s.
BUDGET_LIMIT_MS = 10_000
#: The requirement ids, pinned: renumbering one is a deliberate change of this list.
IDS = [
    "SP-AUTH-1",
    "SP-ERR-1",
    "SP-ERR-2",
    "SP-SHEET-1",
    "SP-ADMIT-1",
    "SP-ADMIT-2",
    "SP-ADMIT-3",
    "SP-ADMIT-4",
    "SP-READ-1",
    "SP-READ-2",
    "SP-READ-3",
    "SP-READ-4",
    "SP-READ-5",
    "SP-READ-6",
    "SP-READ-7",
    "SP-READ-8",
    "SP-READ-9",
    "SP-READ-10",
    "SP-BUDGET-1",
    "SP-BUDGET-2",
    "SP-BUDGET-3",
    "SP-BP-1",
    "SP-SESS-1",
    "SP-SESS-2",
    "SP-SESS-3",
    "SP-SESS-4",
    "SP-SESS-5",
    "SP-PLAY-1",
    "SP-TENANT-1",
    "SP-WRITE-1",
    "SP-WRITE-2",
    "SP-WRITE-3",
    "SP-WRITE-4",
    "SP-WRITE-5",
    "SP-WRITE-6",
    "SP-WRITE-7",
    "SP-WRITE-8",
    "SP-WRITE-9",
    "SP-SUM-1",
    "SP-RCPT-1",
    "SP-RCPT-2",
    "SP-LEASE-1",
    "SP-LEASE-2",
    "SP-LEASE-3",
    "SP-LEASE-4",
    "SP-LEASE-5",
    "SP-STAGE-1",
    "SP-STAGE-2",
    "SP-STAGE-3",
    "SP-PLAY-2",
    "SP-PLAY-3",
    "SP-OPS-1",
    "SP-SHARE-1",
    "SP-SHARE-2",
    "SP-SHARE-3",
    "SP-SHARE-4",
    "SP-MODEL-1",
]
DOCS = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"


@attrs.frozen
class Served:
    base_url: str
    database_url: str = attrs.field(repr=False)


@pytest.fixture(scope="module")
def served(sheetplane_database_url: str) -> Iterator[Served]:
    with (
        own_database(sheetplane_database_url, "conformance") as database_url,
        ThreadedGateway(
            database_url,
            tokens={TOKEN_A: "org-conformance-a", TOKEN_B: "org-conformance-b"},
            allow_test_faults=True,
            body_read_timeout_ms=BODY_READ_TIMEOUT_MS,
        ) as gateway,
    ):
        yield Served(gateway.base_url, database_url)


def _options(base_url: str, **changes: Any) -> Options:
    settings: dict[str, Any] = {
        "token": TOKEN_A,
        "token_b": TOKEN_B,
        "examples": 3,
        "max_seconds": 10.0,
        "seed": 20261201,
        "stall_limit_ms": STALL_LIMIT_MS,
        "budget_limit_ms": BUDGET_LIMIT_MS,
        **changes,
    }
    return Options(base_url=base_url, **settings)


def _mutant(served: Served, mutation: Mutation, **changes: Any) -> Report:
    return run(_options(served.base_url, transport=MutantTransport(mutation), **changes))


# --- the registry -----------------------------------------------------------------------


def test_every_requirement_has_one_check_and_one_mutant_and_the_ids_are_pinned() -> None:
    ids = [r.id for r in REQUIREMENTS]
    assert ids == IDS
    assert set(CHECKS) == set(ids)
    assert set(mutations(TOKEN_A)) | set(_TIMED_FAKES) == set(ids)
    assert all(r.source and r.title for r in REQUIREMENTS)


def test_list_prints_one_requirement_a_line_the_same_every_time() -> None:
    outputs = []
    for _ in range(2):
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["conformance", "--list"]) == 0
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1]
    lines = outputs[0].splitlines()
    assert lines == list_lines()
    assert [line.split(" ", 1)[0] for line in lines] == IDS


def test_docs_list_every_requirement_with_its_title_and_source() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for requirement in REQUIREMENTS:
        assert f"`{requirement.id}`" in text, requirement.id
        # The table escapes "|" inside a cell.
        assert requirement.title.replace("|", "\\|") in text, requirement.id
        assert requirement.source.replace("|", "\\|") in text, requirement.id


# --- PASS: the reference gateway ------------------------------------------------------------


def test_the_reference_gateway_passes_every_requirement_of_the_sheetplane_profile(
    served: Served,
) -> None:
    report = run(_options(served.base_url))
    verdicts = {r.requirement.id: (r.status, r.detail) for r in report.results}
    assert {rid: v for rid, v in verdicts.items() if v[0] != "PASS"} == {}
    assert list(verdicts) == IDS
    assert report.passed


def test_the_reference_gateway_passes_the_seed_profile_quick_skipping_only_the_timed_checks(
    served: Served,
) -> None:
    report = run(_options(served.base_url, profile="seed", quick=True, token_b=None))
    assert [r.requirement for r in report.results] == list(selected("seed"))
    verdicts = {r.requirement.id: (r.status, r.detail) for r in report.results}
    skipped = {rid for rid, (status, _) in verdicts.items() if status == "SKIP"}
    assert skipped == {"SP-BUDGET-1", "SP-BUDGET-2", "SP-BUDGET-3", "SP-TENANT-1"}, verdicts
    assert report.passed, verdicts


_ONE_OF_EACH_AREA = {
    "SP-WRITE-1",
    "SP-SUM-1",
    "SP-RCPT-1",
    "SP-LEASE-1",
    "SP-STAGE-1",
    "SP-PLAY-2",
    "SP-OPS-1",
    "SP-MODEL-1",
}


def test_a_gateway_of_only_the_seeds_actions_passes_the_seed_profile_and_fails_sheetplanes(
    served: Served, request: pytest.FixtureRequest
) -> None:
    with ThreadedGateway(
        served.database_url,
        tokens={TOKEN_A: "org-conformance-seed-a", TOKEN_B: "org-conformance-seed-b"},
        actions=SEED_ACTIONS,
        allow_test_faults=True,
        body_read_timeout_ms=BODY_READ_TIMEOUT_MS,
    ) as seed_only:
        seed = run(_options(seed_only.base_url, profile="seed"))
        # One requirement of each sheetplane area (the whole profile: with --campaign).
        only = None if request.config.getoption("--campaign") else _ONE_OF_EACH_AREA
        sheetplane = run(_options(seed_only.base_url, quick=True, examples=5, only=only))
    verdicts = {r.requirement.id: (r.status, r.detail) for r in seed.results}
    assert {rid: v for rid, v in verdicts.items() if v[0] != "PASS"} == {}
    failed = set(sheetplane.failed_ids())
    assert _ONE_OF_EACH_AREA - {"SP-OPS-1"} <= failed, sorted(failed)
    assert all(by_id(rid).profile == "sheetplane" for rid in failed), failed


_BATCH_CHECKS = {"SP-READ-3", "SP-READ-4", "SP-READ-5", "SP-READ-6", "SP-READ-7", "SP-READ-10"}


def test_a_gateway_that_predates_the_batch_action_passes_the_seed_profile_not_sheetplanes(
    served: Served,
) -> None:
    # The seed's runtime reads page by page from such a gateway, so the seed profile skips
    # the batch checks; the sheetplane profile requires the action.
    with ThreadedGateway(
        served.database_url, tokens={TOKEN_A: "org-conformance-legacy"}, legacy=True
    ) as legacy:
        seed = run(_options(legacy.base_url, profile="seed", quick=True, token_b=None))
        sheetplane = run(_options(legacy.base_url, only=_BATCH_CHECKS - {"SP-READ-10"}))
    # (SP-READ-7 holds either way: an unknown action is refused 400 too.)
    verdicts = {r.requirement.id: (r.status, r.detail) for r in seed.results}
    assert seed.passed, verdicts
    assert {rid for rid, (status, _) in verdicts.items() if status == "SKIP"} >= _BATCH_CHECKS
    assert "predates runtime_sheet_read_rows_batch" in verdicts["SP-READ-3"][1]
    assert set(sheetplane.failed_ids()) == _BATCH_CHECKS - {"SP-READ-10", "SP-READ-7"}


# --- FAIL: one mutant per requirement -----------------------------------------------------------

_TIMED_FAKES = {"SP-BUDGET-2": reads_whole_body, "SP-BUDGET-3": never_closes}


#: Checked by its own test below (the model phase takes longer than one check).
_OWN_TEST = {"SP-MODEL-1"}


@pytest.mark.parametrize("requirement_id", [i for i in IDS if i not in {*_TIMED_FAKES, *_OWN_TEST}])
def test_a_gateway_made_wrong_fails_the_requirement_it_breaks(
    served: Served, requirement_id: str
) -> None:
    mutation = mutations(TOKEN_A)[requirement_id]
    report = _mutant(served, mutation, only={requirement_id})
    (result,) = report.results
    assert result.status == "FAIL", (mutation.name, result.detail)
    line = result_line(result)
    assert line.startswith(f"FAIL {requirement_id}:") and "expected" in line


@pytest.mark.parametrize("requirement_id", sorted(_TIMED_FAKES))
def test_a_server_that_holds_a_body_fails_the_timed_budget(requirement_id: str) -> None:
    with fake_server(_TIMED_FAKES[requirement_id]) as base_url:
        report = run(
            _options(base_url, only={requirement_id}, stall_limit_ms=300, budget_limit_ms=300)
        )
    (result,) = report.results
    assert result.status == "FAIL", result.detail
    assert "within" in result.detail


#: The headline mutants run against the whole quick profile in CI; the rest with --campaign
#: (each is also caught alone, by its requirement's mutant above).
_CI_HEADLINE = {"pages out of order", "a stale write accepted", "an unknown action answered 404"}


@pytest.mark.parametrize(
    "name",
    [
        name if name in _CI_HEADLINE else pytest.param(name, marks=pytest.mark.slow)
        for name in sorted(HEADLINE)
    ],
)
def test_the_whole_quick_profile_names_the_broken_requirement(served: Served, name: str) -> None:
    requirement_id, mutation = headline(name, TOKEN_A)
    report = _mutant(served, mutation, quick=True, examples=1)
    assert requirement_id in report.failed_ids(), (name, report.failed_ids())
    assert not report.passed


@pytest.mark.heavy(11)
def test_the_model_phase_prints_the_shortest_sequence_and_the_seed_that_replays_it(
    served: Served, request: pytest.FixtureRequest
) -> None:
    mutation = mutations(TOKEN_A)["SP-MODEL-1"]
    # A replay of the same seed fails again (a longer campaign also checks it shrinks to
    # the same steps when shrinking has the time to finish).
    rounds = 2 if request.config.getoption("--campaign") else 1
    details = []
    for _ in range(rounds):
        report = _mutant(served, mutation, only={"SP-MODEL-1"}, seed=7, examples=20)
        (result,) = report.results
        assert result.status == "FAIL", result.detail
        details.append(result.detail)
    assert "replay with --seed 7" in details[0]
    steps = re.findall(r"state\.(\w+)\(", details[0])
    assert steps and any(step.startswith("write") for step in steps), details[0]
    assert all(re.findall(r"state\.(\w+)\(", detail) for detail in details)


def test_an_answer_the_model_phase_cannot_read_fails_it_with_the_sequence(served: Served) -> None:
    broken = on_answer("start_sheet_dataset", ok_only(lambda v, _: {**v, "pendingRows": "none"}))
    report = _mutant(served, Mutation("pendingRows a string", broken), only={"SP-MODEL-1"})
    (result,) = report.results
    assert result.status == "FAIL"
    assert "an answer a rule could not read" in result.detail
    assert "state.start(" in result.detail


# --- what the kit writes, what it reports ---------------------------------------------------------


def _rows_by_table(database_url: str) -> dict[str, set[str]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE starts_with(schemaname, 'sp_')"
        ).fetchall()
        return {
            f"{schema}.{table}": {
                str(row[0])
                for row in conn.execute(
                    sql.SQL("SELECT t::text FROM {} AS t").format(sql.Identifier(schema, table))
                )
            }
            for schema, table in tables
        }


def test_the_kit_writes_nothing_outside_its_prefix(served: Served) -> None:
    bystander = Options(base_url=served.base_url, token=TOKEN_A, namespace_prefix="bystander")
    # Another play's sheets, receipts and plays of the same org, written first.
    run(attrs.evolve(bystander, only={"SP-ADMIT-1", "SP-WRITE-1", "SP-RCPT-1", "SP-PLAY-2"}))
    before = _rows_by_table(served.database_url)
    prefix = f"conformance_{uuid.uuid4().hex[:8]}"
    report = run(_options(served.base_url, namespace_prefix=prefix, quick=True, examples=2))
    assert report.passed
    after = _rows_by_table(served.database_url)
    for table, rows in before.items():
        assert rows <= after[table], f"rows of {table} changed or deleted"
        added = after[table] - rows
        assert all(prefix in row for row in added), f"{table} gained rows outside {prefix}"


def test_junit_output_is_one_testsuite_of_one_testcase_per_requirement(
    served: Served, tmp_path: Path
) -> None:
    mutation = mutations(TOKEN_A)["SP-READ-3"]
    only = {"SP-READ-3", "SP-PLAY-1", "SP-BUDGET-1", "SP-ERR-1"}
    report = _mutant(served, mutation, only=only, quick=True)
    path = tmp_path / "conformance.xml"
    write_junit(report, path)
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root
    assert suite.tag == "testsuite"
    cases = suite.findall("testcase")
    assert int(suite.get("tests", "")) == len(cases) == len(only)
    failures = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert int(suite.get("failures", "")) == len(failures) == 1
    assert int(suite.get("skipped", "")) == len(skipped) == 1
    assert int(suite.get("errors", "")) == 0
    for case in cases:
        assert case.get("classname", "").startswith("conformance.")
        assert float(case.get("time", "")) >= 0
    failure = failures[0].find("failure")
    assert failure is not None and failure.get("message") == "FAIL SP-READ-3"
    assert failures[0].get("name", "").startswith("SP-READ-3: ")
    assert "request:" in (failure.text or "")


def test_the_command_exits_0_on_the_reference_gateway_and_1_naming_every_failure(
    served: Served, tmp_path: Path
) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        status = main(
            ["conformance", served.base_url, "--token", TOKEN_A, "--quick", "--profile", "seed"]
        )
    assert status == 0, out.getvalue()
    lines = out.getvalue().splitlines()
    assert len(lines) == len(selected("seed")) + 1
    assert lines[-1].startswith("conforms: ")
    out = io.StringIO()
    with redirect_stdout(out):
        # The second org's token refused: the isolation check fails, the others pass.
        status = main(
            [
                "conformance",
                served.base_url,
                "--token",
                TOKEN_A,
                "--token-b",
                "not-a-token",
                "--quick",
                "--profile",
                "seed",
                "--json",
                str(tmp_path / "r.json"),
            ]
        )
    assert status == 1
    failing = [line for line in out.getvalue().splitlines() if line.startswith("FAIL ")]
    assert failing and all(re.match(r"FAIL SP-[A-Z]+-\d+: ", line) for line in failing)
    assert out.getvalue().splitlines()[-1].startswith("DOES NOT CONFORM: ")
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["passed"] is False
    assert [r["id"] for r in written["results"]] == [r.id for r in selected("seed")]
    assert sum(r["status"] == "FAIL" for r in written["results"]) == len(failing)


def test_a_refused_token_stops_the_run_after_the_first_check_with_one_line(
    served: Served,
) -> None:
    # Before, a wrong token printed a FAIL line for every requirement (45 of them).
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["conformance", served.base_url, "--token", "not-a-token", "--quick"])
    assert status == 2
    # The checks that need no token (SP-AUTH-1 sends none) pass; the first that sends
    # it stops the run.
    report = run(_options(served.base_url, token="not-a-token", quick=True))
    assert report.token_refused is not None and not report.passed
    assert all(r.status == "PASS" for r in report.results) and len(report.results) <= 2
    order = [r.id for r in selected("sheetplane")]
    assert order.index(report.token_refused.id) == len(report.results)
    assert out.getvalue().splitlines() == [
        line for line in out.getvalue().splitlines() if line.startswith("PASS ")
    ]
    assert len(out.getvalue().splitlines()) == len(report.results)
    (line,) = err.getvalue().splitlines()
    assert line == (
        "sheetplane conformance: the gateway refused the token (HTTP 401 at"
        f" {report.token_refused.id}); stopped before any further check"
    )
