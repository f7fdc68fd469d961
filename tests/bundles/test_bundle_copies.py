"""Each bundle folder stands alone (a model-zoo bundle is copied out on its own), so the files both bundles need are
copies in each folder, not links or a shared file. These tests keep the copies from drifting apart: they name the
files meant to be the same, and a copy edited in one bundle only fails here, naming the file and where it differs.

A copy that must differ for a real reason leaves :data:`SAME_BYTES` / :data:`SAME_CONFIG` (and the reason goes into
:data:`DIFFERENT_ON_PURPOSE`); every other file the two bundles hold byte for byte the same must be listed, so a new
shared copy is kept in step from its first commit."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from monai.bundle import ConfigParser

from tests.bundles.helpers import REPO

BUNDLES = ("spectraflow_2d_segmentation", "spectraflow_synapse_segmentation")
FOLDERS = tuple(REPO / "bundles" / name for name in BUNDLES)
# folders a run may write inside a bundle folder (never shipped, see .gitignore and setup.py)
RUN_OUTPUTS = {"__pycache__", "data", "logs", "cache", "eval", "predictions", "models"}

# byte-identical in both bundles: edit one, copy it over the other
SAME_BYTES = ("configs/train_stage1.yaml", "configs/multi_gpu_train.yaml", "configs/logging.conf", "LICENSE")
# the same configuration (every key and value as MONAI parses them); the comments speak of the bundle's own inputs
# (2D images / CT volumes and its slice inferer), so the bytes differ
SAME_CONFIG = ("configs/inference_onnx.yaml",)
# present in both bundles and different on purpose: the bundle's own data, transforms, model record and docs
DIFFERENT_ON_PURPOSE = (
    "configs/train.yaml", "configs/evaluate.yaml", "configs/inference.yaml", "configs/metadata.json",
    "docs/README.md", "docs/data_license.txt",
)  # fmt: skip


MISSING = "<missing>"


def _copies(relative: str) -> tuple[Path, Path]:
    return FOLDERS[0] / relative, FOLDERS[1] / relative


def _shipped(folder: Path) -> set[str]:
    """The files of a bundle folder (relative paths), without run outputs that may sit in it (as setup.py ships it)."""
    files = (p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    return {f.as_posix() for f in files if not RUN_OUTPUTS.intersection(f.parts) and f.suffix != ".pyc"}


def _in_both() -> list[str]:
    """Files (relative paths) that both bundle folders hold."""
    return sorted(_shipped(FOLDERS[0]) & _shipped(FOLDERS[1]))


def _diff(a: Path, b: Path, limit: int = 40) -> str:
    lines = difflib.unified_diff(
        a.read_text().splitlines(), b.read_text().splitlines(), str(a.relative_to(REPO)), str(b.relative_to(REPO)),
        lineterm="",
    )  # fmt: skip
    return "\n".join(list(lines)[:limit])


@pytest.mark.parametrize("relative", SAME_BYTES + SAME_CONFIG)
def test_each_bundle_holds_its_own_copy(relative):
    for path in _copies(relative):
        assert path.is_file() and not path.is_symlink(), f"{path.relative_to(REPO)}: a regular file in each bundle"


@pytest.mark.parametrize("relative", SAME_BYTES)
def test_byte_identical_copies_are_the_same(relative):
    a, b = _copies(relative)
    assert a.read_bytes() == b.read_bytes(), (
        f"{relative} differs between {BUNDLES[0]} and {BUNDLES[1]}; these files are meant to be byte-identical: "
        f"{', '.join(SAME_BYTES)}. Copy the edited one over the other (or, if they must differ, move it to "
        f"DIFFERENT_ON_PURPOSE in {Path(__file__).name}).\n{_diff(a, b)}"
    )


@pytest.mark.parametrize("relative", SAME_CONFIG)
def test_same_config_copies_parse_the_same(relative):
    a, b = _copies(relative)
    first, second = (ConfigParser.load_config_file(str(p)) for p in (a, b))
    differing = sorted(k for k in first.keys() | second.keys() if first.get(k, MISSING) != second.get(k, MISSING))
    values = "\n".join(f"  {k}: {first.get(k, MISSING)!r} / {second.get(k, MISSING)!r}" for k in differing)
    assert not differing, (
        f"{relative}: keys {differing} differ between {BUNDLES[0]} and {BUNDLES[1]}; these configs are meant to be the "
        f"same (comments aside): {', '.join(SAME_CONFIG)}. Make the keys the same in both (or, if they must differ, "
        f"move the file to DIFFERENT_ON_PURPOSE in {Path(__file__).name}).\n{values}"
    )


def test_every_file_in_both_bundles_is_listed():
    listed = set(SAME_BYTES + SAME_CONFIG + DIFFERENT_ON_PURPOSE)
    twice = [f for f in listed if (f in SAME_BYTES) + (f in SAME_CONFIG) + (f in DIFFERENT_ON_PURPOSE) > 1]
    assert not twice, f"listed in more than one set: {twice}"
    unlisted = [f for f in _in_both() if f not in listed]
    assert not unlisted, (
        f"{unlisted}: in both bundles but in none of SAME_BYTES, SAME_CONFIG, DIFFERENT_ON_PURPOSE of "
        f"{Path(__file__).name}; list each where it belongs"
    )
    gone = sorted(f for f in listed if not all(p.is_file() for p in _copies(f)))
    assert not gone, f"{gone}: listed in {Path(__file__).name} but not in both bundles"


def test_byte_identical_copies_are_listed_in_same_bytes():
    others = (f for f in _in_both() if f not in SAME_BYTES + SAME_CONFIG)
    same = [f for f in others if _copies(f)[0].read_bytes() == _copies(f)[1].read_bytes()]
    assert not same, f"{same}: byte-identical in both bundles; list them in SAME_BYTES so that they stay so"
