"""Readable training logs of the 2D bundle: the TensorBoard tags and the console of one-epoch runs of both stages.

Stage-1 logs its unweighted MeanFlow error as the headline (``meanflow_error``), the adaptively weighted loss
(close to 1 by construction) under a name that says so, and the dispersive terms; Stage-2 logs its Dice, BCE and
boundary terms and the boundary weight ``beta``. With ``--progress_bar False`` the console holds one summary line
per epoch and stage, and no line per iteration.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.bundles.helpers import run_bundle_process

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "bundles" / "spectraflow_2d_segmentation" / "configs"
TRAIN, STAGE1 = str(CONFIGS / "train.yaml"), str(CONFIGS / "train_stage1.yaml")

pytestmark = pytest.mark.xdist_group("training_logs")


def _tags(log_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Stage-1 then Stage-2, one epoch each, as ``python -m monai.bundle run`` with ``--progress_bar False``."""
    root = tmp_path_factory.mktemp("training_logs")
    common = {
        "bundle_root": str(root),
        "dataset_dir": str(root / "data"),
        "synthetic_size": {"num_train": 4, "num_val": 2},
        "num_workers": 0,
        "progress_bar": False,
        "pretrained_weights": "none",
        "image_size": 28,
        "encoder_kwargs": {"depth": 2},
    }
    stage1 = {**common, "stage1_epochs": 1, "stage1_batch_size": 2}
    rc1, log1 = run_bundle_process([TRAIN, STAGE1], stage1, root, root / "stage1.log")
    assert rc1 == 0, log1[-4000:]
    stage2 = {**common, "max_epochs": 1, "batch_size": 2, "val_batch_size": 2, "encoder_init": "pretrained"}
    rc2, log2 = run_bundle_process([TRAIN], stage2, root, root / "stage2.log")
    assert rc2 == 0, log2[-4000:]
    yield {"root": root, "stage1": log1, "stage2": log2}
    shutil.rmtree(root, ignore_errors=True)  # checkpoints: keep the suite's disk use small


def test_stage1_tensorboard_names(runs):
    tags = _tags(runs["root"] / "logs" / "stage1")
    assert {"meanflow_error", "loss_meanflow_weighted", "loss_dispersive", "dispersive_weighted", "loss"} <= set(tags)
    assert not {"loss_meanflow", "mse"} & set(tags)  # the old, misleading names are gone
    assert len(tags["meanflow_error"]) == 2  # per iteration: 4 images, batch 2
    for weighted, disp, dw, total in zip(
        tags["loss_meanflow_weighted"], tags["loss_dispersive"], tags["dispersive_weighted"], tags["loss"]
    ):
        assert 0 < weighted <= 1  # the adaptive weight keeps it below 1
        assert dw == pytest.approx(0.4 * disp, rel=1e-4, abs=1e-6)
        assert total == pytest.approx(weighted + dw, rel=1e-4, abs=1e-6)


def test_stage2_tensorboard_terms(runs):
    tags = _tags(runs["root"] / "logs")
    terms = ("train_loss_dice", "train_loss_bce", "train_loss_boundary", "train_loss_boundary_weighted")
    assert {"train_loss", "train_mean_dice", "boundary_beta", "val_mean_dice", *terms} <= set(tags)
    assert [len(tags[k]) for k in (*terms, "boundary_beta")] == [1] * 5  # one value per epoch
    assert tags["boundary_beta"] == [pytest.approx(0.01)]  # the bundle's starting beta, epoch 1 of the ramp
    assert tags["train_loss_boundary_weighted"][0] == pytest.approx(0.01 * tags["train_loss_boundary"][0], rel=1e-4)
    # the epoch mean of the total is the sum of the epoch means of its terms
    total = tags["train_loss_dice"][0] + tags["train_loss_bce"][0] + tags["train_loss_boundary_weighted"][0]
    assert sum(tags["train_loss"]) / len(tags["train_loss"]) == pytest.approx(total, rel=1e-4)


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_console_one_summary_line_per_epoch(runs, stage):
    log = runs[stage]
    title = "Stage-1" if stage == "stage1" else "Stage-2"
    lines = [line for line in log.splitlines() if f"{title} epoch " in line]
    assert len(lines) == 1 and f"{title} epoch 1/1 | " in lines[0], log[-4000:]
    assert not re.search(r"Iter: \d+/\d+", log), log[-4000:]  # no StatsHandler line per iteration
    assert "Epoch[1] Metrics --" not in log  # the metrics are in the summary line only
    line = lines[0]
    assert re.search(r"\| lr [0-9.e+-]+ \|", line) and re.search(r"\| \d+\.\ds", line), line
    if stage == "stage1":
        assert line.index("meanflow_error") < line.index("loss_meanflow_weighted"), line  # the headline first
        assert "dispersive_weighted" in line
    else:
        for name in ("train_loss ", "train_loss_dice", "train_loss_bce", "train_loss_boundary", "boundary_beta 0.01"):
            assert name in line, line
        assert "val_mean_dice" in line and "best val_mean_dice" in line, line


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_quiet_without_progress_bars(runs, stage):
    """``--progress_bar False``: no bar at all (MONAI's dataset caching bar included); the known-harmless library
    warnings (spectraflow_monai.utils.quiet) do not print."""
    log = runs[stage]
    assert "Loading dataset" not in log and "%|" not in log, log[-4000:]
    for text in ("`torch.jit.script` is deprecated", "is all 0, this may result", "always_return_as_numpy"):
        assert text not in log, text
