"""Where a run's time went, read from its spans: the summary ``sheetplane demo --trace``
prints.

:func:`summarize` takes finished spans (the SDK's ``ReadableSpan``, or anything with
their ``name``, ``start_time``, ``end_time``, ``attributes`` and ``events``) and adds
them up per phase of a map: admission, page reads, ``fn``, terminal writes, retries,
session mints, waits for a Postgres connection and receipt claims. Phases overlap
(sixteen ``fn`` calls run while a page is read and a batch is written), so each
phase says both its *busy* time (the wall time during which at least one of its
spans ran: the union of their intervals) and its *summed* time (their durations
added up); ``fn`` has no span of its own, so its time is the map spans' summed
``sheetplane.map.fn_seconds``. Shares are of the maps' busy time.

:func:`trace_in_memory` points sheetplane's spans at the SDK's in-memory exporter
(:func:`in_memory_tracing` for a block only). The SDK is the ``trace`` extra;
sheetplane itself needs the API alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from . import _tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["Phase", "Summary", "in_memory_tracing", "summarize", "trace_in_memory"]

_NS: Final = 1e9


class _Event(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def attributes(self) -> Mapping[str, Any] | None: ...


class FinishedSpan(Protocol):
    """What the summary reads of a span (the SDK's ``ReadableSpan`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def start_time(self) -> int | None: ...

    @property
    def end_time(self) -> int | None: ...

    @property
    def attributes(self) -> Mapping[str, Any] | None: ...

    @property
    def events(self) -> Sequence[_Event]: ...


@attrs.frozen
class Phase:
    """One phase of the summary."""

    name: str
    """What the phase is (``admission``, ``page reads``, ...)."""
    count: int
    """Its spans (for ``fn``: calls; for retries: attempts sent again)."""
    rows: int | None
    """Rows it handled, where its spans count them."""
    busy_seconds: float | None
    """Wall time during which at least one of its spans ran (None: no spans of its own)."""
    summed_seconds: float
    """Its spans' durations added up (for retries: the waits before each new attempt)."""


@attrs.frozen
class Summary:
    """The phases of one run, and the maps' busy time they are compared with."""

    phases: tuple[Phase, ...]
    """In the order of a map: admission, reads, fn, writes, then the rest."""
    map_seconds: float
    """Wall time during which at least one ``map`` ran."""
    maps: int
    """``map`` calls traced."""


def _seconds(span: FinishedSpan) -> float:
    if span.start_time is None or span.end_time is None:
        return 0.0
    return (span.end_time - span.start_time) / _NS


def _busy(spans: Sequence[FinishedSpan]) -> float:
    """The length of the union of the spans' intervals, in seconds."""
    intervals = sorted(
        (s.start_time, s.end_time)
        for s in spans
        if s.start_time is not None and s.end_time is not None
    )
    total = 0
    start = end = None
    for begin, finish in intervals:
        if end is None or begin > end:
            if end is not None and start is not None:
                total += end - start
            start, end = begin, finish
        else:
            end = max(end, finish)
    if start is not None and end is not None:
        total += end - start
    return total / _NS


def _number(span: FinishedSpan, name: str) -> float:
    value = (span.attributes or {}).get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _sum(spans: Iterable[FinishedSpan], *names: str) -> int:
    return round(sum(_number(s, name) for s in spans for name in names))


#: Each phase with spans of its own: its name, the span names it takes, how it counts rows.
_SPANNED: Final[
    tuple[tuple[str, frozenset[str], Callable[[list[FinishedSpan]], int] | None], ...]
] = (
    (
        "admission",
        frozenset({"sheetplane.admission"}),
        lambda spans: _sum(spans, "sheetplane.admission.pending", "sheetplane.admission.completed"),
    ),
    (
        "page reads",
        frozenset({"sheetplane.read", "sheetplane.read_batch"}),
        lambda spans: _sum(spans, "sheetplane.read.rows"),
    ),
    (
        "terminal writes",
        frozenset({"sheetplane.write"}),
        lambda s: _sum(s, "sheetplane.write.rows"),
    ),
    ("session mints", frozenset({"sheetplane.session.mint"}), None),
    ("Postgres slot waits", frozenset({"db slot wait"}), None),
    ("receipt claims", frozenset({"sheetplane.receipt.claim"}), None),
)


def summarize(spans: Iterable[FinishedSpan]) -> Summary:
    """The per-phase summary of ``spans`` (see the module docstring)."""
    every = list(spans)
    by_name: dict[str, list[FinishedSpan]] = {}
    for span in every:
        by_name.setdefault(span.name, []).append(span)
    maps = by_name.get("sheetplane.map", [])
    phases: list[Phase] = []
    for name, names, rows in _SPANNED:
        taken = [s for n in sorted(names) for s in by_name.get(n, [])]
        phases.append(
            Phase(
                name=name,
                count=len(taken),
                rows=rows(taken) if rows is not None else None,
                busy_seconds=_busy(taken),
                summed_seconds=sum(_seconds(s) for s in taken),
            )
        )
    fn = Phase(
        name="fn",
        count=_sum(maps, "sheetplane.map.fn_calls"),
        rows=None,
        busy_seconds=None,
        summed_seconds=sum(_number(s, "sheetplane.map.fn_seconds") for s in maps),
    )
    phases.insert(2, fn)
    resent = [s for s in every if _number(s, "http.request.resend_count") >= 1]
    waited_ms = sum(
        float((event.attributes or {}).get("sheetplane.retry.delay_ms", 0))
        for span in every
        for event in span.events
        if event.name == "retry"
    )
    phases.insert(
        4,
        Phase(
            name="retries",
            count=len(resent),
            rows=None,
            busy_seconds=None,
            summed_seconds=waited_ms / 1000,
        ),
    )
    return Summary(phases=tuple(phases), map_seconds=_busy(maps), maps=len(maps))


def trace_in_memory() -> tuple[InMemorySpanExporter, TracerProvider]:
    """From now on sheetplane's spans go to an in-memory exporter, through an SDK
    ``TracerProvider`` made for sheetplane alone (the process's global provider is left
    as it is). Raises ``ImportError`` when the SDK is not installed."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracing.use_tracer_provider(provider)
    return exporter, provider


@contextmanager
def in_memory_tracing() -> Iterator[InMemorySpanExporter]:
    """``trace_in_memory`` for the block; then sheetplane's spans go back to the
    process's global provider."""
    exporter, provider = trace_in_memory()
    try:
        yield exporter
    finally:
        _tracing.use_tracer_provider(None)
        provider.shutdown()
