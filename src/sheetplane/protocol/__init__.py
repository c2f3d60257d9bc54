"""The runtime gateway's protocol, both sides of it, without I/O.

The client (``sheetplane.gateway.client``), the reference server
(``sheetplane.gateway.server``), the sessions, the conformance checks and
the test strategies all speak the wire through this package, so the two
sides agree by construction rather than by copy:

* ``_wire``: the vocabulary (the routes, the actions, the error codes, the
  enumerations) and the body codec;
* ``_converter``: the one cattrs converter and the field rules;
* ``_messages``: every request and answer as an attrs class;
* ``_domain``: domain values to wire messages and back, both directions;
* ``_errors``: the error table (code, status, exception, retryable);
* ``_receive``: what one answer means (answer, retry or raise), as a pure function;
* ``_splice``: bodies built around bytes already encoded, and their overheads;
* ``_chunks``: the staged chunk codec (input rows checked, keyed and encoded once);
* ``_openapi``: the OpenAPI 3.1 document, generated from the classes and the table.

Importing it imports neither httpx, starlette, hypercorn nor psycopg (a test
checks ``sys.modules``).
"""

from ._chunks import ENCODE_OPTIONS as ENCODE_OPTIONS
from ._chunks import ChunkBuilder as ChunkBuilder
from ._chunks import EncodedChunk as EncodedChunk
from ._chunks import encode_row as encode_row
from ._chunks import keyed_document as keyed_document
from ._chunks import prepare_chunk as prepare_chunk
from ._converter import ABSENT as ABSENT
from ._converter import TEXT_CAPS as TEXT_CAPS
from ._converter import Absent as Absent
from ._converter import Checked as Checked
from ._converter import Verbatim as Verbatim
from ._converter import WireConverter as WireConverter
from ._converter import WireError as WireError
from ._converter import admission_id_field as admission_id_field
from ._converter import between as between
from ._converter import build as build
from ._converter import build_checked as build_checked
from ._converter import check_text_cap as check_text_cap
from ._converter import count_rule as count_rule
from ._converter import domain_text_field as domain_text_field
from ._converter import int_field as int_field
from ._converter import lease_token_field as lease_token_field
from ._converter import non_empty as non_empty
from ._converter import optional_int_field as optional_int_field
from ._converter import optional_text_field as optional_text_field
from ._converter import rule as rule
from ._converter import text_field as text_field
from ._converter import wire_name as wire_name
from ._domain import admission_answer as admission_answer
from ._domain import admitted_of as admitted_of
from ._domain import admitted_wire as admitted_wire
from ._domain import attempt_status_answer as attempt_status_answer
from ._domain import check_page as check_page
from ._domain import claim_answer as claim_answer
from ._domain import complete_rows_decoded as complete_rows_decoded
from ._domain import complete_rows_json as complete_rows_json
from ._domain import complete_rows_of as complete_rows_of
from ._domain import complete_rows_wire as complete_rows_wire
from ._domain import contract_json as contract_json
from ._domain import contract_of as contract_of
from ._domain import contract_wire as contract_wire
from ._domain import copy_fields as copy_fields
from ._domain import fail_rows_decoded as fail_rows_decoded
from ._domain import fail_rows_json as fail_rows_json
from ._domain import fail_rows_of as fail_rows_of
from ._domain import fail_rows_wire as fail_rows_wire
from ._domain import keyed_write_answer as keyed_write_answer
from ._domain import page_batch_of as page_batch_of
from ._domain import page_input as page_input
from ._domain import pages_wire as pages_wire
from ._domain import parse_admission as parse_admission
from ._domain import parse_attempt_status as parse_attempt_status
from ._domain import parse_db_session as parse_db_session
from ._domain import parse_keyed_write as parse_keyed_write
from ._domain import parse_ok as parse_ok
from ._domain import parse_pages as parse_pages
from ._domain import parse_receipt_claim as parse_receipt_claim
from ._domain import parse_receipt_completion as parse_receipt_completion
from ._domain import parse_released as parse_released
from ._domain import parse_resolved_play as parse_resolved_play
from ._domain import parse_row_keys as parse_row_keys
from ._domain import parse_share_claim as parse_share_claim
from ._domain import parse_share_lease as parse_share_lease
from ._domain import parse_summary as parse_summary
from ._domain import parse_terminal_write as parse_terminal_write
from ._domain import play_wire as play_wire
from ._domain import protocol_error as protocol_error
from ._domain import read_as as read_as
from ._domain import read_contract as read_contract
from ._domain import receipt_answer as receipt_answer
from ._domain import receipt_of as receipt_of
from ._domain import receipt_wire as receipt_wire
from ._domain import resolved_play_answer as resolved_play_answer
from ._domain import row_cursor_of as row_cursor_of
from ._domain import row_cursor_wire as row_cursor_wire
from ._domain import row_filter_of as row_filter_of
from ._domain import session_limits_json as session_limits_json
from ._domain import session_limits_of as session_limits_of
from ._domain import share_claim_answer as share_claim_answer
from ._domain import share_lease_answer as share_lease_answer
from ._domain import summary_answer as summary_answer
from ._domain import terminal_write_answer as terminal_write_answer
from ._errors import ERRORS as ERRORS
from ._errors import TRANSIENT_STATUSES as TRANSIENT_STATUSES
from ._errors import ErrorRule as ErrorRule
from ._errors import rule_for_code as rule_for_code
from ._errors import rule_for_exception as rule_for_exception
from ._errors import status_descriptions as status_descriptions
from ._messages import ACTIONS as ACTIONS
from ._messages import ANSWERS as ANSWERS
from ._messages import CLOSED as CLOSED
from ._messages import CONVERTER as CONVERTER
from ._messages import EXCHANGES as EXCHANGES
from ._messages import MAX_TTL_SECONDS as MAX_TTL_SECONDS
from ._messages import PAGE_READS as PAGE_READS
from ._messages import PROBE_ANSWERS as PROBE_ANSWERS
from ._messages import REQUESTS as REQUESTS
from ._messages import UNCAPPED as UNCAPPED
from ._messages import WRITES_NULLS as WRITES_NULLS
from ._messages import AbortAdmissionAnswer as AbortAdmissionAnswer
from ._messages import AbortAdmissionRequest as AbortAdmissionRequest
from ._messages import AdmissionAnswer as AdmissionAnswer
from ._messages import AdmittedPartWire as AdmittedPartWire
from ._messages import AppendRowsRequest as AppendRowsRequest
from ._messages import AttemptRequest as AttemptRequest
from ._messages import AttemptStatusAnswer as AttemptStatusAnswer
from ._messages import AttemptStatusRequest as AttemptStatusRequest
from ._messages import BeginAdmissionAnswer as BeginAdmissionAnswer
from ._messages import BeginAdmissionRequest as BeginAdmissionRequest
from ._messages import ClaimAnswer as ClaimAnswer
from ._messages import ClaimShareAnswer as ClaimShareAnswer
from ._messages import ClaimShareRequest as ClaimShareRequest
from ._messages import ClaimWorkReceiptRequest as ClaimWorkReceiptRequest
from ._messages import CommitAdmissionAnswer as CommitAdmissionAnswer
from ._messages import CommitAdmissionRequest as CommitAdmissionRequest
from ._messages import CompleteMapRowsRequest as CompleteMapRowsRequest
from ._messages import CompleteRowWire as CompleteRowWire
from ._messages import CompleteWorkReceiptRequest as CompleteWorkReceiptRequest
from ._messages import ContractColumnWire as ContractColumnWire
from ._messages import CreateDbSessionAnswer as CreateDbSessionAnswer
from ._messages import CreateDbSessionRequest as CreateDbSessionRequest
from ._messages import EnsureSheetRequest as EnsureSheetRequest
from ._messages import EnvelopeWire as EnvelopeWire
from ._messages import ErrorBody as ErrorBody
from ._messages import FailMapRowsRequest as FailMapRowsRequest
from ._messages import FailRowWire as FailRowWire
from ._messages import HealthAnswer as HealthAnswer
from ._messages import KeyedWriteAnswer as KeyedWriteAnswer
from ._messages import KeyedWriteRequest as KeyedWriteRequest
from ._messages import OkAnswer as OkAnswer
from ._messages import PageRequestWire as PageRequestWire
from ._messages import PageWire as PageWire
from ._messages import PlayDefinitionWire as PlayDefinitionWire
from ._messages import PlayWire as PlayWire
from ._messages import PostgresTablesWire as PostgresTablesWire
from ._messages import ReadInput as ReadInput
from ._messages import ReadRowKeysAnswer as ReadRowKeysAnswer
from ._messages import ReadRowKeysInput as ReadRowKeysInput
from ._messages import ReadRowKeysRequest as ReadRowKeysRequest
from ._messages import ReadRowsAnswer as ReadRowsAnswer
from ._messages import ReadRowsBatchAnswer as ReadRowsBatchAnswer
from ._messages import ReadRowsBatchInput as ReadRowsBatchInput
from ._messages import ReadRowsBatchRequest as ReadRowsBatchRequest
from ._messages import ReadRowsInput as ReadRowsInput
from ._messages import ReadRowsRequest as ReadRowsRequest
from ._messages import ReadyAnswer as ReadyAnswer
from ._messages import ReceiptAnswer as ReceiptAnswer
from ._messages import ReceiptWire as ReceiptWire
from ._messages import RegisterPlayAnswer as RegisterPlayAnswer
from ._messages import RegisterPlayRequest as RegisterPlayRequest
from ._messages import ReleaseAnswer as ReleaseAnswer
from ._messages import ReleaseShareRequest as ReleaseShareRequest
from ._messages import ReleaseWorkReceiptRequest as ReleaseWorkReceiptRequest
from ._messages import RenewShareRequest as RenewShareRequest
from ._messages import ReplaceRowsRequest as ReplaceRowsRequest
from ._messages import Request as Request
from ._messages import ResolvePlayAnswer as ResolvePlayAnswer
from ._messages import ResolvePlayRequest as ResolvePlayRequest
from ._messages import RowCursorWire as RowCursorWire
from ._messages import SessionLimitsAnswer as SessionLimitsAnswer
from ._messages import SessionLimitsWire as SessionLimitsWire
from ._messages import SessionTargetAnswer as SessionTargetAnswer
from ._messages import SessionTargetWire as SessionTargetWire
from ._messages import ShareLeaseAnswer as ShareLeaseAnswer
from ._messages import SheetContractWire as SheetContractWire
from ._messages import SheetRequest as SheetRequest
from ._messages import StageAdmissionChunkAnswer as StageAdmissionChunkAnswer
from ._messages import StageAdmissionChunkRequest as StageAdmissionChunkRequest
from ._messages import StagedAdmissionRequest as StagedAdmissionRequest
from ._messages import StaleRowWire as StaleRowWire
from ._messages import StartSheetDatasetRequest as StartSheetDatasetRequest
from ._messages import SummaryAnswer as SummaryAnswer
from ._messages import SummaryRequest as SummaryRequest
from ._messages import TerminalWriteAnswer as TerminalWriteAnswer
from ._messages import TerminalWriteRequest as TerminalWriteRequest
from ._messages import UnreadyAnswer as UnreadyAnswer
from ._messages import UnreadyReason as UnreadyReason
from ._messages import UpsertRowsRequest as UpsertRowsRequest
from ._messages import UrlEncryptionWire as UrlEncryptionWire
from ._messages import action_of as action_of
from ._messages import error_body as error_body
from ._messages import structure as structure
from ._messages import unstructure as unstructure
from ._openapi import ERROR_STATUSES as ERROR_STATUSES
from ._openapi import OPENAPI_PATH as OPENAPI_PATH
from ._openapi import json_of as json_of
from ._openapi import openapi_document as openapi_document
from ._receive import TRANSIENT_MESSAGE as TRANSIENT_MESSAGE
from ._receive import UNSUPPORTED_ACTION_MESSAGE as UNSUPPORTED_ACTION_MESSAGE
from ._receive import Answer as Answer
from ._receive import Retry as Retry
from ._receive import is_transient_message as is_transient_message
from ._receive import receive as receive
from ._receive import retry_after_from_body as retry_after_from_body
from ._receive import retry_after_from_header as retry_after_from_header
from ._splice import ANSWER_OVERHEAD as ANSWER_OVERHEAD
from ._splice import PAGE_OVERHEAD as PAGE_OVERHEAD
from ._splice import chunk_body as chunk_body
from ._splice import page_body as page_body
from ._splice import page_overhead as page_overhead
from ._splice import pages_body as pages_body
from ._wire import BIGINT_MAX as BIGINT_MAX
from ._wire import BIGINT_MIN as BIGINT_MIN
from ._wire import HEALTHZ_PATH as HEALTHZ_PATH
from ._wire import LOGICAL_TABLES as LOGICAL_TABLES
from ._wire import METRICS_PATH as METRICS_PATH
from ._wire import OPERATIONS as OPERATIONS
from ._wire import PROTECTION_BYPASS_HEADER as PROTECTION_BYPASS_HEADER
from ._wire import READYZ_PATH as READYZ_PATH
from ._wire import ROW_MODES as ROW_MODES
from ._wire import RUNTIME_PATH as RUNTIME_PATH
from ._wire import SERVED_LOGICAL_TABLES as SERVED_LOGICAL_TABLES
from ._wire import STALE_REASONS as STALE_REASONS
from ._wire import UNSUPPORTED_ACTION_TEXT as UNSUPPORTED_ACTION_TEXT
from ._wire import Code as Code
from ._wire import decode_body as decode_body
from ._wire import encode_body as encode_body
from ._wire import token_digest as token_digest

__all__ = [
    "ABSENT",
    "ACTIONS",
    "ANSWERS",
    "ANSWER_OVERHEAD",
    "BIGINT_MAX",
    "BIGINT_MIN",
    "CLOSED",
    "CONVERTER",
    "ENCODE_OPTIONS",
    "ERRORS",
    "ERROR_STATUSES",
    "EXCHANGES",
    "HEALTHZ_PATH",
    "LOGICAL_TABLES",
    "MAX_TTL_SECONDS",
    "METRICS_PATH",
    "OPENAPI_PATH",
    "OPERATIONS",
    "PAGE_OVERHEAD",
    "PAGE_READS",
    "PROBE_ANSWERS",
    "PROTECTION_BYPASS_HEADER",
    "READYZ_PATH",
    "REQUESTS",
    "ROW_MODES",
    "RUNTIME_PATH",
    "SERVED_LOGICAL_TABLES",
    "STALE_REASONS",
    "TEXT_CAPS",
    "TRANSIENT_MESSAGE",
    "TRANSIENT_STATUSES",
    "UNCAPPED",
    "UNSUPPORTED_ACTION_MESSAGE",
    "UNSUPPORTED_ACTION_TEXT",
    "WRITES_NULLS",
    "AbortAdmissionAnswer",
    "AbortAdmissionRequest",
    "Absent",
    "AdmissionAnswer",
    "AdmittedPartWire",
    "Answer",
    "AppendRowsRequest",
    "AttemptRequest",
    "AttemptStatusAnswer",
    "AttemptStatusRequest",
    "BeginAdmissionAnswer",
    "BeginAdmissionRequest",
    "Checked",
    "ChunkBuilder",
    "ClaimAnswer",
    "ClaimShareAnswer",
    "ClaimShareRequest",
    "ClaimWorkReceiptRequest",
    "Code",
    "CommitAdmissionAnswer",
    "CommitAdmissionRequest",
    "CompleteMapRowsRequest",
    "CompleteRowWire",
    "CompleteWorkReceiptRequest",
    "ContractColumnWire",
    "CreateDbSessionAnswer",
    "CreateDbSessionRequest",
    "EncodedChunk",
    "EnsureSheetRequest",
    "EnvelopeWire",
    "ErrorBody",
    "ErrorRule",
    "FailMapRowsRequest",
    "FailRowWire",
    "HealthAnswer",
    "KeyedWriteAnswer",
    "KeyedWriteRequest",
    "OkAnswer",
    "PageRequestWire",
    "PageWire",
    "PlayDefinitionWire",
    "PlayWire",
    "PostgresTablesWire",
    "ReadInput",
    "ReadRowKeysAnswer",
    "ReadRowKeysInput",
    "ReadRowKeysRequest",
    "ReadRowsAnswer",
    "ReadRowsBatchAnswer",
    "ReadRowsBatchInput",
    "ReadRowsBatchRequest",
    "ReadRowsInput",
    "ReadRowsRequest",
    "ReadyAnswer",
    "ReceiptAnswer",
    "ReceiptWire",
    "RegisterPlayAnswer",
    "RegisterPlayRequest",
    "ReleaseAnswer",
    "ReleaseShareRequest",
    "ReleaseWorkReceiptRequest",
    "RenewShareRequest",
    "ReplaceRowsRequest",
    "Request",
    "ResolvePlayAnswer",
    "ResolvePlayRequest",
    "Retry",
    "RowCursorWire",
    "SessionLimitsAnswer",
    "SessionLimitsWire",
    "SessionTargetAnswer",
    "SessionTargetWire",
    "ShareLeaseAnswer",
    "SheetContractWire",
    "SheetRequest",
    "StageAdmissionChunkAnswer",
    "StageAdmissionChunkRequest",
    "StagedAdmissionRequest",
    "StaleRowWire",
    "StartSheetDatasetRequest",
    "SummaryAnswer",
    "SummaryRequest",
    "TerminalWriteAnswer",
    "TerminalWriteRequest",
    "UnreadyAnswer",
    "UnreadyReason",
    "UpsertRowsRequest",
    "UrlEncryptionWire",
    "Verbatim",
    "WireConverter",
    "WireError",
    "action_of",
    "admission_answer",
    "admission_id_field",
    "admitted_of",
    "admitted_wire",
    "attempt_status_answer",
    "between",
    "build",
    "build_checked",
    "check_page",
    "check_text_cap",
    "chunk_body",
    "claim_answer",
    "complete_rows_decoded",
    "complete_rows_json",
    "complete_rows_of",
    "complete_rows_wire",
    "contract_json",
    "contract_of",
    "contract_wire",
    "copy_fields",
    "count_rule",
    "decode_body",
    "domain_text_field",
    "encode_body",
    "encode_row",
    "error_body",
    "fail_rows_decoded",
    "fail_rows_json",
    "fail_rows_of",
    "fail_rows_wire",
    "int_field",
    "is_transient_message",
    "json_of",
    "keyed_document",
    "keyed_write_answer",
    "lease_token_field",
    "non_empty",
    "openapi_document",
    "optional_int_field",
    "optional_text_field",
    "page_batch_of",
    "page_body",
    "page_input",
    "page_overhead",
    "pages_body",
    "pages_wire",
    "parse_admission",
    "parse_attempt_status",
    "parse_db_session",
    "parse_keyed_write",
    "parse_ok",
    "parse_pages",
    "parse_receipt_claim",
    "parse_receipt_completion",
    "parse_released",
    "parse_resolved_play",
    "parse_row_keys",
    "parse_share_claim",
    "parse_share_lease",
    "parse_summary",
    "parse_terminal_write",
    "play_wire",
    "prepare_chunk",
    "protocol_error",
    "read_as",
    "read_contract",
    "receipt_answer",
    "receipt_of",
    "receipt_wire",
    "receive",
    "resolved_play_answer",
    "retry_after_from_body",
    "retry_after_from_header",
    "row_cursor_of",
    "row_cursor_wire",
    "row_filter_of",
    "rule",
    "rule_for_code",
    "rule_for_exception",
    "session_limits_json",
    "session_limits_of",
    "share_claim_answer",
    "share_lease_answer",
    "status_descriptions",
    "structure",
    "summary_answer",
    "terminal_write_answer",
    "text_field",
    "token_digest",
    "unstructure",
    "wire_name",
]
