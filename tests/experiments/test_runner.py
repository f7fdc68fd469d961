"""ExperimentRunner: a step whose settings changed since it finished starts over (the bundle's run record would
refuse to continue the earlier run), and the earlier run is kept aside."""

from __future__ import annotations

import json

from spectraflow_monai.experiments.runner import ExperimentRunner

COMMON = {
    "dataset": "synthetic", "image_size": 28, "encoder_kwargs": {"depth": 2}, "pretrained_weights": "none",
    "encoder_init": "random", "synthetic_size": {"num_train": 4, "num_val": 2}, "max_epochs": 1, "batch_size": 2,
    "val_batch_size": 2, "num_workers": 0, "progress_bar": False, "precision": "fp32",
}  # fmt: skip


def test_a_step_with_changed_settings_starts_over(tmp_path):
    runner = ExperimentRunner(tmp_path, "exp", {**COMMON, "dataset_dir": str(tmp_path / "data")})
    root = runner.step("run", "stage2", ["train.yaml"], {"learning_rate": 0.0001})
    runner.step("run", "stage2", ["train.yaml"], {"learning_rate": 0.0001})  # done: skipped
    assert runner.executed == ["run/stage2"]
    runner.step("run", "stage2", ["train.yaml"], {"learning_rate": 0.001})
    assert runner.executed == ["run/stage2", "run/stage2"]
    record = json.loads((root / "models" / "stage2" / "run_record.json").read_text())
    assert record["settings"]["learning_rate"] == 0.001
    assert len(list((root / "models").glob("stage2.bak-*"))) == 1  # the earlier run, kept aside
