import math

import numpy as np
import pytest
import torch

from spectraflow_monai.metrics.surface import hd95_monai, hd95_pooled, transunet_case_metrics

SQRT2_CASE = 1.0 + 0.05 * (math.sqrt(2.0) - 1.0)


def squares(offset=1, size=10):
    gt = np.zeros((size, size), dtype=np.uint8)
    pred = np.zeros((size, size), dtype=np.uint8)
    gt[2:8, 2:8] = 1
    pred[2 + offset : 8 + offset, 2 + offset : 8 + offset] = 1
    return pred, gt


def pixel_case():
    """gt: one pixel; pred: the same pixel plus one 4 px to the right.

    Surfaces are the pixels themselves: d(pred->gt) = {0, 4}, d(gt->pred) = {0}.
    monai: max(p95{0, 4}, p95{0}) = 0.95 * 4 = 3.8; pooled: p95{0, 0, 4} = 4 * (0.95 * 2 - 1) = 3.6.
    """
    gt = np.zeros((12, 12), dtype=np.uint8)
    pred = np.zeros((12, 12), dtype=np.uint8)
    gt[5, 5] = 1
    pred[5, 5] = pred[5, 9] = 1
    return pred, gt


def brute_force(pred, gt, spacing):
    """Independent reference: 4-/6-neighbour surfaces and all pairwise distances."""

    def surface(m):
        m = np.pad(m.astype(bool), 1)
        inner = m.copy()
        for axis in range(m.ndim):
            inner &= np.roll(m, 1, axis) & np.roll(m, -1, axis)
        return (m & ~inner)[tuple(slice(1, -1) for _ in range(m.ndim))]

    ps = np.argwhere(surface(pred)) * np.asarray(spacing)
    gs = np.argwhere(surface(gt)) * np.asarray(spacing)
    d = np.sqrt(((ps[:, None, :] - gs[None, :, :]) ** 2).sum(-1))
    d_pg, d_gp = d.min(1), d.min(0)
    return max(np.percentile(d_pg, 95), np.percentile(d_gp, 95)), np.percentile(np.concatenate([d_pg, d_gp]), 95)


def test_squares_both_definitions_agree_on_symmetric_case():
    # per direction: 2 zeros, 17 ones, one sqrt(2) (corner) -> p95 = 1 + 0.05 (sqrt2 - 1); pooled: same
    pred, gt = squares()
    assert hd95_monai(pred, gt) == pytest.approx(SQRT2_CASE, rel=1e-6)
    assert hd95_pooled(pred, gt) == pytest.approx(SQRT2_CASE, rel=1e-12)


@pytest.mark.parametrize(
    "spacing, monai_value, pooled_value", [(None, 3.8, 3.6), ((1.0, 2.0), 7.6, 7.2), (2.0, 7.6, 7.2)]
)
def test_definitions_differ_hand_computed(spacing, monai_value, pooled_value):
    pred, gt = pixel_case()
    assert hd95_monai(pred, gt, spacing) == pytest.approx(monai_value, rel=1e-6)
    assert hd95_pooled(pred, gt, spacing) == pytest.approx(pooled_value, rel=1e-12)
    # torch input gives the same
    assert hd95_pooled(torch.from_numpy(pred), torch.from_numpy(gt), spacing) == pytest.approx(pooled_value)


def test_3d_with_anisotropic_spacing():
    gt = np.zeros((8, 8, 12), dtype=bool)
    pred = np.zeros_like(gt)
    gt[4, 4, 2] = True
    pred[4, 4, 2] = pred[4, 4, 6] = True  # 4 voxels along the axis with spacing 2.5 -> distance 10
    assert hd95_pooled(pred, gt, (1.0, 1.0, 2.5)) == pytest.approx(9.0)
    assert hd95_monai(pred, gt, (1.0, 1.0, 2.5)) == pytest.approx(9.5, rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force_reference(seed):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:40, 0:40]
    gt = (yy - 20) ** 2 / 120 + (xx - 18) ** 2 / 60 < 1
    pred = (yy - 22 - rng.integers(-3, 4)) ** 2 / 80 + (xx - 21) ** 2 / 150 < 1
    pred[2:6, 30:36] = True  # a false-positive island makes the directions asymmetric
    spacing = (1.0, 0.7)
    ref_monai, ref_pooled = brute_force(pred, gt, spacing)
    assert hd95_pooled(pred, gt, spacing) == pytest.approx(ref_pooled, rel=1e-9)
    assert hd95_monai(pred, gt, spacing) == pytest.approx(ref_monai, rel=1e-5)
    assert ref_monai != pytest.approx(ref_pooled)


def test_mask_touching_border():
    gt = np.ones((6, 6), dtype=bool)  # everything is foreground: the border pixels are its surface
    pred = np.zeros((6, 6), dtype=bool)
    pred[:, :3] = True
    ref_monai, ref_pooled = brute_force(pred, gt, (1.0, 1.0))
    assert hd95_pooled(pred, gt) == pytest.approx(ref_pooled)
    assert hd95_monai(pred, gt) == pytest.approx(ref_monai, rel=1e-6)


@pytest.mark.parametrize("fn", [hd95_monai, hd95_pooled])
def test_empty_is_nan(fn):
    pred, gt = squares()
    empty = np.zeros_like(gt)
    assert math.isnan(fn(empty, gt)) and math.isnan(fn(pred, empty)) and math.isnan(fn(empty, empty))


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros((4, 4)), np.zeros((4, 5))), "same shape"),
        ((np.zeros(4), np.zeros(4)), "2D or 3D"),
        ((np.ones((4, 4)), np.ones((4, 4)), (1.0, 2.0, 3.0)), "spacing"),
        ((np.ones((4, 4)), np.ones((4, 4)), -1.0), "spacing"),
    ],
)
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        hd95_pooled(*args)
    with pytest.raises(TypeError, match="pred"):
        hd95_pooled([[1]], np.ones((1, 1)))


def test_transunet_case_metrics_conventions():
    pred, gt = pixel_case()
    empty = np.zeros_like(gt)
    dice, hd = transunet_case_metrics(pred, gt)
    assert dice == pytest.approx(2 / 3) and hd == pytest.approx(3.6)  # pooled definition
    assert transunet_case_metrics(pred, empty) == (1.0, 0.0)  # pred non-empty, gt empty
    assert transunet_case_metrics(empty, gt) == (0.0, 0.0)  # pred empty
    assert transunet_case_metrics(empty, empty) == (0.0, 0.0)  # both empty
    labels = np.where(pred > 0, 7, 0)  # values > 0 count as foreground, like TransUNet's pred[pred > 0] = 1
    assert transunet_case_metrics(labels, gt)[0] == pytest.approx(2 / 3)
