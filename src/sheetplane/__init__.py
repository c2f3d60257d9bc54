"""sheetplane: a trio-native sheet data plane under explicit budgets.

The runtime names (``open_runtime``, ``Runtime``, ``RuntimeContext``) and
``resolve_sheet_contract`` load on first use: the runtime pulls in the store
and psycopg, the contract reader the wire converter, and a process that only
speaks HTTP (``sheetplane.gateway.client``) must not pay for, or depend on, them.
"""

from __future__ import annotations

import typing

from ._attempts import Attempt as Attempt
from ._attempts import AttemptStatus as AttemptStatus
from ._leases import Lease as Lease
from ._map import MapProgress as MapProgress
from ._map import MapReport as MapReport
from ._types import CompleteRow as CompleteRow
from ._types import ContractColumn as ContractColumn
from ._types import FailRow as FailRow
from ._types import ResolvedPlay as ResolvedPlay
from ._types import SheetContract as SheetContract
from ._types import SheetRef as SheetRef
from .batching import BatcherStatistics as BatcherStatistics
from .batching import BoundedBatchFunction as BoundedBatchFunction
from .errors import AdmissionStagingTooLargeError as AdmissionStagingTooLargeError
from .errors import AdmissionStateError as AdmissionStateError
from .errors import AdmissionTooLargeError as AdmissionTooLargeError
from .errors import AttemptSupersededError as AttemptSupersededError
from .errors import BackpressureError as BackpressureError
from .errors import BatchContractError as BatchContractError
from .errors import BatcherClosedError as BatcherClosedError
from .errors import BatchingError as BatchingError
from .errors import ConnectionSlotsExhaustedError as ConnectionSlotsExhaustedError
from .errors import DatabaseNotHardenedError as DatabaseNotHardenedError
from .errors import EnvelopeDecryptionError as EnvelopeDecryptionError
from .errors import GatewayActionMissingError as GatewayActionMissingError
from .errors import GatewayAuthError as GatewayAuthError
from .errors import GatewayError as GatewayError
from .errors import GatewayProtocolError as GatewayProtocolError
from .errors import GatewayRoleLacksPrivilegesError as GatewayRoleLacksPrivilegesError
from .errors import GatewayTimeoutError as GatewayTimeoutError
from .errors import GatewayUnreachableError as GatewayUnreachableError
from .errors import InvalidInputError as InvalidInputError
from .errors import LaneWedgedError as LaneWedgedError
from .errors import LeaseError as LeaseError
from .errors import LeaseHeldError as LeaseHeldError
from .errors import LeaseLostError as LeaseLostError
from .errors import OversizedValueError as OversizedValueError
from .errors import PoolSaturatedError as PoolSaturatedError
from .errors import QuotaExceededError as QuotaExceededError
from .errors import ReadBatchTooLargeError as ReadBatchTooLargeError
from .errors import ReceiptCompletedError as ReceiptCompletedError
from .errors import ResponseTooLargeError as ResponseTooLargeError
from .errors import SessionError as SessionError
from .errors import SessionExpiredError as SessionExpiredError
from .errors import SessionPrewarmError as SessionPrewarmError
from .errors import SheetCapError as SheetCapError
from .errors import SheetplaneError as SheetplaneError
from .errors import StagingQuotaError as StagingQuotaError
from .errors import StatementTimeoutError as StatementTimeoutError
from .errors import StoreError as StoreError
from .errors import StoreUnavailableError as StoreUnavailableError
from .errors import TransactionConflictError as TransactionConflictError
from .errors import TransientGatewayError as TransientGatewayError
from .errors import UnsupportedActionError as UnsupportedActionError
from .errors import ValueCancelledError as ValueCancelledError
from .errors import WorkReceiptFencedError as WorkReceiptFencedError
from .errors import WriteConflictError as WriteConflictError
from .identity import derive_row_identity as derive_row_identity
from .names import normalize_play_name as normalize_play_name
from .names import normalize_table_namespace as normalize_table_namespace
from .sizes import SizeMeasurement as SizeMeasurement
from .sizes import json_byte_length_up_to as json_byte_length_up_to

if typing.TYPE_CHECKING:
    from ._pipeline import resolve_sheet_contract as resolve_sheet_contract
    from .runtime import Runtime as Runtime
    from .runtime import RuntimeContext as RuntimeContext
    from .runtime import open_runtime as open_runtime

__version__ = "0.1.0"

#: The names that load on first use, and the module each comes from.
_LAZY_NAMES: typing.Final = {
    "Runtime": "runtime",
    "RuntimeContext": "runtime",
    "open_runtime": "runtime",
    "resolve_sheet_contract": "_pipeline",
}


def __getattr__(name: str) -> typing.Any:
    if name in _LAZY_NAMES:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES))


__all__ = [
    "AdmissionStagingTooLargeError",
    "AdmissionStateError",
    "AdmissionTooLargeError",
    "Attempt",
    "AttemptStatus",
    "AttemptSupersededError",
    "BackpressureError",
    "BatchContractError",
    "BatcherClosedError",
    "BatcherStatistics",
    "BatchingError",
    "BoundedBatchFunction",
    "CompleteRow",
    "ConnectionSlotsExhaustedError",
    "ContractColumn",
    "DatabaseNotHardenedError",
    "EnvelopeDecryptionError",
    "FailRow",
    "GatewayActionMissingError",
    "GatewayAuthError",
    "GatewayError",
    "GatewayProtocolError",
    "GatewayRoleLacksPrivilegesError",
    "GatewayTimeoutError",
    "GatewayUnreachableError",
    "InvalidInputError",
    "LaneWedgedError",
    "Lease",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "MapProgress",
    "MapReport",
    "OversizedValueError",
    "PoolSaturatedError",
    "QuotaExceededError",
    "ReadBatchTooLargeError",
    "ReceiptCompletedError",
    "ResolvedPlay",
    "ResponseTooLargeError",
    "Runtime",
    "RuntimeContext",
    "SessionError",
    "SessionExpiredError",
    "SessionPrewarmError",
    "SheetCapError",
    "SheetContract",
    "SheetRef",
    "SheetplaneError",
    "SizeMeasurement",
    "StagingQuotaError",
    "StatementTimeoutError",
    "StoreError",
    "StoreUnavailableError",
    "TransactionConflictError",
    "TransientGatewayError",
    "UnsupportedActionError",
    "ValueCancelledError",
    "WorkReceiptFencedError",
    "WriteConflictError",
    "derive_row_identity",
    "json_byte_length_up_to",
    "normalize_play_name",
    "normalize_table_namespace",
    "open_runtime",
    "resolve_sheet_contract",
]
