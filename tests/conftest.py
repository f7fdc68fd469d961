"""Shared test setup: keep CPU threads in check when pytest-xdist runs several workers on a small machine."""

import os
import shutil
import sys
import tempfile

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run the CUDA paths for real: skipped where CUDA is not available."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (pytest -m gpu on a GPU machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_configure(config):
    """Data fingerprints cache their file digests (spectraflow_monai.utils.fingerprint): in a folder of this session,
    not in the user's cache folder."""
    if not os.environ.get("SPECTRAFLOW_FINGERPRINT_CACHE"):
        folder = tempfile.mkdtemp(prefix="spectraflow_digests_")
        os.environ["SPECTRAFLOW_FINGERPRINT_CACHE"] = os.path.join(folder, "file_digests.json")
        config.stash[_DIGESTS] = folder


def pytest_unconfigure(config):
    folder = config.stash.get(_DIGESTS, None)
    if folder is None:
        return
    fingerprint = sys.modules.get("spectraflow_monai.utils.fingerprint")
    if fingerprint is not None:
        fingerprint.flush()
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop("SPECTRAFLOW_FINGERPRINT_CACHE", None)


_DIGESTS = pytest.StashKey[str]()
