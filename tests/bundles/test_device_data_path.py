"""``data_path: device`` (MONAI's fast-training recipe): the deterministic part cached once on the training device,
the bundle's own MONAI augmentation run per batch there by its batched twins, no worker processes. Both stages of
both bundles run it on the CPU; the run records it and a checkpoint holds the loader's state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spectraflow_monai.apps.workflow import split_at_random
from spectraflow_monai.data import DeviceCacheLoader
from spectraflow_monai.transforms.batched import RandAffineBatchd, RandFlipBatchd, batched_twins
from spectraflow_monai.utils.bundles import bundle_path
from tests.bundles.helpers import load_weights, parse_config, run_bundle

TWO_D, SYNAPSE = "spectraflow_2d_segmentation", "spectraflow_synapse_segmentation"
TINY = {
    TWO_D: {"synthetic_size": {"num_train": 4, "num_val": 2}},
    SYNAPSE: {"synthetic_size": {"cases": [5, 6, 7, 1, 2], "shape": [40, 40, 4]}, "val_cases": [7]},
}
COMMON = {
    "image_size": 28, "encoder_kwargs": {"depth": 2}, "num_workers": 0, "progress_bar": False, "batch_size": 2,
    "val_batch_size": 2, "stage1_batch_size": 2, "pretrained_weights": "none", "precision": "fp32",
    "head_hidden_channels": 16, "head_num_blocks": 1, "data_path": "device", "cache_device": "auto",
}  # fmt: skip


@pytest.mark.parametrize("dataset", ["kvasir", "isic2016", "glas", "synthetic"])
def test_every_preset_augmentation_has_batched_twins(dataset):
    """The 2D bundle's augmentation of each preset (geometry and colour) runs per batch unchanged."""
    parser = parse_config(str(bundle_path(TWO_D) / "configs" / "train.yaml"), dataset=dataset, dataset_dir="/nowhere")
    _, random = split_at_random(parser.get_parsed_content("train#preprocessing"))
    twins = batched_twins(random)
    assert len(twins) >= 4 and isinstance(twins[0], RandFlipBatchd)
    assert any(isinstance(t, RandAffineBatchd) for t in twins)
    batch = {"image": torch.rand(3, 3, 28, 28), "label": (torch.rand(3, 1, 28, 28) > 0.5).float()}
    for t in twins:
        t.set_random_state(0) if hasattr(t, "set_random_state") else None
        batch = t(batch)
    assert batch["image"].shape == (3, 3, 28, 28) and set(batch["label"].unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("bundle", [TWO_D, SYNAPSE])
def test_both_stages_run_on_the_device_data_path(bundle, tmp_path):
    configs = bundle_path(bundle) / "configs"
    meta = str(configs / "metadata.json")
    settings = {"bundle_root": str(tmp_path), **COMMON, **TINY[bundle]}
    run_bundle([str(configs / "train.yaml"), str(configs / "train_stage1.yaml")], meta, stage1_epochs=1, **settings)
    assert json.loads((tmp_path / "models" / "stage1" / "run_record.json").read_text())["settings"]["data"][
        "data_path"] == "device"  # fmt: skip
    parser = parse_config(str(configs / "train.yaml"), **settings)
    assert isinstance(parser.get_parsed_content("train#dataloader"), DeviceCacheLoader)
    run_bundle(str(configs / "train.yaml"), meta, max_epochs=1, stage2_checkpoints_kept=1, **settings)
    assert (tmp_path / "models" / "model.pt").is_file()
    checkpoint = load_weights(next(Path(tmp_path / "models" / "stage2").glob("checkpoint_epoch=*.pt")))
    assert checkpoint["data_loader"]["epoch"] == 0 and "transform" in checkpoint["data_loader"]


def test_log_every_reads_the_loss_at_intervals(tmp_path):
    """``log_every``: the loss is read on the host every N iterations (TensorBoard points, the non-finite check),
    the Stage-1 trainer keeps its outputs on the device, and the epoch summaries stay exact."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    configs = bundle_path(TWO_D) / "configs"
    settings = {"bundle_root": str(tmp_path), **COMMON, **TINY[TWO_D], "log_every": 2,
                "synthetic_size": {"num_train": 8, "num_val": 2}}  # fmt: skip
    meta = str(configs / "metadata.json")
    run_bundle([str(configs / "train.yaml"), str(configs / "train_stage1.yaml")], meta, stage1_epochs=1, **settings)
    parser = parse_config([str(configs / "train.yaml"), str(configs / "train_stage1.yaml")], **settings)
    assert parser.get_parsed_content("stage1").build(load_weights=False).output_on_device
    run_bundle(str(configs / "train.yaml"), meta, max_epochs=1, **settings)
    acc = EventAccumulator(str(tmp_path / "logs"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train_loss")] == [2, 4]  # 4 iterations, read every 2
