"""The attempt handle: a frozen value whose JSON any process can take up, with
no secret in it, and the share-lease settings a worker is given."""

from __future__ import annotations

import json

import attrs
import pytest

import sheetplane
from sheetplane._attempts import ShareLease
from sheetplane.budgets import (
    SHARE_LEASE_GUARD_MS,
    SHARE_LEASE_MIN_TTL_MS,
    SHARE_LEASE_RENEWAL_MS,
    SHARE_LEASE_TTL_MS,
)


def test_an_attempt_round_trips_through_its_json() -> None:
    attempt = sheetplane.Attempt("My Play", "leads", "run-7", 12)
    text = attempt.to_json()
    assert json.loads(text) == {
        "playName": attempt.play_name,
        "tableNamespace": "leads",
        "runId": "run-7",
        "writeVersion": 12,
    }
    assert sheetplane.Attempt.from_json(text) == attempt
    assert sheetplane.Attempt.from_json(text.encode()) == attempt
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        attempt.write_version = 13  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"playName":"p","tableNamespace":"t","runId":"r"}',
        '{"playName":"p","tableNamespace":"t","runId":"r","writeVersion":0}',
        '{"playName":"p","tableNamespace":"t","runId":"","writeVersion":1}',
        '{"playName":"p","tableNamespace":"t","runId":"r","writeVersion":"1"}',
        '{"playName":"p","tableNamespace":"t","runId":"r","writeVersion":1,"token":"x"}',
    ],
)
def test_anything_but_an_attempts_json_is_refused(text: str) -> None:
    with pytest.raises(sheetplane.InvalidInputError):
        sheetplane.Attempt.from_json(text)


def test_the_default_share_lease_is_the_budgets_and_a_bad_one_is_refused() -> None:
    lease = ShareLease()
    assert (lease.ttl_ms, lease.renewal_ms, lease.guard_ms) == (
        SHARE_LEASE_TTL_MS,
        SHARE_LEASE_RENEWAL_MS,
        SHARE_LEASE_GUARD_MS,
    )
    assert lease.call_ms > 0
    with pytest.raises(sheetplane.InvalidInputError, match="ttl_ms"):
        ShareLease(ttl_ms=SHARE_LEASE_MIN_TTL_MS - 1, renewal_ms=1, guard_ms=1)
    with pytest.raises(sheetplane.InvalidInputError, match="renewal_ms"):
        ShareLease(ttl_ms=1000, renewal_ms=600, guard_ms=400)
