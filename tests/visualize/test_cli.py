"""Tests of the report command line (``spectraflow report``)."""

from __future__ import annotations

import json
import os

import pytest

from spectraflow_monai.visualize import cli
from tests.visualize.helpers import SUMMARY


def test_cli(run_dir, tmp_path, capsys):
    root, datalist = run_dir
    ev = tmp_path / "eval"
    os.makedirs(ev)
    os.symlink(root / "eval" / "predictions", ev / "predictions")
    (ev / "summary.md").write_text(SUMMARY)
    (tmp_path / "dl.json").write_text(json.dumps({"validation": datalist[:3]}))
    argv = ["--eval-dir", str(ev), "--log-dir", f"Stage-2={root / 'logs'}", "--datalist", str(tmp_path / "dl.json"),
            "--num-images", "2", "--title", "CLI run"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.strip() == str(ev / "report.md")
    text = (ev / "report.md").read_text()
    assert text.startswith("# CLI run") and "2 of 3 image(s)" in text and "drawn at random" in text
    with pytest.raises(SystemExit):
        cli.main(["--eval-dir", str(ev), "--log-dir", "logs"])  # not NAME=DIR
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["--eval-dir", str(ev), "--datalist", str(tmp_path / "missing.json")])
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--eval-dir", str(tmp_path / "nowhere")])
    assert "nowhere" in capsys.readouterr().err


def _eval_folder(run_dir, tmp_path):
    """An evaluation folder (summary.md, the run's predictions) and ``tmp_path/dl.json`` listing 3 of its images."""
    root, datalist = run_dir
    ev = tmp_path / "eval"
    os.makedirs(ev)
    os.symlink(root / "eval" / "predictions", ev / "predictions")
    (ev / "summary.md").write_text(SUMMARY)
    (tmp_path / "dl.json").write_text(json.dumps(datalist[:3]))
    return ev


def test_cli_output_and_image_size(run_dir, tmp_path, capsys, monkeypatch):
    """``--output`` names the evaluation folder (``--eval-dir`` is its former name); ``--image-size`` sets the size of
    the overlay panels."""
    import spectraflow_monai.visualize.report as rep

    ev = _eval_folder(run_dir, tmp_path)
    sizes = []
    real = rep.plot_overlays
    monkeypatch.setattr(rep, "plot_overlays", lambda *a, **k: sizes.append(k["size"]) or real(*a, **k))
    assert cli.main(["--output", str(ev), "--datalist", str(tmp_path / "dl.json"), "--image-size", "64"]) == 0
    assert capsys.readouterr().out.strip() == str(ev / "report.md")
    assert sizes == [64] and (ev / "overlays.png").is_file()
    assert cli.main(["--output", str(ev)]) == 0 and sizes == [64]  # no datalist: no overlays, default size unused
    with pytest.raises(SystemExit):
        cli.main(["--output", str(ev), "--image-size", "4"])
    assert "--image-size must be >= 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--datalist", str(tmp_path / "dl.json")])  # --output is required
    assert "--output" in capsys.readouterr().err


def test_cli_without_model_draws_at_the_size_of_the_predictions(run_dir, tmp_path, monkeypatch):
    """No ``--model`` and no ``--image-size``: the overlays and their note take the predictions' size (112), not 224."""
    import spectraflow_monai.visualize.report as rep
    from tests.visualize.helpers import save_prediction

    root, datalist = run_dir
    ev = tmp_path / "eval"
    (ev / "predictions").mkdir(parents=True)
    for name in ("case0", "case1", "case2"):
        save_prediction(str(root / "raw_pred" / f"{name}.png"), str(ev / "predictions"), size=112)
    (ev / "summary.md").write_text(SUMMARY)
    (tmp_path / "dl.json").write_text(json.dumps(datalist[:3]))
    sizes = []
    real = rep.plot_overlays
    monkeypatch.setattr(rep, "plot_overlays", lambda *a, **k: sizes.append(k["size"]) or real(*a, **k))
    assert cli.main(["--output", str(ev), "--datalist", str(tmp_path / "dl.json")]) == 0
    assert sizes == [112] and "Drawn on the 112x112 resize" in (ev / "report.md").read_text()


def _own_data(root):
    """A folder data set as the 2D bundle reads it: half-float TIFF images (Pillow cannot open them), ``<id>_mask.png``
    masks, and evaluation outputs (summary.md, 224x224 predictions)."""
    import numpy as np
    import tifffile
    from PIL import Image

    from tests.visualize.helpers import box_mask, save_prediction

    for sub in ("images", "masks", "raw_pred", "eval/predictions"):
        os.makedirs(root / sub)
    for i in range(5):
        img = np.full((48, 64), 0.3, np.float16)
        img[10:30, 10:40] = 0.9
        tifffile.imwrite(root / "images" / f"c{i}.tif", img)
        Image.fromarray(box_mask((10, 30, 10, 40))).save(root / "masks" / f"c{i}_mask.png")
        Image.fromarray(box_mask((12, 30, 10, 40))).save(root / "raw_pred" / f"c{i}.png")
        save_prediction(str(root / "raw_pred" / f"c{i}.png"), str(root / "eval" / "predictions"))
    (root / "eval" / "summary.md").write_text(SUMMARY)
    return root


@pytest.mark.parametrize("source", ["folder", "json_own_folder", "json_dataset_dir"])
def test_cli_reads_the_bundles_sources_and_formats(tmp_path, capsys, source):
    """``spectraflow report`` reads what the bundle reads: a folder source, a datalist JSON with paths relative to
    its own folder or to --dataset-dir, TIFFs that Pillow cannot open."""
    data = _own_data(tmp_path / "data")
    items = [{"image": f"images/c{i}.tif", "label": f"masks/c{i}_mask.png"} for i in range(5)]
    if source == "folder":
        argv = ["--dataset", "folder", "--dataset-dir", str(data)]
        expected = 1  # the bundle's seeded hold-out (val_fraction 0.2 of 5 images)
    elif source == "json_own_folder":
        (data / "d.json").write_text(json.dumps({"training": items[:3], "test": items[3:]}))
        argv, expected = ["--datalist", str(data / "d.json")], 2
    else:
        (tmp_path / "lists").mkdir()
        (tmp_path / "lists" / "d.json").write_text(json.dumps({"training": items[:2], "validation": items[2:]}))
        argv, expected = ["--datalist", str(tmp_path / "lists" / "d.json"), "--dataset-dir", str(data)], 3
    assert cli.main(["--output", str(data / "eval"), *argv]) == 0
    text = (data / "eval" / "report.md").read_text()
    assert f"{expected} of {expected} image(s) with a prediction shown" in text
    assert (data / "eval" / "overlays.png").is_file()
    from spectraflow_monai.visualize.overlays import overlay_arrays

    rgb, gt, pred = overlay_arrays({"image": str(data / "images" / "c0.tif"), "label": str(data / "masks" /
                                    "c0_mask.png")}, data / "eval" / "predictions" / "c0_seg.png", size=48)
    assert rgb[0, 0] == pytest.approx([0.3] * 3, abs=1e-3) and rgb[20, 20] == pytest.approx([0.9] * 3, abs=1e-3)
    assert gt.sum() > 0 and pred.sum() > 0


def test_cli_help_lists_the_bundles_sources(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "folder" in out and "--label-classes" in out


def test_cli_reads_the_image_size_from_the_model_record(run_dir, tmp_path, capsys, monkeypatch):
    """``--model``: the overlay size comes from the record beside the model (models/model.json); a size given that
    contradicts it is refused in one error naming both."""
    import torch

    import spectraflow_monai.visualize.report as rep
    from spectraflow_monai.utils.run_record import write_model_settings
    from spectraflow_monai.utils.settings import ModelSettings

    ev = _eval_folder(run_dir, tmp_path)
    model = tmp_path / "models" / "model.pt"
    os.makedirs(model.parent)
    torch.save({}, model)
    write_model_settings(model, ModelSettings(architecture="unetpp", image_size=64))
    sizes = []
    real = rep.plot_overlays
    monkeypatch.setattr(rep, "plot_overlays", lambda *a, **k: sizes.append(k["size"]) or real(*a, **k))
    argv = ["--output", str(ev), "--datalist", str(tmp_path / "dl.json"), "--model", str(model)]
    assert cli.main(argv) == 0 and sizes == [64]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main([*argv, "--image-size", "224"])
    assert "image_size: 64 in the record, 224 given" in capsys.readouterr().err
