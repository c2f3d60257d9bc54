"""Plain reference models: what the data plane should do, written as simply as possible.

Each model is ordinary Python over dicts and lists, with no I/O, no trio and
no code shared with the part it checks, so a state machine or a chaos run can
hold the real thing beside it and compare:

* :class:`SheetModel`: a sheet's rows under admissions and fenced terminal
  writes (the fencing table of ``sheetplane.store._fencing`` restated), with
  the summary counters; :func:`model_decision` is its per-key decision.
* :func:`fewest_chunks` and :func:`halving_depth`: the adaptive splitter's
  optimum (OPT, the fewest contiguous chunks that each fit a budget) and the
  depth of its halving tree, which bound how many reads a split may cost.
* :func:`predict_call`: one ``GatewayClient.post_action`` call under a fault
  schedule (the retry ladder, a clamped Retry-After, the attempt timeout cut
  at the call deadline): when each request goes out, when the call ends, how.
* :class:`ReceiptModel`: work receipts (the first completion wins) and their
  leases (one live holder per key, released or superseded by completion),
  with no clock: its leases never expire, so use it within a lease's TTL.
* :class:`FaultQueueModel`: the reference gateway's armed test faults, a FIFO
  per action.
* :class:`BatcherModel`: the scheduling rules of ``BoundedBatchFunction``
  (docs/protocol.md, rules 1 to 3) over plain lanes: readiness, the in-flight cap,
  oldest head first, the batch caps, first come first served retention.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from ..budgets import (
    CALL_BUDGET_MS,
    DEFAULT_RETRY_AFTER_MS,
    GATEWAY_FIRST_CONTACT_BUDGET_MS,
    GATEWAY_RECONNECT_BASE_MS,
    GATEWAY_RECONNECT_CAP_MS,
    MAX_ATTEMPTS,
    MAX_RETRY_AFTER_MS,
    REQUEST_TIMEOUT_MS,
    RETRY_DELAYS_MS,
)

__all__ = [
    "BatcherModel",
    "FaultQueueModel",
    "ModelAdmission",
    "ModelRow",
    "ModelWrite",
    "ModelWriteResult",
    "PredictedCall",
    "ReceiptModel",
    "SheetModel",
    "fewest_chunks",
    "halving_depth",
    "json_equal",
    "model_decision",
    "predict_call",
]

Status = Literal["pending", "running", "enriched", "failed", "stale"]
Target = Literal["enriched", "failed"]

_WRITABLE = ("pending", "running")
_SUMMARY_OF: Mapping[str, str] = {
    "pending": "queued",
    "stale": "queued",
    "running": "running",
    "enriched": "completed",
    "failed": "failed",
}

# --- fencing: a sheet's rows ------------------------------------------------------------


@attrs.define
class ModelRow:
    """One row as the model keeps it."""

    status: Status
    version: int
    run_id: str
    input_index: int
    values: dict[str, Any]
    """Column values by physical column name (input and output alike); JSON null, like
    SQL NULL, is simply absent."""
    error: str | None = None
    cell_meta: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ModelAdmission:
    """What an admission did, as the model sees it."""

    version: int
    inserted: int
    skipped: int
    pending_keys: tuple[str, ...]
    completed_keys: tuple[str, ...]


@attrs.frozen
class ModelWrite:
    """One key of a terminal write."""

    key: str
    target: Target
    values: Mapping[str, Any] = attrs.field(factory=dict)
    """Output values by physical column name."""
    error: str | None = None
    cell_meta: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ModelWriteResult:
    """What a terminal write did: committed keys, ``(key, reason, stamp)`` stale rows,
    rows changed; ``conflict`` is True when the model refuses the whole write."""

    committed: tuple[str, ...]
    stale: tuple[tuple[str, str, int | None], ...]
    updated: int
    conflict: bool = False


def model_decision(
    row: ModelRow | None,
    writer_version: int | None,
    write: ModelWrite,
    run_id: str | None = None,
) -> tuple[str, str | None]:
    """``(disposition, reason)`` for one key: ``write``, ``replay``, ``conflict`` or
    ``stale`` with its reason. The fencing table, case by case; ``run_id`` is the
    writer's (a terminal row at its version that another run wrote, an unversioned
    writer's, is ``already_terminal`` rather than a conflict)."""
    if row is None:
        return "stale", "newer_write_version"
    if writer_version is None:
        return ("write", None) if row.status in _WRITABLE else ("stale", "already_terminal")
    if row.version != writer_version:
        return "stale", "newer_write_version" if row.version > writer_version else (
            "older_write_version"
        )
    if row.status in _WRITABLE:
        return "write", None
    if row.status == "stale":
        return "stale", "already_terminal"
    same = (
        row.status == write.target
        and all(row.values.get(name) == value for name, value in write.values.items())
        and all(row.cell_meta.get(name) == value for name, value in write.cell_meta.items())
        and (write.target != "failed" or row.error == write.error)
    )
    if same:
        return "replay", None
    if run_id is not None and row.run_id != run_id:
        return "stale", "already_terminal"
    return "conflict", None


@attrs.define
class SheetModel:
    """A sheet: rows by key, the admission counter, and a serial history of writes.

    ``columns`` are the physical column names (the contract's ``sqlName``s,
    which the model also uses as column ids); ``input_columns`` are the ones an
    admission refreshes.
    """

    columns: tuple[str, ...] = ()
    input_columns: tuple[str, ...] = ()
    rows: dict[str, ModelRow] = attrs.field(factory=dict)
    version: int = 0
    history: list[tuple[str, Any]] = attrs.field(factory=list)
    """Every accepted operation, in order: ``("admit", run_id)`` or ``(target, keys)``."""

    def admit(self, rows: Sequence[tuple[str, Mapping[str, Any]]], run_id: str) -> ModelAdmission:
        """Admit ``(key, row)`` pairs for ``run_id`` under a new write version."""
        self.version += 1
        kept: dict[str, Mapping[str, Any]] = {}
        for key, row in rows:
            kept.setdefault(key, row)
        inserted, pending, completed = 0, [], []
        for index, (key, row) in enumerate(kept.items()):
            inputs = {c: row[c] for c in self.input_columns if c in row}
            stored = self.rows.get(key)
            if stored is None:
                # A new row stores every physical column it carries (outputs too).
                values = {c: row[c] for c in self.columns if row.get(c) is not None}
                self.rows[key] = ModelRow("pending", self.version, run_id, index, values)
                inserted += 1
                pending.append(key)
            elif stored.status == "enriched":
                stored.input_index = index
                completed.append(key)
            else:
                if stored.status == "stale":
                    inserted += 1  # revived, as the seed's admission counts it
                stored.status, stored.version, stored.run_id = "pending", self.version, run_id
                stored.error, stored.input_index = None, index
                for name, value in inputs.items():
                    if value is None:
                        stored.values.pop(name, None)
                    else:
                        stored.values[name] = value
                pending.append(key)
        self.history.append(("admit", run_id))
        # The seed's counts: skipped is every input row not inserted.
        return ModelAdmission(
            self.version,
            inserted,
            len(rows) - inserted,
            tuple(pending),
            tuple(completed),
        )

    def terminal_write(
        self, writes: Sequence[ModelWrite], writer_version: int | None, run_id: str
    ) -> ModelWriteResult:
        """Apply a fenced terminal write (the last write of a repeated key wins)."""
        last: dict[str, ModelWrite] = {}
        for write in writes:
            # Fields that are not physical columns are ignored, as the store does.
            carried = {n: v for n, v in write.values.items() if n in self.columns}
            last.pop(write.key, None)
            last[write.key] = attrs.evolve(write, values=carried)
        committed, stale, to_write = [], [], []
        for key, write in last.items():
            row = self.rows.get(key)
            disposition, reason = model_decision(row, writer_version, write, run_id)
            if disposition == "conflict":
                return ModelWriteResult((), (), 0, conflict=True)
            if disposition == "stale":
                stale.append((key, str(reason), None if row is None else row.version))
            else:
                committed.append(key)
                if disposition == "write":
                    to_write.append(write)
        for write in to_write:
            row = self.rows[write.key]
            row.status, row.run_id, row.error = write.target, run_id, write.error
            row.cell_meta.update(write.cell_meta)
            for name, value in write.values.items():
                if value is None:
                    row.values.pop(name, None)
                else:
                    row.values[name] = value
        if to_write:
            self.history.append((to_write[0].target, tuple(w.key for w in to_write)))
        return ModelWriteResult(tuple(committed), tuple(stale), len(to_write))

    def summary(self) -> dict[str, int]:
        """``{total, queued, running, completed, failed}`` counted from the rows."""
        counts = {"total": len(self.rows), "queued": 0, "running": 0, "completed": 0, "failed": 0}
        for row in self.rows.values():
            counts[_SUMMARY_OF[row.status]] += 1
        return counts

    def read_order(self) -> list[str]:
        """Keys in read order (``_input_index``, then key; creation order ties are rare)."""
        return sorted(self.rows, key=lambda key: (self.rows[key].input_index, key))


def json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON means it: numbers by value (Postgres keeps jsonb numbers as
    ``numeric``, so ``1e308`` comes back as an integer with 309 digits and ``-0.0``
    as ``0``), objects by key, arrays in order."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        if isinstance(left, int) and isinstance(right, int):
            return left == right
        return float(left) == float(right)
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(
            json_equal(a, b) for a, b in zip(left, right, strict=True)
        )
    return type(left) is type(right) and left == right


# --- work receipts and their leases ---------------------------------------------------------


@attrs.define
class ReceiptModel:
    """Work receipts by key: the first completion wins; leases name one live holder.

    Each method returns what the gateway's answer should say.
    """

    receipts: dict[str, tuple[Any, str]] = attrs.field(factory=dict)
    """``key -> (result, run_id)`` of the completion that won."""
    holders: dict[str, str] = attrs.field(factory=dict)
    """``key -> holder`` of each live lease."""

    def complete(
        self, key: str, result: Any, run_id: str, holder: str | None = None
    ) -> tuple[str, Any, str] | None:
        """``(disposition, result, run_id)``, or None when fenced: a live lease is held by
        another than ``holder`` (a completion with no holder included); nothing is
        written then."""
        if key in self.receipts:
            won, won_run = self.receipts[key]
            return "existing", won, won_run
        live = self.holders.get(key)
        if live is not None and live != holder:
            return None
        self.receipts[key] = (result, run_id)
        self.holders.pop(key, None)
        return "persisted", result, run_id

    def claim(self, key: str, holder: str) -> tuple[bool, str | None]:
        """``(acquired, holder named)``: completed work names no holder."""
        if key in self.receipts:
            return False, None
        live = self.holders.setdefault(key, holder)
        return live == holder, live

    def release(self, key: str, holder: str) -> bool:
        """Whether ``holder`` held the key's lease (and so gave it up)."""
        if key in self.receipts or self.holders.get(key) != holder:
            return False
        del self.holders[key]
        return True


# --- the splitter's optimum -----------------------------------------------------------------


def fewest_chunks(sizes: Sequence[int], budget: int) -> int:
    """OPT: the fewest contiguous chunks of ``sizes`` that each fit ``budget``.

    Greedy is optimal for contiguous chunks. A single size over the budget
    still counts one chunk (it cannot be split further).
    """
    chunks, used = 0, budget + 1
    for size in sizes:
        if used + size > budget:
            chunks, used = chunks + 1, 0
        used += size
    return chunks


def halving_depth(limit: int) -> int:
    """Levels of the splitter's halving tree under a page of ``limit`` rows."""
    return math.ceil(math.log2(limit)) if limit > 1 else 0


# --- one gateway call under a fault schedule ---------------------------------------------------


@attrs.frozen
class PredictedCall:
    """What the model says one call does."""

    request_times: tuple[float, ...]
    """When each attempt's request goes out (seconds, the caller's clock)."""
    end: float
    """When the call returns or raises."""
    outcome: str
    """``ok``, or the name of the error class raised."""


#: Fault kinds (the first element of a fault tuple) and how an attempt ends.
_TRANSIENT_NOW = frozenset({"status", "truncated"})
#: Faults that reach no gateway (refused, reset before any answer): off the ladder.
_UNREACHED = frozenset({"connect", "reset", "lost"})


def _failed_attempt(
    fault: Sequence[Any], t: float, attempt_deadline: float
) -> tuple[float, str, int | None]:
    """A failed attempt that reached a gateway: when it ends, its error, and the
    ``retry_after_ms`` it asks for (None: the ladder's delay)."""
    kind = fault[0]
    if kind in ("hang", "drip") or (kind == "slow" and t + fault[1] >= attempt_deadline):
        return attempt_deadline, "GatewayTimeoutError", None
    if kind == "slow":
        return t + fault[1], "TransientGatewayError", None
    if kind == "backpressure":
        asked = fault[1]
        retry_after = DEFAULT_RETRY_AFTER_MS if asked is None else min(asked, MAX_RETRY_AFTER_MS)
        return t, "BackpressureError", retry_after
    if kind == "malformed":
        return t, "GatewayProtocolError", None
    if kind in _TRANSIENT_NOW:
        return t, "TransientGatewayError", None
    raise ValueError(f"unknown fault kind {kind!r}")


def predict_call(
    schedule: Iterable[Sequence[Any]],
    start: float,
    action: str,
    *,
    batch: bool = False,
    draw: float = 0.5,
    contacted: bool = False,
) -> PredictedCall:
    """One ``post_action`` call starting at ``start`` under ``schedule``.

    A fault is a tuple whose first element names its kind: ``ok``,
    ``("status", 502|503|504)``, ``("backpressure", retry_after_ms | None)``,
    ``connect``, ``reset``, ``lost`` (applied, answer lost), ``hang``, ``drip``,
    ``truncated``, ``malformed``, ``("slow", seconds)`` (a transient 503 after
    that long), ``413`` and ``unsupported``. ``batch`` says whether the call is a
    batch read (413 is then ``ReadBatchTooLargeError``). ``connect``, ``reset``
    and ``lost`` reach no gateway: they do not spend the ladder and wait the
    reconnect back-off instead (one URL), with ``draw`` as the client's jitter
    (tests fix the client's draw to it). ``contacted`` says whether a gateway has
    answered the client before (a fresh client's has not): until one does, a
    ``connect`` fault whose back-off would end at or past
    ``GATEWAY_FIRST_CONTACT_BUDGET_MS`` from the start ends the call with
    ``GatewayUnreachableError``; any other fault is a contact.
    """
    budget, timeout = CALL_BUDGET_MS / 1000, REQUEST_TIMEOUT_MS / 1000
    deadline = start + budget
    first_contact = start + GATEWAY_FIRST_CONTACT_BUDGET_MS / 1000
    t, failures, times, unreached = start, 0, [], 0
    faults = iter(schedule)
    while True:
        fault: Sequence[Any] = next(faults, ("ok",))
        times.append(t)
        attempt_deadline = min(t + timeout, deadline)
        kind = fault[0]
        contacted = contacted or kind != "connect"
        if kind == "ok":
            return PredictedCall(tuple(times), t, "ok")
        if kind == "413":
            outcome = "ReadBatchTooLargeError" if batch else "GatewayError"
            return PredictedCall(tuple(times), t, outcome)
        if kind == "unsupported":
            return PredictedCall(tuple(times), t, "UnsupportedActionError")
        if kind in _UNREACHED:
            unreached += 1
            ceiling = min(
                GATEWAY_RECONNECT_CAP_MS, GATEWAY_RECONNECT_BASE_MS * 2 ** (unreached - 1)
            )
            wake = t + (ceiling / 2 + ceiling / 2 * draw) / 1000
            if not contacted and wake >= first_contact:
                return PredictedCall(tuple(times), t, "GatewayUnreachableError")
            if wake >= deadline:
                return PredictedCall(tuple(times), t, "TransientGatewayError")
            t = wake
            continue
        end, error, retry_after = _failed_attempt(fault, t, attempt_deadline)
        unreached = 0
        failures += 1
        if failures >= MAX_ATTEMPTS:
            return PredictedCall(tuple(times), end, error)
        delay = RETRY_DELAYS_MS[failures - 1] if retry_after is None else retry_after
        wake = end + delay / 1000
        if wake >= deadline:
            return PredictedCall(tuple(times), end, error)
        t = wake


# --- the gateway's armed faults --------------------------------------------------------------


@attrs.define
class FaultQueueModel:
    """Armed test faults: per action, a FIFO of ``[kind, remaining]``; a header value arms once."""

    queues: dict[str, deque[list[Any]]] = attrs.field(factory=dict)
    armed: set[str] = attrs.field(factory=set)

    def arm(self, header_value: str, specs: Sequence[tuple[str, str, int]]) -> None:
        """Arm ``(action, kind, count)`` specs unless ``header_value`` armed before."""
        if header_value in self.armed:
            return
        self.armed.add(header_value)
        for action, kind, count in specs:
            self.queues.setdefault(action, deque()).append([kind, count])

    def take(self, action: str) -> str | None:
        """The fault answering this request of ``action``, or None."""
        queue = self.queues.get(action)
        if not queue:
            return None
        head = queue[0]
        head[1] -= 1
        if head[1] == 0:
            queue.popleft()
        return str(head[0])


# --- the batcher's scheduling rules -------------------------------------------------------------


@attrs.define
class _Value:
    ident: int
    lane: Hashable
    size: int
    arrived: float


@attrs.define
class BatcherModel:
    """``BoundedBatchFunction``'s scheduling rules over plain state, in the order docs/protocol.md
    states them (rules 1 to 3). Values are identified by the integers ``submit`` returns.

    Call :meth:`submit`, :meth:`finish` and :meth:`cancel` as things happen and
    :meth:`dispatch` at a time ``now`` to learn which batches start then.
    """

    max_batch_items: int
    max_batch_bytes: int
    max_retained_items: int
    max_retained_bytes: int
    max_in_flight_batches: int
    flush_seconds: float
    admitting: deque[_Value] = attrs.field(factory=deque)
    """Submitted values waiting for retention room, first come first served."""
    lanes: dict[Hashable, deque[_Value]] = attrs.field(factory=dict)
    in_flight: dict[int, tuple[_Value, ...]] = attrs.field(factory=dict)
    retained_items: int = 0
    retained_bytes: int = 0
    _next: int = 0

    def submit(self, lane: Hashable, size: int, now: float) -> int:
        """A new value; raises ``ValueError`` if it alone exceeds the retained-bytes cap."""
        if size > self.max_retained_bytes:
            raise ValueError("oversized value")
        self._next += 1
        self.admitting.append(_Value(self._next, lane, size, now))
        self._admit()
        return self._next

    def has_room(self, size: int) -> bool:
        """Whether a value of ``size`` would be admitted at once (rule 3): nobody waits
        for admission and it fits under both retention caps. Where it would not,
        ``submit`` waits and ``submit_nowait`` raises ``trio.WouldBlock``."""
        return (
            not self.admitting
            and self.retained_items + 1 <= self.max_retained_items
            and self.retained_bytes + size <= self.max_retained_bytes
        )

    def _admit(self) -> None:
        while self.admitting:
            head = self.admitting[0]
            if (
                self.retained_items + 1 > self.max_retained_items
                or self.retained_bytes + head.size > self.max_retained_bytes
            ):
                return
            self.admitting.popleft()
            self.retained_items += 1
            self.retained_bytes += head.size
            self.lanes.setdefault(head.lane, deque()).append(head)

    def _ready(self, queue: deque[_Value], now: float) -> bool:
        """Full (the next batch cannot grow: item cap reached, the head alone over the byte
        cap, or a following value does not fit), or the head has waited ``flush_seconds``."""
        size, count = 0, 0
        for value in queue:
            if count == self.max_batch_items:
                return True
            if count and size + value.size > self.max_batch_bytes:
                return True
            size, count = size + value.size, count + 1
        if count == self.max_batch_items or size > self.max_batch_bytes:
            return True
        return now >= queue[0].arrived + self.flush_seconds

    def dispatch(self, now: float) -> list[tuple[int, tuple[int, ...]]]:
        """Batches that start at ``now``: ``(batch id, value ids)`` each."""
        started = []
        while len(self.in_flight) < self.max_in_flight_batches:
            ready = [q for q in self.lanes.values() if q and self._ready(q, now)]
            if not ready:
                break
            queue = min(ready, key=lambda q: (q[0].arrived, q[0].ident))
            batch = [queue.popleft()]
            size = batch[0].size
            while (
                queue
                and len(batch) < self.max_batch_items
                and size + queue[0].size <= self.max_batch_bytes
            ):
                size += queue[0].size
                batch.append(queue.popleft())
            ident = batch[0].ident
            self.in_flight[ident] = tuple(batch)
            started.append((ident, tuple(v.ident for v in batch)))
        return started

    def finish(self, batch_id: int) -> None:
        """A batch's execute returned: its values stop being retained."""
        for value in self.in_flight.pop(batch_id):
            self.retained_items -= 1
            self.retained_bytes -= value.size
        self._admit()

    def cancel(self, value_id: int) -> bool:
        """A caller withdrew a value that has not started; True if it was still waiting."""
        for value in list(self.admitting):
            if value.ident == value_id:
                self.admitting.remove(value)
                self._admit()
                return True
        for queue in self.lanes.values():
            for value in queue:
                if value.ident == value_id:
                    queue.remove(value)
                    self.retained_items -= 1
                    self.retained_bytes -= value.size
                    self._admit()
                    return True
        return False

    def next_flush(self) -> float | None:
        """The earliest time a non-full lane becomes ready by waiting, or None."""
        heads = [q[0].arrived + self.flush_seconds for q in self.lanes.values() if q]
        return min(heads) if heads else None
