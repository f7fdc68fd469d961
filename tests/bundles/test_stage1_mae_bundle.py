"""The 2D bundle's mixed-domain MAE Stage-1 (``--stage1_objective mae``, SpectraFlow Table 2 baseline) end to end on tiny synthetic data: Stage-1 with the override, then Stage-2, which loads the MAE encoder export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from monai.utils import set_determinism

from spectraflow_monai.engines import MAEPretrainer
from spectraflow_monai.networks import DINOv2Encoder, MAEDecoder
from tests.bundles.helpers import load_weights, parse_config, run_bundle, stage1_program

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "bundles" / "spectraflow_2d_segmentation" / "configs"
TRAIN = str(CONFIGS / "train.yaml")
STAGE1 = [TRAIN, str(CONFIGS / "train_stage1.yaml")]
META = str(CONFIGS / "metadata.json")
IMAGE_SIZE, DEPTH, NUM_TRAIN, BATCH = 56, 2, 8, 4

pytestmark = pytest.mark.xdist_group("spectraflow_2d_mae_bundle")


def test_mae_stage1_then_stage2(tmp_path):
    common = {
        "bundle_root": str(tmp_path),
        "dataset_dir": str(tmp_path / "data"),
        "synthetic_size": {"num_train": NUM_TRAIN, "num_val": 4},
        "num_workers": 0,
        "progress_bar": False,
        "pretrained_weights": "none",  # no hub on the test machines: Stage-1 starts from random weights, explicitly
        "image_size": IMAGE_SIZE,
        "encoder_kwargs": {"depth": DEPTH},
    }
    stage1 = {
        "stage1_objective": "mae",
        "stage1_epochs": 1,
        "stage1_batch_size": BATCH,
        "mae_decoder_hidden_size": 32,
        "mae_decoder_num_layers": 1,
        "mae_decoder_num_heads": 4,
        "stage1_start_lr": 1e-3,
        "stage1_end_lr": 1e-4,
        "ema_decay": 0.5,
    }
    # the objective replaces the Stage-1 trainer and head only
    program = stage1_program(parse_config(STAGE1, **common, **stage1))
    assert isinstance(program.head, MAEDecoder)
    assert program.trainer.mask_ratio == 0.75 and isinstance(program.trainer, MAEPretrainer)

    run_bundle(STAGE1, META, **common, **stage1)
    record = json.loads((tmp_path / "models" / "stage1" / "run_record.json").read_text())
    assert record["settings"]["mae_decoder_hidden_size"] == 32 and record["settings"]["mae_mask_ratio"] == 0.75
    path = tmp_path / "models" / "encoder_stage1.pt"
    export = load_weights(path)
    # the MAE export is a plain timm-layout encoder (no decoder keys) that loads with strict keys
    encoder = DINOv2Encoder(pretrained=str(path), img_size=IMAGE_SIZE, model_kwargs={"depth": DEPTH})
    assert set(export) == set(encoder.vit.state_dict())
    set_determinism(seed=0)
    fresh = DINOv2Encoder(img_size=IMAGE_SIZE, model_kwargs={"depth": DEPTH}).vit.state_dict()
    assert any(not torch.equal(fresh[k], export[k]) for k in export)
    # the MAE loss was logged per iteration
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "logs" / "stage1"))
    acc.Reload()
    assert {"loss", "loss_mae"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("loss_mae")] == list(range(1, NUM_TRAIN // BATCH + 1))
    assert (tmp_path / "models" / "stage1" / "checkpoint_final.pt").is_file()

    # Stage-2 (train.yaml after its encoder_initialization step, default encoder_init: stage1) starts from the MAE export
    set_determinism(seed=0)
    parser = parse_config(TRAIN, **common)
    parser.get_parsed_content("encoder_initialization")
    start = parser.get_parsed_content("network_def").encoder.vit.state_dict()
    for key, value in export.items():
        torch.testing.assert_close(start[key], value, rtol=0, atol=0, msg=key)
    run_bundle(TRAIN, META, **common, max_epochs=1, batch_size=BATCH, val_batch_size=4)
    model = load_weights(tmp_path / "models" / "model.pt")
    torch.testing.assert_close(model["encoder.vit.blocks.0.attn.qkv.weight"], export["blocks.0.attn.qkv.weight"])
