"""Pages: request and result values, the adaptive splitter, the page reader."""

from __future__ import annotations

from .._page import Page as Page
from .._page import PageRequest as PageRequest
from ._splitter import ReadBatch as ReadBatch
from ._splitter import read_pages_adaptive as read_pages_adaptive

__all__ = ["Page", "PageRequest", "ReadBatch", "read_pages_adaptive"]
