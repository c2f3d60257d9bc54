"""The runner-facing entry point: one block that holds a run's context and its parts.

::

    async with sheetplane.open_runtime(
        base_url=..., token=..., org_id=..., play_name=..., run_id=...,
        strategy="direct",            # or "gateway_only"
    ) as rt:
        writer = rt.writer("leads", contract)
        admission = await writer.start(rows)            # always through the gateway
        await writer.complete([CompleteRow(key, outputs), ...])
        async for row in rt.dataset("leads"):
            ...
        await rt.receipts().complete("send-42", {"ok": True})

``open_runtime`` opens, inside its block, a ``GatewayClient`` (HTTP), a
``SessionManager`` (scoped Postgres sessions, their pools and the tasks that
close them) and a ``PageReader`` (the batcher whose nursery runs every batch
read). Nothing it starts outlives the block.

Which road each operation takes:

=====================================  ==========================  =====================
operation                              ``direct``                  ``gateway_only``
=====================================  ==========================  =====================
dataset reads                          scoped session (rows.read)  gateway
``start`` on an empty sheet            one transaction on a        gateway (staged)
(a sequence)                           scoped session (rows.admit,
                                       COPY into the sheet)
``start``, any other                   staged: chunks on a scoped  staged: chunks,
                                       session (rows.stage),       begin and commit
                                       begin and commit by the     by the gateway
                                       gateway
``complete`` / ``fail``                scoped session              gateway
                                       (rows.read + rows.upsert)
``append`` / ``upsert`` / ``replace``  scoped session (one         gateway
                                       operation)
receipts, ``resolve_play``, ensure     gateway                     gateway
=====================================  ==========================  =====================

Admission has one owner, ``runtime/_admit.py``, which chooses the way in
(whole, staged, or at once) and leaves what differs to the road
(``pages.AdmissionRoad``: ``DirectAdmissions``, ``GatewayAdmissions``). On
``direct``, a first admission of a sequence is written once,
straight into the sheet, in one transaction of a ``rows.admit`` session whose
write version the sheet's own begin function takes (``store/_direct.py``);
everything else is staged (docs/store.md, "Staged admission"): the input's
chunks go into the sheet's staging area, on a scoped session on
``direct`` and by request on ``gateway_only``, and the gateway commits it
whole: re-admitting rows is the gateway's job. ``append``, ``upsert`` and
``replace`` write through a session the gateway mints for exactly that
operation on ``direct`` (as the runtime this library re-creates does), and by
the gateway's keyed-write actions on ``gateway_only``. Receipts and plays live
outside every sheet, where no session role is granted, so they go through the
gateway on both. Each family is one interface with an implementation per road
(``sheetplane.pages``); the runtime picks the roads, and the writer, the receipt
recorder and ``map`` call them without asking which road they are on.
"""

from __future__ import annotations

from .._map import MapProgress as MapProgress
from .._map import MapReport as MapReport
from .._types import CompleteRow as CompleteRow
from .._types import ContractColumn as ContractColumn
from .._types import FailRow as FailRow
from .._types import ReceiptCompletion as ReceiptCompletion
from .._types import ResolvedPlay as ResolvedPlay
from .._types import SheetContract as SheetContract
from .._types import TerminalWriteResult as TerminalWriteResult
from .._types import WriteResult as WriteResult
from ..admission import Admission as Admission
from ._context import RuntimeContext as RuntimeContext
from ._context import Strategy as Strategy
from ._receipts import ReceiptRecorder as ReceiptRecorder
from ._runtime import Runtime as Runtime
from ._runtime import RuntimeStats as RuntimeStats
from ._runtime import open_runtime as open_runtime
from ._writer import RowWriter as RowWriter

__all__ = [
    "Admission",
    "CompleteRow",
    "ContractColumn",
    "FailRow",
    "MapProgress",
    "MapReport",
    "ReceiptCompletion",
    "ReceiptRecorder",
    "ResolvedPlay",
    "RowWriter",
    "Runtime",
    "RuntimeContext",
    "RuntimeStats",
    "SheetContract",
    "Strategy",
    "TerminalWriteResult",
    "WriteResult",
    "open_runtime",
]
