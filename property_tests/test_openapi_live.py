"""schemathesis against the live reference gateway, one action at a time.

The document is the one the gateway serves (generated from the wire classes).
The operating routes (``/healthz``, ``/readyz``, ``/metrics``) are checked the
same way, with and without the metrics token.
For each action, schemathesis draws requests from that action's request schema
and sends them, authorized with a test token, to a real gateway on an
embedded Postgres; every answer must be no 5xx, a documented status, JSON,
and conform to the document's schema for that status. ``EXAMPLES`` bounds the
requests per action (more with ``--campaign``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from sheetplane.protocol import (
    HEALTHZ_PATH,
    METRICS_PATH,
    OPENAPI_PATH,
    READYZ_PATH,
    REQUESTS,
    RUNTIME_PATH,
)

from ._threaded_gateway import ThreadedGateway

TOKEN = "schemathesis-test-token"
METRICS_TOKEN = "schemathesis-metrics-token"
ORG = "org-schemathesis"
EXAMPLES = 12
#: The statuses seen, by action (printed with -s).
STATUSES: dict[str, list[int]] = {}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def served(sheetplane_database_url: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with ThreadedGateway(
        sheetplane_database_url, tokens={TOKEN: ORG}, metrics_token=METRICS_TOKEN
    ) as gateway:
        document = httpx.get(gateway.base_url + OPENAPI_PATH, timeout=60).json()
        yield gateway.base_url, document


def _one_action(document: dict[str, Any], action: str) -> dict[str, Any]:
    """The served document narrowed to one action: its request and its answer."""
    narrowed = copy.deepcopy(document)
    del narrowed["paths"][OPENAPI_PATH]
    body = narrowed["paths"][RUNTIME_PATH]["post"]["requestBody"]["content"]["application/json"]
    request = REQUESTS[action].__name__
    body["schema"] = {"$ref": f"#/components/schemas/{request}"}
    # The 200 answer narrowed too: each action's answer must be its own class's.
    answer = narrowed["components"]["schemas"][request]["x-answer"]
    ok = narrowed["paths"][RUNTIME_PATH]["post"]["responses"]["200"]["content"]
    ok["application/json"]["schema"] = {"$ref": answer}
    return narrowed


@pytest.mark.parametrize("action", sorted(REQUESTS))
def test_every_answer_conforms_to_the_document(
    served: tuple[str, dict[str, Any]], action: str, request: pytest.FixtureRequest
) -> None:
    base_url, document = served
    schema = schemathesis.openapi.from_dict(_one_action(document, action))
    operation = schema[RUNTIME_PATH]["POST"]
    examples = EXAMPLES * (10 if request.config.getoption("--campaign") else 1)

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        response = case.call_and_validate(
            base_url=base_url,
            headers={"authorization": f"Bearer {TOKEN}"},
            checks=CHECKS,
            timeout=60,
        )
        STATUSES.setdefault(action, []).append(response.status_code)

    run()
    print(action, sorted(STATUSES[action]))


@pytest.mark.parametrize(
    ("path", "token"),
    [
        (HEALTHZ_PATH, None),
        (READYZ_PATH, None),
        (METRICS_PATH, METRICS_TOKEN),
        (METRICS_PATH, None),
        (METRICS_PATH, "not-the-metrics-token"),
    ],
)
def test_the_operating_routes_conform_to_the_document(
    served: tuple[str, dict[str, Any]], path: str, token: str | None
) -> None:
    base_url, document = served
    schema = schemathesis.openapi.from_dict(document)
    operation = schema[path]["GET"]
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    seen: list[int] = []

    @settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        response = case.call_and_validate(
            base_url=base_url, headers=headers, checks=CHECKS, timeout=60
        )
        seen.append(response.status_code)

    run()
    expected = {METRICS_TOKEN: 200, None: 401, "not-the-metrics-token": 401}
    assert set(seen) == {200 if path != METRICS_PATH else expected[token]}, seen
