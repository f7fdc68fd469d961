"""Masks that are all background are reported before training (spectraflow_monai.data.validation.check_foreground)
and through the bundles' datalist helper (spectraflow_monai.apps.workflow.datalist, ``role``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image

from spectraflow_monai.apps.workflow import datalist
from spectraflow_monai.data import validation
from spectraflow_monai.data.validation import DatasetError, check_foreground, has_foreground


def _masks(folder, values):
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, value in enumerate(values):
        mask = np.zeros((16, 16), np.uint8)
        mask[4:8, 4:8] = value
        Image.fromarray(mask).save(folder / f"m{i}.png")
        entries.append({"image": str(folder / f"m{i}.png"), "label": str(folder / f"m{i}.png"), "label_threshold": 128})
    return entries


def test_training_masks_without_foreground_stop_the_run(tmp_path, caplog):
    entries = _masks(tmp_path, [0, 0, 100])  # 100 < label_threshold 128: background too
    with pytest.raises(DatasetError, match=r"demo \(train split\): every training mask \(3, e\.g\. .*m0\.png'\) is "
                                           r"background only.*allow_empty_masks"):  # fmt: skip
        check_foreground(entries, "demo (train split)")
    with caplog.at_level(logging.WARNING):
        assert check_foreground(entries, "demo", allow_empty=True) is False
        assert check_foreground(entries, "demo", role="validation") is False
    assert "training anyway" in caplog.text and "every validation mask (3" in caplog.text
    with pytest.raises(ValueError, match="role must be"):
        check_foreground(entries, "demo", role="test")


def test_one_mask_with_foreground_is_enough_and_is_read_first(tmp_path, monkeypatch):
    entries = _masks(tmp_path, [255, 0, 0])
    read = []
    original = validation._mask_array
    monkeypatch.setattr(validation, "_mask_array", lambda path: read.append(path) or original(path))
    assert check_foreground(entries, "demo") is True and len(read) == 1


def test_label_maps_and_slices(tmp_path):
    np.savez(tmp_path / "s0.npz", image=np.zeros((4, 4), np.float32), label=np.zeros((4, 4), np.uint8))
    np.savez(tmp_path / "s1.npz", image=np.zeros((4, 4), np.float32), label=np.eye(4, dtype=np.uint8) * 3)
    assert has_foreground(tmp_path / "s0.npz") is False and has_foreground(tmp_path / "s1.npz") is True
    (tmp_path / "junk.png").write_bytes(b"not an image")
    assert has_foreground(tmp_path / "junk.png") is None  # unreadable: the other checks report it
    with pytest.raises(DatasetError):
        check_foreground([{"label": str(tmp_path / "s0.npz")}], "slices")


class _Source:
    def __init__(self, entries, allow_empty_masks=False):
        self.entries, self.allow_empty_masks = entries, allow_empty_masks

    def datalist(self, split, **kwargs):
        return list(self.entries)


def test_the_bundles_datalists_check_their_masks_when_told_their_role(tmp_path, caplog):
    source = _Source(_masks(tmp_path, [0, 0]))
    assert len(datalist(source, "train")) == 2  # no role: not checked
    with pytest.raises(DatasetError, match=r"_Source \(train split\)"):
        datalist(source, "train", role="training")
    assert len(datalist(source, "train", role="training", allow_empty_masks=True)) == 2
    # by default the source decides: the run's DataSettings.allow_empty_masks, which the data sources carry
    assert len(datalist(_Source(source.entries, allow_empty_masks=True), "train", role="training")) == 2
    with caplog.at_level(logging.WARNING):
        assert len(datalist(source, "val", role="validation")) == 2
    assert "every validation mask" in caplog.text
