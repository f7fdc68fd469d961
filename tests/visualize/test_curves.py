"""Tests of the training curves: TensorBoard scalars read back and plotted, headline tags first, errors."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from spectraflow_monai.visualize import curves as cv
from tests.visualize.helpers import png


def test_read_scalars(run_dir):
    root, _ = run_dir
    s = cv.read_scalars(root / "logs")
    assert sorted(s) == ["train_loss", "val_hd95", "val_mean_dice"]  # stage1/ is a sub-folder: not included
    steps, values = s["train_loss"]
    np.testing.assert_array_equal(steps, np.arange(1, 61))
    np.testing.assert_allclose(values, 1.0 / np.arange(1, 61), rtol=1e-6)
    assert np.isnan(s["val_hd95"][1][1])
    assert cv.read_scalars(root / "logs_empty") == {}


def test_plot_training_curves(run_dir, tmp_path, caplog):
    root, _ = run_dir
    out = tmp_path / "curves.png"
    log_dirs = {"Stage-1": root / "logs" / "stage1", "Stage-2": str(root / "logs"), "Stage-0": root / "nope",
                "Empty": root / "logs_empty"}
    with caplog.at_level(logging.WARNING, logger=cv.__name__):
        tags = cv.plot_training_curves(log_dirs, out)
    assert tags == ["Stage-1/loss", "Stage-1/mse", "Stage-2/train_loss", "Stage-2/val_hd95", "Stage-2/val_mean_dice"]
    assert "nope" in caplog.text and "logs_empty" in caplog.text
    png(out)
    assert os.listdir(tmp_path) == ["curves.png"]


def test_plot_training_curves_nothing(run_dir, tmp_path):
    root, _ = run_dir
    assert cv.plot_training_curves({"A": root / "nope", "B": root / "logs_empty"}, tmp_path / "c.png") == []
    assert not (tmp_path / "c.png").exists()


def test_ema():
    np.testing.assert_allclose(cv._ema(np.array([2.0, 2.0, 2.0])), [2.0, 2.0, 2.0])
    # debiased: second value = (0.1 * 0.9 * 1 + 0.1 * 3) / (1 - 0.81)
    np.testing.assert_allclose(cv._ema(np.array([1.0, 3.0]))[1], (0.09 + 0.3) / 0.19)


def _stage1_logs(folder, meanflow_error=None):
    """Stage-1 event file as the MeanFlow pretrainer logs it: the weighted MeanFlow loss flat near 1 (the adaptive
    weight normalises it), the unweighted error and the dispersive loss falling."""
    steps = range(1, 9)
    error = [1.0 / s for s in steps] if meanflow_error is None else meanflow_error
    disp = [-0.1 * s for s in steps]
    _write(folder, {
        "meanflow_error": list(zip(steps, error)),
        "loss_meanflow_weighted": [(s, 1.0 - 1e-3 / s) for s in steps],
        "loss_dispersive": list(zip(steps, disp)),
        "dispersive_weighted": [(s, 0.4 * d) for s, d in zip(steps, disp)],
        "loss": [(s, 1.0 - 1e-3 / s + 0.4 * d) for s, d in zip(steps, disp)],
    })  # fmt: skip


def test_stage1_curves_draw_the_informative_series(tmp_path):
    """Stage-1's unweighted MeanFlow error leads its block, then the dispersive loss; the flat weighted MeanFlow
    loss and the series that repeat these two are not drawn, and the figure's foot names them."""
    _stage1_logs(tmp_path / "stage1")
    tags = cv.plot_training_curves({"Stage-1": tmp_path / "stage1"}, tmp_path / "curves.png")
    assert tags == ["Stage-1/meanflow_error", "Stage-1/loss_dispersive"]
    scalars = cv.read_scalars(tmp_path / "stage1")
    for tag in tags:  # each drawn series moves; the one left out is flat
        assert np.ptp(scalars[tag.split("/")[1]][1]) > 0.5
    assert np.ptp(scalars["loss_meanflow_weighted"][1]) < 1e-2
    assert set(cv.redundant_tags(scalars)) == {"loss_meanflow_weighted", "dispersive_weighted", "loss"}
    png(tmp_path / "curves.png")


def test_weighted_meanflow_loss_is_drawn_without_a_finite_error(tmp_path, caplog):
    """A ``meanflow_error`` that is all NaN (a loss without ``compute``) does not replace the weighted loss."""
    _stage1_logs(tmp_path / "stage1", meanflow_error=[float("nan")] * 8)
    caplog.set_level(logging.INFO, logger="spectraflow_monai.visualize.curves")
    tags = cv.plot_training_curves({"Stage-1": tmp_path / "stage1"}, tmp_path / "curves.png")
    assert tags == ["Stage-1/meanflow_error", "Stage-1/loss", "Stage-1/loss_dispersive",
                    "Stage-1/loss_meanflow_weighted"]  # fmt: skip
    assert "Stage-1/dispersive_weighted not drawn" in caplog.text


def test_report_says_which_stage1_curves_are_drawn(tmp_path):
    from spectraflow_monai.visualize.report import STAGE1_CURVES_NOTE, write_report
    from tests.visualize.helpers import SUMMARY

    (tmp_path / "summary.md").write_text(SUMMARY)
    _stage1_logs(tmp_path / "logs" / "stage1")
    with open(write_report(tmp_path, log_dirs={"Stage-1": tmp_path / "logs" / "stage1"})) as f:
        text = f.read()
    assert "- Stage-1 (`" + str(tmp_path / "logs" / "stage1") + "`): `meanflow_error`, `loss_dispersive`\n" in text
    assert STAGE1_CURVES_NOTE in text


def test_plot_training_curves_bad_args(run_dir, tmp_path):
    root, _ = run_dir
    with pytest.raises(ValueError, match="log_dirs must be a mapping"):
        cv.plot_training_curves([str(root / "logs")], tmp_path / "c.png")
    with pytest.raises(FileNotFoundError, match="nope"):
        cv.read_scalars(root / "nope")


def _write(folder, series):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(folder))
    for tag, points in series.items():
        for step, value in points:
            w.add_scalar(tag, value, step)
    w.close()


def test_latest_run_of_a_folder_without_zigzag(tmp_path):
    """An interrupted run (iterations 1..10) and its rerun from a checkpoint (6..12): one curve, the rerun's values
    from step 6 on; a run started over (1..3) replaces the whole curve."""
    from spectraflow_monai.visualize.curves import read_scalars

    _write(tmp_path, {"train_loss": [(s, 1.0) for s in range(1, 11)]})
    _write(tmp_path, {"train_loss": [(s, 2.0) for s in range(6, 13)]})
    steps, values = read_scalars(tmp_path)["train_loss"]
    assert steps.tolist() == list(range(1, 13)) and values.tolist() == [1.0] * 5 + [2.0] * 7
    _write(tmp_path, {"train_loss": [(s, 3.0) for s in range(1, 4)]})
    steps, values = read_scalars(tmp_path)["train_loss"]
    assert steps.tolist() == [1, 2, 3] and values.tolist() == [3.0] * 3


@pytest.mark.parametrize("names", [
    ("events.out.tfevents.1700000000.host.7.9", "events.out.tfevents.1700000000.host.7.10"),  # writer 9, then 10
    ("events.out.tfevents.1700000000.host.900.1", "events.out.tfevents.1700000000.host.80.1"),  # two processes
])  # fmt: skip
def test_runs_begun_within_one_second_are_ordered_by_their_first_event(tmp_path, names):
    """Two runs whose file names carry the same second: the one opened later is the latest run, whatever the text
    order of the rest of the names (writer 10 sorts before writer 9 as text; process ids say nothing of time)."""
    from spectraflow_monai.visualize.curves import read_scalars

    for i, (name, points) in enumerate(zip(names, ([(s, 1.0) for s in range(1, 11)], [(s, 2.0) for s in (1, 2)]))):
        _write(tmp_path / f"w{i}", {"train_loss": points})
        (event,) = os.listdir(tmp_path / f"w{i}")
        os.replace(tmp_path / f"w{i}" / event, tmp_path / name)
    steps, values = read_scalars(tmp_path)["train_loss"]
    assert steps.tolist() == [1, 2] and values.tolist() == [2.0, 2.0]  # the later run started over


def test_axes_named_iteration_or_epoch(run_dir):
    from spectraflow_monai.visualize.curves import read_scalars, step_units

    root, _ = run_dir
    units = step_units(read_scalars(root / "logs"))
    assert units == {"train_loss": "iteration", "val_hd95": "epoch", "val_mean_dice": "epoch"}
    assert set(step_units(read_scalars(root / "logs" / "stage1")).values()) == {"iteration"}


def test_report_explains_the_beta_ramp(tmp_path):
    from spectraflow_monai.visualize.report import BETA_RAMP_NOTE, write_report
    from tests.visualize.helpers import SUMMARY

    (tmp_path / "summary.md").write_text(SUMMARY)
    _write(tmp_path / "logs", {"train_loss": [(s, 0.5 + 0.01 * s) for s in range(1, 9)],
                               "boundary_beta": [(1, 0.01), (2, 0.02)], "train_loss_dice": [(1, 0.5), (2, 0.4)]})
    text = open(write_report(tmp_path, log_dirs={"Stage-2": tmp_path / "logs"})).read()
    assert BETA_RAMP_NOTE in text and "latest run" in text
