"""OpenTelemetry spans of the data plane: the one module that speaks to OpenTelemetry.

sheetplane depends on ``opentelemetry-api`` only. A process that installs and
configures an SDK (a ``TracerProvider``) sees sheetplane's spans; one that does
not pays for the API's no-op calls alone (``docs/benchmarks.md`` measures it).
Every call site is one ``with span(...)``; what a span may carry is decided
here and at the call sites, never taken from a request or a row:

* names and attributes follow OpenTelemetry's semantic conventions where one
  exists (``http.*``, ``url.*``, ``server.*``, ``db.*``, ``error.type``), and
  use the ``sheetplane.`` prefix otherwise;
* no span carries a token, a database URL, a password or row data: attribute
  values are counts, sizes, action and operation names, table namespaces,
  statuses and error *types*. An error is recorded by its type alone
  (``error.type`` and the status), never by its message, which may quote a
  value (``tests/test_tracing.py`` greps every exported value for secrets).

Context is OpenTelemetry's, which lives in ``contextvars``: a trio task
inherits a copy of its parent's at ``start_soon``, so a span opened in a task
is the parent of everything that task and the tasks it starts do. A task that
runs on behalf of many callers (a batcher's batch runner) takes its owner's
context instead (:func:`current_context`, :func:`adopt`), so a batch is never
parented by whichever caller happened to start the runner.

``SHEETPLANE_TRACING=off`` in the environment, or :func:`set_enabled`, turns
every span into a shared no-op without calling OpenTelemetry at all: the
benchmark's baseline of no instrumentation.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from types import TracebackType
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

__all__ = [
    "INSTRUMENTATION_NAME",
    "READ_BYTES",
    "Span",
    "SpanKind",
    "Status",
    "StatusCode",
    "adopt",
    "annotate",
    "count_read_bytes",
    "counting_read_bytes",
    "current_context",
    "current_span_id",
    "current_trace_id",
    "enabled",
    "inject",
    "links_to",
    "read_span",
    "recording",
    "server_span",
    "set_enabled",
    "span",
    "use_tracer_provider",
]

#: The instrumentation scope every sheetplane span is created under.
INSTRUMENTATION_NAME: Final = "sheetplane"

Attributes = Mapping[str, AttributeValue]

#: W3C trace context only (``traceparent``, ``tracestate``): baggage is not forwarded,
#: whatever the process's global propagator says.
_PROPAGATOR: Final = TraceContextTextMapPropagator()


class _State:
    __slots__ = ("enabled", "tracer")

    def __init__(self) -> None:
        self.enabled = os.environ.get("SHEETPLANE_TRACING", "").strip().lower() != "off"
        #: The global provider's tracer (a proxy until a provider is set).
        self.tracer: Tracer = trace.get_tracer(INSTRUMENTATION_NAME)


_STATE: Final = _State()


def enabled() -> bool:
    """Whether spans are made at all (``SHEETPLANE_TRACING`` not ``off``)."""
    return _STATE.enabled


def set_enabled(on: bool) -> None:
    """Turn every span on or off for the process (off: a shared no-op, OpenTelemetry
    is not called). For benchmarks that compare both in one run."""
    _STATE.enabled = bool(on)


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Make sheetplane's spans with ``provider``'s tracer (None: the global provider's
    again). ``sheetplane demo --trace`` and the benchmarks use it so as not to set
    the process's global provider, which can be set only once."""
    if provider is None:
        _STATE.tracer = trace.get_tracer(INSTRUMENTATION_NAME)
    else:
        _STATE.tracer = provider.get_tracer(INSTRUMENTATION_NAME)


class _NoSpan:
    """What ``span`` is when tracing is off: enters to the invalid span, does nothing."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return trace.INVALID_SPAN

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NO_SPAN: Final = _NoSpan()


#: The attribute of a page read's bytes (see :func:`read_span`).
READ_BYTES: Final = "sheetplane.read.bytes"


class _ReadTally:
    """The bytes the reads under one recording :func:`read_span` counted."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


#: Where a recording read span keeps its tally: in OpenTelemetry's context, so it reaches
#: the store's worker thread and the client's attempts, and never the gateway's side of a
#: request (a server span starts from the request's headers alone).
_READ_TALLY: Final = otel_context.create_key("sheetplane.read_tally")


class _CurrentSpan:
    """A span made current for a ``with`` block, in the task (or thread) that entered it.

    An exception leaving the block is recorded by its type only: ``error.type``
    and an error status for an ``Exception``; a cancellation (or any other
    ``BaseException``) leaves the status unset and marks ``sheetplane.cancelled``
    when it is ``trio.Cancelled``. A read span (``tallies``) that records also
    keeps a tally of the bytes its reads count, set as ``sheetplane.read.bytes``
    when it ends.
    """

    __slots__ = (
        "_attributes",
        "_context",
        "_kind",
        "_links",
        "_name",
        "_span",
        "_tallies",
        "_tally",
        "_token",
    )

    def __init__(
        self,
        name: str,
        attributes: Attributes | None,
        kind: SpanKind,
        links: Sequence[Link] | None,
        context: otel_context.Context | None,
        *,
        tallies: bool = False,
    ) -> None:
        self._name = name
        self._attributes = attributes
        self._kind = kind
        self._links = links
        self._context = context
        self._tallies = tallies
        self._tally: _ReadTally | None = None
        self._span: Span = trace.INVALID_SPAN
        self._token: object | None = None

    def __enter__(self) -> Span:
        parent = otel_context.get_current() if self._context is None else self._context
        made = _STATE.tracer.start_span(
            self._name,
            parent,
            kind=self._kind,
            attributes=self._attributes,
            links=self._links,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._span = made
        if self._tallies and made.is_recording():
            tally = self._tally = _ReadTally()
            inner = otel_context.set_value(
                _READ_TALLY, tally, trace.set_span_in_context(made, parent)
            )
            self._token = otel_context.attach(inner)
        elif made is not trace.get_current_span(parent) or self._context is not None:
            # The API alone hands back the current span itself: nothing to attach.
            self._token = otel_context.attach(trace.set_span_in_context(made, parent))
        return made

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        made = self._span
        try:
            if self._tally is not None:
                made.set_attribute(READ_BYTES, self._tally.bytes)
            if exc is not None and made.is_recording():
                _record_error(made, exc)
        finally:
            if self._token is not None:
                otel_context.detach(self._token)  # type: ignore[arg-type]
                self._token = None
            made.end()


def _record_error(made: Span, exc: BaseException) -> None:
    kind = type(exc)
    if isinstance(exc, Exception):
        made.set_attribute("error.type", f"{kind.__module__}.{kind.__qualname__}")
        # The type, not the message: a message may quote a value of a row.
        made.set_status(Status(StatusCode.ERROR, kind.__name__))
    elif kind.__name__ == "Cancelled" and kind.__module__.startswith("trio"):
        made.set_attribute("sheetplane.cancelled", True)
    else:
        made.set_attribute("error.type", f"{kind.__module__}.{kind.__qualname__}")


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    links: Sequence[Link] | None = None,
) -> _CurrentSpan | _NoSpan:
    """``with span(name, {...}) as s:`` a span, current for the block, child of the
    current one. ``s.set_attribute`` adds what is known only at the end."""
    if not _STATE.enabled:
        return _NO_SPAN
    return _CurrentSpan(name, attributes, kind, links, None)


def read_span(
    name: str,
    attributes: Attributes | None = None,
    *,
    links: Sequence[Link] | None = None,
) -> _CurrentSpan | _NoSpan:
    """A page read's span (``sheetplane.read``, ``sheetplane.read_batch``): like
    :func:`span`, and while it records, the bytes the reads under it report with
    :func:`count_read_bytes` (the store on the direct road, the client on the
    gateway road) are summed into its ``sheetplane.read.bytes``."""
    if not _STATE.enabled:
        return _NO_SPAN
    return _CurrentSpan(name, attributes, SpanKind.INTERNAL, links, None, tallies=True)


def counting_read_bytes() -> bool:
    """Whether a recording read span is current, to count its bytes (so work done only to
    measure them is skipped otherwise)."""
    return _STATE.enabled and otel_context.get_value(_READ_TALLY) is not None


def count_read_bytes(size: int) -> None:
    """Add ``size`` bytes of rows read to the current read span's tally (none: nothing).

    ``size`` is the rows' own compact JSON, each row as the object the gateway
    sends, summed: no separators, no page or answer envelope (docs/tracing.md)."""
    if not _STATE.enabled:
        return
    tally = otel_context.get_value(_READ_TALLY)
    if isinstance(tally, _ReadTally):
        tally.bytes += size


def server_span(
    name: str, headers: Mapping[str, str], attributes: Attributes | None = None
) -> _CurrentSpan | _NoSpan:
    """A ``SERVER`` span continuing the trace of a request's ``traceparent`` (and
    ``tracestate``) headers, or starting one when they are absent or malformed."""
    if not _STATE.enabled:
        return _NO_SPAN
    parent = _PROPAGATOR.extract(headers)
    return _CurrentSpan(name, attributes, SpanKind.SERVER, None, parent)


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` (and ``tracestate``) to ``headers``;
    nothing when there is no valid current span (no SDK, tracing off)."""
    if _STATE.enabled:
        _PROPAGATOR.inject(headers)


def recording() -> bool:
    """Whether the current span records (an SDK is configured and samples it): for work
    done only to describe a span, such as timing each of a map's ``fn`` calls."""
    return _STATE.enabled and trace.get_current_span().is_recording()


def annotate(attributes: Attributes) -> None:
    """Add ``attributes`` to the current span (nothing when it does not record)."""
    if not _STATE.enabled:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(attributes)


def current_trace_id() -> str | None:
    """The current trace's id as 32 hex digits, or None outside a valid trace."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def current_span_id() -> str | None:
    """The current span's id as 16 hex digits, or None outside a valid trace."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.span_id, "016x") if ctx.is_valid else None


#: Links a span takes at most from :func:`links_to`.
MAX_LINKS: Final = 32


def _current_span_context() -> trace.SpanContext:
    return trace.get_current_span().get_span_context()


def links_to(contexts: Iterable[contextvars.Context]) -> list[Link]:
    """Links to the spans current in other tasks' ``contexts`` (a batch's waiting callers:
    ``Batch.waiting_contexts``), each once, at most ``MAX_LINKS``; none to an invalid
    span or to the current one (the batch's parent)."""
    if not _STATE.enabled:
        return []
    here = _current_span_context()
    seen = {here.span_id}
    links: list[Link] = []
    for ctx in contexts:
        try:
            there = ctx.run(_current_span_context)
        except RuntimeError:  # a context entered now (the running task's own)
            continue
        if there.is_valid and there.span_id not in seen:
            seen.add(there.span_id)
            links.append(Link(there))
            if len(links) == MAX_LINKS:
                break
    return links


def current_context() -> otel_context.Context:
    """The current OpenTelemetry context (to hand to :func:`adopt` in another task)."""
    return otel_context.get_current()


def adopt(context: otel_context.Context) -> None:
    """Make ``context`` this task's for the rest of its life: for a task that works on
    behalf of the block that owns it (a batch runner), not of whoever started it."""
    if _STATE.enabled:
        otel_context.attach(context)
