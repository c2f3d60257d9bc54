"""The model-based phase: a Hypothesis state machine drives the gateway beside the models.

Each example starts a fresh sheet under the prefix. Rules admit random rows,
write terminal results from the current attempt, from stale ones and without
a version, read the sheet back, count it, and complete, claim and release
work receipts; every answer is compared with ``sheetplane.testing.models``
(:class:`SheetModel`, :class:`ReceiptModel`). A mismatch fails SP-MODEL-1 with
the shortest sequence Hypothesis found and the seed that replays it
(``--seed``). Hypothesis is a test dependency: without it the phase is skipped.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

from ..testing.models import ModelWrite, ReceiptModel, SheetModel
from ._checks_sheetplane import claim, lease_extras
from ._context import CONTRACT, CheckFailed, CheckSkipped, Context, check, rows_of
from ._http import Exchange

__all__ = ["run_model_phase"]

#: Row values (``n``) the machine draws from: few, so admissions overlap.
N_VALUES: Final = 6
RECEIPT_KEYS: Final = 3
HOLDERS: Final = 3
STEPS: Final = 12
#: The most examples ``--quick`` draws.
QUICK_EXAMPLES: Final = 5


class ModelMismatch(AssertionError):
    """The gateway answered otherwise than the model."""


def _agree(
    deadline: list[float], condition: bool, what: str, exchange: Exchange | None = None
) -> None:
    """A mismatch unless ``condition``; it lifts the deadline (so shrinking replays it)."""
    if not condition:
        deadline[0] = float("inf")
        shown = f"; {exchange.describe()}" if exchange is not None else ""
        raise ModelMismatch(f"expected {what}{shown}")


def _guarded(deadline: list[float], fn: Callable[..., None]) -> Callable[..., None]:
    """Lift the deadline on any failure of a rule (so shrinking replays it), and report
    an answer the rule could not read as a mismatch."""

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except ModelMismatch:
            raise
        except Exception as exc:
            deadline[0] = float("inf")
            raise ModelMismatch(f"an answer a rule could not read: {exc!r}") from None

    return guarded


class _Example:
    """One example: its own rows and receipts in the shared sheet, beside the models.

    One sheet serves every example (a new sheet per example would spend most of the
    phase creating tables): each example's rows carry its own salt, so their keys are
    its own; it admits and writes under one run id, so reading that run reads its
    rows only; and it counts the summary from what the sheet held before it began.
    Each step is a rule of the machine (``_build_machine``); a step does nothing once
    ``deadline[0]`` has passed.
    """

    def __init__(self, ctx: Context, deadline: list[float], namespace: str) -> None:
        self.ctx = ctx
        self.deadline = deadline
        self.sheet = SheetModel(columns=("n", "label", "out"), input_columns=("n", "label"))
        self.receipts = ReceiptModel()
        self.namespace = namespace
        self.salt = ctx.name("example")
        self.run_id = ctx.name("run")
        self.before: dict[str, Any] = {}
        self.keys: dict[int, str] = {}
        self.versions: dict[int, int] = {}
        """model write version -> the gateway's"""
        self.extras: dict[tuple[str, str], dict[str, Any]] = {}

    def inert(self) -> bool:
        return time.monotonic() >= self.deadline[0]

    def agree(self, condition: bool, what: str, exchange: Exchange | None = None) -> None:
        _agree(self.deadline, condition, what, exchange)

    def start(self, values: list[int]) -> None:
        if self.inert():
            return
        answer = self.ctx.wire.post("runtime_sheet_summary", {"tableNamespace": self.namespace})
        # Before the first example the sheet does not exist yet: it holds nothing.
        self.before = answer.json_object if answer.status == 200 else {}
        self.admit(values)

    def _receipt_key(self, i: int) -> str:
        return f"{self.salt}-receipt-{i}"

    def _holder(self, holder: int) -> str:
        return f"{self.ctx.prefix}-holder-{holder}"

    def _rows(self, values: list[int]) -> list[dict[str, Any]]:
        return rows_of(values, salt=f" {self.salt}")

    def admit(self, values: list[int]) -> None:
        if self.inert():
            return
        run_id = self.run_id
        answer = self.ctx.wire.post(
            "start_sheet_dataset",
            {
                "tableNamespace": self.namespace,
                "sheetContract": CONTRACT,
                "rows": self._rows(values),
                "runId": run_id,
            },
        )
        body = answer.json_object
        self.agree(answer.status == 200, "start_sheet_dataset to answer 200", answer)
        self._learn_keys(values, body, answer)
        expected = self.sheet.admit(
            [(self.keys[v], row) for v, row in zip(values, self._rows(values), strict=True)],
            run_id,
        )
        previous = self.versions.get(expected.version - 1)
        version = body.get("writeVersion")
        self.agree(
            isinstance(version, int) and (previous is None or version > previous),
            f"a writeVersion greater than the last ({previous})",
            answer,
        )
        assert isinstance(version, int)
        self.versions[expected.version] = version
        got = (
            body.get("inserted"),
            body.get("skipped"),
            [r.get("_key") for r in body.get("pendingRows", [])],
            [r.get("_key") for r in body.get("completedRows", [])],
        )
        want = (
            expected.inserted,
            expected.skipped,
            list(expected.pending_keys),
            list(expected.completed_keys),
        )
        self.agree(
            got == want, f"(inserted, skipped, pending keys, completed keys) = {want}", answer
        )

    def _learn_keys(self, values: list[int], body: dict[str, Any], answer: Exchange) -> None:
        """Each answered row's key by its ``n``, which must never change."""
        seen = [*body.get("pendingRows", []), *body.get("completedRows", [])]
        for row in seen:
            n, key = row.get("n"), row.get("_key")
            self.agree(
                isinstance(n, int) and self.keys.setdefault(n, key) == key,
                f"row n={n} to keep its key {self.keys.get(n)}",
                answer,
            )
        self.agree(all(v in self.keys for v in values), "every admitted row answered", answer)

    def write(self, kind: str, attempt: int, values: list[int], out: str) -> None:
        """A terminal write from the current attempt (0), a stale one (1, 2: that many
        admissions back) or with no version (3); n = N_VALUES is a key never admitted."""
        if self.inert() or not self.versions:
            return
        model_version: int | None = None
        if attempt < 3:
            model_version = max(1, self.sheet.version - attempt)
        run_id = self.run_id
        keys = [self.keys.get(v, f"{self.salt}-never-{v}") for v in values]
        writes, rows = [], []
        for key in keys:
            if kind == "enriched":
                writes.append(ModelWrite(key, "enriched", {"out": out}))
                rows.append({"key": key, "data": {"out": out}})
            else:
                writes.append(ModelWrite(key, "failed", error=f"failed {out}"))
                rows.append({"key": key, "error": f"failed {out}"})
        payload: dict[str, Any] = {
            "tableNamespace": self.namespace,
            "sheetContract": CONTRACT,
            "runId": run_id,
            "rows": rows,
        }
        if model_version is not None:
            payload["writeVersion"] = self.versions[model_version]
        action = (
            "runtime_sheet_complete_map_rows"
            if kind == "enriched"
            else "runtime_sheet_fail_map_rows"
        )
        answer = self.ctx.wire.post(action, payload)
        expected = self.sheet.terminal_write(writes, model_version, run_id)
        if expected.conflict:
            self.agree(
                answer.status == 409 and answer.json_object.get("code") == "write_conflict",
                "409 write_conflict",
                answer,
            )
            return
        self._agree_written(action, answer, expected)

    def _agree_written(self, action: str, answer: Exchange, expected: Any) -> None:
        """A terminal write's answer: its committed keys, stale rows and count as modelled."""
        body = answer.json_object
        self.agree(answer.status == 200, f"{action} to answer 200", answer)
        stamps = {v: k for k, v in self.versions.items()}
        got_stale = sorted(
            (r.get("key"), r.get("reason"), stamps.get(r.get("rowVersionStamp")))
            for r in body.get("staleRows", [])
        )
        want_stale = sorted(expected.stale)
        self.agree(
            sorted(body.get("committedKeys", [])) == sorted(expected.committed)
            and got_stale == want_stale
            and sorted(body.get("staleKeys", [])) == sorted(k for k, _, _ in expected.stale)
            and body.get("updated") == expected.updated,
            f"committed {sorted(expected.committed)}, stale (key, reason, model version) "
            f"{want_stale}, updated {expected.updated}",
            answer,
        )

    def read_back(self) -> None:
        if self.inert() or not self.versions:
            return
        rows = self.ctx.all_rows(self.namespace, runId=self.run_id)
        got = {r.get("_key"): (r.get("_status"), r.get("out"), r.get("_error")) for r in rows}
        want = {
            key: (row.status, row.values.get("out"), row.error)
            for key, row in self.sheet.rows.items()
        }
        last = self.ctx.wire.exchanges[-1]
        self.agree(got == want, f"rows (status, out, error) by key {want}", last)
        order = [self.sheet.rows[r["_key"]].input_index for r in rows]
        self.agree(order == sorted(order), "rows in input order", last)

    def summary(self) -> None:
        if self.inert() or not self.versions:
            return
        answer = self.ctx.wire.post("runtime_sheet_summary", {"tableNamespace": self.namespace})
        want = {k: v + self.before.get(k, 0) for k, v in self.sheet.summary().items()}
        got = {k: answer.json_object.get(k) for k in want}
        self.agree(got == want, f"summary {want}", answer)

    def complete_receipt(self, i: int, result: int, holder: int | None) -> None:
        if self.inert():
            return
        key, run_id = self._receipt_key(i), self.ctx.name("run")
        payload: dict[str, Any] = {"key": key, "result": result, "runId": run_id}
        name = None if holder is None else self._holder(holder)
        if name is not None:
            payload.update(self.extras.get((key, name), {}), holder=name)
        answer = self.ctx.wire.post("complete_work_receipt", payload)
        expected = self.receipts.complete(key, result, run_id, name)
        if expected is None:
            self.agree(
                answer.status == 409 and answer.json_object.get("code") == "work_receipt_fenced",
                "409 work_receipt_fenced",
                answer,
            )
            return
        receipt = answer.json_object.get("receipt") or {}
        got = (
            answer.json_object.get("completionDisposition"),
            receipt.get("result"),
            receipt.get("runId"),
        )
        self.agree(got == expected, f"(disposition, result, runId) = {expected}", answer)

    def claim_receipt(self, i: int, holder: int) -> None:
        if self.inert():
            return
        key, name = self._receipt_key(i), self._holder(holder)
        answer = claim(self.ctx, key, name, self.extras.get((key, name)))
        want = self.receipts.claim(key, name)
        got = (answer.json_object.get("acquired"), answer.json_object.get("holder"))
        self.agree(got == want, f"(acquired, holder) = {want}", answer)
        if want[0]:
            self.extras[(key, name)] = lease_extras(answer)

    def release_receipt(self, i: int, holder: int) -> None:
        if self.inert():
            return
        key, name = self._receipt_key(i), self._holder(holder)
        payload = {"key": key, "holder": name, **self.extras.get((key, name), {})}
        answer = self.ctx.wire.post("release_work_receipt", payload)
        want = self.receipts.release(key, name)
        self.agree(answer.json_object.get("released") is want, f"{{released: {want}}}", answer)

    def answered(self) -> None:
        # Every exchange of the run so far was answered (no 5xx slipped past a rule).
        if self.ctx.wire.exchanges:
            last = self.ctx.wire.exchanges[-1]
            self.agree(last.status < 500, "no 5xx answer", last)


def _build_machine(ctx: Context, deadline: list[float]) -> type[Any]:
    """The machine class for one run: Hypothesis' rules over an ``_Example``'s steps;
    ``deadline[0]`` ends new work (not a replay of a failure: the first mismatch lifts
    it, so shrinking sees the same gateway answers)."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

    guarded = functools.partial(_guarded, deadline)
    admitted = st.lists(st.integers(0, N_VALUES - 1), min_size=1, max_size=5)
    kinds, outs = st.sampled_from(["enriched", "failed"]), st.sampled_from(["a", "b"])
    written = st.lists(st.integers(0, N_VALUES), min_size=1, max_size=3)
    receipt, holder = st.integers(0, RECEIPT_KEYS - 1), st.integers(0, HOLDERS - 1)
    namespace = ctx.namespace("model")  # one sheet for every example (``_Example``)

    class GatewayMachine(RuleBasedStateMachine):
        """One example, its steps an ``_Example``'s."""

        def __init__(self) -> None:
            super().__init__()
            self.example = _Example(ctx, deadline, namespace)

        @initialize(values=admitted)
        @guarded
        def start(self, values: list[int]) -> None:
            self.example.start(values)

        @rule(values=admitted)
        @guarded
        def admit(self, values: list[int]) -> None:
            self.example.admit(values)

        @rule(kind=kinds, attempt=st.integers(1, 2), values=written, out=outs)
        @guarded
        def write_stale(self, kind: str, attempt: int, values: list[int], out: str) -> None:
            """A terminal write from an attempt ``attempt`` admissions back."""
            self.example.write(kind, attempt, values, out)

        @rule(kind=kinds, attempt=st.integers(0, 3), values=written, out=outs)
        @guarded
        def write(self, kind: str, attempt: int, values: list[int], out: str) -> None:
            """A terminal write: current (0), stale (1, 2) or with no version (3)."""
            self.example.write(kind, attempt, values, out)

        @rule()
        @guarded
        def read_back(self) -> None:
            self.example.read_back()

        @rule()
        @guarded
        def summary(self) -> None:
            self.example.summary()

        @rule(i=receipt, result=st.integers(0, 2), holder=st.one_of(st.none(), holder))
        @guarded
        def complete_receipt(self, i: int, result: int, holder: int | None) -> None:
            self.example.complete_receipt(i, result, holder)

        @rule(i=receipt, holder=holder)
        @guarded
        def claim_receipt(self, i: int, holder: int) -> None:
            self.example.claim_receipt(i, holder)

        @rule(i=receipt, holder=holder)
        @guarded
        def release_receipt(self, i: int, holder: int) -> None:
            self.example.release_receipt(i, holder)

        @invariant()
        @guarded
        def answered(self) -> None:
            self.example.answered()

    return GatewayMachine


def run_model_phase(ctx: Context) -> None:
    """Run the machine for ``ctx.examples`` examples (at most ``ctx.max_seconds`` of new
    ones) from ``ctx.seed``; raise :class:`CheckFailed` with the shortest failing sequence."""
    try:
        import hypothesis
        from hypothesis import HealthCheck, settings
        from hypothesis.reporting import with_reporter
        from hypothesis.stateful import get_state_machine_test
    except ImportError:
        raise CheckSkipped(
            "Hypothesis is not installed (pip install 'sheetplane[test]' runs this phase)"
        ) from None
    deadline = [time.monotonic() + ctx.max_seconds]
    machine = _build_machine(ctx, deadline)
    examples = max(1, ctx.examples if not ctx.quick else min(ctx.examples, QUICK_EXAMPLES))
    chosen = settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    test = hypothesis.seed(ctx.seed)(get_state_machine_test(machine, settings=chosen))
    lines: list[object] = []
    try:
        with with_reporter(lines.append), _shrinking_for(ctx.max_seconds):
            test()
    except Exception as error:
        # A mismatch, or an answer of a shape a rule could not read (KeyError, TypeError...):
        # either way the sequence that led to it is the evidence.
        known = isinstance(error, ModelMismatch | hypothesis.errors.Flaky)
        message = str(error) if known else f"an answer a rule could not read: {error!r}"
        steps = _steps([*lines, *getattr(error, "__notes__", [])])
        raise CheckFailed(
            "the gateway to answer as the model does",
            detail=f"{message}; shortest sequence (replay with --seed {ctx.seed}): "
            + " | ".join(steps),
        ) from None


@contextmanager
def _shrinking_for(seconds: float) -> Iterator[None]:
    """Bound Hypothesis' shrinking to ``seconds`` (its own bound is five minutes).

    Every example of this phase makes real requests, so shrinking a failure may
    take minutes; past the bound Hypothesis reports the shortest failing
    sequence found so far. The bound is Hypothesis' engine constant
    ``MAX_SHRINKING_SECONDS``; a version without it shrinks under its own bound.
    """
    engine = importlib.import_module("hypothesis.internal.conjecture.engine")
    saved = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if saved is not None:
        setattr(engine, "MAX_SHRINKING_SECONDS", seconds)  # noqa: B010 (a private constant)
    try:
        yield
    finally:
        if saved is not None:
            setattr(engine, "MAX_SHRINKING_SECONDS", saved)  # noqa: B010


def _steps(lines: Sequence[object]) -> list[str]:
    """The reported program (``state = ...``, ``state.rule(...)``), one step a line."""
    return [
        line.strip()
        for text in lines
        for line in str(text).splitlines()
        if line.strip().startswith("state")
    ]


@check("SP-MODEL-1")
def model_phase(ctx: Context) -> None:
    run_model_phase(ctx)
