"""The protocol package is importable without any I/O library."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sheetplane.protocol

_IO_LIBRARIES = ("httpx", "httpcore", "starlette", "hypercorn", "psycopg", "psycopg_pool")


def test_importing_the_protocol_imports_no_http_server_or_database_library() -> None:
    modules = [
        f"sheetplane.protocol.{name}"
        for name in (
            "_wire",
            "_converter",
            "_messages",
            "_domain",
            "_errors",
            "_receive",
            "_splice",
            "_openapi",
        )
    ]
    probe = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in modules)
        + f"print(','.join(sorted(m for m in {_IO_LIBRARIES!r} if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
    assert sheetplane.protocol.__doc__ is not None


def test_every_action_is_named_once_by_its_request_class() -> None:
    from sheetplane.gateway.server._actions import HANDLERS
    from sheetplane.protocol import _messages as m

    assert tuple(m.action_of(request) for request, _ in m.EXCHANGES) == m.ACTIONS
    assert len(set(m.ACTIONS)) == len(m.ACTIONS)
    for action, request in m.REQUESTS.items():
        assert m.ANSWERS[action] is dict(m.EXCHANGES)[request]
    assert set(HANDLERS) == set(m.ACTIONS)


def test_two_converters_with_different_policies_do_not_share_rules() -> None:
    import attrs

    from sheetplane.protocol._converter import WireConverter, WireError

    @attrs.frozen(kw_only=True)
    class Probe:
        name: str

    open_ = WireConverter(closed=frozenset(), uncapped=frozenset(), writes_nulls=frozenset())
    closed = WireConverter(
        closed=frozenset({Probe}), uncapped=frozenset(), writes_nulls=frozenset()
    )
    assert open_.structure({"name": "a", "extra": 1}, Probe) == Probe(name="a")
    with pytest.raises(WireError, match="extra"):
        closed.structure({"name": "a", "extra": 1}, Probe)


def test_read_cursor_converts_both_ways_in_the_protocol() -> None:
    """``input.after`` and ``nextAfter`` are read and written by the protocol package,
    and ``RowCursor`` is one class wherever it is imported from."""
    import datetime as dt

    import sheetplane.store
    from sheetplane._types import RowCursor
    from sheetplane.protocol import _domain as d
    from sheetplane.protocol import _messages as m

    assert sheetplane.store.RowCursor is RowCursor
    cursor = RowCursor(7, dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC), "k-7")
    wire = d.row_cursor_wire(cursor)
    assert wire == m.RowCursorWire(
        input_index=7, created_at="2026-01-02T03:04:05.000006+00:00", key="k-7"
    )
    assert d.row_cursor_of(m.structure(m.unstructure(wire), m.RowCursorWire)) == cursor
    assert d.row_cursor_wire(None) is None
    assert d.row_cursor_of(None) is None
    for created_at, key, fragment in [
        ("yesterday", "k", "input.after.createdAt must be an ISO 8601 timestamp"),
        ("2026-01-02T03:04:05", "k", "input.after.createdAt must carry a time zone"),
        ("2026-01-02T03:04:05+00:00", "a\x00b", "input.after.key must be text"),
        ("2026-01-02T03:04:05+00:00", "\ud800", "input.after.key must be text"),
    ]:
        bad = m.RowCursorWire(input_index=None, created_at=created_at, key=key)
        with pytest.raises(m.WireError, match=fragment):
            d.row_cursor_of(bad)
