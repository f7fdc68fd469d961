"""Tests of the evaluation report: report.md with its figures, and its errors."""

from __future__ import annotations

import os

import pytest

from spectraflow_monai.visualize import report as rep
from tests.visualize.helpers import SUMMARY, png


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
    png(ev / "curves.png")
    png(ev / "overlays.png")
    assert sorted(os.listdir(ev)) == sorted(
        ["predictions", "summary.md", "summary.json", "metrics.csv", "report.md", "curves.png", "overlays.png"]
    )


def test_write_report_summary_only(tmp_path):
    (tmp_path / "summary.md").write_text("# Summary\n\n| Metric | Value |\n")
    text = open(rep.write_report(tmp_path)).read()
    assert "## Summary" in text and "curves.png" not in text and "overlays.png" not in text
    assert sorted(os.listdir(tmp_path)) == ["report.md", "summary.md"]


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


def test_lazy_package_exports():
    import spectraflow_monai.visualize as vis

    assert vis.write_report is rep.write_report and "plot_overlays" in vis.__all__
    with pytest.raises(AttributeError):
        vis.no_such_name  # noqa: B018


@pytest.mark.parametrize("scoring, differs", [
    ("Scored at 224x224, the network's input size (the ground truth resized to it), over the whole image (no "
     "field-of-view mask).", False),
    ("Scored at each image's original size (565x584; the prediction resized to it, nearest), inside a field-of-view "
     "mask for 3 of 3 image(s) (only its pixels scored, its area the whole for the degenerate-prediction warnings).",
     True),
])  # fmt: skip
def test_report_says_where_overlays_are_drawn_and_how_scoring_was_done(run_dir, tmp_path, scoring, differs):
    import json

    root, datalist = run_dir
    ev = tmp_path / "eval"
    os.makedirs(ev)
    os.symlink(root / "eval" / "predictions", ev / "predictions")
    summary = json.loads((root / "eval" / "summary.json").read_text())
    (ev / "summary.json").write_text(json.dumps({**summary, "scoring": scoring}))
    (ev / "summary.md").write_text((root / "eval" / "summary.md").read_text() + f"\n{scoring}\n")
    text = (ev / "report.md").read_text() if rep.write_report(ev, datalist) else ""
    assert scoring in text
    assert ("Drawn on the 224x224 resize of each image, the size of its prediction (the network's input), over the "
            "whole image.") in text
    assert ("The metrics were not scored that way" in text) is differs


@pytest.mark.parametrize("image_size, drawn, note", [
    (None, 112, "Drawn on the 112x112 resize of each image, the size of its prediction (the network's input)"),
    (64, 64, "Drawn on the 64x64 resize of each image, over the whole image; the predictions (112x112) are resized"),
])  # fmt: skip
def test_report_draws_and_names_the_size_of_the_predictions(run_dir, tmp_path, monkeypatch, image_size, drawn, note):
    """Without an image size the overlays are drawn at the size the predictions were written (here 112, not a
    default 224), and the report says so; a size given is used and the predictions' own size is named beside it."""
    from tests.visualize.helpers import save_prediction

    root, datalist = run_dir
    ev = tmp_path / "eval"
    (ev / "predictions").mkdir(parents=True)
    for name in ("case0", "case1"):
        save_prediction(str(root / "raw_pred" / f"{name}.png"), str(ev / "predictions"), size=112)
    (ev / "summary.md").write_text(SUMMARY)
    sizes = []
    real = rep.plot_overlays
    monkeypatch.setattr(rep, "plot_overlays", lambda *a, **k: sizes.append(k["size"]) or real(*a, **k))
    with open(rep.write_report(ev, datalist, image_size=image_size)) as f:
        text = f.read()
    assert sizes == [drawn] and note in text and "224x224" not in text
