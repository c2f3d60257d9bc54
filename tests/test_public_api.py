"""The public namespace: complete, sorted, and every error carries a stable code."""

from __future__ import annotations

import datetime as dt
import inspect
import pickle
import subprocess
import sys

import sheetplane
from sheetplane import errors
from sheetplane._types import Receipt, StaleRow


def test_all_is_sorted_and_unique() -> None:
    assert sheetplane.__all__ == sorted(set(sheetplane.__all__))


def test_all_names_every_public_attribute() -> None:
    for name in sheetplane.__all__:  # the runtime names load on first use
        getattr(sheetplane, name)
    public = {
        name
        for name, value in vars(sheetplane).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert public == set(sheetplane.__all__)


def test_importing_the_http_client_and_map_does_not_import_psycopg() -> None:
    # A fresh interpreter: this test session has long imported the store. map checks
    # its outputs with the store's own checks and reads ahead over a dataset: both
    # once came through the store package.
    probe = (
        "import sys, sheetplane.gateway.client, sheetplane._types, sheetplane\n"
        "import sheetplane._map, sheetplane._rowchecks\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool')"
        " or m.startswith('sheetplane.store')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_runtime_names_load_on_first_use() -> None:
    # The runtime loads on first use, and without the store: only the direct road's
    # first session opens it (tests/test_runner_without_psycopg.py).
    probe = (
        "import sys, sheetplane\nloaded = 'sheetplane.runtime' in sys.modules\n"
        "sheetplane.open_runtime\n"
        "print(loaded, 'sheetplane.runtime' in sys.modules, 'psycopg' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False True False"
    assert "open_runtime" in dir(sheetplane)


def test_every_error_is_exported_with_a_unique_code() -> None:
    classes = [
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, errors.SheetplaneError)
    ]
    assert {cls.__name__ for cls in classes} <= set(sheetplane.__all__)
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes)), codes


def test_contract_errors_survive_pickling() -> None:
    for exc in (
        errors.ReadBatchTooLargeError(123),
        errors.ResponseTooLargeError("runtime_sheet_read_rows", 10, 11),
        errors.GatewayError(502, "bad_gateway", "upstream failed", {"x": 1}),
        errors.BackpressureError(503, "runtime_postgres_admission_backpressure", "busy", None, 500),
        errors.AttemptSupersededError(
            "leads", "run-1", 3, 2, (StaleRow("a", "newer_write_version", 4),)
        ),
        errors.LeaseHeldError("k", "run-1:ab", dt.datetime(2030, 1, 1, tzinfo=dt.UTC)),
        errors.LeaseLostError("k", "a renewal was refused"),
        errors.ReceiptCompletedError(Receipt("k", {"n": 1}, "run-1", "2030-01-01T00:00:00+00:00")),
    ):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc)
        assert str(again) == str(exc)


def test_read_batch_too_large_carries_observed_bytes() -> None:
    exc = sheetplane.ReadBatchTooLargeError(12_345)
    assert exc.observed_bytes == 12_345
    assert exc.code == "runtime_sheet_read_batch_too_large"


def test_contract_rows_and_store_back_pressure_are_top_level_names() -> None:
    from sheetplane import _types, errors

    assert sheetplane.SheetContract is _types.SheetContract
    assert sheetplane.ContractColumn is _types.ContractColumn
    assert sheetplane.CompleteRow is _types.CompleteRow
    assert sheetplane.FailRow is _types.FailRow
    assert sheetplane.PoolSaturatedError is errors.PoolSaturatedError
    assert sheetplane.TransactionConflictError is errors.TransactionConflictError
    assert issubclass(sheetplane.PoolSaturatedError, sheetplane.StoreError)
    tree = errors.__doc__ or ""
    assert "PoolSaturatedError" in tree and "TransactionConflictError" in tree
