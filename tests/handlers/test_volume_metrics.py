"""Tests of VolumeMetricsHandler: whole-volume organ metrics in an ignite evaluation, against hand-computed values."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from ignite.engine import Engine
from monai.data import MetaTensor

from spectraflow_monai.apps.synapse import ORGAN_DISPLAY_NAMES
from spectraflow_monai.handlers import VolumeMetricsHandler, spacing_from_affine

SPACING = (0.8, 0.9, 2.5)
SHAPE = (16, 12, 8)


def _volumes() -> tuple[np.ndarray, np.ndarray]:
    """A hand-made case with 4 classes (1 spleen, 2 right kidney, 3 left kidney; the others absent).

    - class 1: ground truth one voxel A = (2, 2, 2); prediction A and B = (12, 2, 2), 10 voxels away along axis 0.
      Surfaces are the voxels themselves. Distances pred -> gt: [0, 10 voxels = 8 mm]; gt -> pred: [0].
      MONAI HD95 = max(p95([0, 8]), p95([0])) = 0.95 * 8 = 7.6 mm; TransUNet pooled p95([0, 0, 10]) = 0.9 * 10 = 9
      voxels (linear interpolation at rank 0.95 * 2 = 1.9); DSC = 2 * 1 / (1 + 2) = 2/3.
    - class 2: predicted, absent from the ground truth: MONAI DSC and HD95 NaN; TransUNet (1, 0).
    - class 3: in the ground truth, not predicted: MONAI DSC 0, HD95 NaN; TransUNet (0, 0).
    """
    gt = np.zeros(SHAPE, np.uint8)
    pred = np.zeros(SHAPE, np.uint8)
    gt[2, 2, 2] = 1
    pred[2, 2, 2] = pred[12, 2, 2] = 1
    pred[5:7, 8:10, 4:6] = 2
    gt[10:12, 8:10, 4:6] = 3
    return pred, gt


def _meta(arr: np.ndarray, spacing=SPACING, name="img0001.nii.gz") -> MetaTensor:
    affine = torch.diag(torch.tensor([*spacing, 1.0], dtype=torch.float64))
    return MetaTensor(torch.from_numpy(arr[None].astype(np.float32)), affine=affine, meta={"filename_or_obj": name})


def _run(handler: VolumeMetricsHandler, items: list[dict]) -> Engine:
    """Evaluate ``items`` one per iteration (decollated outputs, as monai.engines produce them)."""
    engine = Engine(lambda e, batch: batch)
    handler.attach(engine)
    engine.run([[item] for item in items], max_epochs=1)
    return engine


def test_hand_computed_case_both_hd95_definitions(tmp_path):
    pred, gt = _volumes()
    organs = ["spleen", "right_kidney", "left_kidney"]
    handler = VolumeMetricsHandler(tmp_path, num_classes=4, organ_names=organs, display_names=ORGAN_DISPLAY_NAMES)
    engine = _run(handler, [{"pred": _meta(pred), "label": _meta(gt), "case": "0001"}])
    with open(tmp_path / "synapse_per_case.csv", newline="") as f:
        rows = {r["organ"]: r for r in csv.DictReader(f)}
    spleen = rows["spleen"]
    assert spleen["case"] == "0001" and (spleen["gt_voxels"], spleen["pred_voxels"]) == ("1", "2")
    assert float(spleen["dice"]) == pytest.approx(2 / 3, abs=1e-5)
    assert float(spleen["hd95"]) == pytest.approx(7.6, abs=1e-5)  # mm, max of the directed p95
    assert float(spleen["dice_transunet"]) == pytest.approx(2 / 3, abs=1e-5)
    assert float(spleen["hd95_transunet"]) == pytest.approx(9.0, abs=1e-5)  # voxels, pooled p95
    right = rows["right_kidney"]  # predicted only
    assert math.isnan(float(right["dice"])) and math.isnan(float(right["hd95"]))
    assert (float(right["dice_transunet"]), float(right["hd95_transunet"])) == (1.0, 0.0)
    left = rows["left_kidney"]  # missed
    assert float(left["dice"]) == 0.0 and math.isnan(float(left["hd95"]))
    assert (float(left["dice_transunet"]), float(left["hd95_transunet"])) == (0.0, 0.0)
    # means over organs: MONAI skips NaN, TransUNet averages everything
    assert engine.state.metrics["mean_dice"] == pytest.approx((2 / 3 + 0.0) / 2)
    assert engine.state.metrics["mean_hd95"] == pytest.approx(7.6)
    assert engine.state.metrics["mean_dice_transunet"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert engine.state.metrics["mean_hd95_transunet"] == pytest.approx(3.0)
    summary = json.loads((tmp_path / "synapse_summary.json").read_text())
    assert summary["cases"] == ["0001"] and summary["hd95_units"] == "mm"
    table = (tmp_path / "synapse_organs.md").read_text()
    assert "| Spleen | 66.7 | 7.60 | 66.7 | 9.00 |" in table
    assert handler.last_summary["num_cases"] == 1


def test_unit_spacing_and_names_from_meta(tmp_path):
    pred, gt = _volumes()
    handler = VolumeMetricsHandler(tmp_path, spacing=None, num_classes=4, order="class")
    items = [
        {"pred": _meta(pred, name="/d/case0002.npy.h5"), "label": _meta(gt, name="/d/case0002.npy.h5")},
        {"pred": torch.from_numpy(gt[None]), "label": _meta(gt, name="/d/img0003.nii.gz")},
    ]
    engine = _run(handler, items)
    with open(tmp_path / "synapse_per_case.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["case"] for r in rows] == ["case0002"] * 3 + ["img0003"] * 3
    assert float(rows[0]["hd95"]) == pytest.approx(9.5)  # voxels: 0.95 * 10
    assert float(rows[3]["dice"]) == 1.0 and float(rows[3]["hd95"]) == 0.0
    assert "HD95 (voxels)" in (tmp_path / "synapse_organs.md").read_text()
    # class_1: (9.5 + 0) / 2 cases; class_3: 0 (img0003; NaN for case0002 skipped); class_2: NaN everywhere
    assert engine.state.metrics["mean_hd95"] == pytest.approx((4.75 + 0.0) / 2)
    # every epoch starts a new table
    engine = Engine(lambda e, batch: batch)
    handler.attach(engine)
    engine.run([[items[1]]], max_epochs=2)
    assert handler.last_summary["num_cases"] == 1 and handler.last_summary["cases"] == ["img0003"]


def test_spacing_from_affine():
    affine = np.array([[0.0, 0.0, 2.0, 1.0], [-0.7, 0.0, 0.0, 2.0], [0.0, 0.7, 0.0, 3.0], [0, 0, 0, 1]])
    assert spacing_from_affine(affine) == pytest.approx((0.7, 0.7, 2.0))
    assert spacing_from_affine(torch.eye(3) * 2) == pytest.approx((2.0, 2.0))
    with pytest.raises(ValueError, match="3x3 or 4x4"):
        spacing_from_affine(np.eye(5))
    with pytest.raises(ValueError, match="invalid voxel spacing"):
        spacing_from_affine(np.diag([1.0, 0.0, 1.0, 1.0]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"output_dir": ""}, "output_dir"),
        ({"spacing": "mm"}, "spacing"),
        ({"spacing": [1.0, -1.0, 1.0]}, "spacing"),
        ({"num_classes": 1}, "num_classes"),
        ({"order": "alphabetical"}, "order"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        VolumeMetricsHandler(**{"output_dir": tmp_path, **kwargs})


def test_run_time_errors_name_the_case(tmp_path):
    pred, gt = _volumes()
    handler = VolumeMetricsHandler(tmp_path, num_classes=4)
    with pytest.raises(ValueError, match=r"case 0007: the prediction has shape .*\(Invertd\)"):
        _run(handler, [{"pred": _meta(pred[:-1]), "label": _meta(gt), "case": "0007"}])
    with pytest.raises(ValueError, match=r"case 0008: .*integer labels in \[0, 3\]"):
        _run(handler, [{"pred": _meta(pred * 2), "label": _meta(gt), "case": "0008"}])
    with pytest.raises(ValueError, match=r"case 0009: spacing='meta' needs the label as a MetaTensor"):
        _run(handler, [{"pred": _meta(pred), "label": torch.from_numpy(gt[None]), "case": "0009"}])
