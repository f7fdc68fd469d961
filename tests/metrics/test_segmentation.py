import csv
import json
import math
import os

import numpy as np
import pytest
import torch

from spectraflow_monai.metrics import SegmentationMetricSuite, binarize_prediction, evaluate_segmentation

HD_SQUARES = 1.0 + 0.05 * (math.sqrt(2.0) - 1.0)  # see tests/metrics/test_surface.py


def square(r0, r1, c0, c1, size=10):
    m = torch.zeros(1, 1, size, size)
    m[0, 0, r0:r1, c0:c1] = 1
    return m


def test_shifted_squares_exact_fractions():
    # gt 6x6, pred 6x6 shifted by (1, 1): TP = 25, |A| = |B| = 36
    suite = SegmentationMetricSuite()
    rows = suite.update(square(3, 9, 3, 9), square(2, 8, 2, 8), name="shifted")
    assert len(rows) == 1
    r = rows[0]
    assert r["name"] == "shifted" and r["class"] == "foreground" and r["gt_area"] == 36 and r["pred_area"] == 36
    assert r["iou"] == pytest.approx(25 / 47, rel=1e-6)
    assert r["dice"] == pytest.approx(25 / 36, rel=1e-6)
    assert r["precision"] == pytest.approx(25 / 36, rel=1e-6)
    assert r["recall"] == pytest.approx(25 / 36, rel=1e-6)
    assert r["hd95_monai"] == pytest.approx(HD_SQUARES, rel=1e-6)
    assert r["hd95_pooled"] == pytest.approx(HD_SQUARES, rel=1e-6)


def test_batch_average_precision_recall_differ():
    # image a: shifted squares; image b: pred = left 6x4 part of the gt square -> precision 1, recall 2/3
    pred = torch.cat([square(3, 9, 3, 9), square(2, 8, 2, 6)])
    gt = torch.cat([square(2, 8, 2, 8), square(2, 8, 2, 8)])
    suite = SegmentationMetricSuite(hd95="pooled")
    suite.update(pred, gt, name=["a", "b"])
    b = suite.per_image()[1]
    assert (b["precision"], b["recall"], b["dice"], b["iou"]) == pytest.approx((1.0, 2 / 3, 0.8, 2 / 3))
    s = suite.summary()
    assert s["num_images"] == 2
    assert s["mIoU"] == pytest.approx((25 / 47 + 2 / 3) / 2)
    assert s["mDSC"] == pytest.approx((25 / 36 + 0.8) / 2)
    assert s["precision"] == pytest.approx((25 / 36 + 1) / 2)
    assert s["recall"] == pytest.approx((25 / 36 + 2 / 3) / 2)
    assert "hd95_monai" not in s and set(s["hd95_definitions"]) == {"pooled"}
    # b: d(pred->gt) = 12 zeros, 1, 2, 2, 1; d(gt->pred) = 12 zeros, 2 ones, 6 twos; pooled 36 values: p95 = 2
    assert s["hd95_pooled"] == pytest.approx((HD_SQUARES + 2.0) / 2)


# (empty convention, case) -> (dice, iou, precision, recall); case: both empty, gt empty only, pred empty only
NAN = float("nan")
EMPTY_TABLE = {
    ("one", "both"): (1, 1, 1, 1),
    ("one", "gt"): (0, 0, 0, 0),
    ("one", "pred"): (0, 0, 0, 0),
    ("nan", "both"): (NAN, NAN, NAN, NAN),
    ("nan", "gt"): (0, 0, 0, NAN),
    ("nan", "pred"): (0, 0, NAN, 0),
    ("monai", "both"): (NAN, NAN, NAN, NAN),
    ("monai", "gt"): (NAN, NAN, 0, NAN),
    ("monai", "pred"): (0, 0, NAN, 0),
}


@pytest.mark.parametrize("convention, case", sorted(EMPTY_TABLE))
def test_empty_conventions(convention, case):
    full, empty = square(2, 8, 2, 8), torch.zeros(1, 1, 10, 10)
    pred, gt = {"both": (empty, empty), "gt": (full, empty), "pred": (empty, full)}[case]
    suite = SegmentationMetricSuite(empty=convention)
    r = suite.update(pred, gt)[0]
    got = (r["dice"], r["iou"], r["precision"], r["recall"])
    np.testing.assert_equal(np.array(got, dtype=float), np.array(EMPTY_TABLE[(convention, case)], dtype=float))
    assert math.isnan(r["hd95_monai"]) and math.isnan(r["hd95_pooled"])


def test_exclusion_counts_and_means():
    full, empty = square(2, 8, 2, 8), torch.zeros(1, 1, 10, 10)
    suite = SegmentationMetricSuite(empty="nan")
    suite.update(torch.cat([full, empty, full]), torch.cat([full, empty, empty]), name=["ok", "both", "fp"])
    s = suite.summary()
    assert s["mDSC"] == pytest.approx(0.5)  # (1 + 0) / 2, "both" excluded
    assert s["excluded"]["mDSC"] == 1 and s["excluded"]["recall"] == 2
    assert s["excluded"]["hd95_monai"] == 2 and s["excluded"]["hd95_pooled"] == 2
    assert s["hd95_pooled"] == 0.0
    md = suite.summary_markdown()
    assert "2 image(s) excluded" in md and "`nan`" in md


def test_multiclass_label_maps_per_class():
    gt = torch.zeros(1, 1, 8, 8)
    gt[0, 0, :4] = 1
    gt[0, 0, 4:, :4] = 2
    pred = gt.clone()
    pred[0, 0, 4:, :2] = 0  # class 2: half missed -> dice 2*8/(8+16) = 2/3, IoU 1/2
    suite = SegmentationMetricSuite(num_classes=3, class_names=["bg", "liver", "spleen"])
    rows = suite.update(pred, gt, name="case1")
    assert [r["class"] for r in rows] == ["liver", "spleen"]
    assert rows[0]["dice"] == 1.0 and rows[0]["hd95_pooled"] == 0.0
    assert rows[1]["dice"] == pytest.approx(2 / 3) and rows[1]["iou"] == pytest.approx(0.5)
    s = suite.summary()
    assert set(s["per_class"]) == {"liver", "spleen"}
    assert s["per_class"]["spleen"]["mDSC"] == pytest.approx(2 / 3)
    assert s["mDSC"] == pytest.approx((1 + 2 / 3) / 2)
    assert "| spleen | 50.00 | 66.67 |" in suite.summary_markdown()

    # one-hot prediction vs label-map ground truth, background included: same foreground numbers
    onehot = torch.nn.functional.one_hot(pred[:, 0].long(), 3).permute(0, 3, 1, 2).float()
    suite2 = SegmentationMetricSuite(include_background=True, hd95=None)
    rows2 = suite2.update(onehot, gt)
    assert [r["class"] for r in rows2] == ["0", "1", "2"]
    assert rows2[2]["dice"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("class_names", [["membrane"], ["background", "membrane"]])
def test_two_class_label_map_names(class_names):
    """A 2-class label map (``num_classes=2``) is binary input; its names may list the background first."""
    gt = torch.zeros(1, 1, 8, 8)
    gt[0, 0, :4] = 1
    suite = SegmentationMetricSuite(num_classes=2, class_names=class_names, hd95=None)
    rows = suite.update(gt.clone(), gt, name="em0")
    assert [r["class"] for r in rows] == ["membrane"] and rows[0]["dice"] == 1.0
    with pytest.raises(ValueError, match="1 entry"):
        SegmentationMetricSuite(num_classes=2, class_names=["a", "b", "c"]).update(gt, gt)


def test_3d_input_and_spacing():
    gt = torch.zeros(1, 1, 6, 6, 12)
    pred = torch.zeros_like(gt)
    gt[0, 0, 3, 3, 2] = 1
    pred[0, 0, 3, 3, 2] = pred[0, 0, 3, 3, 6] = 1
    suite = SegmentationMetricSuite(spacing=(1.0, 1.0, 2.5))
    r = suite.update(pred, gt)[0]
    assert r["hd95_pooled"] == pytest.approx(9.0) and r["hd95_monai"] == pytest.approx(9.5, rel=1e-6)
    assert suite.summary()["units"] == "spacing units"


def test_csv_and_markdown(tmp_path):
    suite = SegmentationMetricSuite()
    suite.update(
        torch.cat([square(3, 9, 3, 9), square(2, 8, 2, 6)]), torch.cat([square(2, 8, 2, 8)] * 2), name=["a", "b"]
    )
    path = suite.to_csv(tmp_path / "out" / "metrics.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [
        "name",
        "class",
        "gt_area",
        "pred_area",
        "iou",
        "dice",
        "recall",
        "precision",
        "hd95_monai",
        "hd95_pooled",
        "hd95_monai_empty_as_diagonal",
        "hd95_pooled_empty_as_diagonal",
    ]
    assert [r["name"] for r in rows] == ["a", "b"]
    assert float(rows[0]["iou"]) == pytest.approx(25 / 47, rel=1e-5) and rows[1]["recall"] == "0.666667"
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".tmp")]
    md = suite.summary_markdown()
    lines = md.splitlines()
    assert lines[0] == "| Metric | Value |"
    assert f"| mIoU (%) | {100 * (25 / 47 + 2 / 3) / 2:.2f} |" in lines
    assert f"| Precision (%) | {100 * (25 / 36 + 1) / 2:.2f} |" in lines
    hd_rows = [line for line in lines if line.startswith("| HD95") and "empty prediction" not in line]
    diagonal_rows = [line for line in lines if line.startswith("| HD95") and "empty prediction = image" in line]
    assert len(diagonal_rows) == 2 and diagonal_rows[1].endswith(f"| {(HD_SQUARES + 2) / 2:.2f} |")
    assert len(hd_rows) == 2 and "monai" in hd_rows[0] and "pooled" in hd_rows[1] and "(pixels)" in hd_rows[0]
    assert hd_rows[1].endswith(f"| {(HD_SQUARES + 2) / 2:.2f} |")
    assert "Images: 2." in md


def test_save_and_evaluate_segmentation(tmp_path):
    pairs = [(square(3, 9, 3, 9), square(2, 8, 2, 8), "a"), {"pred": square(2, 8, 2, 6), "label": square(2, 8, 2, 8)}]
    suite = evaluate_segmentation(pairs, output_dir=tmp_path, hd95="monai")
    assert sorted(os.listdir(tmp_path)) == ["metrics.csv", "summary.json", "summary.md"]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["num_images"] == 2 and s["mDSC"] == pytest.approx((25 / 36 + 0.8) / 2)
    assert [r["name"] for r in suite.per_image()] == ["a", "image_00001"]
    suite.reset()
    assert len(suite) == 0 and suite.per_image() == []


def test_numpy_and_binarize_prediction():
    logits = torch.tensor([[[[-2.0, 0.1], [3.0, -0.1]]]])
    assert binarize_prediction(logits).tolist() == [[[[0.0, 1.0], [1.0, 0.0]]]]
    probs = torch.tensor([[[[0.2, 0.4]]]])
    assert binarize_prediction(probs, sigmoid=False, threshold=0.3).tolist() == [[[[0.0, 1.0]]]]
    multi = torch.tensor([[[[1.0, 0.0]], [[0.0, 2.0]], [[0.5, 1.0]]]])  # (1, 3, 1, 2)
    out = binarize_prediction(multi)
    assert out.shape == (1, 3, 1, 2) and out[0, :, 0, 0].tolist() == [1, 0, 0] and out[0, :, 0, 1].tolist() == [0, 1, 0]
    suite = SegmentationMetricSuite(hd95=())
    r = suite.update(np.ones((1, 1, 4, 4)), np.ones((1, 1, 4, 4)))[0]
    assert r["dice"] == 1.0 and "hd95_monai" not in r


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"hd95": "hausdorff"}, "hd95"),
        ({"hd95": ("monai", "monai")}, "hd95"),
        ({"empty": "zero"}, "empty"),
        ({"num_classes": 1}, "num_classes"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SegmentationMetricSuite(**kwargs)


@pytest.mark.parametrize(
    "pred, gt, name, match",
    [
        (torch.full((1, 1, 4, 4), 0.7), torch.ones(1, 1, 4, 4), None, "binary"),
        (torch.ones(1, 1, 4, 4), torch.ones(1, 1, 4, 5), None, "spatial shape"),
        (torch.ones(4, 4), torch.ones(4, 4), None, r"\(B, C, H, W\)"),
        (torch.ones(2, 1, 4, 4), torch.ones(2, 1, 4, 4), "one", "sequence of 2"),
        (torch.ones(2, 1, 4, 4), torch.ones(2, 1, 4, 4), ["a"], "2 entries"),
        (torch.ones(1, 3, 4, 4), torch.ones(1, 2, 4, 4), None, "channels"),
        (torch.full((1, 1, 4, 4), 5.0), torch.ones(1, 3, 4, 4), None, "integer labels"),
    ],
)
def test_bad_update_arguments(pred, gt, name, match):
    with pytest.raises(ValueError, match=match):
        SegmentationMetricSuite().update(pred, gt, name)


def test_missed_structure_scores_image_diagonal(tmp_path):
    """Empty prediction, non-empty ground truth: dropped from hd95_* (counted in hd95_dropped), the image diagonal in
    hd95_*_empty_as_diagonal; an empty ground truth stays undefined in both."""
    full, empty = square(2, 8, 2, 8, size=10), torch.zeros(1, 1, 10, 10)
    shifted = square(3, 9, 3, 9, size=10)
    suite = SegmentationMetricSuite()
    rows = suite.update(
        torch.cat([shifted, empty, full]), torch.cat([full, full, empty]), name=["hit", "missed", "fp"]
    )
    diagonal = math.sqrt(10**2 + 10**2)
    assert math.isnan(rows[1]["hd95_monai"]) and rows[1]["hd95_monai_empty_as_diagonal"] == pytest.approx(diagonal)
    assert rows[1]["hd95_pooled_empty_as_diagonal"] == pytest.approx(diagonal)
    assert rows[0]["hd95_monai_empty_as_diagonal"] == rows[0]["hd95_monai"]
    assert math.isnan(rows[2]["hd95_monai_empty_as_diagonal"])
    s = suite.save(tmp_path)
    assert s["hd95_monai"] == pytest.approx(HD_SQUARES, rel=1e-6)  # the flattering figure is kept
    assert s["hd95_monai_empty_as_diagonal"] == pytest.approx((HD_SQUARES + diagonal) / 2, rel=1e-6)
    assert s["hd95_dropped"] == 1 and s["excluded"]["hd95_monai_empty_as_diagonal"] == 1
    with open(tmp_path / "summary.json") as f:
        saved = json.load(f)
    assert saved["hd95_dropped"] == 1 and saved["hd95_pooled_empty_as_diagonal"] == pytest.approx(
        (HD_SQUARES + diagonal) / 2, rel=1e-6
    )
    with open(tmp_path / "metrics.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert float(csv_rows[1]["hd95_monai_empty_as_diagonal"]) == pytest.approx(diagonal, rel=1e-5)
    md = (tmp_path / "summary.md").read_text()
    assert f"| HD95, monai, empty prediction = image diagonal (pixels) | {(HD_SQUARES + diagonal) / 2:.2f} |" in md
    assert "HD95 dropped: 1 image(s)" in md


def test_missed_structure_volume_diagonal_in_spacing_units():
    gt = torch.zeros(1, 3, 4, 6, 8)
    gt[0, 1, 1, 1, 1] = gt[0, 2, 2, 2, 2] = 1
    pred = torch.zeros_like(gt)
    pred[0, 2, 2, 2, 2] = 1  # class 1 missed, class 2 hit
    suite = SegmentationMetricSuite(spacing=(2.0, 1.0, 0.5))
    rows = suite.update(pred, gt)
    assert rows[0]["hd95_pooled_empty_as_diagonal"] == pytest.approx(math.sqrt(8.0**2 + 6.0**2 + 4.0**2))
    assert rows[1]["hd95_pooled_empty_as_diagonal"] == 0.0
    s = suite.summary()
    assert s["hd95_dropped"] == 1 and s["per_class"]["1"]["hd95_dropped"] == 1


@pytest.mark.parametrize("case", ["empty", "full", "fine"])
def test_degenerate_predictions_warned_in_the_summary(case):
    """An all-foreground model on masks that cover most of each image (EM membranes) scores a high Dice; the
    summary says so. Mostly empty predictions are named as well."""
    gt = torch.ones(4, 1, 8, 8)
    gt[:, :, :2] = 0  # foreground covers 75 % of each image
    pred = {"empty": torch.zeros_like(gt), "full": torch.ones_like(gt), "fine": gt.clone()}[case]
    suite = SegmentationMetricSuite(hd95=None)
    suite.update(pred, gt)
    s = suite.summary()
    md = suite.summary_markdown()
    if case == "fine":
        assert s["warnings"] == [] and "Warning" not in md
    else:
        words = {"empty": "4 of 4 prediction(s) are empty", "full": "foreground over >= 90 % of the scored"}[case]
        assert len(s["warnings"]) == 1 and words in s["warnings"][0] and f"**Warning:** {s['warnings'][0]}" in md
    if case == "full":
        assert s["mDSC"] > 0.8  # the misleading score the warning is about


@pytest.mark.parametrize("fill, warned", [(0.97, True), (0.85, False)])
def test_a_prediction_that_nearly_fills_the_field_of_view_is_warned(fill, warned):
    """A prediction covering 97 % of the field of view (precision about 13 %) is named; 85 % is not (the threshold
    is 90 % of the scored pixels); the summary says the images were scored inside a field of view."""
    fov = torch.zeros(2, 1, 20, 20)
    fov[:, :, 2:18, 2:18] = 1  # 256 scored pixels
    gt = torch.zeros_like(fov)
    gt[:, :, 5:11, 5:11] = 1  # 36 pixels: 14 % of the field of view
    pred = torch.zeros_like(fov).flatten(2)
    inside = fov.flatten(2)[0, 0].nonzero().squeeze(1)
    pred[:, :, inside[: int(fill * 256)]] = 1
    pred = pred.reshape(fov.shape)
    pred[:, :, 5:11, 5:11] = 1
    suite = SegmentationMetricSuite(hd95=None)
    suite.update(pred, gt, mask=fov)
    s = suite.summary()
    assert bool(s["warnings"]) is warned, s["warnings"]
    if warned:
        assert s["precision"] < 0.15 and "2 of 2 prediction(s) are foreground over >= 90 %" in s["warnings"][0]
    assert s["scoring"] == (
        "Scored at 20x20, inside a field-of-view mask for 2 of 2 image(s) (only its pixels scored, its area the "
        "whole for the degenerate-prediction warnings)."
    )
    assert s["scoring"] in suite.summary_markdown()
    assert "network's input size" in suite.summary(original_size=False)["scoring"]
    assert "original size" in suite.summary(original_size=True)["scoring"]


def test_field_of_view_mask_scores_inside_only():
    gt = torch.zeros(1, 1, 8, 8)
    gt[0, 0, 2:6, 2:6] = 1
    pred = gt.clone()
    pred[0, 0, :, 6:] = 1  # false positives, all outside the field of view
    fov = torch.zeros(1, 1, 8, 8)
    fov[..., :6] = 1
    suite = SegmentationMetricSuite(hd95=None)
    assert suite.update(pred, gt)[0]["dice"] < 1.0
    row = suite.update(pred, gt, mask=fov)[0]
    assert row["dice"] == 1.0 and row["pred_area"] == 16 and row["pixels"] == 48
    with pytest.raises(ValueError, match="mask must be"):
        suite.update(pred, gt, mask=fov[..., :4])


@pytest.mark.parametrize("sizes, expected", [
    (["1214x1019", "720x576", "720x576"], ["720x576", "1214x1019"]),  # text order would put 1214x1019 first
    (["128x64", "64x128", "100x100"], ["64x128", "128x64", "100x100"]),  # pixel count, then dimension by dimension
    (["10x10x10", "999x2", "n/a", "9x9"], ["9x9", "10x10x10", "999x2", "n/a"]),  # any rank; a non-size last
    ([], []),
])  # fmt: skip
def test_sort_sizes_compares_numbers(sizes, expected):
    from spectraflow_monai.metrics.segmentation import sort_sizes

    assert sort_sizes(sizes) == expected


def test_scoring_sentence_gives_the_size_range_smallest_first():
    from spectraflow_monai.metrics.segmentation import scoring_description

    rows = [{"name": "a", "size": "1214x1019", "fov": False}, {"name": "b", "size": "720x576", "fov": False}]
    assert scoring_description(rows).startswith("Scored at 2 different sizes (720x576 .. 1214x1019), ")
