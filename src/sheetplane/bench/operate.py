"""``sheetplane bench operate``: what operating the gateway costs a request.

The reference gateway runs in-process on loopback, on ``SHEETPLANE_DATABASE_URL``
(else a throwaway embedded Postgres). One keep-alive client sends N requests
one after another, for each of:

* ``GET /healthz`` (no store), ``GET /readyz`` (``SELECT 1`` through the pool)
  and ``POST runtime_sheet_summary`` (one store read);
* the summary again with the JSON access log written (to ``/dev/null``,
  through the real formatter) against the same requests with the access log
  off (the logger above INFO): the ratio is what one structured log line per
  request costs;
* the time from the shutdown trigger to the end of the shutdown (drain with
  nothing in flight, reaper stopped, pool closed).

Each figure is the median of ``--repeats`` runs of ``--requests`` requests.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import httpx
import trio

from .._plain import PlainHelpFormatter
from ..gateway.server import RUNTIME_PATH, JsonFormatter, running_gateway
from ..store.embedded import EmbeddedPostgres, database_url_from_env

TOKEN = "tok-bench-operate"
ORG = "org-bench-operate"


async def _per_request_ms(
    http: httpx.AsyncClient, method: str, path: str, body: dict[str, str] | None, n: int
) -> float:
    start = time.perf_counter()
    for _ in range(n):
        response = await http.request(method, path, json=body)
        response.raise_for_status()
    return (time.perf_counter() - start) * 1000 / n


async def run_bench(url: str, requests: int, repeats: int, sink: TextIO) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    access = logging.getLogger("sheetplane.gateway.access")
    handler = logging.StreamHandler(sink)
    handler.setFormatter(JsonFormatter())
    access.addHandler(handler)
    access.propagate = False
    summary = {"action": "runtime_sheet_summary", "playName": "p", "tableNamespace": "bench"}
    try:
        for repeat in range(repeats):
            async with (
                running_gateway(url, tokens={TOKEN: ORG}) as gw,
                httpx.AsyncClient(
                    base_url=gw.base_url, headers={"authorization": f"Bearer {TOKEN}"}
                ) as http,
            ):
                await _per_request_ms(http, "POST", RUNTIME_PATH, summary, 10)  # warm the pool
                for name, method, path, body in (
                    ("healthz", "GET", "/healthz", None),
                    ("readyz", "GET", "/readyz", None),
                ):
                    figure = await _per_request_ms(http, method, path, body, requests)
                    figures.setdefault(name, []).append(figure)
                # On and off in alternating order, so neither always runs warmer.
                modes = [("on", logging.INFO), ("off", logging.WARNING)]
                if repeat % 2:
                    modes.reverse()
                for mode, level in modes:
                    access.setLevel(level)
                    figure = await _per_request_ms(http, "POST", RUNTIME_PATH, summary, requests)
                    figures.setdefault(f"summary, access log {mode}", []).append(figure)
                access.setLevel(logging.INFO)
                stopping = time.perf_counter()
            figures.setdefault("shutdown: drain and close", []).append(
                (time.perf_counter() - stopping) * 1000
            )
    finally:
        access.removeHandler(handler)
        access.propagate = True
        access.setLevel(logging.NOTSET)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print medians (ms) and the access log's cost."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench operate", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=500, help="requests a run (default 500)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs of each kind; medians (default 5)"
    )
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    url = args.database_url or database_url_from_env()
    with open(os.devnull, "w") as sink, contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(EmbeddedPostgres()).url
        figures = trio.run(run_bench, url, args.requests, args.repeats, sink)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    print(f"median of {args.repeats} runs x {args.requests} sequential requests (ms/request):")
    for name, value in medians.items():
        print(f"  {name:28} {value:8.3f}   runs: {[round(v, 3) for v in figures[name]]}")
    on, off = medians["summary, access log on"], medians["summary, access log off"]
    print(f"access log cost: {on / off:.3f}x the summary request without it ({on - off:+.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
