"""The multiprocess exposition (``serve --workers N``) while another worker is
creating its metric file: prometheus-client creates the file and sizes it
after, and a scrape in that window must still answer every other sample."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from sheetplane.gateway.server._metrics import MULTIPROCESS_DIR_ENV, GatewayMetrics


def test_a_scrape_skips_a_metric_file_another_worker_is_creating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = MmapedDict(str(tmp_path / "counter_101.db"))
    key = mmap_key(
        "sheetplane_admissions", "sheetplane_admissions_total", (), (), "Admissions committed."
    )
    written.write_value(key, 3.0, 0.0)
    written.close()
    # The other worker's file, created and not yet sized (MmapedDict.__init__).
    (tmp_path / "counter_202.db").touch()
    monkeypatch.setenv(MULTIPROCESS_DIR_ENV, str(tmp_path))

    text = GatewayMetrics().exposition().decode()

    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples["sheetplane_admissions_total"] == 3.0
