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


@pytest.mark.parametrize("kwargs", [{}, {"in_channels": 1, "out_channels": 3, "refine": "fdconv_cbam"}])
def test_real_dft_matches_complex_fft(kwargs):
    """set_real_dft: FDConv's kernels and FBM's bands as real matrix products, within float32 round-off."""
    from spectraflow_monai.networks.export import set_real_dft

    net = _net(**kwargs)
    for p in net.decoder.parameters():  # move FDConv / FBM away from their identity initialisation
        p.data += 0.05 * torch.randn_like(p)
    x = torch.randn(2, net.in_channels, 28, 42)
    with torch.no_grad():
        want = net(x)
        got = set_real_dft(net)(x)
        set_real_dft(net, False)
    assert any(getattr(m, "real_dft", None) is False for m in net.modules())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_onnx_export_matches_pytorch(tmp_path):
    """ONNX (dynamo exporter, real DFT) run by onnxruntime: logits within 1e-4 of PyTorch's (about 1e-7 seen)."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from spectraflow_monai.networks.export import export_onnx

    net = _net()
    path = export_onnx(net, tmp_path / "net.onnx", image_size=28, batch_size=2, verify=True, atol=1e-4)
    x = torch.randn(2, 3, 28, 28)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"image": x.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), net(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="batch_size"):
        export_onnx(net, tmp_path / "x.onnx", batch_size=0)
