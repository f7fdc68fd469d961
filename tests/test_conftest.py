"""The suite's own setup (tests/conftest.py): the low-disk line a run prints first."""

from collections import namedtuple

import pytest

from tests import conftest

Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("free_gb, warned", [(0.3, True), (1.9, True), (2.0, False), (60.0, False)])
def test_low_disk_warning(monkeypatch, tmp_path, free_gb, warned):
    monkeypatch.setattr(conftest.shutil, "disk_usage", lambda _: Usage(0, 0, int(free_gb * 1024**3)))
    line = conftest.low_disk_warning(str(tmp_path))
    assert (line is not None) == warned
    if warned:
        assert f"{free_gb:.1f} GB free in {tmp_path}" in line and "TMPDIR" in line
