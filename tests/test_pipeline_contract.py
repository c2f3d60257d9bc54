"""resolve_sheet_contract: the runtime's resolveRuntimeSheetContract, on a static pipeline."""

from __future__ import annotations

from typing import Any

import pytest

import sheetplane
from sheetplane import InvalidInputError, resolve_sheet_contract
from sheetplane._types import ContractColumn, SheetContract


def _contract(column: str) -> dict[str, Any]:
    return {"columns": [{"id": column, "sqlName": column, "source": "input"}]}


def _read(column: str) -> SheetContract:
    return SheetContract((ContractColumn(column, column, "input"),))


PIPELINE: dict[str, Any] = {
    "tableNamespace": " Leads ",
    "sheetContract": _contract("root"),
    "stages": [
        {"type": "filter", "tableNamespace": "scored", "sheetContract": _contract("filter")},
        {"type": "map", "tableNamespace": "Scored", "sheetContract": _contract("stage")},
    ],
    "substeps": [
        {"type": "map", "tableNamespace": "scored", "sheetContract": _contract("late")},
        {"type": "map", "tableNamespace": "ÉMAILS", "sheetContract": _contract("emails")},
        {"type": "map", "tableNamespace": "bare"},
    ],
}


def test_the_root_namespace_answers_first_compared_after_normalisation() -> None:
    assert resolve_sheet_contract(PIPELINE, "leads") == _read("root")
    assert resolve_sheet_contract(PIPELINE, "  LEADS") == _read("root")


def test_map_stages_come_before_substeps_and_other_types_are_skipped() -> None:
    # "filter" names the same namespace first but is not a map; the stage wins over the substep.
    assert resolve_sheet_contract(PIPELINE, "scored") == _read("stage")


def test_a_substep_answers_when_no_stage_does() -> None:
    decomposed = "E\u0301mails"  # NFD spelling of the substep's "ÉMAILS"
    assert resolve_sheet_contract(PIPELINE, decomposed) == _read("emails")


def test_a_matching_entry_without_a_contract_answers_none() -> None:
    assert resolve_sheet_contract(PIPELINE, "bare") is None


@pytest.mark.parametrize(
    ("pipeline", "namespace"),
    [(PIPELINE, "absent"), (None, "leads"), (PIPELINE, None), (PIPELINE, "   "), ({}, "x")],
)
def test_absent_answers_none(pipeline: Any, namespace: Any) -> None:
    assert resolve_sheet_contract(pipeline, namespace) is None


def test_a_pipeline_without_stages_is_read_from_its_substeps() -> None:
    pipeline = {
        "substeps": [{"type": "map", "tableNamespace": "s", "sheetContract": _contract("s")}]
    }
    assert resolve_sheet_contract(pipeline, "S") == _read("s")


def test_a_contract_value_is_returned_as_it_is() -> None:
    contract = _read("given")
    assert (
        resolve_sheet_contract({"tableNamespace": "t", "sheetContract": contract}, "t") is contract
    )


def test_a_malformed_contract_names_its_entry() -> None:
    pipeline = {
        "substeps": [{"type": "map", "tableNamespace": "t", "sheetContract": {"columns": 3}}]
    }
    with pytest.raises(InvalidInputError, match=r"pipeline\.substeps\[0\]\.sheetContract"):
        resolve_sheet_contract(pipeline, "t")


@pytest.mark.parametrize(
    ("pipeline", "namespace"),
    [([1], "t"), ({"stages": "map"}, "t"), (PIPELINE, 3)],
)
def test_bad_arguments_are_refused(pipeline: Any, namespace: Any) -> None:
    with pytest.raises(InvalidInputError):
        resolve_sheet_contract(pipeline, namespace)


def test_it_is_importable_from_the_top_level() -> None:
    assert "resolve_sheet_contract" in sheetplane.__all__
