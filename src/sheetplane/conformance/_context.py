"""What every check is handed: the gateway's wires, the namespace prefix, and the verdicts.

A check is a plain function of a :class:`Context`. It passes by returning,
fails by raising :class:`CheckFailed` (what it expected, and the exchange
that broke it) and skips by raising :class:`CheckSkipped` (why). Every sheet a
check writes is named by :meth:`Context.namespace`, under the run's prefix,
and every request carries the run's own play name, so the kit never writes
outside its prefix.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from ..budgets import REQUEST_TIMEOUT_MS
from ._http import Exchange, Wire

__all__ = [
    "CHECKS",
    "CONTRACT",
    "Admitted",
    "CheckFailed",
    "CheckSkipped",
    "Context",
    "check",
    "expect",
    "ok",
    "rows_of",
]

#: The sheet contract every check admits under: two input columns and one output.
CONTRACT: Final[Mapping[str, Any]] = {
    "columns": [
        {"id": "n", "sqlName": "n", "source": "input"},
        {"id": "label", "sqlName": "label", "source": "input"},
        {"id": "out", "sqlName": "out", "source": "output"},
    ]
}


class CheckFailed(Exception):
    """The gateway broke a requirement: what was expected, and the evidence."""

    def __init__(self, expected: str, exchange: Exchange | None = None, detail: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.exchange = exchange
        self.detail = detail

    def evidence(self) -> str:
        """``expected ...; request ...; answer ...`` on one line."""
        parts = [f"expected {self.expected}"]
        if self.detail:
            parts.append(self.detail)
        if self.exchange is not None:
            parts.append(self.exchange.describe())
        return "; ".join(parts)


class CheckSkipped(Exception):
    """The requirement could not be checked here; the message says why."""


def expect(
    condition: bool, expected: str, exchange: Exchange | None = None, detail: str = ""
) -> None:
    """Raise :class:`CheckFailed` unless ``condition``."""
    if not condition:
        raise CheckFailed(expected, exchange, detail)


def ok(exchange: Exchange, what: str = "200 with a JSON object") -> dict[str, Any]:
    """The answer's JSON object; fails unless it is a 200 with one."""
    expect(exchange.status == 200 and isinstance(exchange.answer, dict), what, exchange)
    return exchange.json_object


def rows_of(n_values: Sequence[int], salt: str = "") -> list[dict[str, Any]]:
    """Input rows ``{n, label}``, one per value; their content names them."""
    return [{"n": n, "label": f"row {n}{salt}"} for n in n_values]


@attrs.frozen
class Admitted:
    """A sheet the kit admitted: its namespace, run, version and keys in input order."""

    namespace: str
    run_id: str
    write_version: int
    keys: tuple[str, ...]
    answer: Exchange
    salt: str = ""
    """What its rows' labels end with (rows of another salt have other keys)."""


@attrs.define(eq=False)
class Context:
    """One conformance run against one gateway."""

    wire: Wire
    """The first token's wire (``--token``)."""
    wire_b: Wire | None
    """The second org's wire (``--token-b``), if given."""
    prefix: str
    """Every namespace, play, key and holder the kit makes starts with it."""
    profile: str = "sheetplane"
    """The profile checked (``seed`` or ``sheetplane``)."""
    quick: bool = False
    """``--quick``: the timed checks are skipped, the model phase draws fewer examples."""
    seed: int = 0
    """The model phase's seed."""
    examples: int = 25
    """The model phase's examples."""
    max_seconds: float = 30.0
    """No new model example starts past this, and its shrinking stops there."""
    stall_limit_ms: int = REQUEST_TIMEOUT_MS
    """How long a stalled body may be held before the gateway must answer or close."""
    budget_limit_ms: int = REQUEST_TIMEOUT_MS
    """How long the big-body budget checks may take each."""
    _counter: itertools.count[int] = attrs.field(factory=itertools.count, repr=False)
    _shared: Admitted | None = attrs.field(default=None, repr=False)
    _scratch: str | None = attrs.field(default=None, repr=False)
    big: Admitted | None = attrs.field(default=None, repr=False)
    """The budget checks' sheet of big rows, once admitted."""

    def name(self, tag: str) -> str:
        """A fresh name under the prefix: ``<prefix>_<tag>_<n>``."""
        return f"{self.prefix}_{tag}_{next(self._counter)}"

    def namespace(self, tag: str) -> str:
        """A fresh table namespace under the prefix."""
        return self.name(tag)

    def admit(
        self,
        namespace: str,
        rows: Sequence[Mapping[str, Any]],
        run_id: str,
        *,
        wire: Wire | None = None,
    ) -> Admitted:
        """``start_sheet_dataset``; fails the check unless it answers 200 with keys."""
        answer = (wire or self.wire).post(
            "start_sheet_dataset",
            {
                "tableNamespace": namespace,
                "sheetContract": CONTRACT,
                "rows": list(rows),
                "runId": run_id,
            },
        )
        body = ok(answer, "start_sheet_dataset to answer 200 with a JSON object")
        pending = body.get("pendingRows")
        completed = body.get("completedRows")
        version = body.get("writeVersion")
        expect(
            isinstance(pending, list)
            and isinstance(completed, list)
            and isinstance(version, int)
            and all(isinstance(r, dict) and isinstance(r.get("_key"), str) for r in pending),
            "pendingRows and completedRows lists of rows carrying _key, an integer writeVersion",
            answer,
        )
        assert isinstance(pending, list) and isinstance(version, int)
        return Admitted(namespace, run_id, version, tuple(r["_key"] for r in pending), answer)

    def fresh(self, n_values: Sequence[int], *, tag: str) -> Admitted:
        """Rows no other check has (their labels carry a salt of their own), admitted under
        a run of their own into the run's scratch sheet: one sheet's tables serve every
        check that needs rows of its own rather than a sheet of its own."""
        if self._scratch is None:
            self._scratch = self.namespace("scratch")
        salt = f" {self.name(tag)}"
        admitted = self.admit(self._scratch, rows_of(n_values, salt), self.name("run"))
        return attrs.evolve(admitted, salt=salt)

    def shared_sheet(self) -> Admitted:
        """One sheet of ten rows (``n`` 0..9), admitted once per run for the read checks."""
        if self._shared is None:
            namespace = self.namespace("reads")
            self._shared = self.admit(namespace, rows_of(range(10)), self.name("run"))
            expect(
                len(self._shared.keys) == 10,
                "ten distinct rows admitted as ten pendingRows",
                self._shared.answer,
            )
        return self._shared

    def read(self, namespace: str, limit: int, offset: int, **extra: Any) -> Exchange:
        """``runtime_sheet_read_rows`` of one page."""
        spec = {"tableNamespace": namespace, "limit": limit, "offset": offset, **extra}
        return self.wire.post("runtime_sheet_read_rows", {"input": spec})

    def read_batch(
        self,
        namespace: str,
        pages: Sequence[tuple[int, int]],
        *,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> Exchange:
        """``runtime_sheet_read_rows_batch`` of ``(limit, offset)`` pages.

        A gateway that predates the action (it answers "Unsupported runtime data-plane
        action") skips the check under the seed profile, since the seed's runtime then
        reads page by page; under the sheetplane profile the answer is judged as it is.
        """
        spec = {
            "tableNamespace": namespace,
            "pages": [{"limit": limit, "offset": offset} for limit, offset in pages],
            **extra,
        }
        answer = self.wire.post("runtime_sheet_read_rows_batch", {"input": spec}, headers=headers)
        if answer.unsupported and self.profile == "seed":
            raise CheckSkipped(
                "the gateway predates runtime_sheet_read_rows_batch (Unsupported runtime "
                "data-plane action); the seed's runtime then reads with runtime_sheet_read_rows"
            )
        return answer

    def all_rows(self, namespace: str, **extra: Any) -> list[dict[str, Any]]:
        """Every row of the sheet, read in pages of 50 with ``rowMode: all``."""
        rows: list[dict[str, Any]] = []
        while True:
            answer = self.read(namespace, 50, len(rows), rowMode="all", **extra)
            page = ok(answer).get("rows")
            expect(isinstance(page, list), "a rows list", answer)
            assert isinstance(page, list)
            rows.extend(page)
            if len(page) < 50:
                return rows


Check = Callable[[Context], None]

#: Every check, by requirement id (filled by the check modules' ``@check``).
CHECKS: dict[str, Check] = {}


def check(requirement_id: str) -> Callable[[Check], Check]:
    """Register ``fn`` as the check of ``requirement_id``."""

    def register(fn: Check) -> Check:
        if requirement_id in CHECKS:
            raise ValueError(f"{requirement_id} already has a check")
        CHECKS[requirement_id] = fn
        return fn

    return register
