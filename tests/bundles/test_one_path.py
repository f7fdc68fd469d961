"""One path from a value to its use (issue: the record is the program): each bundle trains with a non-default value
for every Stage-2 and model setting; the objects the run builds from its settings hold the recorded values."""

from __future__ import annotations

import json

import pytest
import torch

from monai.transforms import NormalizeIntensityd

from spectraflow_monai.apps.workflow import recorded_network
from spectraflow_monai.utils.settings import ModelSettings
from tests.bundles.helpers import config_paths, parse_config, run_bundle

#: a non-default value of every Stage-2 and model setting both bundles take
COMMON = {
    "learning_rate": 3e-4,
    "weight_decay": 2e-3,
    "min_learning_rate": 2e-5,
    "lr_factor": 0.25,
    "lr_patience": 3,
    "batch_size": 3,
    "trainable_blocks": 2,
    "boundary_beta": 0.02,
    "boundary_beta_max": 0.3,
    "boundary_ramp_epochs": 7,
    "encoder_init": "random",
    "pretrained_weights": "none",
    "image_size": 42,
    "encoder_kwargs": {"depth": 3},
    "fusion": "concat",
    "refine": "standard",
    "image_mean": [0.4, 0.5, 0.6],
    "image_std": [0.2, 0.3, 0.25],
    "max_epochs": 1,
    "num_workers": 0,
    "progress_bar": False,
    "precision": "fp32",
    "allow_empty_masks": True,
}
BUNDLES = {
    "spectraflow_2d_segmentation": {"synthetic_size": {"num_train": 8, "num_val": 3}},
    "spectraflow_synapse_segmentation": {
        "synthetic_size": {"cases": [5, 6, 40, 1], "shape": [48, 48, 6], "spacing": [0.8, 0.8, 2.5]},
        "hu_window": [-200.0, 300.0],
    },
}


@pytest.mark.parametrize("bundle", sorted(BUNDLES))
def test_the_running_objects_hold_the_recorded_values(bundle, tmp_path):
    paths = config_paths(bundle)
    values = {**COMMON, **BUNDLES[bundle], "bundle_root": str(tmp_path), "dataset_dir": str(tmp_path / "data")}
    run_bundle(paths["train"], paths["metadata"], **values)
    whole = json.loads((tmp_path / "models" / "stage2" / "run_record.json").read_text())
    record = whole["settings"]
    model = json.loads((tmp_path / "models" / "model.json").read_text())["model"]
    for name in ("learning_rate", "weight_decay", "batch_size", "trainable_blocks", "lr_factor", "lr_patience",
                 "min_learning_rate", "boundary_beta", "boundary_beta_max", "boundary_ramp_epochs", "encoder_init"):
        assert record[name] == values[name], name
    for name in ("image_size", "encoder_kwargs", "fusion", "refine", "image_mean", "image_std"):
        assert model[name] == values[name], name

    parser = parse_config(paths["train"], **values)
    trainer = parser.get_parsed_content("train#trainer")
    optimizer = trainer.optimizer
    assert optimizer.param_groups[0]["lr"] == record["learning_rate"]
    assert optimizer.param_groups[0]["weight_decay"] == record["weight_decay"]
    assert trainer.data_loader.batch_size == record["batch_size"]
    loss = trainer.loss_function
    assert (loss.beta, loss.beta_max, loss.ramp_epochs) == (
        record["boundary_beta"], record["boundary_beta_max"], record["boundary_ramp_epochs"]
    )
    plateau = parser.get_parsed_content("validate#handlers#0").lr_scheduler
    assert (plateau.factor, plateau.patience, plateau.min_lrs[0]) == (
        record["lr_factor"], record["lr_patience"], record["min_learning_rate"]
    )
    network = trainer.network
    encoder = network.encoder
    blocks = encoder.vit.blocks
    trained = [i for i, block in enumerate(blocks) if any(p.requires_grad for p in block.parameters())]
    assert len(trained) == record["trainable_blocks"] and len(blocks) == model["encoder_kwargs"]["depth"]
    # the architecture, fusion and refinement of the record: the network the record rebuilds has the same parts
    rebuilt = recorded_network(ModelSettings.from_dict(model))
    assert type(network) is type(rebuilt) and model["architecture"] == "spectraflow"
    assert {k: v.shape for k, v in network.state_dict().items()} == {k: v.shape for k, v in rebuilt.state_dict().items()}
    with torch.no_grad():
        out = network(torch.zeros(2, 3, model["image_size"], model["image_size"]))
    assert out.shape[-1] == model["image_size"]
    normalize = [t for t in parser.get_parsed_content("train#preprocessing").transforms
                 if isinstance(t, NormalizeIntensityd)][0].normalizer
    assert list(normalize.subtrahend) == pytest.approx(model["image_mean"])
    assert list(normalize.divisor) == pytest.approx(model["image_std"])
    # the run settings' precision, resolved by the program, is the recorded one
    assert parser.get_parsed_content("stage2").precision.name == whole["precision"] == values["precision"]
    assert whole["not_compared"]["precision"] == values["precision"]
    # the data settings reach the data source: the foreground rule, the synthetic preset's size (recorded)
    source = parser.get_parsed_content("data_source")
    assert source.allow_empty_masks is record["data"]["allow_empty_masks"] is True
    assert record["data"]["data_options"]["synthetic_size"] == values["synthetic_size"]
    if "hu_window" in values:  # the CT window the slices are cut with: the model's, recorded once (model.json)
        window = parser.get_parsed_content("data_source").hu_window
        assert list(window) == model["hu_window"] == values["hu_window"]
        assert "hu_window" not in record["data"]["data_options"]
