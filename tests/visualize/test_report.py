"""Tests of the evaluation report: training curves, prediction overlays, report.md, CLI and error handling."""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np
import pytest
from PIL import Image

from spectraflow_monai.visualize import report as rep

H, W = 48, 64  # raw image size (not square, so a swapped axis cannot go unnoticed)
# object boxes (row0, row1, col0, col1) in raw pixels, ground truth and prediction
GT_BOXES = {"case0": (4, 16, 6, 30), "case1": (20, 36, 10, 24), "case2": (8, 30, 36, 60)}
PRED_BOXES = {"case0": (4, 16, 6, 30), "case1": (28, 44, 10, 24), "case2": (12, 30, 40, 60)}
DICE = {"case0": 0.95, "case1": 0.40, "case2": 0.70}
SUMMARY = "| Metric | Value |\n| --- | --- |\n| mIoU (%) | 61.00 |\n| mDSC (%) | 68.33 |\n\nImages: 3.\n"


def _box_mask(box: tuple[int, int, int, int]) -> np.ndarray:
    m = np.zeros((H, W), np.uint8)
    m[box[0] : box[1], box[2] : box[3]] = 255
    return m


def _save_prediction(src_png: str, pred_dir: str) -> None:
    """Write a prediction as the bundle does: MONAI PIL reader -> 224x224 binary -> SaveImage(PILWriter, 0/255)."""
    from monai.transforms import EnsureChannelFirst, LoadImage, Resize, SaveImage

    x = EnsureChannelFirst()(LoadImage(reader="PILReader", image_only=True)(src_png))
    x = Resize((224, 224), mode="nearest")((x >= 128).float())
    SaveImage(output_dir=pred_dir, output_postfix="seg", output_ext=".png", writer="PILWriter", scale=255,
              separate_folder=False, print_log=False)(x)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny evaluation folder (3 images with predictions + 1 without), TensorBoard logs of both stages."""
    root = tmp_path_factory.mktemp("run")
    for sub in ("images", "masks", "raw_pred", "eval/predictions", "logs/stage1", "logs_empty"):
        os.makedirs(root / sub)
    datalist = []
    for name in [*GT_BOXES, "case3"]:
        box = GT_BOXES.get(name, (10, 20, 10, 20))
        img = np.full((H, W, 3), 90, np.uint8)
        img[box[0] : box[1], box[2] : box[3]] = (40, 60, 200)  # blue object: only contours are pure red/green
        Image.fromarray(img).save(root / "images" / f"{name}.png")
        Image.fromarray(_box_mask(box)).save(root / "masks" / f"{name}.png")
        datalist.append({"image": str(root / "images" / f"{name}.png"), "label": str(root / "masks" / f"{name}.png"),
                         "name": name, "label_threshold": 128})
        if name in PRED_BOXES:  # case3 gets no prediction
            Image.fromarray(_box_mask(PRED_BOXES[name])).save(root / "raw_pred" / f"{name}.png")
            _save_prediction(str(root / "raw_pred" / f"{name}.png"), str(root / "eval" / "predictions"))
    ev = root / "eval"
    (ev / "summary.md").write_text(SUMMARY)
    (ev / "summary.json").write_text("{}\n")
    rows = ["name,IoU,DSC,recall,precision,HD95 (pixels)"]
    rows += [f"{n},{d - 0.1:.2f},{d:.2f},0.9,0.8,3.0" for n, d in DICE.items()]
    (ev / "metrics.csv").write_text("\n".join(rows) + "\n")

    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(root / "logs"))
    for step in range(1, 61):
        w.add_scalar("train_loss", 1.0 / step, step)
    for epoch in range(1, 4):
        w.add_scalar("val_mean_dice", 0.2 * epoch, epoch)
        w.add_scalar("val_hd95", float("nan") if epoch == 2 else 10.0 / epoch, epoch)
    w.close()
    w = SummaryWriter(log_dir=str(root / "logs" / "stage1"))
    for step in range(5):
        w.add_scalar("loss", 2.0 - 0.1 * step, step)
        w.add_scalar("mse", 1.0 - 0.1 * step, step)
    w.close()
    return root, datalist


def _png(path) -> np.ndarray:
    img = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert img.shape[0] > 200 and img.shape[1] > 200
    assert img.std() > 10  # not a blank canvas
    return img


def _colour_pixels(img: np.ndarray, channel: int) -> int:
    """Pixels where ``channel`` is strong and both others weak (pure red / pure green contour pixels)."""
    others = [c for c in range(3) if c != channel]
    return int(((img[..., channel] > 180) & (img[..., others[0]] < 80) & (img[..., others[1]] < 80)).sum())


def _rows_cols(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))


# -------------------------------------------------------------------------------------------- alignment
def test_overlay_arrays_orientation(run_dir):
    root, datalist = run_dir
    pred_dir = root / "eval" / "predictions"
    assert sorted(os.listdir(pred_dir)) == ["case0_seg.png", "case1_seg.png", "case2_seg.png"]
    rgb, gt, pred = rep.overlay_arrays(datalist[0], rep.find_prediction(datalist[0], pred_dir))
    assert rgb.shape == (224, 224, 3) and gt.shape == pred.shape == (224, 224)
    assert gt.dtype == bool and 0.0 <= rgb.min() and rgb.max() <= 1.0
    np.testing.assert_array_equal(gt, pred)  # case0: the prediction is the ground truth
    # the box sits where the raw file has it: rows 4..16 of 48, columns 6..30 of 64 -> scaled to 224
    rows, cols = _rows_cols(gt)
    assert abs(rows[0] - 4 * 224 / H) <= 2 and abs(rows[-1] + 1 - 16 * 224 / H) <= 2
    assert abs(cols[0] - 6 * 224 / W) <= 2 and abs(cols[-1] + 1 - 30 * 224 / W) <= 2
    # the image is aligned too: blue inside the box, grey outside
    assert rgb[rows[2], cols[2], 2] > 0.7 and rgb[rows[2], cols[2], 0] < 0.2
    assert abs(rgb[200, 200, 0] - 90 / 255) < 0.02
    # case1: the prediction is shifted 8 raw rows down, same columns
    _, gt1, pred1 = rep.overlay_arrays(datalist[1], rep.find_prediction(datalist[1], pred_dir), size=112)
    assert gt1.shape == (112, 112)
    (gr, gc), (pr, pc) = _rows_cols(gt1), _rows_cols(pred1)
    assert abs((pr.mean() - gr.mean()) - 8 * 112 / H) <= 1.5
    np.testing.assert_array_equal(gc, pc)


def test_find_prediction_layouts(tmp_path):
    entry = {"image": str(tmp_path / "imgs" / "ISIC_01.jpg"), "label": "x", "name": "id7"}
    assert rep.find_prediction(entry, tmp_path) is None
    os.makedirs(tmp_path / "ISIC_01")
    (tmp_path / "ISIC_01" / "ISIC_01_seg.png").write_bytes(b"")  # separate_folder=True layout, image stem
    assert rep.find_prediction(entry, tmp_path) == str(tmp_path / "ISIC_01" / "ISIC_01_seg.png")
    (tmp_path / "id7_seg.png").write_bytes(b"")  # the datalist name wins
    assert rep.find_prediction(entry, tmp_path) == str(tmp_path / "id7_seg.png")


# -------------------------------------------------------------------------------------------- overlays
def test_plot_overlays_png_and_missing(run_dir, tmp_path, caplog):
    root, datalist = run_dir
    out = tmp_path / "overlays.png"
    with caplog.at_level(logging.INFO, logger=rep.__name__):
        n = rep.plot_overlays(datalist, root / "eval" / "predictions", out, metrics_csv=root / "eval" / "metrics.csv")
    assert n == 3  # 4 entries, case3 has no prediction
    assert any("1 of 4" in r.message and "case3" in r.message for r in caplog.records if r.levelno == logging.WARNING)
    img = _png(out)
    assert _colour_pixels(img, 0) > 100 and _colour_pixels(img, 1) > 100  # red and green contours drawn
    assert [f for f in os.listdir(tmp_path) if f != "overlays.png"] == []  # no temporary file left


@pytest.mark.parametrize(
    "num_images,expected",
    [(1, "case0"), (2, "case0, case1"), (3, "case0, case2, case1"), (10, "case0, case2, case1")],
)
def test_plot_overlays_picks_by_dice(run_dir, tmp_path, caplog, num_images, expected):
    root, datalist = run_dir
    with caplog.at_level(logging.INFO, logger=rep.__name__):
        n = rep.plot_overlays(datalist[:3], root / "eval" / "predictions", tmp_path / "o.png", num_images=num_images,
                              size=32, metrics_csv=root / "eval" / "metrics.csv")
    assert n == min(num_images, 3)
    assert f"showing {expected}" in caplog.text  # best first, worst last


def test_plot_overlays_random_choice(run_dir, tmp_path, caplog):
    root, datalist = run_dir
    shown = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=rep.__name__):
            assert rep.plot_overlays(datalist, root / "eval" / "predictions", tmp_path / "o.png", 2, 32, 3) == 2
        shown.append([r.message for r in caplog.records if "showing" in r.message])
    assert shown[0] == shown[1] and len(shown[0]) == 1  # same seed, same images


@pytest.mark.parametrize(
    "header,row",
    [("name,IoU,DSC,recall,precision", "{n},0.5,{d},1,1"),
     ("name,class,gt_area,pred_area,iou,dice,recall,precision,hd95_monai", "{n},1,10,10,0.5,{d},1,1,nan")],
)
def test_read_dice_columns(tmp_path, header, row):
    p = tmp_path / "m.csv"
    p.write_text("\n".join([header, row.format(n="a", d=0.25), row.format(n="b", d="nan")]) + "\n")
    d = rep._read_dice(p)
    assert d["a"] == 0.25 and math.isnan(d["b"])


def test_read_dice_averages_class_rows(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("name,class,dice\na,1,0.2\na,2,0.6\na,3,nan\n")
    assert rep._read_dice(p) == {"a": pytest.approx(0.4)}


@pytest.mark.parametrize(
    "n,k,expected",
    [(10, 3, [0, 4, 9]), (10, 1, [0]), (10, 2, [0, 9]), (5, 5, [0, 1, 2, 3, 4]), (9, 4, [0, 2, 4, 8]), (1, 1, [0])],
)
def test_spread_ranks(n, k, expected):
    assert rep._spread_ranks(n, k) == expected


# -------------------------------------------------------------------------------------------- curves
def test_read_scalars(run_dir):
    root, _ = run_dir
    s = rep.read_scalars(root / "logs")
    assert sorted(s) == ["train_loss", "val_hd95", "val_mean_dice"]  # stage1/ is a sub-folder: not included
    steps, values = s["train_loss"]
    np.testing.assert_array_equal(steps, np.arange(1, 61))
    np.testing.assert_allclose(values, 1.0 / np.arange(1, 61), rtol=1e-6)
    assert np.isnan(s["val_hd95"][1][1])
    assert rep.read_scalars(root / "logs_empty") == {}


def test_plot_training_curves(run_dir, tmp_path, caplog):
    root, _ = run_dir
    out = tmp_path / "curves.png"
    log_dirs = {"Stage-1": root / "logs" / "stage1", "Stage-2": str(root / "logs"), "Stage-0": root / "nope",
                "Empty": root / "logs_empty"}
    with caplog.at_level(logging.WARNING, logger=rep.__name__):
        tags = rep.plot_training_curves(log_dirs, out)
    assert tags == ["Stage-1/loss", "Stage-1/mse", "Stage-2/train_loss", "Stage-2/val_hd95", "Stage-2/val_mean_dice"]
    assert "nope" in caplog.text and "logs_empty" in caplog.text
    _png(out)
    assert os.listdir(tmp_path) == ["curves.png"]


def test_plot_training_curves_nothing(run_dir, tmp_path):
    root, _ = run_dir
    assert rep.plot_training_curves({"A": root / "nope", "B": root / "logs_empty"}, tmp_path / "c.png") == []
    assert not (tmp_path / "c.png").exists()


def test_ema():
    np.testing.assert_allclose(rep._ema(np.array([2.0, 2.0, 2.0])), [2.0, 2.0, 2.0])
    # debiased: second value = (0.1 * 0.9 * 1 + 0.1 * 3) / (1 - 0.81)
    np.testing.assert_allclose(rep._ema(np.array([1.0, 3.0]))[1], (0.09 + 0.3) / 0.19)


# -------------------------------------------------------------------------------------------- report
def test_write_report(run_dir, tmp_path):
    root, datalist = run_dir
    ev = tmp_path / "eval"
    os.makedirs(ev)
    os.symlink(root / "eval" / "predictions", ev / "predictions")
    for f in ("summary.md", "summary.json", "metrics.csv"):
        (ev / f).write_text((root / "eval" / f).read_text())
    path = rep.write_report(ev, datalist, {"Stage-1": root / "logs" / "stage1", "Stage-2": root / "logs",
                                           "Stage-0": root / "nope"}, title="Run 1", extra_lines=["seed 0"])
    assert path == os.path.join(str(ev), "report.md")
    text = (ev / "report.md").read_text()
    assert text.startswith("# Run 1\n")
    assert SUMMARY.strip() in text  # the table is embedded as is
    for link in ("![Training curves](curves.png)", "![Prediction overlays](overlays.png)", "[metrics.csv](metrics.csv)",
                 "[summary.json](summary.json)"):
        assert link in text
    assert "Stage-0: log folder" in text and "`val_mean_dice`" in text
    assert "3 of 3 image(s) with a prediction shown" in text
    assert "1 of 4 image(s) had no prediction" in text and "case3" in text
    assert "## Notes\n\nseed 0\n" in text
    _png(ev / "curves.png")
    _png(ev / "overlays.png")
    assert sorted(os.listdir(ev)) == sorted(
        ["predictions", "summary.md", "summary.json", "metrics.csv", "report.md", "curves.png", "overlays.png"]
    )


def test_write_report_summary_only(tmp_path):
    (tmp_path / "summary.md").write_text("# Summary\n\n| Metric | Value |\n")
    text = open(rep.write_report(tmp_path)).read()
    assert "## Summary" in text and "curves.png" not in text and "overlays.png" not in text
    assert sorted(os.listdir(tmp_path)) == ["report.md", "summary.md"]


# -------------------------------------------------------------------------------------------- errors
def test_write_report_missing_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        rep.write_report(tmp_path / "no_such_dir")
    with pytest.raises(FileNotFoundError, match="summary.md"):
        rep.write_report(tmp_path)


def test_no_predictions(run_dir, tmp_path):
    root, datalist = run_dir
    (tmp_path / "summary.md").write_text(SUMMARY)
    with pytest.raises(FileNotFoundError, match="predictions"):
        rep.write_report(tmp_path, datalist)
    os.makedirs(tmp_path / "predictions")
    with pytest.raises(ValueError, match=str(tmp_path / "predictions")):
        rep.write_report(tmp_path, datalist)
    assert not (tmp_path / "report.md").exists()


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
        rep.plot_overlays(**args)


def test_missing_files(run_dir, tmp_path):
    root, datalist = run_dir
    with pytest.raises(FileNotFoundError, match="absent.csv"):
        rep.plot_overlays(datalist, root / "eval" / "predictions", tmp_path / "o.png",
                          metrics_csv=tmp_path / "absent.csv")
    entry = dict(datalist[0], image=str(tmp_path / "gone.png"))
    with pytest.raises(FileNotFoundError, match="gone.png"):
        rep.overlay_arrays(entry, rep.find_prediction(datalist[0], root / "eval" / "predictions"))
    (tmp_path / "junk.png").write_text("not an image")
    with pytest.raises(ValueError, match="junk.png"):
        rep.overlay_arrays(datalist[0], tmp_path / "junk.png")
    with pytest.raises(ValueError, match="log_dirs must be a mapping"):
        rep.plot_training_curves([str(root / "logs")], tmp_path / "c.png")
    with pytest.raises(FileNotFoundError, match="nope"):
        rep.read_scalars(root / "nope")


# -------------------------------------------------------------------------------------------- CLI
def test_cli(run_dir, tmp_path, capsys):
    root, datalist = run_dir
    ev = tmp_path / "eval"
    os.makedirs(ev)
    os.symlink(root / "eval" / "predictions", ev / "predictions")
    (ev / "summary.md").write_text(SUMMARY)
    (tmp_path / "dl.json").write_text(json.dumps({"validation": datalist[:3]}))
    argv = ["--eval-dir", str(ev), "--log-dir", f"Stage-2={root / 'logs'}", "--datalist", str(tmp_path / "dl.json"),
            "--num-images", "2", "--title", "CLI run"]
    assert rep.main(argv) == 0
    assert capsys.readouterr().out.strip() == str(ev / "report.md")
    text = (ev / "report.md").read_text()
    assert text.startswith("# CLI run") and "2 of 3 image(s)" in text and "drawn at random" in text
    with pytest.raises(SystemExit):
        rep.main(["--eval-dir", str(ev), "--log-dir", "logs"])  # not NAME=DIR
    capsys.readouterr()
    with pytest.raises(SystemExit):
        rep.main(["--eval-dir", str(ev), "--datalist", str(tmp_path / "missing.json")])
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rep.main(["--eval-dir", str(tmp_path / "nowhere")])
    assert "nowhere" in capsys.readouterr().err


def test_lazy_package_exports():
    import spectraflow_monai.visualize as vis

    assert vis.write_report is rep.write_report and "plot_overlays" in vis.__all__
    with pytest.raises(AttributeError):
        vis.no_such_name  # noqa: B018


def test_plot_training_curves_headline_first(tmp_path):
    """Stage-1's unweighted MeanFlow error leads its block, ahead of the tags that sort before it."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(tmp_path / "stage1"))
    for step in range(3):
        for tag in ("dispersive_weighted", "loss", "loss_meanflow_weighted", "meanflow_error"):
            w.add_scalar(tag, 1.0 + step, step)
    w.close()
    tags = rep.plot_training_curves({"Stage-1": tmp_path / "stage1"}, tmp_path / "curves.png")
    assert tags == ["Stage-1/meanflow_error", "Stage-1/dispersive_weighted", "Stage-1/loss",
                    "Stage-1/loss_meanflow_weighted"]  # fmt: skip
