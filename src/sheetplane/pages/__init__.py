"""Pages: request and result values, the adaptive splitter, the page reader, the two
roads, an attempt's shares on either road, and terminal writes on either road."""

from __future__ import annotations

from .._types import Page as Page
from .._types import PageRequest as PageRequest
from ._reader import PageReader as PageReader
from ._reader import ReadScope as ReadScope
from ._reader import SheetRoad as SheetRoad
from ._reader import normalize_page_request as normalize_page_request
from ._reader import token_digest as token_digest
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
    "DirectRoad",
    "DirectShareRoad",
    "DirectWrites",
    "GatewayCursor",
    "GatewayRoad",
    "GatewayShareRoad",
    "GatewayWrites",
    "Page",
    "PageReader",
    "PageRequest",
    "ReadBatch",
    "ReadScope",
    "RoadStats",
    "ShareRoad",
    "SheetRoad",
    "TerminalWrites",
    "normalize_page_request",
    "read_pages_adaptive",
    "session_rows",
    "token_digest",
]
