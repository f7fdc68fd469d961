"""The CUDA paths for real (``pytest -m gpu``; skipped where CUDA is not available).

On a CUDA device: one Stage-1 epoch (MeanFlow JVP + dispersive loss) and one Stage-2 epoch (Dice + BCE + boundary) of
the 2D bundle in bf16 and in fp16 (fp16 with its gradient scaler), each a ``monai.bundle`` workflow on a tiny
synthetic set; the Synapse bundle's slice-wise inference (``monai.inferers.SliceInferer``) of a CT volume on CUDA; and
a NCCL process group of one process around the Stage-2 network (``torchrun``, the multi-GPU config). Tiny settings: 56x56
inputs, a 2-block encoder, a handful of images. A Stage-1 run resumed on CUDA (its checkpoint mapped to the GPU).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
import torch

from tests.bundles.helpers import (
    CONFIGS_2D,
    CONFIGS_3D,
    assert_float32_state,
    load_weights,
    layered,
    parse_config,
    record_output_dtypes,
    run_workflow,
    synapse_model_and_volume,
    tiny_2d_settings,
)

pytestmark = pytest.mark.gpu

NET = {"image_size": 56, "encoder_kwargs": {"depth": 2}}
TINY = tiny_2d_settings(56, "cuda")
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}



@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_stage1_epoch_on_cuda(tmp_path, precision):
    parser = parse_config(
        [str(CONFIGS_2D / "train.yaml"), str(CONFIGS_2D / "train_stage1.yaml")],
        bundle_root=str(tmp_path),
        precision=precision,
        stage1_epochs=1,
        stage1_batch_size=2,
        head_hidden_channels=16,
        head_num_blocks=1,
        **TINY,
    )
    program = parser.get_parsed_content("stage1")
    trainer = program.build(load_weights=False)
    assert trainer.amp and trainer._autocast_kwargs["dtype"] == HALF[precision]
    assert (trainer.scaler is not None) == (precision == "fp16")  # float16 needs its gradient scaler
    encoder = program.encoder
    assert next(encoder.parameters()).device.type == "cuda"
    dtypes = record_output_dtypes(encoder.vit.blocks[0].attn.qkv)
    trainer.run()
    assert HALF[precision] in dtypes  # the encoder's linear layers ran under CUDA autocast
    out = trainer.state.output
    for key in ("loss", "meanflow_error", "loss_meanflow_weighted", "loss_dispersive"):
        assert math.isfinite(out[key]), out
    assert_float32_state(load_weights(tmp_path / "models" / "encoder_stage1.pt"))


def test_stage1_resumes_on_cuda(tmp_path):
    """A Stage-1 run continued on the GPU: the checkpoint (random states included) loads onto ``cuda``."""
    settings = {
        "bundle_root": str(tmp_path), "precision": "bf16", "stage1_batch_size": 2, "head_hidden_channels": 16,
        "head_num_blocks": 1, **TINY,
    }  # fmt: skip
    configs = [str(CONFIGS_2D / "train.yaml"), str(CONFIGS_2D / "train_stage1.yaml")]
    run_workflow(parse_config(configs, stage1_epochs=1, **settings))
    parser = parse_config(configs, stage1_epochs=2, **settings)
    run_workflow(parser)
    trainer = parser.get_parsed_content("stage1").trainer
    assert trainer.state.epoch == 2 and trainer.state.iteration == 2 * trainer.state.epoch_length
    assert_float32_state(load_weights(tmp_path / "models" / "encoder_stage1.pt"))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_stage2_epoch_on_cuda(tmp_path, precision):
    parser = parse_config(
        str(CONFIGS_2D / "train.yaml"), bundle_root=str(tmp_path), max_epochs=1, precision=precision, **TINY
    )
    network = parser.get_parsed_content("network")
    assert next(network.parameters()).device.type == "cuda"
    # the encoder's linear layers show the autocast (CUDA autocast runs the final upsampling in float32)
    dtypes = record_output_dtypes(network.encoder.vit.blocks[0].attn.qkv)
    trainer = parser.get_parsed_content("train#trainer")
    assert trainer.amp == (precision == "fp16")  # MONAI's amp = float16 autocast + GradScaler
    run_workflow(parser)
    assert HALF[precision] in dtypes  # the forward ran under CUDA autocast
    assert math.isfinite(float(trainer.state.output[0]["loss"]))
    metrics = parser.get_parsed_content("validate#evaluator").state.metrics
    for name in ("val_mean_dice", "val_mean_iou"):
        assert math.isfinite(float(metrics[name])), (name, metrics)
    state = load_weights(tmp_path / "models" / "model.pt")
    assert_float32_state(state)


def test_synapse_slice_inferer_on_cuda(tmp_path):
    root, in_dir, image = synapse_model_and_volume(tmp_path, NET, (60, 52, 5))
    common = {"bundle_root": str(root), "input_dir": str(in_dir), **NET}
    results = {}
    for device, precision in (("cuda", "bf16"), ("cuda", "fp32"), ("cpu", "fp32")):
        out_dir = tmp_path / f"out_{device}_{precision}"
        parser = parse_config(
            str(CONFIGS_3D / "inference.yaml"),
            output_dir=str(out_dir),
            precision=precision,
            device=f"$torch.device('{device}')",
            **common,
        )
        network = parser.get_parsed_content("network")
        assert next(network.parameters()).device.type == device
        dtypes = record_output_dtypes(network.encoder.vit.blocks[0].attn.qkv)
        run_workflow(parser)
        if precision == "bf16":
            assert torch.bfloat16 in dtypes  # every slice batch ran under CUDA autocast
        out = nib.load(str(out_dir / "case_seg.nii.gz"))
        assert out.shape == image.shape
        results[(device, precision)] = np.asarray(out.dataobj)
    # the same weights give (nearly) the same labels on CUDA and on the CPU in float32
    agree = (results[("cuda", "fp32")] == results[("cpu", "fp32")]).mean()
    assert agree > 0.99, agree


def test_multi_gpu_config_with_nccl(tmp_path):
    """``configs/multi_gpu_train.yaml`` under ``torchrun`` (one process): NCCL process group, DDP-wrapped network on
    ``cuda:0``, one Stage-2 epoch."""
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    overrides = {**TINY, "max_epochs": 1, "precision": "bf16"}
    overrides.pop("device")  # the multi-GPU config picks cuda:<local rank>
    args = []
    for key, value in overrides.items():
        args += [f"--{key}", repr(value) if isinstance(value, dict) else str(value)]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", "29533",
        "-m", "monai.bundle", "run",
        "--config_file", repr(layered([CONFIGS_2D / "train.yaml", CONFIGS_2D / "multi_gpu_train.yaml"])),
        "--meta_file", str(CONFIGS_2D / "metadata.json"), "--logging_file", str(CONFIGS_2D / "logging.conf"),
        "--bundle_root", str(tmp_path), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="2"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "precision: bf16" in out, out[-6000:]
    assert_float32_state(load_weights(tmp_path / "models" / "model.pt"))
