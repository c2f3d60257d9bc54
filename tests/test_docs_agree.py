"""Statements two documents make about one fact agree with each other and with the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from sheetplane.testing import plugin

ROOT = Path(__file__).resolve().parent.parent


def test_the_plugins_postgres_durability_is_stated_alike_in_testing_and_store_docs() -> None:
    # docs/testing.md said the plugin's Postgres is not durable, docs/store.md that the
    # plugin starts a durable one; the plugin starts EmbeddedPostgres(durable=False).
    assert "EmbeddedPostgres(durable=False)" in inspect.getsource(plugin)
    testing = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    assert re.search(r"`sheetplane_database_url`[^\n]*not durable", testing)
    store = (ROOT / "docs" / "store.md").read_text(encoding="utf-8")
    durable = store[store.index("**Durable by default.**") :].split("\n\n", 1)[0]
    starters = durable[: durable.index("so a write the store acknowledged")]
    assert "plugin" not in starters, starters
    assert re.search(r"pytest plugin's `sheetplane_database_url`", " ".join(durable.split()))
