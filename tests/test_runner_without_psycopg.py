"""A runner on the gateway road needs no database driver: with psycopg made
unimportable, ``open_runtime(strategy="gateway_only")`` admits, maps, writes and
reads back; the chunk codec it encodes with lives in ``protocol``, and the store
(which imports psycopg) loads only for the direct road."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator

import pytest
import trio

from sheetplane.gateway.server import RunningGateway, running_gateway

#: Python that makes psycopg and its pool unimportable in the process it runs in.
BLOCK_PSYCOPG = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("psycopg", "psycopg_pool", "psycopg_c", "psycopg_binary"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
"""

RUNNER = """
import json, trio, sheetplane

CONTRACT = sheetplane.SheetContract((
    sheetplane.ContractColumn("company", "company", "input"),
    sheetplane.ContractColumn("size", "size", "output"),
))

async def size(row):
    return {"size": len(row["company"])}

async def main(base_url, token):
    async with sheetplane.open_runtime(
        base_url=base_url, token=token, org_id="nopg-org", play_name="nopg",
        run_id="run-1", strategy="gateway_only",
    ) as rt:
        report = await rt.map("leads", CONTRACT, [{"company": "c" * i} for i in range(1, 31)], size)
        sizes = sorted([row["size"] async for row in rt.dataset("leads")])
    return report.completed, sizes

completed, sizes = trio.run(main, *sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0].startswith("psycopg")
                or m.startswith("sheetplane.store"))
print(json.dumps({"completed": completed, "sizes": sizes, "loaded": loaded}))
"""


@pytest.fixture
async def gateway(database_url: str) -> AsyncIterator[RunningGateway]:
    async with running_gateway(database_url, tokens={"tok-nopg": "nopg-org"}) as gw:
        yield gw


async def test_a_gateway_only_runner_maps_and_reads_with_psycopg_unimportable(
    gateway: RunningGateway,
) -> None:
    done = await trio.run_process(
        [sys.executable, "-c", BLOCK_PSYCOPG + RUNNER, gateway.base_url, "tok-nopg"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert answer == {"completed": 30, "sizes": list(range(1, 31)), "loaded": []}
