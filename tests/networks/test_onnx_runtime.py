"""The onnxruntime export variants (``spectraflow_monai.networks.onnx_runtime``): the ViT attention fused into
onnxruntime ``Attention`` nodes, and the ``cpu`` variant (fused attention + int8 encoder) that CPU servers run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from spectraflow_monai.networks.nets.spectraflow import SpectraFlowNet
from spectraflow_monai.networks.onnx_runtime import (
    ONNX_VARIANTS,
    OnnxAttention,
    export_variant,
    fuse_vit_attention,
)

torch.set_num_threads(1)


def _net(**kwargs) -> SpectraFlowNet:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = SpectraFlowNet(**{"img_size": 28, "encoder_kwargs": {"depth": 2}, **kwargs}).eval()
    with torch.no_grad():  # DINOv2's layer scale starts at 1e-5: let the blocks count, so that a change shows
        for name, p in net.encoder.named_parameters():
            if name.endswith((".ls1.gamma", ".ls2.gamma")):
                p.fill_(1.0)
    return net


def _ops(path) -> list[tuple[str, str]]:
    import onnx

    return [(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node]


def _quantised_weights(path) -> list[tuple[np.ndarray, np.ndarray]]:
    """(int8 weight, its zero point) of each ``MatMulInteger`` and ``QAttention`` node of the ONNX file ``path``."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    where = {"MatMulInteger": (1, 3), "QAttention": (1, 7)}  # (weight, weight zero point) input positions
    return [
        (constants[n.input[where[n.op_type][0]]], constants[n.input[where[n.op_type][1]]])
        for n in model.graph.node
        if n.op_type in where
    ]


@pytest.mark.parametrize("encoder", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_fused_attention_copy_runs_as_the_network(encoder):
    net = _net(encoder=encoder, out_channels=3)
    fused = fuse_vit_attention(net)
    wrapped = [m for m in fused.modules() if isinstance(m, OnnxAttention)]
    assert len(wrapped) == 2 and not any(isinstance(m, OnnxAttention) for m in net.modules())  # net unchanged
    sizes = [sorted(t.numel() for t in m.state_dict().values()) for m in (fused, net)]
    assert sizes[0] == sizes[1]  # the same weights, nothing added (the transposed qkv is not saved)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), net(x), rtol=0, atol=0)


def test_fuse_vit_attention_needs_a_vit():
    with pytest.raises(ValueError, match="holds no ViT attention to fuse"):
        fuse_vit_attention(torch.nn.Conv2d(3, 2, 3))
    with pytest.raises(ValueError, match="attention must be a timm Attention"):
        OnnxAttention(torch.nn.Linear(4, 4))


def test_fused_attention_export_equals_the_network_at_fp32(tmp_path):
    """The fused graph in float32: one onnxruntime Attention per block, logits equal to PyTorch's within float
    round-off at any batch size (export_onnx checks batches 1 and 3 within atol)."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    from spectraflow_monai.networks.export import export_onnx

    net = _net(out_channels=9, in_channels=1)
    path = export_onnx(fuse_vit_attention(net), tmp_path / "fused.onnx", image_size=28, atol=1e-4)
    ops = _ops(path)
    assert ops.count(("com.microsoft", "Attention")) == 2 and ("", "Softmax") not in ops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        np.testing.assert_allclose(session.run(None, {"image": x.numpy()})[0], net(x).numpy(), atol=1e-4)


@pytest.mark.parametrize("variant", ONNX_VARIANTS)
def test_export_variants(variant, tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    net = _net(out_channels=3)
    path = export_variant(net, tmp_path / "net.onnx", variant, image_size=28, atol=0.1, metadata={"k": "v"})
    ops = _ops(path)
    quantised = {op for _, op in ops if op in ("QAttention", "MatMulInteger")}
    assert quantised == {"fp32": set(), "int8-encoder": {"MatMulInteger"}, "cpu": {"QAttention", "MatMulInteger"}}[
        variant
    ]
    # one int8 scale and zero point per output column of each weight (per channel), not one per matrix
    for weight, zero_point in _quantised_weights(path):
        assert zero_point.shape == (weight.shape[1],), (weight.shape, zero_point.shape)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map["k"] == "v"
    x = torch.randn(4, 3, 28, 28)
    with torch.no_grad():
        want = net(x)
    got = torch.from_numpy(session.run(None, {"image": x.numpy()})[0])
    assert float((got - want).abs().max()) < 0.1 * float(want.std())
    assert float((got.argmax(1) == want.argmax(1)).float().mean()) >= 0.95


def test_one_int8_scale_per_matrix_on_request(tmp_path):
    """``quantize_encoder_linear(per_channel=False)``: onnxruntime's default, one scale and zero point per weight
    matrix (the benchmark's comparison with the per-channel exports)."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from spectraflow_monai.networks.export import quantize_encoder_linear

    fp32 = export_variant(_net(out_channels=3), tmp_path / "fp32.onnx", "fp32", image_size=28, atol=1e-3)
    quantize_encoder_linear(fp32, tmp_path / "per_matrix.onnx", per_channel=False)
    weights = _quantised_weights(tmp_path / "per_matrix.onnx")
    assert weights and all(zero_point.shape == () for _, zero_point in weights)


def test_export_variant_arguments(tmp_path):
    with pytest.raises(ValueError, match="variant must be one of"):
        export_variant(_net(), tmp_path / "x.onnx", "fp16")


def test_cli_variants_are_the_modules():
    from spectraflow_monai.apps.onnx_export import VARIANTS

    assert VARIANTS == ONNX_VARIANTS
