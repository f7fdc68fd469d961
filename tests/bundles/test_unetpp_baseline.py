"""The 2D bundle's U-Net++ baselines (paper Fig. 5): Zhou et al.'s deep supervision trains every head (MONAI's
DeepSupervisionLoss, heads averaged) while the trainer's metrics and the evaluation see the final head only; the
reference-code reading (no norm, dropout 0.5, Keras L2 under Adam) builds and trains with its optimizer."""

from __future__ import annotations

import json
import shutil

import monai.losses
import pytest
import torch

from spectraflow_monai.experiments.runner import ExperimentRunner
from spectraflow_monai.utils.bundles import bundle_parser
from spectraflow_monai.utils.checkpoint import RECORD_FILE

TINY = {
    "dataset": "synthetic", "image_size": 112, "pretrained_weights": "none", "encoder_kwargs": {"depth": 2},
    "synthetic_size": {"num_train": 4, "num_val": 2}, "max_epochs": 1, "batch_size": 2, "val_batch_size": 2,
    "num_workers": 0, "progress_bar": False, "precision": "fp32", "network_kwargs#features": [4, 4, 8, 8, 16, 4],
}  # fmt: skip
LITERAL = "unetpp_zhou_literal_baseline.yaml"


@pytest.mark.parametrize("config", ["unetpp_baseline.yaml", LITERAL])
@pytest.mark.parametrize("deep_supervision,heads", [(True, 4), (False, 1)])
def test_deep_supervision_averages_the_heads_losses(tmp_path, monkeypatch, config, deep_supervision, heads):
    seen, steps = [], []
    forward = monai.losses.DeepSupervisionLoss.forward

    def recording(self, input, target):
        seen.append((len(input) if isinstance(input, list) else 1, self.get_weights(len(input)) if heads > 1 else None))
        return forward(self, input, target)

    def recording_step(step):
        def wrapped(self, *args, **kwargs):
            steps.append((type(self).__name__, [g["weight_decay"] for g in self.param_groups]))
            return step(self, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(monai.losses.DeepSupervisionLoss, "forward", recording)
    for optimizer in (torch.optim.Adam, torch.optim.AdamW):
        monkeypatch.setattr(optimizer, "step", recording_step(optimizer.step))
    runner = ExperimentRunner(tmp_path, "unetpp", {**TINY, "dataset_dir": str(tmp_path / "data")})
    configs, settings = ["train.yaml", config], {"unetpp_deep_supervision": deep_supervision}
    runner.step("ds", "stage2", configs, settings)
    assert seen and all(n == heads for n, _ in seen)  # 2 iterations of 2 images
    if heads > 1:
        assert seen[0][1] == [0.25] * 4  # the heads' losses averaged
    # the literal reading trains with Adam and the L2 penalty on the kernels, the default with AdamW's decay
    assert set(map(str, steps)) == {str(("Adam", [2e-4, 0.0]) if config == LITERAL else ("AdamW", [1e-4]))}
    # the run record names the optimizer that ran, whole; U-Net++ has no encoder: no encoder start recorded
    models = runner.run_dir("ds") / "models"
    record = json.loads((models / "stage2" / RECORD_FILE).read_text())
    optimizer = record["components"]["optimizer"]
    assert optimizer["class"] == ("torch.optim.adam.Adam" if config == LITERAL else "torch.optim.adamw.AdamW")
    decay = [g.get("weight_decay", optimizer["defaults"]["weight_decay"]) for g in optimizer["param_groups"]]
    assert decay == ([2e-4, 0.0] if config == LITERAL else [1e-4])
    # and the loss function that ran: the baselines' deep supervision around the bundle's loss
    loss = record["components"]["loss_function"]
    assert loss["class"] == "monai.losses.ds_loss.DeepSupervisionLoss"
    assert loss["modules"]["loss"]["class"] == "spectraflow_monai.losses.dice_bce_boundary.DiceBCEBoundaryLoss"
    assert "resolved" not in record["settings"]
    assert "encoder_start" not in json.loads((models / "model.json").read_text())
    scores = runner.evaluate("ds", configs, "clean", settings)  # the final head, one tensor
    assert 0.0 <= scores["mIoU"] <= scores["mDSC"] <= 1.0
    shutil.rmtree(tmp_path / "unetpp", ignore_errors=True)


def test_zhou_literal_config_builds(tmp_path):
    """The reference-code reading at full size: Zhou et al.'s widths, no normalisation, dropout 0.5 (9.04 M
    parameters at 3 -> 1 channels), Adam over the kernel-L2 groups (2 x 1e-4 on the convolution kernels)."""
    runner = ExperimentRunner(tmp_path, "robustness", {"dataset": "synthetic", "image_size": 112})
    configs = ["train.yaml", LITERAL]
    assert runner.network_facts("baseline", configs) == {"parameters": 9_042_276, "norm": "none"}
    parser = bundle_parser(runner.bundle, configs, {"dataset": "synthetic", "pretrained_weights": "none"})
    network = parser.get_parsed_content("network_def")
    assert {m.p for m in network.modules() if isinstance(m, torch.nn.Dropout)} == {0.5}
    optimizer = parser.get_parsed_content("train#optimizer")
    assert type(optimizer) is torch.optim.Adam
    assert [g["weight_decay"] for g in optimizer.param_groups] == [2e-4, 0.0]
    assert [len(g["params"]) for g in optimizer.param_groups] == [2 * 15 + 4, 2 * 15 + 4 + 2 * 10]
