"""Tenancy of an attempt's shares on both roads: a worker of org A cannot claim, renew
or release org B's shares, nor another sheet's, nor another attempt's; a scoped
session granted ``rows.claim`` may only execute its own sheet's share functions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from _session_helpers import run_sql
from sheetplane._types import SheetRef
from sheetplane.gateway.server import RunningGateway, running_gateway
from sheetplane.store import share_signatures, sheet_names
from test_gateway_tenancy import (
    ORG_A,
    ORG_B,
    PLAY,
    TOKEN_A,
    TOKEN_B,
    act,
    admit,
    mint,
    post,
)

TOKEN = "s" * 43
TTL = 60_000


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={TOKEN_A: ORG_A, TOKEN_B: ORG_B}) as gw:
        yield gw


def fresh() -> str:
    return f"ns-{uuid.uuid4().hex[:10]}"


async def claim(gw: RunningGateway, token: str, namespace: str, version: int) -> Any:
    return await post(
        gw,
        token,
        "claim_sheet_share",
        tableNamespace=namespace,
        writeVersion=version,
        holder="w",
        leaseToken=TOKEN,
        ttlMs=TTL,
        maxRows=10,
    )


async def test_gateway_a_worker_reaches_only_its_own_orgs_shares(gateway: RunningGateway) -> None:
    namespace = fresh()
    b = await admit(gateway, TOKEN_B, namespace)
    version = b["writeVersion"]
    held = await claim(gateway, TOKEN_B, namespace, version)
    assert held.status_code == 200 and held.json()["outcome"] == "claimed"
    # Org A names org B's namespace and version: the action acts on org A's own sheet,
    # which was never admitted. Nothing of org B's is claimed, renewed or released.
    refused = await claim(gateway, TOKEN_A, namespace, version)
    assert refused.status_code == 400 and "no admission" in refused.json()["error"]
    for action, fields in (
        ("renew_sheet_share", {"share": 1, "ttlMs": TTL}),
        ("release_sheet_share", {"share": 1, "finished": True}),
        ("sheet_attempt_status", {}),
    ):
        extra = {} if action == "sheet_attempt_status" else {"leaseToken": TOKEN}
        answer = await post(
            gateway,
            TOKEN_A,
            action,
            tableNamespace=namespace,
            writeVersion=version,
            **extra,
            **fields,
        )
        assert answer.status_code == 400, (action, answer.text)
    status = await act(
        gateway, TOKEN_B, "sheet_attempt_status", tableNamespace=namespace, writeVersion=version
    )
    assert (status["claimed"], status["workers"]) == (3, 1)


async def test_gateway_another_attempts_and_another_workers_shares_are_refused(
    gateway: RunningGateway,
) -> None:
    namespace = fresh()
    first = (await admit(gateway, TOKEN_A, namespace))["writeVersion"]
    assert (await claim(gateway, TOKEN_A, namespace, first)).json()["outcome"] == "claimed"
    second = (await admit(gateway, TOKEN_A, namespace))["writeVersion"]
    # The older attempt is superseded: no claim, no renewal.
    assert (await claim(gateway, TOKEN_A, namespace, first)).json()["outcome"] == "superseded"
    # Another worker's share of the current attempt: its token is needed.
    mine = await claim(gateway, TOKEN_A, namespace, second)
    assert mine.json()["share"] == 1
    for action, fields in (
        ("renew_sheet_share", {"ttlMs": TTL}),
        ("release_sheet_share", {"finished": False}),
    ):
        answer = await act(
            gateway,
            TOKEN_A,
            action,
            tableNamespace=namespace,
            writeVersion=second,
            share=1,
            leaseToken="t" * 43,
            **fields,
        )
        assert answer == {"outcome": "lost"}


async def test_direct_a_claim_session_executes_only_its_own_sheets_share_functions(
    gateway: RunningGateway, database_url: str
) -> None:
    mine, other_sheet = fresh(), fresh()
    version = (await admit(gateway, TOKEN_A, mine))["writeVersion"]
    await admit(gateway, TOKEN_A, other_sheet)
    await admit(gateway, TOKEN_B, mine)
    _, url = await mint(gateway, TOKEN_A, mine, ["rows.claim"])
    names = sheet_names(SheetRef(ORG_A, PLAY, mine))
    claim_fn = sql.SQL("SELECT * FROM {}(%s, %s, %s, %s, %s)")

    def function(sheet: SheetRef, which: str) -> sql.Identifier:
        n = sheet_names(sheet)
        return sql.Identifier(n.schema, f"{n.sheet_table.removesuffix('_rows')}_share_{which}")

    # Its own sheet's current attempt: claimed.
    own = await run_sql(
        url,
        claim_fn.format(function(SheetRef(ORG_A, PLAY, mine), "claim")),
        (version, "w", TOKEN, TTL, 2),
    )
    assert own[0][0] == "claimed"
    # Another sheet of its org, and org B's sheet of the same name: not executable.
    for sheet in (SheetRef(ORG_A, PLAY, other_sheet), SheetRef(ORG_B, PLAY, mine)):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await run_sql(url, claim_fn.format(function(sheet, "claim")), (1, "w", TOKEN, TTL, 2))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await run_sql(
                url,
                sql.SQL("SELECT {}(%s, %s, %s, %s)").format(function(sheet, "renew")),
                (1, 1, TOKEN, TTL),
            )
    # No privilege on the shares table itself: the rules are the functions'.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await run_sql(
            url,
            sql.SQL("UPDATE {} SET expires_at = now()").format(names.ident("shares_table")),
        )
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await run_sql(url, sql.SQL("SELECT * FROM {}").format(names.ident("shares_table")))
    # Another attempt (an older version) and another worker's token: refused by the rules.
    newer = (await admit(gateway, TOKEN_A, mine))["writeVersion"]
    stale = await run_sql(
        url,
        claim_fn.format(function(SheetRef(ORG_A, PLAY, mine), "claim")),
        (version, "w", TOKEN, TTL, 2),
    )
    assert stale[0][0] == "superseded"
    fresh_claim = await run_sql(
        url,
        claim_fn.format(function(SheetRef(ORG_A, PLAY, mine), "claim")),
        (newer, "w", TOKEN, TTL, 2),
    )
    assert fresh_claim[0][:2] == ("claimed", 1)
    lost = await run_sql(
        url,
        sql.SQL("SELECT {}(%s, %s, %s, %s)").format(
            function(SheetRef(ORG_A, PLAY, mine), "release")
        ),
        (newer, 1, "t" * 43, True),
    )
    assert lost == [("lost",)]
    # A session for reads only may not execute them at all.
    _, reader = await mint(gateway, TOKEN_A, mine, ["rows.read"])
    for signature in share_signatures(names):
        found = await run_sql(
            reader,
            "SELECT has_function_privilege(%s, 'EXECUTE')",
            (signature.as_string(),),
        )
        assert found == [(False,)]
