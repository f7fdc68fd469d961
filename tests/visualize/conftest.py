"""Fixtures of the visualize tests."""

from __future__ import annotations

import pytest

from tests.visualize.helpers import make_run_dir


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """A tiny evaluation folder (3 images with predictions + 1 without), TensorBoard logs of both stages."""
    return make_run_dir(tmp_path_factory.mktemp("run"))
