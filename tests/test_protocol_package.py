"""The protocol package is importable without any I/O library."""

from __future__ import annotations

import subprocess
import sys

import sheetplane.protocol

_IO_LIBRARIES = ("httpx", "httpcore", "starlette", "hypercorn", "psycopg", "psycopg_pool")


def test_importing_the_protocol_imports_no_http_server_or_database_library() -> None:
    modules = [
        f"sheetplane.protocol.{name}"
        for name in ("_wire", "_converter", "_messages", "_domain", "_openapi")
    ]
    probe = (
        "import sys\n"
        + "".join(f"import {module}\n" for module in modules)
        + f"print(','.join(sorted(m for m in {_IO_LIBRARIES!r} if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
    assert sheetplane.protocol.__doc__ is not None
