"""Pages: request and result values, the adaptive splitter, the page reader, the two
roads, and each family of operations behind one interface for both roads: an
attempt's shares, admissions, terminal writes, keyed writes, work receipts and plays."""

from __future__ import annotations

from .._types import Page as Page
from .._types import PageRequest as PageRequest
from ._admits import BEGIN_ADMISSION as BEGIN_ADMISSION
from ._admits import AdmissionRoad as AdmissionRoad
from ._admits import DirectAdmissions as DirectAdmissions
from ._admits import GatewayAdmissions as GatewayAdmissions
from ._keyed import DirectKeyedWrites as DirectKeyedWrites
from ._keyed import GatewayKeyedWrites as GatewayKeyedWrites
from ._keyed import KeyedWrites as KeyedWrites
from ._plays import Plays as Plays
from ._reader import PageReader as PageReader
from ._reader import ReadScope as ReadScope
from ._reader import SheetRoad as SheetRoad
from ._reader import normalize_page_request as normalize_page_request
from ._reader import token_digest as token_digest
from ._receipts import WorkReceipts as WorkReceipts
from ._roads import DirectRoad as DirectRoad
from ._roads import GatewayCursor as GatewayCursor
from ._roads import GatewayRoad as GatewayRoad
from ._roads import RoadStats as RoadStats
from ._shares import DirectShareRoad as DirectShareRoad
from ._shares import GatewayShareRoad as GatewayShareRoad
from ._shares import ShareRoad as ShareRoad
from ._splitter import ReadBatch as ReadBatch
from ._splitter import read_pages_adaptive as read_pages_adaptive
from ._writes import DirectWrites as DirectWrites
from ._writes import GatewayWrites as GatewayWrites
from ._writes import TerminalWrites as TerminalWrites
from ._writes import session_rows as session_rows

__all__ = [
    "BEGIN_ADMISSION",
    "AdmissionRoad",
    "DirectAdmissions",
    "DirectKeyedWrites",
    "DirectRoad",
    "DirectShareRoad",
    "DirectWrites",
    "GatewayAdmissions",
    "GatewayCursor",
    "GatewayKeyedWrites",
    "GatewayRoad",
    "GatewayShareRoad",
    "GatewayWrites",
    "KeyedWrites",
    "Page",
    "PageReader",
    "PageRequest",
    "Plays",
    "ReadBatch",
    "ReadScope",
    "RoadStats",
    "ShareRoad",
    "SheetRoad",
    "TerminalWrites",
    "WorkReceipts",
    "normalize_page_request",
    "read_pages_adaptive",
    "session_rows",
    "token_digest",
]
