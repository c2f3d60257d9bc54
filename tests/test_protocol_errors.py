"""The one error table, and the receive decision it drives, tested without I/O."""

from __future__ import annotations

import pytest

from sheetplane import protocol as m
from sheetplane.budgets import DEFAULT_RETRY_AFTER_MS
from sheetplane.errors import (
    AdmissionStateError,
    BackpressureError,
    ConnectionSlotsExhaustedError,
    GatewayAuthError,
    GatewayError,
    GatewayProtocolError,
    InvalidInputError,
    PoolSaturatedError,
    QuotaExceededError,
    ReadBatchTooLargeError,
    StoreError,
    TransientGatewayError,
    WorkReceiptFencedError,
)
from sheetplane.protocol import (
    ERRORS,
    TRANSIENT_STATUSES,
    Answer,
    Code,
    Retry,
    encode_body,
    openapi_document,
    receive,
    rule_for_code,
    rule_for_exception,
)

READ_ROWS = m.action_of(m.ReadRowsRequest)
SUMMARY = m.action_of(m.SummaryRequest)
STAGE = m.action_of(m.StageAdmissionChunkRequest)


def _error(
    status: int, code: str, text: str = "no", **extra: object
) -> tuple[int, dict[str, str], bytes]:
    return status, {}, encode_body({"error": text, "code": code, **extra})


def test_every_code_the_gateway_writes_is_in_the_table_once() -> None:
    written = {value for name, value in vars(Code).items() if name.isupper()}
    # A test fault mimics any status with its own code: it is judged by its status.
    assert written - {Code.TEST_FAULT} <= {rule.code for rule in ERRORS}
    assert len({rule.code for rule in ERRORS}) == len(ERRORS)


def test_a_rule_under_a_transient_status_is_retryable() -> None:
    # But a cap that waiting cannot free (the org's sheets): its client raises it at once.
    assert all(
        rule.retryable or issubclass(rule.raises, QuotaExceededError)
        for rule in ERRORS
        if rule.status in TRANSIENT_STATUSES
    )


def test_the_server_answers_the_nearest_listed_class() -> None:
    assert rule_for_exception(PoolSaturatedError("full")) == rule_for_code(Code.BACKPRESSURE)
    slots = rule_for_exception(ConnectionSlotsExhaustedError("no slot"))
    assert slots is not None and slots.code == ConnectionSlotsExhaustedError.code
    store = rule_for_exception(StoreError("boom"))
    assert store is not None and (store.status, store.text) == (
        500,
        "Runtime Postgres operation failed",
    )
    assert rule_for_exception(RuntimeError("not ours")) is None


def test_the_openapi_409_line_names_the_admission_state_case() -> None:
    responses = openapi_document()["paths"]
    text = str(responses)
    assert AdmissionStateError.code in text
    assert WorkReceiptFencedError.code in text


def test_a_2xx_object_is_an_answer_and_a_cut_body_is_retried() -> None:
    assert receive(SUMMARY, 200, {}, b'{"total": 1}') == Answer({"total": 1}, 12)
    cut = receive(SUMMARY, 200, {}, b'{"total": 1')
    assert isinstance(cut, Retry) and isinstance(cut.error, GatewayProtocolError)
    with pytest.raises(GatewayProtocolError):
        receive(SUMMARY, 200, {}, b"[1]")


def test_back_pressure_retries_after_the_named_or_default_delay() -> None:
    named = receive(SUMMARY, *_error(503, Code.BACKPRESSURE, retry_after_ms=250))
    assert isinstance(named, Retry) and isinstance(named.error, BackpressureError)
    assert named.retry_after_ms == 250
    unnamed = receive(SUMMARY, *_error(503, Code.BACKPRESSURE))
    assert isinstance(unnamed, Retry) and unnamed.retry_after_ms == DEFAULT_RETRY_AFTER_MS
    header = receive(SUMMARY, 503, {"Retry-After": "2"}, _error(503, "other")[2])
    assert isinstance(header, Retry) and header.retry_after_ms == 2_000


def test_table_codes_raise_their_own_exceptions() -> None:
    with pytest.raises(AdmissionStateError):
        receive(STAGE, *_error(409, Code.ADMISSION_STATE))
    with pytest.raises(WorkReceiptFencedError):
        receive(SUMMARY, *_error(409, WorkReceiptFencedError.code))
    with pytest.raises(ReadBatchTooLargeError) as too_large:
        receive(READ_ROWS, *_error(413, Code.READ_BATCH_TOO_LARGE, observed_bytes=9))
    assert too_large.value.observed_bytes == 9
    with pytest.raises(InvalidInputError, match="rows\\[3\\]"):
        receive(STAGE, *_error(400, InvalidInputError.code, "rows[3] is not an object"))
    with pytest.raises(GatewayAuthError):
        receive(SUMMARY, *_error(401, "anything"))


def test_a_code_outside_its_actions_or_status_is_judged_by_status() -> None:
    # invalid_input of a non-staged action, and a page-read code on another action.
    with pytest.raises(GatewayError) as plain:
        receive(SUMMARY, *_error(400, InvalidInputError.code))
    assert type(plain.value) is GatewayError
    with pytest.raises(GatewayError) as other:
        receive(SUMMARY, *_error(413, Code.READ_BATCH_TOO_LARGE))
    assert type(other.value) is GatewayError
    # A test fault under 500 is not retried; under 502 it is.
    with pytest.raises(GatewayError):
        receive(SUMMARY, *_error(500, Code.TEST_FAULT))
    retried = receive(SUMMARY, *_error(502, Code.TEST_FAULT))
    assert isinstance(retried, Retry) and isinstance(retried.error, TransientGatewayError)


def test_the_token_is_redacted_from_every_text() -> None:
    def redact(text: str) -> str:
        return text.replace("tok-secret", "[redacted]")

    with pytest.raises(GatewayError) as raised:
        receive(SUMMARY, *_error(400, "x", "bad tok-secret", details="tok-secret"), redact)
    assert "tok-secret" not in str(raised.value)
    assert raised.value.details == "[redacted]"
