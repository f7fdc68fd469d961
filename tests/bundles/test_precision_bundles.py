"""The bundles' ``precision`` setting (``auto`` | ``bf16`` | ``fp16`` | ``fp32``) on the CPU, end to end.

Under ``precision: bf16`` the 2D bundle trains one epoch (the network computes in bfloat16, the validation metrics
are finite and ``models/model.pt`` is a float32 state dict that loads into a float32 network), Stage-1 runs one
epoch with finite losses and a float32 encoder export, and the Synapse bundle's slice-wise inference segments a CT
volume; every run logs the resolved choice. Tiny settings: 28x28 inputs, a 2-block encoder, a handful of images.
"""

from __future__ import annotations

import logging
import math

import nibabel as nib
import numpy as np
import pytest
import torch

from tests.bundles.helpers import (
    CONFIGS_2D,
    CONFIGS_3D,
    assert_float32_state,
    error_text,
    load_weights,
    parse_config,
    record_output_dtypes,
    run_workflow,
    synapse_model_and_volume,
    tiny_2d_settings,
)

NET = {"image_size": 28, "encoder_kwargs": {"depth": 2}}
TINY = tiny_2d_settings(28, "cpu")
PRECISION_LOGGER = "spectraflow_monai.utils.precision"


@pytest.fixture
def precision_log(caplog):
    """The INFO records of the precision logger (re-enabled in case a bundle's logging.conf disabled it)."""
    logger = logging.getLogger(PRECISION_LOGGER)
    disabled = logger.disabled
    logger.disabled = False
    caplog.set_level(logging.INFO, logger=PRECISION_LOGGER)
    yield caplog
    logger.disabled = disabled



def test_stage2_one_epoch_bf16_on_cpu(tmp_path, precision_log):
    parser = parse_config(
        str(CONFIGS_2D / "train.yaml"), bundle_root=str(tmp_path), max_epochs=1, precision="bf16", **TINY
    )
    network = parser.get_parsed_content("network")
    dtypes = record_output_dtypes(network)
    run_workflow(parser)
    assert torch.bfloat16 in dtypes  # the forward ran under CPU autocast
    assert any(r.getMessage().startswith("precision: bf16") for r in precision_log.records), precision_log.text
    metrics = parser.get_parsed_content("validate#evaluator").state.metrics
    assert {"val_mean_dice", "val_mean_iou"} <= set(metrics), metrics
    for name in ("val_mean_dice", "val_mean_iou"):
        assert math.isfinite(float(metrics[name])), (name, metrics)
    assert math.isfinite(float(parser.get_parsed_content("train#trainer").state.output[0]["loss"]))
    # the best model is a float32 state dict that loads strictly into a float32 network and predicts finite values
    state = load_weights(tmp_path / "models" / "model.pt")
    assert_float32_state(state)
    fresh = parse_config(str(CONFIGS_2D / "inference.yaml"), bundle_root=str(tmp_path), **NET)
    net = fresh.get_parsed_content("network_def")
    net.load_state_dict(state, strict=True)
    net.eval()
    with torch.no_grad():
        out = net(torch.randn(1, 3, 28, 28))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_stage1_one_epoch_bf16_on_cpu(tmp_path, precision_log):
    parser = parse_config(
        [str(CONFIGS_2D / "train.yaml"), str(CONFIGS_2D / "train_stage1.yaml")],
        bundle_root=str(tmp_path),
        precision="bf16",
        stage1_epochs=1,
        stage1_batch_size=2,
        head_hidden_channels=16,
        head_num_blocks=1,
        **TINY,
    )
    program = parser.get_parsed_content("stage1")
    trainer = program.build(load_weights=False)
    assert trainer.amp and trainer._autocast_kwargs["dtype"] == torch.bfloat16 and trainer.scaler is None
    dtypes = record_output_dtypes(program.encoder.vit.blocks[0].attn.qkv)
    trainer.run()
    assert torch.bfloat16 in dtypes  # the encoder's linear layers ran under CPU autocast
    assert any(r.getMessage().startswith("precision: bf16") for r in precision_log.records), precision_log.text
    out = trainer.state.output
    for key in ("loss", "meanflow_error", "loss_meanflow_weighted", "loss_dispersive"):
        assert math.isfinite(out[key]), out
    assert_float32_state(load_weights(tmp_path / "models" / "encoder_stage1.pt"))


def test_synapse_slicewise_inference_bf16_on_cpu(tmp_path, precision_log):
    root, in_dir, image = synapse_model_and_volume(tmp_path, NET, (30, 26, 3))
    parser = parse_config(
        str(CONFIGS_3D / "inference.yaml"),
        bundle_root=str(root),
        input_dir=str(in_dir),
        output_dir=str(tmp_path / "out"),
        precision="bf16",
        device="$torch.device('cpu')",
        **NET,
    )
    dtypes = record_output_dtypes(parser.get_parsed_content("network"))
    run_workflow(parser)
    assert torch.bfloat16 in dtypes  # every slice batch ran under CPU autocast
    assert any(r.getMessage().startswith("precision: bf16") for r in precision_log.records), precision_log.text
    out = nib.load(str(tmp_path / "out" / "case_seg.nii.gz"))
    assert out.shape == image.shape and int(np.asarray(out.dataobj).max()) <= 8


# training: the run settings check the value, the Stage-2 program resolves it on the device; inference resolves it
@pytest.mark.parametrize(
    "config, key", [(CONFIGS_2D / "train.yaml", "stage2"), (CONFIGS_3D / "inference.yaml", "resolved_precision")]
)
def test_unknown_or_impossible_precision_is_named(config, key, tmp_path):
    for value, message in (("half", "precision must be one of auto, bf16, fp16, fp32, got 'half'"),
                           ("fp16", "precision='fp16' needs a CUDA device")):  # fmt: skip
        parser = parse_config(
            str(config), bundle_root=str(tmp_path), precision=value, device="$torch.device('cpu')", **NET
        )
        with pytest.raises(Exception) as info:
            parser.get_parsed_content(key)
        assert message in error_text(info.value)


def test_fp32_leaves_autocast_off(tmp_path):
    parser = parse_config(
        str(CONFIGS_2D / "train.yaml"), bundle_root=str(tmp_path), precision="fp32", device="$torch.device('cpu')"
    )
    resolved = parser.get_parsed_content("stage2").precision
    assert resolved.name == "fp32" and not resolved.autocast
    assert parser.get_parsed_content("run_settings").precision == "fp32"  # the setting, recorded as given
    trainer = parser.get_parsed_content("train#trainer")
    assert trainer.amp is False and trainer.amp_kwargs == {"dtype": torch.float32}
