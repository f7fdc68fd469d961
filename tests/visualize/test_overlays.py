"""Tests of the prediction overlays: alignment of image, ground truth and prediction, choice of images, errors."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from spectraflow_monai.visualize import overlays as ov
from spectraflow_monai.visualize.predictions import find_prediction
from tests.visualize.helpers import H, W, colour_pixels, png, rows_cols


def test_overlay_arrays_orientation(run_dir):
    root, datalist = run_dir
    pred_dir = root / "eval" / "predictions"
    assert sorted(os.listdir(pred_dir)) == ["case0_seg.png", "case1_seg.png", "case2_seg.png"]
    rgb, gt, pred = ov.overlay_arrays(datalist[0], find_prediction(datalist[0], pred_dir))
    assert rgb.shape == (224, 224, 3) and gt.shape == pred.shape == (224, 224)
    assert gt.dtype == bool and 0.0 <= rgb.min() and rgb.max() <= 1.0
    np.testing.assert_array_equal(gt, pred)  # case0: the prediction is the ground truth
    # the box sits where the raw file has it: rows 4..16 of 48, columns 6..30 of 64 -> scaled to 224
    rows, cols = rows_cols(gt)
    assert abs(rows[0] - 4 * 224 / H) <= 2 and abs(rows[-1] + 1 - 16 * 224 / H) <= 2
    assert abs(cols[0] - 6 * 224 / W) <= 2 and abs(cols[-1] + 1 - 30 * 224 / W) <= 2
    # the image is aligned too: blue inside the box, grey outside
    assert rgb[rows[2], cols[2], 2] > 0.7 and rgb[rows[2], cols[2], 0] < 0.2
    assert abs(rgb[200, 200, 0] - 90 / 255) < 0.02
    # case1: the prediction is shifted 8 raw rows down, same columns
    _, gt1, pred1 = ov.overlay_arrays(datalist[1], find_prediction(datalist[1], pred_dir), size=112)
    assert gt1.shape == (112, 112)
    (gr, gc), (pr, pc) = rows_cols(gt1), rows_cols(pred1)
    assert abs((pr.mean() - gr.mean()) - 8 * 112 / H) <= 1.5
    np.testing.assert_array_equal(gc, pc)


def test_plot_overlays_png_and_missing(run_dir, tmp_path, caplog):
    root, datalist = run_dir
    out = tmp_path / "overlays.png"
    with caplog.at_level(logging.INFO, logger=ov.__name__):
        n = ov.plot_overlays(datalist, root / "eval" / "predictions", out, metrics_csv=root / "eval" / "metrics.csv")
    assert n == 3  # 4 entries, case3 has no prediction
    assert any("1 of 4" in r.message and "case3" in r.message for r in caplog.records if r.levelno == logging.WARNING)
    img = png(out)
    assert colour_pixels(img, 0) > 100 and colour_pixels(img, 1) > 100  # red and green contours drawn
    assert [f for f in os.listdir(tmp_path) if f != "overlays.png"] == []  # no temporary file left


@pytest.mark.parametrize(
    "num_images,expected",
    [(1, "case0"), (2, "case0, case1"), (3, "case0, case2, case1"), (10, "case0, case2, case1")],
)
def test_plot_overlays_picks_by_dice(run_dir, tmp_path, caplog, num_images, expected):
    root, datalist = run_dir
    with caplog.at_level(logging.INFO, logger=ov.__name__):
        n = ov.plot_overlays(datalist[:3], root / "eval" / "predictions", tmp_path / "o.png", num_images=num_images,
                              size=32, metrics_csv=root / "eval" / "metrics.csv")
    assert n == min(num_images, 3)
    assert f"showing {expected}" in caplog.text  # best first, worst last


def test_plot_overlays_random_choice(run_dir, tmp_path, caplog):
    root, datalist = run_dir
    shown = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=ov.__name__):
            assert ov.plot_overlays(datalist, root / "eval" / "predictions", tmp_path / "o.png", 2, 32, 3) == 2
        shown.append([r.message for r in caplog.records if "showing" in r.message])
    assert shown[0] == shown[1] and len(shown[0]) == 1  # same seed, same images


@pytest.mark.parametrize(
    "n,k,expected",
    [(10, 3, [0, 4, 9]), (10, 1, [0]), (10, 2, [0, 9]), (5, 5, [0, 1, 2, 3, 4]), (9, 4, [0, 2, 4, 8]), (1, 1, [0])],
)
def test_spread_ranks(n, k, expected):
    assert ov._spread_ranks(n, k) == expected


@pytest.mark.parametrize(
    "kwargs,match",
    [({"datalist": []}, "datalist is empty"),
     ({"datalist": "list.json"}, "datalist must be a sequence"),
     ({"datalist": [{"image": "a.png"}]}, "'label'"),
     ({"datalist": [3]}, r"datalist\[0\] must be a dict"),
     ({"num_images": 0}, "num_images"),
     ({"size": 4}, "size"),
     ({"metrics_csv": "BADCSV"}, "Dice column")],
)
def test_plot_overlays_bad_args(run_dir, tmp_path, kwargs, match):
    root, datalist = run_dir
    args = {"datalist": datalist, "predictions_dir": root / "eval" / "predictions", "path": tmp_path / "o.png"}
    if kwargs.get("metrics_csv") == "BADCSV":
        (tmp_path / "bad.csv").write_text("name,IoU\na,0.5\n")
        kwargs = {"metrics_csv": tmp_path / "bad.csv"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ov.plot_overlays(**args)


def test_missing_files(run_dir, tmp_path):
    root, datalist = run_dir
    with pytest.raises(FileNotFoundError, match="absent.csv"):
        ov.plot_overlays(datalist, root / "eval" / "predictions", tmp_path / "o.png",
                          metrics_csv=tmp_path / "absent.csv")
    entry = dict(datalist[0], image=str(tmp_path / "gone.png"))
    with pytest.raises(FileNotFoundError, match="gone.png"):
        ov.overlay_arrays(entry, find_prediction(datalist[0], root / "eval" / "predictions"))
    (tmp_path / "junk.png").write_text("not an image")
    with pytest.raises(ValueError, match="junk.png"):
        ov.overlay_arrays(datalist[0], tmp_path / "junk.png")


def test_overlay_arrays_inverted_label_map(tmp_path):
    """A 2-class label map whose foreground is value 0 (``label_classes {'background': 255, 'membrane': 0}``):
    ground truth and prediction (source values, as the bundle writes them) are foreground where the value is 0."""
    from PIL import Image

    mask = np.full((32, 40), 255, np.uint8)
    mask[5:15, 8:20] = 0
    Image.fromarray(np.full((32, 40, 3), 120, np.uint8)).save(tmp_path / "im.png")
    Image.fromarray(mask).save(tmp_path / "lab.png")
    Image.fromarray(mask).save(tmp_path / "pred.png")
    entry = {"image": str(tmp_path / "im.png"), "label": str(tmp_path / "lab.png")}
    _, gt, pred = ov.overlay_arrays(entry, tmp_path / "pred.png", size=32, label_map={255: 0, 0: 1})
    assert gt.sum() == pred.sum() > 0 and gt[:5].sum() == 0 and gt[6:14, :].sum() > 0
