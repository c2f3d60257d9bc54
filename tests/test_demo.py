"""``sheetplane demo`` as a user runs it: a subprocess on the embedded default, and its
failures (bad arguments, an unreachable database) as one clear line and a non-zero exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import trio

#: ``sheetplane ...`` through the console script's entry point, with this interpreter.
SHEETPLANE = [sys.executable, "-c", "import sys; from sheetplane.cli import main; sys.exit(main())"]


async def sheetplane(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        [*SHEETPLANE, *args], capture_stdout=True, capture_stderr=True, env=env, check=False
    )


def without_database_url() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SHEETPLANE_DATABASE_URL"}


async def test_the_demo_runs_to_exit_0_on_an_embedded_postgres() -> None:
    done = await sheetplane("demo", "--rows", "500", "--trace", env=without_database_url())
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "starting a throwaway embedded Postgres" in out
    assert "attempt 1 fenced on the direct road" in out
    assert "newer_write_version -> AttemptSupersededError" in out
    assert "provider calls cancelled in flight, none left running" in out
    assert "its rerun reused" in out and "from their receipts" in out
    # The retry supersedes the version attempt 1 mapped at (map admits its rows itself).
    versions = re.search(
        r"retry admitted as write version (\d+) \(attempt 1 mapped at write version (\d+)\)",
        " ".join(out.split()),
    )
    assert versions is not None, out
    assert int(versions[1]) == int(versions[2]) + 1
    # Every finished call of the stopped map is accounted for, the crash window included.
    assert "finished inside the stop before their receipt was recorded" in " ".join(out.split())
    for line in ("rows admitted", "rows read back", "requests saved by batching", "splits"):
        assert line in out
    assert "500/500" in out  # the progress bars finished
    # --trace: where the time went, per phase, from the spans.
    assert "where the time went: 4 maps" in " ".join(out.split())
    phases = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") == 7]
    for phase in ("admission", "page reads", "fn", "terminal writes", "retries", "receipt claims"):
        assert phase in phases, out
    assert "demo finished" in out
    assert "docs/runner-guide.md, Glossary" in out
    says_each_phase_and_prints_its_progress_in_order(out)


def says_each_phase_and_prints_its_progress_in_order(out: str) -> None:
    """The demo piped: rich drew every bar at the end, after all the text; now each
    phase's one sentence comes first, then what it printed, then its progress line."""
    lines = out.splitlines()

    def at(prefix: str) -> int:
        (index,) = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        return index

    order = [
        at("Admission: the 500 input rows enter the sheet as one attempt"),
        at("admission "),
        at("Map, attempt 1: "),
        at("attempt 1 fenced on the direct road"),
        at("map (attempt 1) "),
        at("Map, the retry: "),
        at("map (rerun) "),
        at("Receipts: a map of 200 rows is stopped half way"),
        at("receipts "),
        at("Read-back: "),
        at("read-back (direct) "),
        at("read-back (gateway) "),
        at("demo finished"),
    ]
    assert order == sorted(order), "\n".join(lines)
    assert lines[at("admission ")].split()[1] == "500/500"


@pytest.mark.heavy(15)
async def test_the_demo_maps_one_attempt_with_runner_processes(database_url: str) -> None:
    env = {**os.environ, "SHEETPLANE_DATABASE_URL": database_url}
    done = await sheetplane("demo", "--workers", "2", "--rows", "300", env=env)
    out = " ".join(done.stdout.decode().split())
    assert done.returncode == 0, out + done.stderr.decode()
    assert "2 runner processes are mapping attempt" in out
    assert "the sheets agree row for row with one worker's" in out


async def test_bad_row_counts_are_refused_by_the_parser() -> None:
    for rows in ("0", "-3", "many"):
        done = await sheetplane("demo", "--rows", rows, env=without_database_url())
        assert done.returncode == 2
        assert b"--rows must be" in done.stderr


@pytest.mark.heavy(23)
async def test_an_unreachable_database_fails_with_one_line_and_no_password() -> None:
    url = "postgresql://demo:sekret-pw@127.0.0.1:1/nowhere"
    done = await sheetplane("demo", "--rows", "10", "--database-url", url, env=dict(os.environ))
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 1, out
    # The failure in one line on stderr, after (at most) one line said while it waited.
    *waiting, line = done.stderr.decode().splitlines()
    assert line.startswith("demo failed: StoreUnavailableError: could not connect")
    assert len(waiting) <= 1 and all("retrying for up to" in w for w in waiting), waiting
    assert "sekret-pw" not in out
    assert "Traceback" not in out
