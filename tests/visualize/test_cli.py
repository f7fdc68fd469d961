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


def test_cli_output_and_image_size(run_dir, tmp_path, capsys, monkeypatch):
    """``--output`` names the evaluation folder (``--eval-dir`` is its former name); ``--image-size`` sets the size of
    the overlay panels."""
    import spectraflow_monai.visualize.report as rep

    root, datalist = run_dir
    ev = tmp_path / "eval"
    os.makedirs(ev)
    os.symlink(root / "eval" / "predictions", ev / "predictions")
    (ev / "summary.md").write_text(SUMMARY)
    (tmp_path / "dl.json").write_text(json.dumps(datalist[:3]))
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
