"""The low-data experiment at its smallest scale on a generated synthetic set (a 2-block encoder, 1 epoch)."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

import spectraflow_monai.experiments.low_data as low_data_module
import spectraflow_monai.experiments.runner as runner_module
from spectraflow_monai.experiments import run_low_data
from spectraflow_monai.experiments.low_data import LOW_DATA_TITLE
from spectraflow_monai.experiments.runner import RANDOM_INIT_NOTE
from tests.experiments.stubs import SUMMARY, stub_bundle_runs
from tests.experiments.test_robustness import TINY

SYNTH = {"num_train": 6, "num_val": 2}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("low_data")
    data = {"dataset": "synthetic", "dataset_dir": str(out / "data"), "pretrained_weights": "none"}
    overrides = {**TINY, "synthetic_size": SYNTH}
    rows = run_low_data(out, data, fractions=[0.5, 1.0], overrides=overrides)
    yield out, data, overrides, rows
    shutil.rmtree(out, ignore_errors=True)  # checkpoints: keep the suite's disk use small


def test_three_arms_per_fraction(experiment):
    out, _, _, rows = experiment
    assert [(r["fraction"], r["model"]) for r in rows] == [
        (f, m) for f in (0.5, 1.0) for m in ("spectraflow", "no_stage1", "baseline")
    ]
    with open(out / "low_data.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    assert (out / "low_data.png").stat().st_size > 0
    text = (out / "low_data.md").read_text()
    assert text.startswith(f"## {LOW_DATA_TITLE}: {RANDOM_INIT_NOTE}\n") and "| 50 % | no_stage1 |" in text
    assert "| mDSC (%) | mIoU (%) | HD95 (px, missed = diagonal) |" in text
    # each row states where its encoder started, read from its models/model.json
    starts = {"spectraflow": "Stage-1 export", "no_stage1": "random (pretrained_weights none)",
              "baseline": "none (no encoder)"}  # fmt: skip
    assert all(r["encoder_start"] == starts[r["model"]] for r in rows)
    assert "| 50 % | spectraflow | Stage-1 export |" in text and "| 50 % | baseline | none (no encoder) |" in text


def test_arms_train_on_the_subset_and_no_stage1_skips_stage1(experiment):
    out, _, _, _ = experiment
    root = out / "low_data"
    stage1 = json.loads((root / "spectraflow_50pct" / "stage1.done.json").read_text())
    assert stage1["overrides"]["data_fraction"] == 0.5  # Stage-1 sees only the subset (its masks included)
    assert not (root / "no_stage1_50pct" / "stage1.done.json").exists()
    no_stage1 = json.loads((root / "no_stage1_50pct" / "stage2.done.json").read_text())
    assert no_stage1["overrides"]["encoder_init"] == "pretrained"
    spectraflow = json.loads((root / "spectraflow_50pct" / "stage2.done.json").read_text())
    assert spectraflow["overrides"]["encoder_init"] == "stage1"  # requires its Stage-1 export, never "auto"
    baseline = json.loads((root / "baseline_100pct" / "stage2.done.json").read_text())
    assert baseline["configs"] == ["train.yaml", "unet_baseline.yaml"]


def test_second_call_does_no_training(experiment, monkeypatch):
    out, data, overrides, rows = experiment
    monkeypatch.setattr(runner_module, "run_bundle_configs", lambda *a, **k: pytest.fail(f"ran again: {a[2:]}"))
    titles = []
    monkeypatch.setattr(low_data_module, "save_figure", lambda fig, path: titles.append(fig.get_suptitle()))
    assert run_low_data(out, data, fractions=[0.5, 1.0], overrides=overrides) == rows
    assert titles == [f"{LOW_DATA_TITLE}: {RANDOM_INIT_NOTE}"]


@pytest.mark.parametrize("kwargs,match", [({"scale": "huge"}, "scale"), ({"fractions": [0.0]}, "fractions")])
def test_bad_settings_are_named(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_low_data(tmp_path, {"dataset": "synthetic"}, **kwargs)


def test_table_carries_miou(tmp_path, monkeypatch):
    stub_bundle_runs(monkeypatch)
    rows = run_low_data(tmp_path, {"dataset": "synthetic", "pretrained_weights": "none"}, fractions=[0.5])
    assert [r["mIoU"] for r in rows] == [SUMMARY["mIoU"]] * 3
    with open(tmp_path / "low_data.csv") as f:
        assert [float(r["mIoU"]) for r in csv.DictReader(f)] == [SUMMARY["mIoU"]] * 3
    # the stubbed runs write no model.json
    row = "| 50 % | baseline | unknown (no model.json) | 81.25 | 68.75 | 12.50 |"
    assert row in (tmp_path / "low_data.md").read_text()
