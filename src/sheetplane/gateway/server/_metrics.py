"""The gateway's Prometheus metrics (prometheus-client), one registry per app.

Code that serves a request reaches them as ``call.state.metrics`` (or the
:class:`GatewayMetrics` handed to the app) and counts with the named
attributes, for example ``metrics.admissions.inc()`` when an admission
commits. A new action needs nothing: ``sheetplane_requests_total`` and
``sheetplane_request_seconds`` count every request by action already.

No label value ever names a tenant: ``action`` is one of the gateway's own
action names (:func:`action_label` folds anything else to ``unknown``), and
``status`` an HTTP status code. The pool's gauges are read at each request's
end and at each scrape.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Callable, Collection, Mapping
from typing import Final, Protocol

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from ...budgets import REQUEST_TIMEOUT_MS

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "action_label", "pool_states"]

#: The Prometheus text exposition format, version 0.0.4.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: Histogram buckets in seconds: prometheus-client's defaults up to 10 s, then
#: the caller's attempt timeout (the longest a gateway action may run).
REQUEST_SECONDS_BUCKETS: Final = (
    *(bound for bound in Histogram.DEFAULT_BUCKETS if bound <= 10),
    REQUEST_TIMEOUT_MS / 1000,
    math.inf,
)

#: Where prometheus-client keeps the values of several processes (its own variable).
MULTIPROCESS_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"

#: Label of requests that never named an action (a body that did not parse).
NO_ACTION: Final = "none"
#: Label of requests that named an action this gateway does not know.
UNKNOWN_ACTION: Final = "unknown"


def action_label(action: str | None, known: Collection[str]) -> str:
    """The ``action`` label of a request: a known action's name, else a fixed word,
    so a client cannot mint label values (nor put a tenant's text in one)."""
    if action is None:
        return NO_ACTION
    return action if action in known else UNKNOWN_ACTION


class _Pool(Protocol):
    max_connections: int

    def stats(self) -> dict[str, int]: ...


def pool_states(pool: _Pool) -> dict[str, int]:
    """``sheetplane_pool_connections`` by state, from a ``TrioPool``'s counters."""
    stats = pool.stats()
    return {
        "in_use": stats.get("in_use", 0),
        "idle": stats.get("pool_available", 0),
        "open": stats.get("pool_size", 0),
        "max": pool.max_connections,
    }


@attrs.define(eq=False)
class GatewayMetrics:
    """Every metric of one gateway, in its own registry (several gateways may
    share a process: tests, the demo).

    When ``$PROMETHEUS_MULTIPROC_DIR`` is set (``sheetplane serve --workers N``
    sets it for its workers), prometheus-client keeps every value in that
    directory and :meth:`exposition` answers for all the processes that write
    there: gauges say how they combine (``multiprocess_mode``)."""

    registry: CollectorRegistry = attrs.field(factory=lambda: CollectorRegistry(auto_describe=True))
    pool_stats: Callable[[], Mapping[str, int]] | None = None
    """Set by the app once its store is open: the pool's gauges, read by :meth:`refresh`."""
    requests: Counter = attrs.field(init=False)
    request_seconds: Histogram = attrs.field(init=False)
    requests_in_flight: Gauge = attrs.field(init=False)
    connections_open: Gauge = attrs.field(init=False)
    pool_connections: Gauge = attrs.field(init=False)
    backpressure: Counter = attrs.field(init=False)
    sessions_minted: Counter = attrs.field(init=False)
    session_roles_live: Gauge = attrs.field(init=False)
    session_roles_reaped: Counter = attrs.field(init=False)
    session_backends_ended: Counter = attrs.field(init=False)
    read_batch_too_large: Counter = attrs.field(init=False)
    admissions: Counter = attrs.field(init=False)
    draining: Gauge = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        registry = self.registry
        self.requests = Counter(
            "sheetplane_requests",
            "Requests answered, by action and HTTP status",
            ["action", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "sheetplane_request_seconds",
            "Time from a request's arrival to the end of its answer, by action",
            ["action"],
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=registry,
        )
        self.requests_in_flight = Gauge(
            "sheetplane_requests_in_flight",
            "Requests being answered now",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.connections_open = Gauge(
            "sheetplane_connections_open",
            "Open HTTP connections",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.pool_connections = Gauge(
            "sheetplane_pool_connections",
            "Postgres pool connections by state (in_use: held by a request or the reaper;"
            " idle: open and free; open; max: the pool's size), summed over workers",
            ["state"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.backpressure = Counter(
            "sheetplane_backpressure",
            "Requests answered 503 back-pressure (the pool stayed saturated)",
            registry=registry,
        )
        self.sessions_minted = Counter(
            "sheetplane_sessions_minted", "Scoped database sessions minted", registry=registry
        )
        self.session_roles_live = Gauge(
            "sheetplane_session_roles_live",
            "Session roles in Postgres that have not expired (all workers'), read when scraped",
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.session_roles_reaped = Counter(
            "sheetplane_session_roles_reaped",
            "Expired session roles the reaper dropped",
            registry=registry,
        )
        self.session_backends_ended = Counter(
            "sheetplane_session_backends_ended",
            "Session backends the watchdog terminated, by reason (time_bound: a statement,"
            " idle transaction or transaction past its bound; org_budget: past its org's"
            " connection budget; memory, org_memory: past its own or its org's memory"
            " bound; orphan: its role dropped; unauthenticated: no role past the login"
            " bound; parallel: it led parallel workers; notify: LISTEN or NOTIFY)",
            ["reason"],
            registry=registry,
        )
        self.read_batch_too_large = Counter(
            "sheetplane_read_batch_too_large",
            "Batch reads answered 413 over the response budget",
            registry=registry,
        )
        self.admissions = Counter(
            "sheetplane_admissions",
            "Admissions committed (each takes a write version)",
            registry=registry,
        )
        self.draining = Gauge(
            "sheetplane_draining",
            "1 once SIGTERM started the drain",
            registry=registry,
            multiprocess_mode="livemax",
        )

    def refresh(self) -> None:
        """Read the pool's gauges now (at each request's end and each scrape)."""
        stats = self.pool_stats() if self.pool_stats is not None else None
        if stats is not None:
            for state, value in stats.items():
                self.pool_connections.labels(state=state).set(value)

    def observe(self, action: str, status: int, seconds: float) -> None:
        """Count one finished request."""
        self.requests.labels(action=action, status=str(status)).inc()
        self.request_seconds.labels(action=action).observe(seconds)

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format: this gateway's registry, or
        every process's in the multiprocess directory when one is set."""
        self.refresh()
        directory = os.environ.get(MULTIPROCESS_DIR_ENV)
        if not directory:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        _SettledFilesCollector(combined, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(combined)


class _SettledFilesCollector(MultiProcessCollector):
    """prometheus-client's multiprocess collector, skipping a file another process
    is creating. ``MmapedDict`` creates its file, then sizes it: a scrape in that
    window read a 0-byte file, ``struct.error``, and answered 500 for every
    metric (prometheus/client_python#1199). Such a file holds no sample yet."""

    def collect(self):  # type: ignore[no-untyped-def]
        files = []
        for name in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(name) > 0:
                    files.append(name)
            except FileNotFoundError:  # a live gauge's file, removed as its process ended
                continue
        return self.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
