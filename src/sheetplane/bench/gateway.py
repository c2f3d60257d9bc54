"""``sheetplane bench gateway``: the gateway road against the direct road, and the batcher's worth.

One sheet of N rows (default 200,000) is read end to end, in read order,
one request after another, on the same Postgres (``SHEETPLANE_DATABASE_URL``,
else a throwaway embedded server) with the reference gateway running
in-process on loopback:

* **Gateway road**: ``GatewayClient.read_rows_batch``, 4 pages of 5,000 rows a
  request (what the page reader's batcher sends).
* **Direct road** (the peer): a scoped session minted with
  ``create_db_session`` (its URL decrypted by ``SessionManager``), and the
  store's ``read_rows_batch`` of the same 4 x 5,000 pages on a pool opened on
  that URL. Minting happens once, outside the timed runs. Target: the gateway
  road at >= 0.9x the direct road's rows/s.
* **Requests with and without the batcher**: the gateway road again, one
  page a request (``runtime_sheet_read_rows``), as an unbatched reader sends
  it: requests sent and rows/s, against the batched figure.

Each figure is the median of several runs (``--repeats``).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

import attrs
import httpx
import trio

from .._plain import PlainHelpFormatter
from .._types import PageRequest, SheetRef
from ..budgets import READ_BATCH_MAX_PAGES, READ_PAGE_MAX_ROWS
from ..gateway.client import GatewayClient
from ..gateway.server import RunningGateway, running_gateway
from ..sessions import SessionManager, batch_read_shape
from ..store import SheetStore, open_store
from ..store.embedded import EmbeddedPostgres, database_url_from_env
from ._common import CONTRACT, make_rows

__all__ = ["main"]

ORG = "bench-org"
PLAY = "bench-gateway"
#: The target: gateway road rows/s over direct road rows/s.
RATIO_TARGET = 0.9


class _Counting(httpx.AsyncBaseTransport):
    """The real HTTP transport, counting the requests it sends."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@attrs.frozen
class Road:
    """One way of reading the whole sheet, measured ``repeats`` times."""

    name: str
    rows: int
    seconds: list[float]
    requests: int
    """HTTP requests one full read sent (0 for the direct road)."""

    @property
    def rate(self) -> float:
        return self.rows / statistics.median(self.seconds)


def _batches(total: int, pages_per_batch: int) -> list[list[PageRequest]]:
    pages = [
        PageRequest(READ_PAGE_MAX_ROWS, offset) for offset in range(0, total, READ_PAGE_MAX_ROWS)
    ]
    return [pages[i : i + pages_per_batch] for i in range(0, len(pages), pages_per_batch)]


async def _timed(fn: Callable[[], Awaitable[int]], expected_rows: int) -> float:
    started = time.perf_counter()
    got = await fn()
    elapsed = time.perf_counter() - started
    if got != expected_rows:
        raise AssertionError(f"read {got} rows, expected {expected_rows}")
    return elapsed


async def _gateway_road(
    gw: RunningGateway, token: str, namespace: str, total: int, repeats: int, *, batched: bool
) -> Road:
    transport = _Counting()
    seconds = []
    requests = 0
    async with GatewayClient(gw.base_url, token, play_name=PLAY, transport=transport) as client:

        async def read_all() -> int:
            rows = 0
            if batched:
                for batch in _batches(total, READ_BATCH_MAX_PAGES):
                    pages = await client.read_rows_batch(namespace, batch)
                    rows += sum(len(page.rows) for page in pages)
            else:
                for [page_request] in _batches(total, 1):
                    page = await client.read_rows(namespace, page_request)
                    rows += len(page.rows)
            return rows

        for _ in range(repeats):
            before = transport.requests
            seconds.append(await _timed(read_all, total))
            requests = transport.requests - before
    name = (
        f"gateway, {READ_BATCH_MAX_PAGES} pages x {READ_PAGE_MAX_ROWS} a request"
        if batched
        else f"gateway, 1 page x {READ_PAGE_MAX_ROWS} a request"
    )
    return Road(name, total, seconds, requests)


async def _direct_road(
    gw: RunningGateway, token: str, namespace: str, total: int, repeats: int
) -> tuple[Road, float]:
    batches = _batches(total, READ_BATCH_MAX_PAGES)
    sheet = SheetRef(ORG, PLAY, namespace)
    seconds = []
    async with (
        GatewayClient(gw.base_url, token, play_name=PLAY) as client,
        SessionManager(client) as manager,
    ):
        shape = batch_read_shape(namespace, batches[0])
        started = time.perf_counter()
        await manager.session(shape)
        mint_s = time.perf_counter() - started
        async with manager.store(shape) as store:

            async def read_all() -> int:
                rows = 0
                for batch in batches:
                    pages = await store.read_rows_batch(sheet, batch)
                    rows += sum(len(page.rows) for page in pages)
                return rows

            for _ in range(repeats):
                seconds.append(await _timed(read_all, total))
    name = f"direct (scoped session), {READ_BATCH_MAX_PAGES} pages x {READ_PAGE_MAX_ROWS} a batch"
    return Road(name, total, seconds, 0), mint_s


async def _seed(store: SheetStore, namespace: str, rows: int) -> None:
    sheet = SheetRef(ORG, PLAY, namespace)
    await store.start_dataset(sheet, make_rows(rows), "bench-run", CONTRACT, key_field="id")


@attrs.frozen
class Result:
    """Every road of one benchmark run."""

    batched: Road
    unbatched: Road
    direct: Road
    mint_s: float

    @property
    def ratio(self) -> float:
        """Gateway road rows/s over direct road rows/s."""
        return self.batched.rate / self.direct.rate


async def run_bench(url: str, rows: int, repeats: int) -> Result:
    token = secrets.token_urlsafe(24)
    namespace = f"ns-{uuid.uuid4().hex[:12]}"
    async with open_store(url, max_connections=2) as store:
        await _seed(store, namespace, rows)
    async with running_gateway(url, tokens={token: ORG}) as gw:
        # One untimed pass warms Postgres' cache and both roads' connections.
        await _gateway_road(gw, token, namespace, rows, 1, batched=True)
        direct, mint_s = await _direct_road(gw, token, namespace, rows, repeats)
        batched = await _gateway_road(gw, token, namespace, rows, repeats, batched=True)
        unbatched = await _gateway_road(gw, token, namespace, rows, repeats, batched=False)
    return Result(batched, unbatched, direct, mint_s)


def report(result: Result, repeats: int) -> str:
    lines = [
        f"gateway benchmark: {result.direct.rows:,} rows, median of {repeats} runs",
        f"{'road':<52} {'requests':>8} {'rows/s':>12} {'median s':>9}",
    ]
    for road in (result.direct, result.batched, result.unbatched):
        median = statistics.median(road.seconds)
        requests = str(road.requests) if road.requests else "-"
        lines.append(f"{road.name:<52} {requests:>8} {road.rate:>12,.0f} {median:>9.3f}")
    lines.append(
        f"gateway / direct: {result.ratio:.2f}x (target >= {RATIO_TARGET:.2f}); "
        f"batched / unbatched: {result.batched.rate / result.unbatched.rate:.2f}x rows/s "
        f"with {result.batched.requests} vs {result.unbatched.requests} requests; "
        f"session mint: {result.mint_s * 1000:.0f} ms"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gateway benchmark and print rows/s, requests and ratios."""
    parser = argparse.ArgumentParser(
        prog="sheetplane bench gateway", description=__doc__, formatter_class=PlainHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=200_000, help="rows of the sheet read (default 200,000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed reads of each kind; medians (default 5)"
    )
    parser.add_argument("--database-url", default=None, help="default: SHEETPLANE_DATABASE_URL")
    args = parser.parse_args(argv)
    url = args.database_url or database_url_from_env()
    if url is not None:
        result = trio.run(run_bench, url, args.rows, args.repeats)
    else:
        with EmbeddedPostgres() as server:
            result = trio.run(run_bench, server.url, args.rows, args.repeats)
    print(report(result, args.repeats))
    for road in (result.direct, result.batched, result.unbatched):
        print(f"  {road.name}: {[round(s, 3) for s in road.seconds]} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
