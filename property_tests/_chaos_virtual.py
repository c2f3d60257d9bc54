"""The chaos harness's virtual world: runners on the real client and ``RowWriter``, a fake
gateway in memory, and faults, all in trio's virtual time (no database, no sockets).

The fake gateway keeps a sheet's rows and decides every terminal write with
the store's own sans-IO core (``decide_terminal_write``); it logs every
operation it applied, and the plain ``SheetModel`` replays that log to check
both each answer and the final sheet. The transport in front of it plays a
seeded fault schedule: transient statuses, back-pressure, resets before the
request is applied, answers *lost after* it was applied, hangs past the
attempt timeout, cut and malformed bodies, and 413s.

A schedule is a few runners (attempts) on one sheet started at random
virtual times, some cancelled at random points, each re-admitting the rows
so that earlier attempts are superseded, then one clean runner that
finishes what is left.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import httpx
import trio

from sheetplane import AttemptSupersededError, SheetplaneError
from sheetplane._types import (
    BENIGN_STALE_REASONS,
    CompleteRow,
    ContractColumn,
    FailRow,
    SheetContract,
)
from sheetplane.budgets import (
    ADMISSION_ABORT_TIMEOUT_MS,
    ADMISSION_COMMIT_CALL_BUDGET_MS,
    CALL_BUDGET_MS,
    READ_BATCH_MAX_RESPONSE_BYTES,
)
from sheetplane.gateway.client import GatewayClient
from sheetplane.pages._reader import PageReader
from sheetplane.runtime import Runtime, RuntimeContext
from sheetplane.sessions import SessionManager
from sheetplane.store._fencing import StoredRow, decide_terminal_write
from sheetplane.testing.models import ModelWrite, SheetModel

NS = "chaos"
#: The creation time of every row of the fake gateway, in its keyset cursors.
_CREATED_AT = "2026-01-01T00:00:00+00:00"
#: A ``start`` of a one-chunk input: its begin and its chunk (a call each), its
#: commit (a commit's call budget) and, if it failed, its abort.
START_LIMIT_SECONDS = (
    2 * CALL_BUDGET_MS + ADMISSION_COMMIT_CALL_BUDGET_MS + ADMISSION_ABORT_TIMEOUT_MS
) / 1000 + 1e-9
CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)
RUNNER_HEADER = "x-chaos-runner"

#: Fault kinds the virtual transport plays, with their weights.
FAULT_WEIGHTS: dict[str, int] = {
    "ok": 60,
    "502": 5,
    "503": 5,
    "504": 3,
    "backpressure": 4,
    "reset": 5,
    "lost": 6,
    "hang": 2,
    "truncated": 3,
    "malformed": 2,
    "413": 1,
}


@attrs.define
class FakeRow:
    status: str
    version: int
    run_id: str
    index: int
    values: dict[str, Any]
    error: str | None = None
    admitted: int = 0
    """The version of the admission that last took this row in (pending or completed)."""


@attrs.define
class FakeGateway:
    """A sheet in memory, answering the four actions a runner uses."""

    rows: dict[str, FakeRow] = attrs.field(factory=dict)
    version: int = 0
    admissions: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """Staged admissions by id: ``{run_id, chunks: {seq: rows}, answer}``."""
    log: list[tuple[Any, ...]] = attrs.field(factory=list)
    """``("admit", pairs, run_id, answer)`` or ``("write", target, writes, version, run_id,
    answer)`` for every operation applied, in order."""

    def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        action = body["action"]
        if action == "start_sheet_dataset":
            return self._admit(body["rows"], body["runId"])
        if action == "begin_sheet_admission":
            self.admissions.setdefault(
                body["admissionId"], {"run_id": body["runId"], "chunks": {}, "answer": None}
            )
            return {"admissionId": body["admissionId"], "chunkRows": 20_000, "chunkBytes": 1}
        if action == "stage_sheet_admission_chunk":
            staged = self.admissions[body["admissionId"]]
            if staged["answer"] is not None:
                raise _Answer(409, {"error": "committed", "code": "runtime_sheet_admission_state"})
            fresh = body["seq"] not in staged["chunks"]
            staged["chunks"].setdefault(body["seq"], body["rows"])
            return {"admissionId": body["admissionId"], "seq": body["seq"], "staged": fresh}
        if action == "commit_sheet_admission":
            return self._commit(body)
        if action == "abort_sheet_admission":
            staged = self.admissions.get(body["admissionId"])
            aborted = staged is not None and staged["answer"] is None
            if aborted:
                del self.admissions[body["admissionId"]]
            return {"aborted": aborted}
        if action in ("runtime_sheet_complete_map_rows", "runtime_sheet_fail_map_rows"):
            return self._terminal(body, "enriched" if "complete" in action else "failed")
        if action == "runtime_sheet_summary":
            return self.summary()
        if action == "runtime_sheet_read_rows":
            return self._read(body["input"])
        raise AssertionError(f"the virtual runners do not send {action}")

    def summary(self) -> dict[str, int]:
        counts = Counter(row.status for row in self.rows.values())
        return {
            "total": len(self.rows),
            "queued": counts["pending"] + counts["stale"],
            "running": counts["running"],
            "completed": counts["enriched"],
            "failed": counts["failed"],
        }

    def _commit(self, body: dict[str, Any]) -> dict[str, Any]:
        """A staged admission's commit: its chunks admitted as one request's rows, once."""
        staged = self.admissions[body["admissionId"]]
        if staged["answer"] is None:
            chunks = staged["chunks"]
            assert sorted(chunks) == list(range(body["chunks"])), "chunks missing at commit"
            rows = [row for seq in sorted(chunks) for row in chunks[seq]]
            assert len(rows) == body["rows"]
            inline = self._admit(rows, staged["run_id"])
            staged["answer"] = {
                "admissionId": body["admissionId"],
                "writeVersion": inline["writeVersion"],
                "inserted": inline["inserted"],
                "skipped": inline["skipped"],
                "pendingCount": len(inline["pendingRows"]),
                "completedCount": len(inline["completedRows"]),
                "tableNamespace": NS,
            }
        answer: dict[str, Any] = staged["answer"]
        return answer

    def _admit(self, input_rows: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
        self.version += 1
        kept: dict[str, dict[str, Any]] = {}
        for row in input_rows:
            kept.setdefault(row["_key"], row)
        inserted, pending, completed = 0, [], []
        for index, (key, row) in enumerate(kept.items()):
            stored = self.rows.get(key)
            if stored is None:
                values = {c: row[c] for c in ("email", "score") if row.get(c) is not None}
                self.rows[key] = FakeRow(
                    "pending", self.version, run_id, index, values, admitted=self.version
                )
                inserted += 1
                pending.append({**row, "_key": key})
            elif stored.status == "enriched":
                stored.index, stored.admitted = index, self.version
                completed.append({**row, **stored.values, "_key": key})
            else:
                stored.status, stored.version, stored.run_id = "pending", self.version, run_id
                stored.error, stored.index, stored.admitted = None, index, self.version
                if "email" in row:
                    stored.values["email"] = row["email"]
                pending.append({**row, "_key": key})
        answer = {
            "inserted": inserted,
            "skipped": len(input_rows) - len(kept) + len(completed),
            "pendingRows": pending,
            "completedRows": completed,
            "tableNamespace": NS,
            "writeVersion": self.version,
        }
        self.log.append(("admit", [(k, r) for k, r in kept.items()], run_id, answer))
        return answer

    def _read(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A keyset read of one admission's pending or completed rows (what
        ``Admission.pending()`` sends); the cursor is the wire's ``RowCursorWire``
        (``{inputIndex, createdAt, key}``; every row here has one creation time)."""
        admission = spec["admission"]
        version, pending = admission["writeVersion"], admission["part"] == "pending"
        after = spec.get("after")
        chosen = sorted(
            (row.index, key)
            for key, row in self.rows.items()
            if row.admitted == version and (row.version == version) == pending
        )
        if after is not None:
            chosen = [pair for pair in chosen if pair > (after["inputIndex"], after["key"])]
        page = chosen[: spec["limit"]]
        rows = [
            {
                "_key": key,
                **self.rows[key].values,
                "_status": self.rows[key].status,
                "_error": self.rows[key].error,
                "_input_index": index,
            }
            for index, key in page
        ]
        more = len(page) == spec["limit"]
        return {
            "rows": rows,
            "limit": spec["limit"],
            "offset": spec["offset"],
            "nextAfter": {"inputIndex": page[-1][0], "createdAt": _CREATED_AT, "key": page[-1][1]}
            if more and page
            else None,
        }

    def _terminal(self, body: dict[str, Any], target: str) -> dict[str, Any]:
        version = body.get("writeVersion")
        last: dict[str, dict[str, Any]] = {}
        for row in body["rows"]:
            last.pop(row["key"], None)
            last[row["key"]] = row
        committed, stale, writes = [], [], []
        for key, row in last.items():
            data = {k: v for k, v in (row.get("data") or {}).items() if k in ("email", "score")}
            error = row.get("error")
            stored = self.rows.get(key)
            same = stored is not None and (
                stored.status == target
                and all(stored.values.get(k) == v for k, v in data.items())
                and (target != "failed" or stored.error == error)
            )
            state = None if stored is None else StoredRow(stored.status, stored.version, same)  # type: ignore[arg-type]
            decision = decide_terminal_write(state, version)
            if decision.disposition == "conflict":
                raise _Answer(409, {"error": "write conflict", "code": "write_conflict"})
            if decision.disposition == "stale":
                stale.append(
                    {
                        "key": key,
                        "reason": decision.reason,
                        "rowVersionStamp": decision.row_version_stamp,
                    }
                )
            else:
                committed.append(key)
                if decision.disposition == "write":
                    writes.append((key, data, error))
        for key, data, error in writes:
            stored = self.rows[key]
            stored.status, stored.run_id, stored.error = target, body["runId"], error
            for name, value in data.items():
                if value is None:
                    stored.values.pop(name, None)
                else:
                    stored.values[name] = value
        answer = {
            "committedKeys": committed,
            "staleKeys": [row["key"] for row in stale],
            "staleRows": stale,
            "updated": len(writes),
        }
        model_writes = [
            ModelWrite(key, target, dict(row.get("data") or {}), row.get("error"))  # type: ignore[arg-type]
            for key, row in last.items()
        ]
        self.log.append(("write", target, model_writes, version, body["runId"], answer))
        return answer


class _Answer(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


@attrs.define
class FaultyTransport:
    """Plays faults in front of ``gateway``; counts them by kind.

    Each runner (named by its header) draws its faults from its own stream,
    seeded by ``seed`` and its name, so which fault meets which request does
    not depend on how the runners' requests interleave. ``quiet`` runners get
    no faults: the clean runner that finishes a schedule.
    """

    gateway: FakeGateway
    seed: int
    streams: dict[str, random.Random] = attrs.field(factory=dict)
    quiet: set[str] = attrs.field(factory=set)
    faults: Counter[str] = attrs.field(factory=Counter)
    requests: int = 0
    answered: list[tuple[str, str, dict[str, Any]]] = attrs.field(factory=list)
    """``(runner, action, answer)`` for every answer delivered to a runner."""

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        body = json.loads(await request.aread())
        runner = request.headers.get(RUNNER_HEADER, "")
        rng = self.streams.setdefault(runner, random.Random(f"{self.seed}:{runner}"))
        kinds = list(FAULT_WEIGHTS)
        kind = (
            "ok"
            if runner in self.quiet
            else rng.choices(kinds, weights=[FAULT_WEIGHTS[k] for k in kinds])[0]
        )
        self.faults[kind] += 1
        await trio.lowlevel.checkpoint()
        if kind in ("502", "503", "504"):
            return httpx.Response(int(kind), json={"error": "test fault", "code": "test_fault"})
        if kind == "backpressure":
            return httpx.Response(
                503,
                json={
                    "error": "saturated",
                    "code": "runtime_postgres_admission_backpressure",
                    "retry_after_ms": rng.choice([None, 0, 300, 10**9]),
                },
            )
        if kind == "reset":
            raise httpx.ReadError(
                "connection reset before the request was applied", request=request
            )
        if kind == "hang":
            await trio.sleep_forever()
        if kind == "truncated":

            async def cut() -> AsyncIterator[bytes]:
                yield b'{"committedKeys": ['
                raise httpx.RemoteProtocolError("peer closed connection", request=request)

            return httpx.Response(200, content=cut())
        if kind == "malformed":
            return httpx.Response(200, content=b'{"pages": [')
        if kind == "413":
            return httpx.Response(
                413,
                json={
                    "error": "too large",
                    "code": "runtime_sheet_read_batch_too_large",
                    "observed_bytes": READ_BATCH_MAX_RESPONSE_BYTES + 1,
                },
            )
        try:
            answer = self.gateway.handle(body)
        except _Answer as refused:
            return httpx.Response(refused.status, json=refused.body)
        if kind == "lost":
            raise httpx.ReadError("connection reset after the request was applied", request=request)
        self.answered.append((runner, body["action"], answer))
        return httpx.Response(200, json=answer)


@attrs.frozen
class RunnerPlan:
    name: str
    start_at: float
    cancel_at: float | None
    chunk: int
    fail_every: int
    subset: tuple[int, ...] | None = None
    """Row indexes this attempt admits (None: every row)."""
    resume_version: int | None = None
    """Set: a writer resuming an attempt admitted elsewhere at this version; it admits
    nothing and writes every row."""


@attrs.define
class RunnerOutcome:
    name: str
    result: str = "not started"
    """``done``, ``superseded``, ``cancelled`` or the name of the typed error it stopped with."""
    calls: list[float] = attrs.field(factory=list)
    starts: list[float] = attrs.field(factory=list)
    """How long each ``start`` took: a staged admission is several calls."""
    """How long each data-plane call took (virtual seconds)."""
    terminal_requests_after_superseded: int = 0


def _score(key: str, runner: str) -> int:
    return sum(map(ord, key + runner)) % 1_000


@attrs.frozen
class VirtualSchedule:
    seed: int
    rows: int
    plans: tuple[RunnerPlan, ...]


def draw_schedule(seed: int) -> VirtualSchedule:
    rng = random.Random(seed)
    rows = rng.randint(1, 10)
    plans = []
    for index in range(rng.randint(1, 3)):
        start = rng.choice([0.0, 0.0, rng.uniform(0, 5)])
        cancel = rng.choice([None, None, start + rng.uniform(0, 40)])
        subset = None
        if rng.random() < 0.3:
            subset = tuple(sorted(rng.sample(range(rows), rng.randint(1, rows))))
        resume = rng.randint(1, 3) if rng.random() < 0.15 else None
        chunk, fail_every = rng.randint(1, 4), rng.randint(2, 6)
        plans.append(RunnerPlan(f"r{index}", start, cancel, chunk, fail_every, subset, resume))
    return VirtualSchedule(seed, rows, tuple(plans))


async def _run_runner(
    client_for: Callable[[str], GatewayClient],
    plan: RunnerPlan,
    rows: list[dict[str, Any]],
    outcome: RunnerOutcome,
) -> None:
    """One attempt on the real ``RowWriter``: admit, then complete or fail in chunks."""
    context = RuntimeContext(
        base_url="http://gw.test",
        token="chaos-token",
        org_id="org",
        play_name="play",
        run_id=f"run-{plan.name}",
        strategy="gateway_only",
    )
    async with (
        client_for(plan.name) as client,
        SessionManager(client) as sessions,
        PageReader() as reader,
    ):
        rt = Runtime(context, client, sessions, reader)
        writer = rt.writer(NS, CONTRACT, write_version=plan.resume_version)
        outcome.result = "running"
        phase = outcome.starts  # a staged start is several calls: its own budget
        began = trio.current_time()
        try:
            if plan.resume_version is None:
                admitted = rows if plan.subset is None else [rows[i] for i in plan.subset]
                admission = await writer.start(admitted)
                outcome.starts.append(trio.current_time() - began)
                phase = outcome.calls
                began = trio.current_time()
                pending = [row["_key"] async for row in admission.pending()]
            else:
                pending = [row["_key"] for row in rows]
            for start in range(0, len(pending), plan.chunk):
                keys = pending[start : start + plan.chunk]
                began = trio.current_time()
                if (start // plan.chunk) % plan.fail_every == plan.fail_every - 1:
                    await writer.fail([FailRow(key, f"failed by {plan.name}") for key in keys])
                else:
                    await writer.complete(
                        [CompleteRow(key, {"score": _score(key, plan.name)}) for key in keys]
                    )
                outcome.calls.append(trio.current_time() - began)
            outcome.result = "done"
        except AttemptSupersededError:
            phase.append(trio.current_time() - began)
            outcome.result = "superseded"
        except SheetplaneError as exc:
            phase.append(trio.current_time() - began)
            outcome.result = type(exc).__name__


@attrs.define
class VirtualReport:
    seed: int
    faults: Counter[str]
    rows_checked: int
    requests: int
    outcomes: list[RunnerOutcome]
    losses: int = 0
    duplicates: int = 0


def seed_trio_scheduler(seed: int) -> None:
    """Seed trio's scheduler, which shuffles runnable tasks on purpose, so runners that
    are ready at the same virtual instant interleave the same way on every replay.

    trio keeps that generator private (``trio._core._run._r``); without it a replay
    meets the same faults per runner but may interleave runners differently.
    """
    scheduler = getattr(getattr(trio, "_core", None), "_run", None)
    generator = getattr(scheduler, "_r", None)
    if isinstance(generator, random.Random):
        generator.seed(seed)
    # The module's shared generator too: the gateway client draws its reconnect
    # back-off's jitter from it, and unseeded it made replays of one schedule
    # wait differently after a reset (the replay test saw 6,026 requests, then 6,010).
    random.seed(seed)


async def run_virtual_schedule(schedule: VirtualSchedule) -> VirtualReport:
    """Play one schedule in the current (virtual-clock) trio run and check its invariants.

    Raises ``AssertionError`` naming the broken invariant and the seed.
    """
    seed_trio_scheduler(schedule.seed)
    gateway = FakeGateway()
    transport = FaultyTransport(gateway, schedule.seed)
    mock = httpx.MockTransport(transport.handle)

    def client_for(runner: str) -> GatewayClient:
        return GatewayClient(
            "http://gw.test",
            "chaos-token",
            play_name="play",
            org_id="org",
            transport=mock,
            headers={RUNNER_HEADER: runner},
        )

    rows = [{"_key": f"k{i}", "email": f"user{i}@example.com"} for i in range(schedule.rows)]
    outcomes = [RunnerOutcome(plan.name) for plan in schedule.plans]
    baseline = trio.lowlevel.current_statistics().tasks_living
    start = trio.current_time()

    async def launch(plan: RunnerPlan, outcome: RunnerOutcome) -> None:
        await trio.sleep_until(start + plan.start_at)
        if plan.cancel_at is None:
            await _run_runner(client_for, plan, rows, outcome)
            return
        with trio.move_on_at(start + plan.cancel_at) as scope:
            await _run_runner(client_for, plan, rows, outcome)
        if scope.cancelled_caught:
            outcome.result = "cancelled"

    async with trio.open_nursery() as nursery:
        for plan, outcome in zip(schedule.plans, outcomes, strict=True):
            nursery.start_soon(launch, plan, outcome)
    # The clean runner finishes whatever the others left.
    final = RunnerPlan("final", 0.0, None, 5, 10**9)
    transport.quiet.add("final")
    final_outcome = RunnerOutcome("final")
    await _run_runner(client_for, final, rows, final_outcome)
    outcomes.append(final_outcome)
    assert trio.lowlevel.current_statistics().tasks_living == baseline, "a task leaked"
    report = VirtualReport(schedule.seed, transport.faults, len(rows), transport.requests, outcomes)
    check_virtual(schedule, gateway, transport, report)
    return report


def check_virtual(
    schedule: VirtualSchedule,
    gateway: FakeGateway,
    transport: FaultyTransport,
    report: VirtualReport,
) -> None:
    seed = schedule.seed
    where = f"(virtual schedule seed {seed})"
    # The clean runner ends every schedule: nothing is left unfinished, no row lost or doubled.
    final = report.outcomes[-1]
    assert final.result == "done", f"the clean runner ended {final.result} {where}"
    keys = [f"k{i}" for i in range(schedule.rows)]
    report.losses = len(set(keys) - set(gateway.rows))
    report.duplicates = len(gateway.rows) - len(set(gateway.rows))
    assert report.losses == 0 and set(gateway.rows) == set(keys), f"rows lost or invented {where}"
    for key, row in gateway.rows.items():
        assert row.status in ("enriched", "failed"), f"{key} left {row.status} {where}"
    # The serial history of accepted writes, replayed on the plain model, gives every
    # answer and the final sheet.
    model = SheetModel(columns=("email", "score"), input_columns=("email",))
    for entry in gateway.log:
        if entry[0] == "admit":
            _, pairs, run_id, answer = entry
            admitted = model.admit(pairs, run_id)
            assert admitted.version == answer["writeVersion"], where
            assert list(admitted.pending_keys) == [r["_key"] for r in answer["pendingRows"]], where
            assert list(admitted.completed_keys) == [r["_key"] for r in answer["completedRows"]], (
                where
            )
        else:
            _, _, writes, version, run_id, answer = entry
            result = model.terminal_write(writes, version, run_id)
            assert list(result.committed) == answer["committedKeys"], where
            assert [(k, r) for k, r, _ in result.stale] == [
                (s["key"], s["reason"]) for s in answer["staleRows"]
            ], where
    for key, row in gateway.rows.items():
        kept = model.rows[key]
        assert (row.status, row.version, row.values, row.error) == (
            kept.status,
            kept.version,
            kept.values,
            kept.error,
        ), f"{key}: the sheet differs from the serial history {where}"
    assert gateway.summary() == model.summary(), where
    # Every writer that saw a superseded row stopped with AttemptSupersededError, and
    # only those did.
    for outcome in report.outcomes:
        answers = [
            a for r, action, a in transport.answered if r == outcome.name and "map_rows" in action
        ]
        saw_superseded = any(
            s["reason"] not in BENIGN_STALE_REASONS for a in answers for s in a["staleRows"]
        )
        if saw_superseded:
            assert outcome.result in ("superseded", "cancelled"), (
                f"{outcome.name} saw a superseded row but ended {outcome.result} {where}"
            )
            first = next(
                i
                for i, a in enumerate(answers)
                if any(s["reason"] not in BENIGN_STALE_REASONS for s in a["staleRows"])
            )
            assert first == len(answers) - 1, (
                f"{outcome.name} wrote on after it was superseded {where}"
            )
        elif outcome.result == "superseded":
            raise AssertionError(f"{outcome.name} stopped superseded without cause {where}")
        # Every wait ended within its derived budget.
        for took in outcome.calls:
            assert took <= CALL_BUDGET_MS / 1000 + 1e-9, f"a call took {took} s {where}"
        for took in outcome.starts:
            assert took <= START_LIMIT_SECONDS, f"a start took {took} s {where}"
