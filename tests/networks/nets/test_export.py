"""Deployment exports of SpectraFlowNet: TorchScript scripting (model-zoo's ``ci/verify_bundle.py`` scripts the
network) and ONNX (skipped where onnxruntime is not installed)."""

from __future__ import annotations

import warnings

import pytest
import torch

from spectraflow_monai.networks.nets.spectraflow import SpectraFlowNet

torch.set_num_threads(1)

SMALL = {"pretrained": "none", "img_size": 28, "encoder_kwargs": {"depth": 3}}


def _net(**kwargs) -> SpectraFlowNet:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SpectraFlowNet(**{**SMALL, **kwargs}).eval()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"fusion": "concat", "refine": "standard"},
        {"fusion": "add", "refine": "cbam"},
        {"refine": "fdconv_cbam"},
        {"in_channels": 1, "out_channels": 9},
        {"encoder": "vit_small_patch14_reg4_dinov2"},
    ],
)
def test_torchscript_matches_eager(kwargs):
    net = _net(**kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(net)
    x = torch.randn(2, net.in_channels, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), net(x), rtol=0, atol=0)
        logits, gate = scripted(x, return_gate=True)
    assert logits.shape == (2, net.out_channels, 28, 28)
    assert (gate is None) == (kwargs.get("fusion", "daf") != "daf")


def test_torchscript_input_check():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(_net())
    with pytest.raises(Exception, match="expected input of shape"):
        scripted(torch.randn(1, 2, 28, 28))
