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


#: the suite's peak use of the temporary folder (a fresh-clone ``.ci/run``: 1.6 GB, README "Tests"), with a margin
PEAK_TEMP_BYTES = 2 * 1024**3


def low_disk_warning(folder: str) -> str | None:
    """A line for a run that would fill its disk (less free space in ``folder`` than the suite's peak, where later
    tests fail with ``No space left on device``, far from the cause), else None."""
    free = shutil.disk_usage(folder).free
    if free >= PEAK_TEMP_BYTES:
        return None
    return (
        f"WARNING: {free / 1024**3:.1f} GB free in {folder}; the suite needs about {PEAK_TEMP_BYTES / 1024**3:.0f} GB "
        "there at its peak (free space, or set TMPDIR to a larger disk)"
    )


def pytest_sessionstart(session):
    """The low-disk line first, once (in the controller, not in each xdist worker), also under ``-q``."""
    if hasattr(session.config, "workerinput"):
        return
    line = low_disk_warning(tempfile.gettempdir())
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line, yellow=True, bold=True)


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
