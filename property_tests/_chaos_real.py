"""The chaos harness against the real thing: the reference gateway (Hypercorn on loopback)
and Postgres (embedded, or ``SHEETPLANE_DATABASE_URL``), runners on ``open_runtime``.

One trio run holds the gateway and every schedule, on a ``MockClock`` that
jumps only when every task has been idle for ``AUTOJUMP_SECONDS`` of real
time: a hung answer or a retry ladder costs that much real time instead of
its 30 virtual seconds, and budgets are checked on the virtual clock.

A schedule: a fresh sheet; one to three runners on random roads (``direct``
or ``gateway_only``) starting at random times, each admitting all or some of
the rows (so earlier attempts are superseded), some cancelled at random
points, each arming its own seeded set of gateway faults (502, 503, reset,
hang, 413, back-pressure, cut and malformed bodies) through the fault header;
a killer that runs ``pg_terminate_backend`` on live sessions at random times;
then one clean runner that finishes the sheet and reads it back.
"""

from __future__ import annotations

import contextlib
import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import psycopg
import trio
import trio.testing
from psycopg import sql

from sheetplane import AttemptSupersededError, SheetplaneError, open_runtime
from sheetplane._types import CompleteRow, ContractColumn, FailRow, SheetContract, SheetRef
from sheetplane.budgets import (
    ADMISSION_COMMIT_CALL_BUDGET_MS,
    CALL_BUDGET_MS,
    POSTGRES_OPERATION_BUDGET_MS,
)
from sheetplane.gateway.faults import FAULT_HEADER, FaultSchedule, FaultSpec, format_fault_header
from sheetplane.gateway.server import (
    ROLE_PREFIX,
    RunningGateway,
    reap_expired_roles,
    running_gateway,
)
from sheetplane.store import sheet_names
from sheetplane.store._counters import status_counts
from sheetplane.store.embedded import EmbeddedPostgres, database_url_from_env

from ._chaos_virtual import seed_trio_scheduler

TOKEN = "chaos-executor-token-5d1e"


def token_for(namespace: str) -> str:
    """Each schedule's own executor token (of the one org): a token holds at most
    ``DB_SESSION_MAX_LIVE_PER_TOKEN`` live sessions, and fifty schedules of
    direct runners (read, terminal and staging sessions each) would pass it."""
    return f"{TOKEN}-{namespace}"


ORG = "chaos-org"
PLAY = "chaos-play"
CONTRACT = SheetContract(
    (ContractColumn("email", "email", "input"), ContractColumn("score", "score", "output"))
)
#: The gateway's watchdog wakes every virtual second and runs a query on a worker
#: thread, so virtual time advances a second per idle threshold plus one query:
#: at 0.25 s the real slice spent a third of its time waiting to jump (334 s at
#: load 4 against 199 s at 0.1 s). A worker-thread call slower than this lets the
#: clock jump, at most to the watchdog's next tick, far inside every call's budget.
AUTOJUMP_SECONDS = 0.1
#: The clean runner is started again after a transient failure, at most this often in all.
FINAL_ATTEMPTS = 3
RETRIED_RESULTS = frozenset(
    {"TransientGatewayError", "GatewayTimeoutError", "BackpressureError", "StoreUnavailableError"}
)
#: The longest one runner call may take: a gateway call's whole budget, plus, on the
#: direct road, one Postgres operation's (minting the session is the gateway call).
CALL_LIMIT_SECONDS = (CALL_BUDGET_MS + POSTGRES_OPERATION_BUDGET_MS) / 1000
#: A ``start`` of a one-chunk input: begin, chunk and abort calls, a commit call,
#: each of which may also wait a whole store operation.
START_LIMIT_SECONDS = (
    3 * CALL_LIMIT_SECONDS + (ADMISSION_COMMIT_CALL_BUDGET_MS + POSTGRES_OPERATION_BUDGET_MS) / 1000
)
#: Fault kinds a runner may arm, with the actions they go on.
FAULT_KINDS = ("502", "503", "reset", "hang", "413", "backpressure", "truncated", "malformed")
FAULT_ACTIONS = (
    "start_sheet_dataset",
    "runtime_sheet_complete_map_rows",
    "runtime_sheet_fail_map_rows",
    "create_db_session",
    "runtime_sheet_read_rows_batch",
    "runtime_sheet_read_rows",
)


@attrs.define(eq=False)
class CountingFaults(FaultSchedule):
    """The gateway's fault schedule, counting every fault it injects; it also sees every
    request arrive, so the killer can strike while a given request is being answered."""

    injected: Counter[str] = attrs.field(factory=Counter)
    requests: int = 0
    kill_at: list[int] = attrs.field(factory=list)
    """Request numbers (ascending) at whose arrival live sessions are terminated."""
    strike: trio.Event = attrs.field(factory=trio.Event)
    cancel_at: list[tuple[int, trio.CancelScope]] = attrs.field(factory=list)
    """``(request number, scope)``: a runner cancelled when that request arrives."""

    def take(self, action: str) -> Any:
        self.requests += 1
        if self.kill_at and self.requests >= self.kill_at[0]:
            self.kill_at.pop(0)
            self.strike.set()
        for entry in [e for e in self.cancel_at if self.requests >= e[0]]:
            self.cancel_at.remove(entry)
            entry[1].cancel()
        kind = super().take(action)
        if kind is not None:
            self.injected[f"real:{kind}"] += 1
        return kind


def score(key: str, runner: str) -> int:
    return sum(map(ord, key + runner)) % 1_000


@attrs.frozen
class RealPlan:
    name: str
    strategy: str
    start_at: float
    cancel_at: int | None
    """Set: the runner is cancelled when the gateway receives this request number."""
    subset: tuple[int, ...] | None
    chunk: int
    fail_every: int
    faults: tuple[FaultSpec, ...]


@attrs.frozen
class RealSchedule:
    seed: int
    rows: int
    plans: tuple[RealPlan, ...]
    kills: tuple[int, ...]
    """Request numbers at which ``pg_terminate_backend`` strikes."""
    final_strategy: str


def draw_real_schedule(seed: int) -> RealSchedule:
    rng = random.Random(seed)
    rows = rng.randint(3, 40)
    plans = []
    for index in range(rng.randint(1, 3)):
        start = rng.choice([0.0, rng.uniform(0, 2)])
        cancel = rng.choice([None, None, rng.randint(1, 12)])
        subset = None
        if rng.random() < 0.3:
            subset = tuple(sorted(rng.sample(range(rows), rng.randint(1, rows))))
        faults = tuple(
            FaultSpec(rng.choice(FAULT_ACTIONS), rng.choice(FAULT_KINDS), rng.randint(1, 2))  # type: ignore[arg-type]
            for _ in range(rng.randint(0, 3))
        )
        plans.append(
            RealPlan(
                f"r{index}",
                rng.choice(["direct", "gateway_only"]),
                start,
                cancel,
                subset,
                rng.randint(2, 15),
                rng.randint(2, 5),
                faults,
            )
        )
    kills = tuple(sorted(rng.randint(1, 12) for _ in range(rng.choice([0, 1, 1, 2]))))
    return RealSchedule(seed, rows, tuple(plans), kills, rng.choice(["direct", "gateway_only"]))


@attrs.define
class RealOutcome:
    name: str
    run_id: str
    result: str = "not started"
    version: int | None = None
    completed: list[str] = attrs.field(factory=list)
    calls: list[float] = attrs.field(factory=list)
    starts: list[float] = attrs.field(factory=list)
    """How long each ``start`` took: a staged admission is several calls."""
    error: str = ""
    """The typed error's message, when it stopped with one."""


async def _runner(
    gw: RunningGateway,
    namespace: str,
    plan: RealPlan,
    rows: list[dict[str, Any]],
    outcome: RealOutcome,
) -> None:
    headers = None
    if plan.faults:
        headers = {FAULT_HEADER: format_fault_header(plan.faults, nonce=uuid.uuid4().hex)}
    async with open_runtime(
        base_url=gw.base_url,
        token=token_for(namespace),
        org_id=ORG,
        play_name=PLAY,
        run_id=outcome.run_id,
        strategy=plan.strategy,  # type: ignore[arg-type]
        headers=headers,
    ) as rt:
        writer = rt.writer(namespace, CONTRACT)
        outcome.result = "running"
        phase = outcome.starts  # a staged start is several calls: its own budget
        began = trio.current_time()
        try:
            admitted = rows if plan.subset is None else [rows[i] for i in plan.subset]
            admission = await writer.start(admitted)
            outcome.starts.append(trio.current_time() - began)
            phase = outcome.calls
            began = trio.current_time()
            outcome.version = admission.write_version
            pending = [row["_key"] async for row in admission.pending()]
            for number, first in enumerate(range(0, len(pending), plan.chunk)):
                keys = pending[first : first + plan.chunk]
                began = trio.current_time()
                if number % plan.fail_every == plan.fail_every - 1:
                    await writer.fail([FailRow(key, f"failed by {plan.name}") for key in keys])
                else:
                    await writer.complete(
                        [CompleteRow(key, {"score": score(key, plan.name)}) for key in keys]
                    )
                    outcome.completed.extend(keys)
                outcome.calls.append(trio.current_time() - began)
            outcome.result = "done"
        except AttemptSupersededError:
            phase.append(trio.current_time() - began)
            outcome.result = "superseded"
        except SheetplaneError as exc:
            phase.append(trio.current_time() - began)
            outcome.result = type(exc).__name__
            outcome.error = str(exc)[:200]


def _terminate_backends(admin_url: str) -> int:
    """``pg_terminate_backend`` on every client session but this one; how many."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND datname = current_database()"
        ).fetchall()
        return sum(1 for (done,) in rows if done)


@attrs.define
class RealReport:
    seed: int
    rows_checked: int = 0
    outcomes: list[RealOutcome] = attrs.field(factory=list)
    killed: int = 0


def _thread_names() -> set[str]:
    return {t.name for t in threading.enumerate()}


def _idle_trio_threads(names: set[str]) -> set[str]:
    # trio keeps idle worker threads cached for reuse; they are not leaks.
    return {n for n in names if n.startswith("Trio thread")}


async def _busy_threads(baseline: set[str]) -> set[str]:
    """Threads started since ``baseline`` that are not idle trio workers, once the
    gateway's own passes have had the time to finish: its watchdog and reaper run on a
    worker thread every tick, and under load (the slice failed so at load 10 and 16)
    the check landed while one was running. A thread still busy after the polls leaked.
    Each poll costs one autojump of real time."""
    for _ in range(20):
        extra = _thread_names() - baseline
        busy = extra - _idle_trio_threads(extra)
        if not busy:
            return busy
        await trio.sleep(1)
    extra = _thread_names() - baseline
    return extra - _idle_trio_threads(extra)


async def _settle(baseline: int) -> int:
    """Wait for the server's tasks of closed connections to end (it notices within its
    keep-alive timeout); the live count. Each poll costs one autojump of real time."""
    for _ in range(20):
        living = trio.lowlevel.current_statistics().tasks_living
        if living <= baseline:
            return living
        await trio.sleep(3)
    return trio.lowlevel.current_statistics().tasks_living


async def run_real_schedule(
    gw: RunningGateway, admin_url: str, schedule: RealSchedule, figures: Any
) -> RealReport:
    where = f"(real schedule seed {schedule.seed})"
    seed_trio_scheduler(schedule.seed)
    namespace = f"chaos-{schedule.seed}"
    rows = [{"_key": f"k{i:03d}", "email": f"user{i}@example.com"} for i in range(schedule.rows)]
    report = RealReport(schedule.seed)
    outcomes = [RealOutcome(p.name, f"run-{schedule.seed}-{p.name}") for p in schedule.plans]
    faults = CountingFaults()
    gw.state.faults = faults
    baseline_tasks = trio.lowlevel.current_statistics().tasks_living
    baseline_threads = _thread_names()
    start = trio.current_time()

    async def launch(plan: RealPlan, outcome: RealOutcome) -> None:
        await trio.sleep_until(start + plan.start_at)
        with trio.CancelScope() as scope:
            if plan.cancel_at is not None:
                faults.cancel_at.append((faults.requests + plan.cancel_at, scope))
            await _runner(gw, namespace, plan, rows, outcome)
        if scope.cancelled_caught:
            outcome.result = "cancelled"

    faults.kill_at = list(schedule.kills)

    async def killer() -> None:
        # Strikes while the request that triggered it is being answered: live sessions.
        for _ in schedule.kills:
            await faults.strike.wait()
            faults.strike = trio.Event()
            report.killed += await trio.to_thread.run_sync(_terminate_backends, admin_url)
            figures.faults["real:pg_terminate_backend"] += 1

    async with trio.open_nursery() as nursery:
        kill_scope = trio.CancelScope()

        async def kill_until_cancelled() -> None:
            with kill_scope:
                await killer()

        nursery.start_soon(kill_until_cancelled)
        async with trio.open_nursery() as runners:
            for plan, outcome in zip(schedule.plans, outcomes, strict=True):
                runners.start_soon(launch, plan, outcome)
        kill_scope.cancel()
    # Faults a runner armed but nobody took must not reach the clean runner.
    figures.faults.update(faults.injected)
    gw.state.faults = CountingFaults()
    final_plan = RealPlan("final", schedule.final_strategy, 0.0, None, None, 25, 10**9, ())
    for attempt in range(FINAL_ATTEMPTS):
        # As an orchestrator would, a clean attempt that ran out of retries is started again.
        final = RealOutcome("final", f"run-{schedule.seed}-final-{attempt}")
        await _runner(gw, namespace, final_plan, rows, final)
        outcomes.append(final)
        if final.result not in RETRIED_RESULTS:
            break
        figures.outcomes["real:final attempt retried"] += 1
        figures.notes.append(f"seed {schedule.seed}: clean runner retried after {final.error}")
    report.outcomes = outcomes
    read_back = await _read_back(gw, namespace, schedule.final_strategy)
    await _check(gw, admin_url, schedule, outcomes, read_back, report, where)
    # Nothing leaked: tasks, threads, scoped connections.
    living = await _settle(baseline_tasks)
    assert living <= baseline_tasks, f"{living - baseline_tasks} task(s) leaked {where}"
    busy = await _busy_threads(baseline_threads)
    assert not busy, f"threads leaked: {busy} {where}"
    sessions = await trio.to_thread.run_sync(_session_connections, admin_url)
    assert sessions == 0, f"{sessions} scoped connection(s) left open {where}"
    return report


async def _read_back(gw: RunningGateway, namespace: str, strategy: str) -> list[dict[str, Any]]:
    async with open_runtime(
        base_url=gw.base_url,
        token=token_for(namespace),
        org_id=ORG,
        play_name=PLAY,
        run_id="read-back",
        strategy=strategy,  # type: ignore[arg-type]
    ) as rt:
        dataset = rt.dataset(namespace, "all")
        rows = await dataset.materialize()
        assert await dataset.count() == len(rows)
        if rows:
            assert (await dataset.at(len(rows) - 1))["_key"] == rows[-1]["_key"]
        return rows


def _session_connections(admin_url: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE starts_with(usename, %s)", (ROLE_PREFIX,)
        ).fetchone()
        return int(row[0]) if row else -1


async def _check(
    gw: RunningGateway,
    admin_url: str,
    schedule: RealSchedule,
    outcomes: list[RealOutcome],
    read_back: list[dict[str, Any]],
    report: RealReport,
    where: str,
) -> None:
    sheet = SheetRef(ORG, PLAY, f"chaos-{schedule.seed}")
    stored, events, counters = await trio.to_thread.run_sync(_stored_state, admin_url, sheet)
    keys = {f"k{i:03d}" for i in range(schedule.rows)}
    report.rows_checked = len(stored)
    # No row lost or duplicated, on the sheet and in what the lazy dataset reads back.
    assert set(stored) == keys, f"rows lost or invented {where}"
    assert sorted(r["_key"] for r in read_back) == sorted(keys), f"read-back differs {where}"
    assert len(read_back) == len({r["_key"] for r in read_back}), f"a row read twice {where}"
    final = outcomes[-1]
    assert final.result == "done", f"the clean runner ended {final.result} {where}"
    runner_of = {o.run_id: o.name for o in outcomes}
    admissions = {version: run_id for kind, run_id, version in events if kind == "admission"}
    for key, row in stored.items():
        assert row["_status"] in ("enriched", "failed"), f"{key} left {row['_status']} {where}"
        # The serial history: the write that stands came from the attempt that owned the
        # row's version when it wrote (the admission log names that attempt).
        owner = admissions.get(row["_write_version"])
        assert owner == row["_run_id"], (
            f"{key} written by {row['_run_id']}, owned by {owner} {where}"
        )
        name = runner_of[row["_run_id"]]
        if row["_status"] == "enriched":
            assert row["score"] == score(key, name), f"{key}: another attempt's output {where}"
        else:
            assert row["_error"] == f"failed by {name}", f"{key}: another attempt's error {where}"
    # Summaries equal the row counts.
    summary, recount = counters
    assert summary == recount, f"summary {summary} != rows {recount} {where}"
    # A writer that finished without being superseded had every completion land (enriched
    # rows are never re-admitted); a writer stopped as superseded had been.
    versions = sorted(admissions)
    for outcome in outcomes:
        if outcome.result == "done":
            for key in outcome.completed:
                row = stored[key]
                assert (row["_status"], row["_run_id"], row["_write_version"]) == (
                    "enriched",
                    outcome.run_id,
                    outcome.version,
                ), f"{outcome.name} finished but its completion of {key} did not stand {where}"
        if outcome.result == "superseded":
            assert outcome.version is not None and outcome.version < versions[-1], where
        # Every wait ended within its derived budget.
        for took in outcome.calls:
            assert took <= CALL_LIMIT_SECONDS, f"a call took {took} s {where}"
        for took in outcome.starts:
            assert took <= START_LIMIT_SECONDS, f"a start took {took} s {where}"


def _stored_state(
    admin_url: str, sheet: SheetRef
) -> tuple[
    dict[str, dict[str, Any]], list[tuple[str, str, int]], tuple[dict[str, int], dict[str, int]]
]:
    names = sheet_names(sheet)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        cur = conn.execute(
            sql.SQL(
                "SELECT _key, _status, _run_id, (seq).write_version, _error, score FROM {}"
            ).format(names.ident("sheet_table"))
        )
        stored = {
            r[0]: {
                "_key": r[0],
                "_status": r[1],
                "_run_id": r[2],
                "_write_version": r[3],
                "_error": r[4],
                "score": r[5],
            }
            for r in cur.fetchall()
        }
        events = [
            (kind, run_id, version)
            for kind, run_id, version in conn.execute(
                sql.SQL("SELECT kind, run_id, write_version FROM {} ORDER BY id").format(
                    names.ident("event_table")
                )
            ).fetchall()
        ]
        summary = status_counts(conn, names)
        grouped = Counter(r["_status"] for r in stored.values())
        recount = {
            "total": len(stored),
            "queued": grouped["pending"] + grouped["stale"],
            "running": grouped["running"],
            "completed": grouped["enriched"],
            "failed": grouped["failed"],
        }
        return stored, events, (summary, recount)


def _expire_and_count_roles(admin_url: str) -> tuple[int, int]:
    """Every session role has an expiry; expire them all. Returns (roles, without expiry)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        roles = conn.execute(
            "SELECT rolname, rolvaliduntil FROM pg_roles WHERE starts_with(rolname, %s)",
            (ROLE_PREFIX,),
        ).fetchall()
        for name, _ in roles:
            conn.execute(
                sql.SQL("ALTER ROLE {} VALID UNTIL '2000-01-01'").format(sql.Identifier(name))
            )
        return len(roles), sum(1 for _, until in roles if until is None)


def _count_roles(admin_url: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_roles WHERE starts_with(rolname, %s)", (ROLE_PREFIX,)
        ).fetchone()
        return int(row[0]) if row else -1


@contextlib.contextmanager
def _database(url: str | None) -> Iterator[str]:
    url = url or database_url_from_env()
    if url is not None:
        yield url
        return
    # Not durable: the campaign throws its data away; its faults never crash the server.
    with EmbeddedPostgres(durable=False) as server:
        yield server.url


async def _reap_every_role(gw: RunningGateway, url: str, seed: int) -> int:
    """Expire every session role, reap them, check none is left; how many there were."""
    minted, unbounded = await trio.to_thread.run_sync(_expire_and_count_roles, url)
    assert unbounded == 0, f"{unbounded} session role(s) without VALID UNTIL (seed {seed})"
    await reap_expired_roles(gw.state.store)
    left = await trio.to_thread.run_sync(_count_roles, url)
    assert left == 0, f"{left} of {minted} session role(s) could not be reaped (seed {seed})"
    return minted


def run_real_schedules(seeds: Sequence[int], figures: Any, database_url: str | None) -> None:
    """Every real schedule in one trio run, one after another, each followed by the
    role check."""
    with _database(database_url) as url:
        # Virtual time stands still while the gateway starts: its lifespan opens the
        # pool and hardens the database on worker threads, which the clock cannot
        # see, so with autojump on a start slower than AUTOJUMP_SECONDS of real time
        # jumped straight to Hypercorn's startup deadline (LifespanTimeoutError).
        clock = trio.testing.MockClock()

        async def main() -> None:
            tokens = {token_for(f"chaos-{seed}"): ORG for seed in seeds}
            async with running_gateway(url, tokens=tokens, allow_test_faults=True) as gw:
                clock.autojump_threshold = AUTOJUMP_SECONDS
                reaped = 0
                for seed in seeds:
                    report = await run_real_schedule(gw, url, draw_real_schedule(seed), figures)
                    figures.real_schedules += 1
                    figures.rows_checked += report.rows_checked
                    figures.outcomes.update(f"real:{o.result}" for o in report.outcomes)
                    # No database role leaked: every one the schedule minted can be
                    # reaped (reaped after each schedule, so fifty schedules of direct
                    # runners stay under the org's live-session cap).
                    reaped += await _reap_every_role(gw, url, seed)
                figures.roles_reaped = reaped

        trio.run(main, clock=clock)
