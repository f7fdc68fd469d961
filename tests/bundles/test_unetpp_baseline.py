"""The 2D bundle's U-Net++ baseline (paper Fig. 5): Zhou et al.'s deep supervision trains every head (MONAI's
DeepSupervisionLoss, heads averaged) while the trainer's metrics and the evaluation see the final head only."""

from __future__ import annotations

import shutil

import monai.losses
import pytest

from spectraflow_monai.experiments.runner import ExperimentRunner

TINY = {
    "dataset": "synthetic", "image_size": 112, "pretrained_weights": "none", "encoder_kwargs": {"depth": 2},
    "synthetic_size": {"num_train": 4, "num_val": 2}, "max_epochs": 1, "batch_size": 2, "val_batch_size": 2,
    "num_workers": 0, "progress_bar": False, "precision": "fp32", "network_def#features": [4, 4, 8, 8, 16, 4],
}  # fmt: skip


@pytest.mark.parametrize("deep_supervision,heads", [(True, 4), (False, 1)])
def test_deep_supervision_averages_the_heads_losses(tmp_path, monkeypatch, deep_supervision, heads):
    seen = []
    forward = monai.losses.DeepSupervisionLoss.forward

    def recording(self, input, target):
        seen.append((len(input) if isinstance(input, list) else 1, self.get_weights(len(input)) if heads > 1 else None))
        return forward(self, input, target)

    monkeypatch.setattr(monai.losses.DeepSupervisionLoss, "forward", recording)
    runner = ExperimentRunner(tmp_path, "unetpp", {**TINY, "dataset_dir": str(tmp_path / "data")})
    configs, settings = ["train.yaml", "unetpp_baseline.yaml"], {"unetpp_deep_supervision": deep_supervision}
    runner.step("ds", "stage2", configs, settings)
    assert seen and all(n == heads for n, _ in seen)  # 2 iterations of 2 images
    if heads > 1:
        assert seen[0][1] == [0.25] * 4  # the heads' losses averaged
    scores = runner.evaluate("ds", configs, "clean", settings)  # the final head, one tensor
    assert 0.0 <= scores["mIoU"] <= scores["mDSC"] <= 1.0
    shutil.rmtree(tmp_path / "unetpp", ignore_errors=True)
