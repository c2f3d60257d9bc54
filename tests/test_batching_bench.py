"""`sheetplane bench batching` runs end to end on a small workload (not a timed test)."""

from __future__ import annotations

import pytest

from sheetplane import cli
from sheetplane.bench import batching


def test_bench_batching_runs_both_sides_and_reports_the_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "batching", "--callers", "40", "--values", "3", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "40 callers x 3 values, batches of 4" in out
    assert "median ratio BoundedBatchFunction / aiodataloader:" in out
    assert "trio floor / aiodataloader" in out


def test_each_side_checks_its_answers_and_counts_every_value() -> None:
    workload = batching.Workload(callers=10, values=5, batch=3)
    assert batching.run_bounded(workload) > 0
    assert batching.run_aiodataloader(workload) > 0
    with pytest.raises(ValueError):
        batching.run_trio_floor(workload)  # 10 callers do not split into batches of 3
    assert batching.run_trio_floor(batching.Workload(callers=12, values=5, batch=3)) > 0


def test_the_floor_is_left_out_when_callers_do_not_split_into_batches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["bench", "batching", "--callers", "10", "--batch", "3", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "median ratio" in out and "trio floor /" not in out


def test_bench_lists_batching_and_rejects_unknown_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "batching" in cli.bench_names()
    with pytest.raises(SystemExit):
        cli.main(["bench", "no-such-bench"])
    assert "invalid choice" in capsys.readouterr().err
