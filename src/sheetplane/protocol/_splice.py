"""The bodies built around bytes already encoded: pages and staged chunks.

A page's rows reach the gateway as the compact JSON Postgres wrote (the store
measured exactly those bytes against the read budget), and a staged chunk's
keys and rows leave the client as the JSON its encoder wrote once (to check,
measure and send them). Neither is decoded and encoded again: the envelope
around them is written here, and the bytes the envelope adds are stated here
once, for the store's budget to count the same bytes the server sends.

::

    {"pages":[P,P,...]}                      ANSWER_OVERHEAD + the commas
    {"rows":[R,R,...],"limit":L,"offset":O}  PAGE_OVERHEAD + digits of L and O
    {...,"keys":[...],"rows":[...]}          a chunk: its envelope, then its arrays

Every constant is checked at import against the converter's own encoding of
an empty page, so the splice and the messages cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from . import _messages as m
from ._wire import encode_body

__all__ = [
    "ANSWER_OVERHEAD",
    "PAGE_OVERHEAD",
    "chunk_body",
    "page_body",
    "page_overhead",
    "pages_body",
]

_PAGES_OPEN: Final = b'{"pages":['
_PAGES_CLOSE: Final = b"]}"
_ROWS_OPEN: Final = b'{"rows":['

#: The bytes of a batch answer around its pages: ``{"pages":[`` and ``]}``.
ANSWER_OVERHEAD: Final = len(_PAGES_OPEN) + len(_PAGES_CLOSE)
#: The bytes of one page around its rows, its limit's and its offset's digits aside:
#: ``{"rows":[``, ``],"limit":``, ``,"offset":`` and ``}``.
PAGE_OVERHEAD: Final = len(_ROWS_OPEN) + len(b'],"limit":') + len(b',"offset":') + len(b"}")


def page_overhead(limit: int, offset: int) -> int:
    """The bytes of a page answering ``limit`` rows from ``offset``, rows aside."""
    return PAGE_OVERHEAD + len(str(limit)) + len(str(offset))


def page_body(
    rows: Iterable[bytes],
    limit: int,
    offset: int,
    next_after: m.RowCursorWire | m.Absent | None = m.ABSENT,
) -> bytes:
    """A page (``ReadRowsAnswer``) around rows already encoded: the envelope is the
    converter's, with the rows spliced in where its empty list is."""
    empty = encode_body(
        m.unstructure(m.ReadRowsAnswer(rows=[], limit=limit, offset=offset, next_after=next_after))
    )
    if not empty.startswith(_ROWS_OPEN + b"]"):
        raise AssertionError("a page answer's wire form starts with its rows")
    return b"".join((_ROWS_OPEN, b",".join(rows), empty[len(_ROWS_OPEN) :]))


def pages_body(pages: Iterable[bytes]) -> bytes:
    """A batch answer (``ReadRowsBatchAnswer``) around pages already built."""
    return b"".join((_PAGES_OPEN, b",".join(pages), _PAGES_CLOSE))


def chunk_body(envelope: bytes, keys: bytes, rows: bytes) -> bytes:
    """A staged chunk's request: ``envelope`` (its other members, encoded, no ``keys``
    or ``rows``) with the encoded ``keys`` and ``rows`` arrays appended."""
    if not envelope.endswith(b"}"):
        raise AssertionError("a chunk's envelope is a JSON object")
    return b"".join((envelope[:-1], b',"keys":', keys, b',"rows":', rows, b"}"))


def _check() -> None:
    """The overheads are what the converter writes for an empty page and answer."""
    page = encode_body(m.unstructure(m.PageWire(rows=[], limit=7, offset=42)))
    assert len(page) == page_overhead(7, 42), page
    assert page_body([], 7, 42) == page
    answer = encode_body(m.unstructure(m.ReadRowsBatchAnswer(pages=[])))
    assert len(answer) == ANSWER_OVERHEAD and pages_body([]) == answer, answer


_check()
