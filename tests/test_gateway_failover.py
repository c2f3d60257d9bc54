"""A writing runner rides through a gateway killed and restarted on its port, and a
second gateway URL takes over from one that is gone.

Real ``sheetplane serve`` processes, killed with SIGKILL under a runner on the
gateway road with several terminal writes in flight. Before, a refused
connect spent the five-attempt ladder in 3.75 s and the runner raised
``TransientGatewayError ... ConnectError``; now a call that reaches no
gateway tries the next URL, then backs off (capped, jittered) within its
whole budget.
"""

from __future__ import annotations

import secrets
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from _runtime_helpers import CONTRACT
from _serve_helpers import Served, serving
from sheetplane.budgets import RETRY_DELAYS_MS
from sheetplane.errors import SheetplaneError
from sheetplane.runtime import CompleteRow, RowWriter, open_runtime

WRITERS = 4
ROWS = 400
#: Acknowledged writes before the kill.
BEFORE_KILL = 40
#: How long the gateway stays down: longer than the old ladder's delays (3.75 s).
OUTAGE_S = sum(RETRY_DELAYS_MS) / 1000 + 1
DEADLINE_S = 120


@attrs.define
class Tenant:
    token: str
    org: str
    args: tuple[str, ...]


def _tenant(database_url: str, tmp_path: Path) -> Tenant:
    token, org = f"tok-{secrets.token_hex(10)}", f"org-{uuid.uuid4().hex[:10]}"
    (tmp_path / "url").write_text(database_url)
    (tmp_path / "tokens").write_text(f"{token}={org}\n")
    args = ("--database-url-file", str(tmp_path / "url"), "--tokens-file", str(tmp_path / "tokens"))
    return Tenant(token, org, args)


@attrs.define
class Writing:
    """Terminal writes of every pending key, ``WRITERS`` at a time, one key a call."""

    keys: list[str]
    acked: set[str] = attrs.field(factory=set)
    failures: list[str] = attrs.field(factory=list)
    progressed: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)

    async def run(self, writer: RowWriter) -> None:
        async def one(part: list[str]) -> None:
            for key in part:
                try:
                    result = await writer.complete([CompleteRow(key, {"words": 1})])
                except SheetplaneError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    return
                self.acked.update(result.committed_keys)
                if len(self.acked) >= BEFORE_KILL:
                    self.progressed.set()

        async with trio.open_nursery() as nursery:
            for i in range(WRITERS):
                nursery.start_soon(one, self.keys[i::WRITERS])
        self.progressed.set()
        self.done.set()


@asynccontextmanager
async def writing(
    tenant: Tenant, base_url: str | list[str]
) -> AsyncIterator[tuple[Writing, trio.Nursery]]:
    async with open_runtime(
        base_url=base_url,
        token=tenant.token,
        org_id=tenant.org,
        play_name="play",
        run_id="run-1",
        strategy="gateway_only",
    ) as rt:
        writer = rt.writer(f"ns_{uuid.uuid4().hex[:10]}", CONTRACT)
        admission = await writer.start([{"text": f"row {i}"} for i in range(ROWS)])
        keys = [row["_key"] async for row in admission.pending()]
        state = Writing(keys)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(state.run, writer)
            yield state, nursery


async def _kill(served: Served) -> None:
    served.process.send_signal(signal.SIGKILL)
    await served.process.wait()
    served.stopped = True


@pytest.mark.heavy(18)
async def test_a_writing_runner_rides_through_a_gateway_killed_and_restarted_on_its_port(
    database_url: str, tmp_path: Path
) -> None:
    tenant = _tenant(database_url, tmp_path)
    async with (
        serving(*tenant.args, tmp_path=tmp_path) as first,
        writing(tenant, first.base_url) as (state, _),
    ):
        with trio.fail_after(DEADLINE_S):
            await state.progressed.wait()
            await _kill(first)
            await trio.sleep(OUTAGE_S)  # the outage itself, not a synchronisation
            async with serving(*tenant.args, "--port", str(first.port), tmp_path=tmp_path):
                await state.done.wait()
    assert state.failures == []
    assert state.acked == set(state.keys)


async def test_a_second_gateway_url_takes_over_from_a_killed_gateway(
    database_url: str, tmp_path: Path
) -> None:
    tenant = _tenant(database_url, tmp_path)
    async with (
        serving(*tenant.args, tmp_path=tmp_path) as first,
        serving(*tenant.args, tmp_path=tmp_path) as second,
        writing(tenant, [first.base_url, second.base_url]) as (state, _),
    ):
        with trio.fail_after(DEADLINE_S):
            await state.progressed.wait()
            await _kill(first)
            await state.done.wait()
    assert state.failures == []
    assert state.acked == set(state.keys)
