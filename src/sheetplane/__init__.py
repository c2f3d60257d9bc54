"""sheetplane: a trio-native sheet data plane under explicit budgets."""

from __future__ import annotations

from .batching import BatcherStatistics as BatcherStatistics
from .batching import BoundedBatchFunction as BoundedBatchFunction
from .errors import AttemptSupersededError as AttemptSupersededError
from .errors import BackpressureError as BackpressureError
from .errors import BatchContractError as BatchContractError
from .errors import BatcherClosedError as BatcherClosedError
from .errors import BatchingError as BatchingError
from .errors import EnvelopeDecryptionError as EnvelopeDecryptionError
from .errors import GatewayAuthError as GatewayAuthError
from .errors import GatewayError as GatewayError
from .errors import GatewayProtocolError as GatewayProtocolError
from .errors import GatewayTimeoutError as GatewayTimeoutError
from .errors import InvalidInputError as InvalidInputError
from .errors import LaneWedgedError as LaneWedgedError
from .errors import OversizedValueError as OversizedValueError
from .errors import ReadBatchTooLargeError as ReadBatchTooLargeError
from .errors import ResponseTooLargeError as ResponseTooLargeError
from .errors import SessionError as SessionError
from .errors import SessionExpiredError as SessionExpiredError
from .errors import SheetplaneError as SheetplaneError
from .errors import StatementTimeoutError as StatementTimeoutError
from .errors import StoreError as StoreError
from .errors import StoreUnavailableError as StoreUnavailableError
from .errors import TransientGatewayError as TransientGatewayError
from .errors import UnsupportedActionError as UnsupportedActionError
from .errors import WorkReceiptFencedError as WorkReceiptFencedError
from .errors import WriteConflictError as WriteConflictError
from .runtime import Runtime as Runtime
from .runtime import RuntimeContext as RuntimeContext
from .runtime import open_runtime as open_runtime
from .sizes import SizeMeasurement as SizeMeasurement
from .sizes import json_byte_length_up_to as json_byte_length_up_to

__version__ = "0.1.0"

__all__ = [
    "AttemptSupersededError",
    "BackpressureError",
    "BatchContractError",
    "BatcherClosedError",
    "BatcherStatistics",
    "BatchingError",
    "BoundedBatchFunction",
    "EnvelopeDecryptionError",
    "GatewayAuthError",
    "GatewayError",
    "GatewayProtocolError",
    "GatewayTimeoutError",
    "InvalidInputError",
    "LaneWedgedError",
    "OversizedValueError",
    "ReadBatchTooLargeError",
    "ResponseTooLargeError",
    "Runtime",
    "RuntimeContext",
    "SessionError",
    "SessionExpiredError",
    "SheetplaneError",
    "SizeMeasurement",
    "StatementTimeoutError",
    "StoreError",
    "StoreUnavailableError",
    "TransientGatewayError",
    "UnsupportedActionError",
    "WorkReceiptFencedError",
    "WriteConflictError",
    "json_byte_length_up_to",
    "open_runtime",
]
