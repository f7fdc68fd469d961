"""Every HD95 of the package goes through the one surface-distance core and agrees with MONAI / a brute force."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from monai.metrics import compute_hausdorff_distance
from scipy.spatial.distance import cdist

from spectraflow_monai.metrics import (
    HD95EmptyAsDiagonalMetric,
    SegmentationMetricSuite,
    compute_hd95,
    hd95_by_definition,
    hd95_monai,
    hd95_pooled,
    organ_metrics,
)
from spectraflow_monai.metrics import surface as surface_module


def _masks(shape, seed):
    """An ellipsoid ground truth and a shifted, differently shaped prediction with a false-positive island."""
    rng = np.random.default_rng(seed)
    grid = np.meshgrid(*[np.arange(n, dtype=float) for n in shape], indexing="ij")
    centre = [n / 2 for n in shape]
    gt = sum(((x - c) / (0.3 * n)) ** 2 for x, c, n in zip(grid, centre, shape)) < 1
    shift = rng.integers(-2, 3, size=len(shape))
    pred = sum(((x - c - s) / (0.25 * n)) ** 2 for x, c, s, n in zip(grid, centre, shift, shape)) < 1
    island = tuple(slice(0, 3) for _ in shape)  # touches the array border
    pred[island] = True
    return pred, gt


def _brute_force(pred, gt, spacing):
    """(max of directed p95, pooled p95) from all pairwise distances of 2n-neighbour surfaces."""

    def surface(m):
        m = np.pad(m, 1)
        inner = m.copy()
        for axis in range(m.ndim):
            inner &= np.roll(m, 1, axis) & np.roll(m, -1, axis)
        return (m & ~inner)[tuple(slice(1, -1) for _ in range(m.ndim))]

    sp = np.ones(pred.ndim) if spacing is None else np.asarray(spacing, float)
    d = cdist(np.argwhere(surface(pred)) * sp, np.argwhere(surface(gt)) * sp)
    d_pg, d_gp = d.min(1), d.min(0)
    return max(np.percentile(d_pg, 95), np.percentile(d_gp, 95)), np.percentile(np.concatenate([d_pg, d_gp]), 95)


def _monai_hd95(pred, gt, spacing):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hd = compute_hausdorff_distance(
            torch.from_numpy(pred)[None, None].float(),
            torch.from_numpy(gt)[None, None].float(),
            include_background=True,
            percentile=95,
            spacing=None if spacing is None else list(spacing),
        )
    return float(hd[0, 0])


CASES = [
    ((40, 36), (1.0, 0.7), 0),
    ((40, 36), (0.5, 2.0), 1),
    ((33, 29), None, 2),
    ((20, 18, 9), (0.7, 0.8, 2.5), 0),
    ((16, 21, 12), (1.5, 1.0, 0.6), 1),
    ((18, 18, 10), None, 2),
]


@pytest.mark.parametrize("shape, spacing, seed", CASES)
def test_pair_functions_agree_with_monai_and_brute_force(shape, spacing, seed):
    pred, gt = _masks(shape, seed)
    ref_monai, ref_pooled = _brute_force(pred, gt, spacing)
    assert ref_monai != pytest.approx(ref_pooled)  # the two definitions differ on these masks
    monai_value = _monai_hd95(pred, gt, spacing)
    assert monai_value == pytest.approx(ref_monai, rel=1e-5)
    assert hd95_monai(pred, gt, spacing) == pytest.approx(monai_value, rel=1e-5)
    assert hd95_pooled(pred, gt, spacing) == pytest.approx(ref_pooled, rel=1e-9)
    both = hd95_by_definition(torch.from_numpy(pred), torch.from_numpy(gt), spacing=spacing)
    assert both == pytest.approx({"monai": monai_value, "pooled": ref_pooled}, rel=1e-5)


@pytest.mark.parametrize("shape, spacing, seed", CASES)
@pytest.mark.parametrize("definition", ["monai", "pooled"])
def test_batch_metrics_agree(shape, spacing, seed, definition):
    """compute_hd95 and HD95EmptyAsDiagonalMetric (2D and 3D) against MONAI / the brute force."""
    pred, gt = _masks(shape, seed)
    expected = _monai_hd95(pred, gt, spacing) if definition == "monai" else _brute_force(pred, gt, spacing)[1]
    p = torch.from_numpy(np.stack([pred, np.zeros_like(pred)]))[:, None].float()
    g = torch.from_numpy(np.stack([gt, gt]))[:, None].float()
    values = compute_hd95(p, g, definition, spacing=spacing)
    assert values[0, 0].item() == pytest.approx(expected, rel=1e-5) and math.isnan(values[1, 0].item())
    diag = HD95EmptyAsDiagonalMetric(definition=definition, spacing=spacing)(p, g)
    size = np.asarray(shape, float) * (1.0 if spacing is None else np.asarray(spacing))
    assert diag[:, 0].tolist() == pytest.approx([expected, float(np.sqrt((size**2).sum()))], rel=1e-5)


@pytest.mark.parametrize("shape, spacing, seed", CASES)
def test_suite_and_organ_metrics_agree(shape, spacing, seed):
    """2D/3D per-image suite and the 3D organ metrics give MONAI's and the pooled value of the same pair."""
    pred, gt = _masks(shape, seed)
    monai_value = _monai_hd95(pred, gt, spacing)
    pooled_value = _brute_force(pred, gt, spacing)[1]
    row = SegmentationMetricSuite(spacing=spacing).update(pred[None, None], gt[None, None].astype(np.uint8))[0]
    assert row["hd95_monai"] == pytest.approx(monai_value, rel=1e-5)
    assert row["hd95_pooled"] == pytest.approx(pooled_value, rel=1e-9)
    assert row["hd95_monai_empty_as_diagonal"] == row["hd95_monai"]
    labels_pred = np.where(pred, 2, 0).astype(np.uint8)
    labels_gt = np.where(gt, 2, 0).astype(np.uint8)
    for fast in (True, False):
        m = organ_metrics(labels_pred, labels_gt, spacing=spacing, num_classes=3, fast=fast)["class_2"]
        assert m["hd95"] == pytest.approx(monai_value, rel=1e-5)
        assert m["hd95_transunet"] == pytest.approx(_brute_force(pred, gt, None)[1], rel=1e-9)  # voxels


def test_every_hd95_goes_through_the_core(monkeypatch):
    """Pair functions, the 2D suite, the batch metric and the 3D organ metrics all call the one core."""
    calls = []
    nearest = surface_module._nearest

    def counting(src, dst, shared, scale, workers):
        calls.append(src.ndim)
        return nearest(src, dst, shared, scale, workers)

    monkeypatch.setattr(surface_module, "_nearest", counting)
    pred, gt = _masks((20, 18), 0)
    vol_pred, vol_gt = _masks((12, 10, 8), 1)
    hd95_monai(pred, gt)
    hd95_pooled(pred, gt, (1.0, 0.5))
    SegmentationMetricSuite().update(pred[None, None], gt[None, None])
    compute_hd95(torch.from_numpy(vol_pred)[None, None], torch.from_numpy(vol_gt)[None, None], "pooled")
    organ_metrics(vol_pred.astype(np.uint8), vol_gt.astype(np.uint8), spacing=(1.0, 1.0, 2.0), num_classes=2)
    # 2 directions each: pair functions 2 + 2, suite (both definitions from one computation) 2, batch 2, organ
    # metrics 4 (MONAI in mm and pooled in voxels from one surface extraction)
    assert calls == [2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3]
