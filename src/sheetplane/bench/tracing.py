"""``sheetplane bench tracing``: what ``Runtime.map``'s OpenTelemetry spans cost.

On ``SHEETPLANE_DATABASE_URL`` or a throwaway embedded Postgres, with the
reference gateway in-process on loopback: ``rt.map(...)`` over ``--rows`` rows
(default 50,000; ``fn`` returns at once, as ``bench map`` (a) does), on each
road of ``--roads``, in three modes, interleaved in one process (the order
rotates every repeat), median of ``--repeats``:

* ``off``: no instrumentation (``sheetplane._tracing.set_enabled(False)``, as
  ``SHEETPLANE_TRACING=off`` does): every span is a shared no-op and
  OpenTelemetry is never called;
* ``api``: the API alone, no SDK: what a runner that installs nothing pays.
  Target: within 2% of ``off`` (judged by the medians only when the ``off``
  runs spread less than that; otherwise by the bound below);
* ``sdk``: the SDK with a ``SimpleSpanProcessor`` into an in-memory exporter
  (emptied after each run): what a runner that records every span pays,
  exporting aside. Skipped when the SDK (the ``trace`` extra) is missing.

A map's time moves by more than 2% from one run to the next on a loaded
machine, so beside the runs the benchmark measures the API's own cost per
span in a tight loop (``span_ns``) and counts the spans of a map (from the
``sdk`` runs): spans x cost per span over the map's time bounds what the
API alone can add, whatever the noise.

The process's global tracer provider must be unset (the ``api`` mode is the
API alone): run it without an OpenTelemetry auto-instrumentation wrapper.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

import trio
from opentelemetry import trace

from .. import _tracing
from .._plain import PlainHelpFormatter
from ..gateway.server import running_gateway
from ..runtime import open_runtime
from ..store.embedded import EmbeddedPostgres, database_url_from_env
from .map import CONTRACT, ORG, instant, make_rows

__all__ = ["main"]

MODES: Final = ("off", "api", "sdk")
ROADS: Final = ("direct", "gateway_only")
API_TARGET: Final = 1.02
#: Spans made in a row to time the API's cost per span.
SPAN_LOOP: Final = 200_000
#: The same with the SDK, whose in-memory exporter keeps every span (about 3 KiB each).
SDK_SPAN_LOOP: Final = 20_000


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _sdk() -> Any | None:
    """A recording SDK provider into an in-memory exporter, or None without the SDK."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
    except ImportError:
        return None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def span_ns(loops: int = SPAN_LOOP, provider: Any | None = None) -> float:
    """Nanoseconds one ``with _tracing.span(...)`` with two attributes costs with the API
    alone (no SDK; with ``provider``: that SDK's), less the same loop with tracing off."""
    attributes: dict[str, str | int] = {"sheetplane.read.limit": 500, "sheetplane.road": "direct"}

    def loop() -> float:
        started = time.perf_counter_ns()
        for _ in range(loops):
            with _tracing.span("sheetplane.read", attributes) as span:
                span.set_attribute("sheetplane.read.rows", 500)
        return (time.perf_counter_ns() - started) / loops

    _tracing.use_tracer_provider(provider)
    try:
        on = min(loop() for _ in range(3))
    finally:
        _tracing.use_tracer_provider(None)
    _tracing.set_enabled(False)
    try:
        off = min(loop() for _ in range(3))
    finally:
        _tracing.set_enabled(True)
    return on - off


async def _runs(url: str, args: argparse.Namespace) -> dict[str, Any]:
    token = secrets.token_urlsafe(24)
    rows = make_rows(args.rows)
    sdk = _sdk()
    modes = [m for m in MODES if m != "sdk" or sdk is not None]
    out: dict[str, Any] = {road: {mode: [] for mode in modes} for road in args.roads}
    out["spans"] = {road: 0 for road in args.roads}
    async with running_gateway(url, tokens={token: ORG}) as gateway:
        for repeat in range(args.repeats):
            order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
            for road in args.roads:
                for mode in order:
                    _tracing.set_enabled(mode != "off")
                    _tracing.use_tracer_provider(sdk[0] if mode == "sdk" and sdk else None)
                    try:
                        async with open_runtime(
                            base_url=gateway.base_url,
                            token=token,
                            org_id=ORG,
                            play_name=f"bench-tracing-{secrets.token_hex(4)}",
                            run_id="bench",
                            strategy=road,
                        ) as rt:
                            started = time.perf_counter()
                            done = (await rt.map("ns", CONTRACT, rows, instant)).completed
                            elapsed = time.perf_counter() - started
                    finally:
                        _tracing.set_enabled(True)
                        _tracing.use_tracer_provider(None)
                    if done != len(rows):
                        raise AssertionError(f"{road} {mode} mapped {done} rows, not {len(rows)}")
                    if mode == "sdk" and sdk is not None:
                        out["spans"][road] = len(sdk[1].get_finished_spans())
                        sdk[1].clear()
                    out[road][mode].append(elapsed)
                    print(f"{road} {mode}: {elapsed:.2f} s, load {_load()}", file=sys.stderr)
    return out


def _verdict(ratio: float, off_runs: Sequence[float]) -> str:
    """The API-alone ratio against its target, when the runs can tell: a spread of the
    ``off`` runs (range over median) wider than the target's margin cannot resolve it,
    and then the bound by spans x cost a span is the figure to read."""
    spread = (max(off_runs) - min(off_runs)) / statistics.median(off_runs)
    if spread > API_TARGET - 1:
        return f"unresolved: the off runs spread {spread:.0%} (read the bound below)"
    return "ok" if ratio <= API_TARGET else "MISSED"


def report(
    out: dict[str, Any], per_span_ns: float, args: argparse.Namespace, sdk_ns: float | None = None
) -> str:
    sdk_cost = "" if sdk_ns is None else f", the SDK into memory {sdk_ns:,.0f} ns"
    lines = [
        f"map's OpenTelemetry spans, {args.rows:,} rows, fn returns at once, median of "
        f"{args.repeats} interleaved runs; a span (tight loop, less tracing off): the API "
        f"alone {per_span_ns:,.0f} ns{sdk_cost}; load average {_load()}"
    ]
    for road in args.roads:
        runs = out[road]
        off = statistics.median(runs["off"])
        lines.append(f"  {road}:")
        for mode, values in runs.items():
            median = statistics.median(values)
            line = (
                f"    {mode:>3} {median:7.2f} s  {args.rows / median:>8,.0f} rows/s  "
                f"{median / off:.3f}x off  runs {[round(v, 2) for v in values]}"
            )
            if mode == "api":
                line += f"  (target <= {API_TARGET}) {_verdict(median / off, runs['off'])}"
            lines.append(line)
        spans = out["spans"][road]
        if spans:
            bound = spans * per_span_ns / 1e9
            lines.append(
                f"    {spans:,} spans a map (the sdk runs'): with the API alone they cost at "
                f"most {bound * 1000:.1f} ms = {bound / off:.3%} of the off median"
            )
            if sdk_ns is not None:
                recorded = spans * sdk_ns / 1e9
                lines.append(
                    f"    with the SDK into memory about {recorded * 1000:.0f} ms = "
                    f"{recorded / off:.2%} of the off median"
                )
    if "sdk" not in out[args.roads[0]]:
        lines.append("  sdk: skipped (the OpenTelemetry SDK is not installed: sheetplane[trace])")
    lines.append(f"load average at the end {_load()}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tracing benchmark and print its figures."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench tracing", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=50_000, help="rows a map (default 50,000)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="maps of each mode and road; medians (default 5)"
    )
    parser.add_argument(
        "--roads", choices=ROADS, nargs="+", default=list(ROADS), help="roads (default all)"
    )
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        parser.error("a global tracer provider is set: the api mode would not be the API alone")
    url = args.database_url or database_url_from_env()
    per_span = span_ns()
    sdk = _sdk()
    sdk_ns = None if sdk is None else span_ns(SDK_SPAN_LOOP, provider=sdk[0])
    del sdk  # and the spans its exporter kept
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url
        out = trio.run(_runs, url, args)
    print(report(out, per_span, args, sdk_ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
