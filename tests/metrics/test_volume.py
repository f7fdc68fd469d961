"""Tests of the organ-wise 3D Synapse metrics."""

from __future__ import annotations

import csv
import math
import warnings

import numpy as np
import pytest
import torch
from monai.metrics import compute_dice, compute_hausdorff_distance
from monai.networks.utils import one_hot
from scipy.ndimage import binary_erosion
from scipy.spatial.distance import cdist

from spectraflow_monai.apps.synapse import ORGAN_DISPLAY_NAMES, PAPER_ORGAN_ORDER, SYNAPSE_ORGANS
from spectraflow_monai.metrics import VOLUME_METRIC_KEYS, VolumeMetricTable, organ_metrics

SPACING = (1.0, 1.0, 3.0)


def _cubes(shift_axis: int, shape=(10, 10, 10)):
    gt = np.zeros(shape, np.uint8)
    gt[2:6, 2:6, 2:6] = 1
    pred = np.roll(gt, 1, axis=shift_axis)
    return pred, gt


def _brute_force(p: np.ndarray, g: np.ndarray, spacing) -> tuple[float, float]:
    """(max of directed p95, pooled p95) from all-pairs distances between the surfaces."""
    sp = np.asarray(spacing, float)
    sp_pts = np.argwhere(p ^ binary_erosion(p)) * sp
    sg_pts = np.argwhere(g ^ binary_erosion(g)) * sp
    dist = cdist(sp_pts, sg_pts)
    d_pg, d_gp = dist.min(1), dist.min(0)
    return max(np.percentile(d_pg, 95), np.percentile(d_gp, 95)), np.percentile(np.concatenate([d_pg, d_gp]), 95)


@pytest.mark.parametrize("fast", [True, False])
def test_cubes_offset_by_one_voxel_anisotropic(fast):
    # shift along the 3 mm axis: 16 surface voxels per side lie 1 voxel = 3 mm away, the rest 0 or 1 mm
    m = organ_metrics(*_cubes(2), spacing=SPACING, num_classes=2, fast=fast)["class_1"]
    assert m["dice"] == pytest.approx(0.75)  # 2 * 48 / (64 + 64)
    assert m["dice_transunet"] == pytest.approx(0.75)
    assert m["hd95"] == pytest.approx(3.0)  # mm
    assert m["hd95_transunet"] == pytest.approx(1.0)  # voxels
    assert m["gt_voxels"] == m["pred_voxels"] == 64
    # shift along a 1 mm axis: both definitions give 1
    m = organ_metrics(*_cubes(0), spacing=SPACING, num_classes=2, fast=fast)["class_1"]
    assert (m["dice"], m["hd95"], m["hd95_transunet"]) == pytest.approx((0.75, 1.0, 1.0))
    # no spacing: the MONAI value is in voxels too
    m = organ_metrics(*_cubes(2), spacing=None, num_classes=2, fast=fast)["class_1"]
    assert m["hd95"] == pytest.approx(1.0)


@pytest.mark.parametrize("fast", [True, False])
def test_max_of_directed_vs_pooled(fast):
    gt = np.zeros((12, 12, 12), np.uint8)
    gt[1:7, 1:7, 1:7] = 1
    pred = gt.copy()
    pred[9:11, 9:11, 8:12] = 1  # a spurious blob far from the ground truth, touching the border
    expected = _brute_force(pred.astype(bool), gt.astype(bool), SPACING)
    m = organ_metrics(pred, gt, spacing=SPACING, num_classes=2, fast=fast)["class_1"]
    assert m["hd95"] == pytest.approx(expected[0], rel=1e-5)
    expected_vox = _brute_force(pred.astype(bool), gt.astype(bool), (1, 1, 1))
    assert m["hd95_transunet"] == pytest.approx(expected_vox[1], rel=1e-6)
    assert m["hd95"] > 10 * SPACING[0] and m["hd95_transunet"] < 3  # the two definitions differ


def test_matches_monai_on_the_whole_volume():
    """Cropping per organ is exact: compare with MONAI's metrics on whole-volume one-hot tensors."""
    rng = np.random.default_rng(0)
    shape = (20, 18, 9)
    gt = np.zeros(shape, np.uint8)
    gt[0:8, 0:7, 0:5] = 1  # touches three borders
    gt[10:20, 5:15, 3:9] = 2
    gt[3:6, 10:18, 1:4] = 4
    pred = gt.copy()
    noise = rng.random(shape) < 0.08
    pred[noise] = rng.integers(0, 5, size=int(noise.sum()))
    pred[12:16, 0:3, 0:2] = 3  # class 3: predicted only
    m = organ_metrics(torch.from_numpy(pred)[None, None], torch.from_numpy(gt), spacing=(0.7, 0.8, 2.5), num_classes=5)
    p1h = one_hot(torch.from_numpy(pred)[None, None].long(), 5)
    g1h = one_hot(torch.from_numpy(gt)[None, None].long(), 5)
    dice = compute_dice(p1h, g1h, include_background=False)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hd = compute_hausdorff_distance(p1h, g1h, percentile=95, spacing=[0.7, 0.8, 2.5])[0]
    for c, name in enumerate(["class_1", "class_2", "class_3", "class_4"]):
        if c == 2:  # class 3: empty ground truth -> NaN in MONAI's conventions
            assert math.isnan(m[name]["dice"]) and math.isnan(float(dice[c])) and math.isnan(m[name]["hd95"])
            continue
        assert m[name]["dice"] == pytest.approx(float(dice[c]), abs=1e-6)
        assert m[name]["hd95"] == pytest.approx(float(hd[c]), rel=1e-5)
        ref = organ_metrics(pred, gt, spacing=(0.7, 0.8, 2.5), num_classes=5, fast=False)[name]
        assert [m[name][k] for k in VOLUME_METRIC_KEYS] == pytest.approx([ref[k] for k in VOLUME_METRIC_KEYS], rel=1e-5)


def test_empty_organ_conventions():
    gt = np.zeros((8, 8, 4), np.uint8)
    pred = np.zeros_like(gt)
    gt[1:3, 1:3, 1:3] = 1  # organ 1: predicted empty
    pred[5:7, 5:7, 1:3] = 2  # organ 2: ground truth empty
    m = organ_metrics(pred, gt, spacing=SPACING, num_classes=4, organ_names=["a", "b", "c"])
    assert list(m) == ["a", "b", "c"]
    # pred empty, gt not: MONAI Dice 0, HD95 NaN; TransUNet (0, 0)
    assert m["a"]["dice"] == 0.0 and math.isnan(m["a"]["hd95"])
    assert (m["a"]["dice_transunet"], m["a"]["hd95_transunet"]) == (0.0, 0.0)
    # gt empty, pred not: MONAI NaN, NaN; TransUNet (1, 0)
    assert math.isnan(m["b"]["dice"]) and math.isnan(m["b"]["hd95"])
    assert (m["b"]["dice_transunet"], m["b"]["hd95_transunet"]) == (1.0, 0.0)
    # both empty: MONAI NaN, NaN; TransUNet (0, 0)
    assert math.isnan(m["c"]["dice"]) and math.isnan(m["c"]["hd95"])
    assert (m["c"]["dice_transunet"], m["c"]["hd95_transunet"]) == (0.0, 0.0)


def test_synapse_default_names_and_2d():
    gt = np.zeros((6, 6), np.int64)
    gt[1:4, 1:4] = 5
    assert list(organ_metrics(gt, gt, num_classes=9))[0] == "class_1"  # generic names: metrics know no organs
    m = organ_metrics(gt, gt, num_classes=9, organ_names=SYNAPSE_ORGANS)
    assert list(m)[0] == "spleen" and m["liver"]["dice"] == 1.0 and m["liver"]["hd95"] == 0.0
    assert m["liver"]["hd95_transunet"] == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"pred_volume": np.zeros((4, 4, 3))}, "same shape"),
        ({"pred_volume": np.full((4, 4, 4), 9)}, r"\[0, 8\].*\[9\]"),
        ({"label_volume": np.full((4, 4, 4), 1.5)}, r"label_volume.*\[1\.5\]"),
        ({"pred_volume": np.zeros((2, 4, 4, 4))}, "label map"),
        ({"spacing": (1.0, 2.0)}, "spacing"),
        ({"spacing": (1.0, -2.0, 1.0)}, "spacing"),
        ({"num_classes": 1}, "num_classes"),
        ({"organ_names": ["a", "b"]}, "organ_names"),
        ({"workers": 0}, "workers"),
        ({"pred_volume": [[0]]}, "numpy array or a torch tensor"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"pred_volume": np.zeros((4, 4, 4), np.uint8), "label_volume": np.zeros((4, 4, 4), np.uint8), **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        organ_metrics(**args)


def test_volume_metric_table(tmp_path):
    table = VolumeMetricTable(9, SYNAPSE_ORGANS, PAPER_ORGAN_ORDER, ORGAN_DISPLAY_NAMES)
    gt = np.zeros((10, 10, 10), np.uint8)
    gt[2:6, 2:6, 2:6] = 7  # aorta
    gt[7:9, 7:9, 7:9] = 4  # gallbladder
    pred = np.roll(gt, 1, axis=2)
    pred[pred == 4] = 0  # gallbladder missed
    table.add("0001", pred, gt, spacing=SPACING)
    table.add("0002", gt, gt, spacing=SPACING)
    s = table.summary()
    assert s["num_cases"] == 2 and s["hd95_units"] == "mm"
    assert s["organs"]["aorta"]["dice"] == pytest.approx((0.75 + 1.0) / 2)
    assert s["organs"]["aorta"]["hd95"] == pytest.approx((3.0 + 0.0) / 2)
    assert s["organs"]["gallbladder"]["dice"] == pytest.approx(0.5)  # (0 + 1) / 2
    assert math.isnan(s["organs"]["liver"]["dice"]) and s["organs"]["liver"]["excluded"]["dice"] == 2
    assert s["organs"]["liver"]["dice_transunet"] == 0.0  # both empty -> 0 in TransUNet's convention
    assert s["organs"]["gallbladder"]["excluded"]["hd95"] == 1
    assert s["mean"]["dice"] == pytest.approx((0.875 + 0.5) / 2)  # only organs with a defined DSC
    assert s["mean"]["dice_transunet"] == pytest.approx((0.875 + 0.5) / 8)  # TransUNet: plain mean of 8 organs

    out = table.save(tmp_path / "eval")
    assert out["num_cases"] == 2
    with open(tmp_path / "eval" / "synapse_per_case.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 and rows[0]["case"] == "0001" and rows[0]["organ"] == "spleen"
    aorta = [r for r in rows if r["organ"] == "aorta"][0]
    assert float(aorta["dice"]) == pytest.approx(0.75) and float(aorta["hd95_transunet"]) == pytest.approx(1.0)
    md = (tmp_path / "eval" / "synapse_organs.md").read_text()
    lines = md.splitlines()
    assert lines[0].startswith("| Organ | DSC (%) | HD95 (mm)")
    assert lines[2].startswith("| Aorta | 87.5 | 1.50 |") and lines[3].startswith("| Gallbladder | 50.0 |")
    assert [ln.split("|")[1].strip() for ln in lines[2:10]] == [
        "Aorta",
        "Gallbladder",
        "Left kidney",
        "Right kidney",
        "Liver",
        "Pancreas",
        "Spleen",
        "Stomach",
    ]
    assert lines[10].startswith("| **Mean** |")
    assert "max of the two directed 95th percentiles" in md and "pooled" in md


def test_volume_metric_table_errors():
    table = VolumeMetricTable(num_classes=3, order="class")
    vol = np.zeros((4, 4, 4), np.uint8)
    table.add("a", vol, vol, spacing=1.0)
    with pytest.raises(ValueError, match="already in the table"):
        table.add("a", vol, vol, spacing=1.0)
    with pytest.raises(ValueError, match="earlier cases are in mm"):
        table.add("b", vol, vol)  # voxels
    with pytest.raises(ValueError, match="lack organ"):
        table.add_metrics("c", {"class_1": {}})
    with pytest.raises(ValueError, match="order"):
        VolumeMetricTable(order="alphabetical")
    assert table.cases == ["a"] and len(table) == 1


def test_missed_organ_scores_volume_diagonal(tmp_path):
    gt = np.zeros((4, 6, 8), dtype=np.int64)
    gt[1, 1, 1], gt[2, 3, 4] = 1, 2
    pred = np.zeros_like(gt)
    pred[2, 3, 4] = 2  # organ 1 missed
    table = VolumeMetricTable(num_classes=3, order="class")
    m = table.add("case0", pred, gt, spacing=(2.0, 1.0, 0.5))
    assert math.isnan(m["class_1"]["hd95"])
    assert m["class_1"]["hd95_empty_as_diagonal"] == pytest.approx(math.sqrt(8.0**2 + 6.0**2 + 4.0**2))
    assert m["class_2"]["hd95_empty_as_diagonal"] == m["class_2"]["hd95"] == 0.0
    s = table.save(tmp_path)
    assert s["hd95_dropped"] == 1 and s["organs"]["class_1"]["hd95_dropped"] == 1
    assert s["mean"]["hd95_empty_as_diagonal"] == pytest.approx(math.sqrt(116) / 2)
    assert "HD95, empty = diagonal (mm)" in (tmp_path / "synapse_organs.md").read_text()
