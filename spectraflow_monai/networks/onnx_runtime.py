"""ONNX exports tuned for onnxruntime's CPU execution provider: the export variants of a SpectraFlow network.

Three variants of one exported model, each made by :func:`export_variant`:

- ``"fp32"``: the network as it is (:func:`~spectraflow_monai.networks.export.export_onnx`); logits equal to
  PyTorch's within float32 round-off.
- ``"int8-encoder"``: the ViT's attention and MLP linear layers dynamically quantised to int8, one scale per output
  channel (:func:`~spectraflow_monai.networks.export.quantize_encoder_linear`); the decoder stays float32.
- ``"cpu"``: the recommended variant for CPU servers. Each ViT attention (the ``qkv`` projection, the scaled
  dot-product attention over the heads) is exported as one onnxruntime ``com.microsoft.Attention`` node
  (:func:`fuse_vit_attention`) instead of a projection, a split into heads, two matrix products, a softmax and the
  transposes between them; the dynamic int8 quantisation then turns each into a ``QAttention`` (int8 ``qkv``
  projection) and quantises the output projection and the MLP as in ``"int8-encoder"``. The decoder stays float32.

``com.microsoft.Attention`` is an onnxruntime operator (not in the ONNX standard): a ``"cpu"`` export runs in
onnxruntime only (CPU and CUDA execution providers), not in other ONNX runtimes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn as nn

__all__ = [
    "CPU_SESSION_CONFIG",
    "ONNX_VARIANTS",
    "RECOMMENDED_CPU_VARIANT",
    "OnnxAttention",
    "export_variant",
    "fuse_vit_attention",
]

#: the export variants, in the order of ``spectraflow export-onnx --variant``'s choices
ONNX_VARIANTS = ("fp32", "int8-encoder", "cpu")
#: the variant the documentation recommends for CPU servers (docs/benchmarks.md, "Synapse CT volumes on a CPU server")
RECOMMENDED_CPU_VARIANT = "cpu"
#: onnxruntime session entries for CPU servers (``OnnxNetwork(session_config=...)``, the Synapse bundle's
#: ``inference_onnx.yaml``): the intra-op threads sleep between runs instead of spinning, as fast on an idle CPU and
#: faster where other processes share the cores
CPU_SESSION_CONFIG = {"session.intra_op.allow_spinning": "0"}


class OnnxAttention(nn.Module):
    """A timm ViT ``Attention`` that an ONNX export writes as one onnxruntime ``com.microsoft.Attention`` node.

    In PyTorch (outside an export) it runs the wrapped attention unchanged, so a network holding it gives the same
    logits. In ``torch.onnx.export`` the ``qkv`` projection and the scaled dot-product attention become one
    ``Attention(x, W_qkv^T, b_qkv, num_heads)`` node (the same products: Q, K and V are the consecutive thirds of the
    ``qkv`` output, each head a consecutive ``head_dim`` slice, scale ``head_dim ** -0.5``), followed by the
    attention's output projection.

    Args:
        attention: a timm ``Attention`` with a ``qkv`` bias, no q / k / output normalisation and no gate (the DINOv2
            ViTs'); see :meth:`fusable`.

    Raises:
        ValueError: ``attention`` is not such a module.
    """

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        if not self.fusable(attention):
            raise ValueError(f"attention must be a timm Attention with a qkv bias and no normalisation or gate, got "
                             f"{type(attention).__name__}.")  # fmt: skip
        self.attention = attention
        self.num_heads = int(attention.num_heads)
        self.register_buffer("qkv_weight", attention.qkv.weight.detach().t().contiguous(), persistent=False)
        self.register_buffer("qkv_bias", attention.qkv.bias.detach().clone(), persistent=False)

    @staticmethod
    def fusable(attention: nn.Module) -> bool:
        """Whether ``attention`` is a timm ``Attention`` that :class:`OnnxAttention` exports exactly."""
        qkv = getattr(attention, "qkv", None)
        identity = (nn.Identity, type(None))
        return (
            isinstance(qkv, nn.Linear) and qkv.bias is not None
            and isinstance(getattr(attention, "proj", None), nn.Linear)
            and isinstance(getattr(attention, "num_heads", None), int)
            and qkv.out_features == 3 * qkv.in_features == 3 * attention.num_heads * getattr(attention, "head_dim", -1)
            and all(isinstance(getattr(attention, name, None), identity) for name in ("q_norm", "k_norm", "norm"))
            and getattr(attention, "gate", None) is None
        )  # fmt: skip

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if not torch.onnx.is_in_onnx_export() or attn_mask is not None or is_causal:
            return self.attention(x, attn_mask=attn_mask, is_causal=is_causal)
        fused = torch.onnx.ops.symbolic(
            "com.microsoft::Attention", [x, self.qkv_weight, self.qkv_bias], {"num_heads": self.num_heads},
            dtype=x.dtype, shape=x.shape, version=1,
        )  # fmt: skip
        return self.attention.proj_drop(self.attention.proj(fused))


def fuse_vit_attention(network: nn.Module) -> nn.Module:
    """A copy of ``network`` (in ``eval`` mode) whose ViT attention modules export as onnxruntime ``Attention``
    nodes (:class:`OnnxAttention`); ``network`` is not modified and the copy's PyTorch outputs are its own.

    Every timm ``Attention`` that :meth:`OnnxAttention.fusable` accepts (those of the DINOv2 encoders) is wrapped;
    others are left as they are.

    Raises:
        ValueError: ``network`` holds no such attention module.
    """
    fused = copy.deepcopy(network).eval()
    targets = [(parent, name) for parent in fused.modules() for name, child in parent.named_children()
               if not isinstance(parent, OnnxAttention) and OnnxAttention.fusable(child)]  # fmt: skip
    if not targets:
        raise ValueError(f"{type(network).__name__} holds no ViT attention to fuse (the cpu variant is for the "
                         "SpectraFlow networks' DINOv2 encoders).")  # fmt: skip
    for parent, name in targets:
        setattr(parent, name, OnnxAttention(getattr(parent, name)))
    return fused


def export_variant(
    network: nn.Module,
    path: str | os.PathLike,
    variant: str = "fp32",
    image_size: int | tuple[int, int] = 224,
    in_channels: int | None = None,
    atol: float = 1e-4,
    metadata: Mapping[str, str] | None = None,
    verify: bool = True,
) -> Path:
    """Export ``network`` as the ONNX ``variant`` (see the module's description) with
    :func:`~spectraflow_monai.networks.export.export_onnx`: a free batch axis, checked against the network at batch
    1 and 3 within ``atol`` (the int8 variants are not equal to the network within float round-off: give an
    ``atol`` that suits the model and compare the labels on own images), ``metadata`` in its ``metadata_props``.

    Args:
        network: the network (not modified).
        path: the ``.onnx`` file written.
        variant: one of :data:`ONNX_VARIANTS`. Defaults to ``"fp32"``.
        image_size: ``H`` (= ``W``) or ``(H, W)``. Defaults to 224.
        in_channels: input channels. Defaults to ``network.in_channels`` (or 3).
        atol: the largest absolute difference of the logits the check accepts. Defaults to 1e-4.
        metadata: ONNX metadata written into the file. Defaults to None.
        verify: run the check with onnxruntime. Defaults to True.

    Returns:
        the path written.

    Raises:
        ValueError: ``variant`` is not one of :data:`ONNX_VARIANTS`, a ``"cpu"`` export of a network without a ViT
            attention, or the check fails.
    """
    from spectraflow_monai.networks.export import export_onnx

    if variant not in ONNX_VARIANTS:
        raise ValueError(f"variant must be one of {ONNX_VARIANTS}, got {variant!r}.")
    model = fuse_vit_attention(network) if variant == "cpu" else network
    if in_channels is None:
        in_channels = getattr(network, "in_channels", None)
    return export_onnx(
        model, path, image_size=image_size, in_channels=in_channels, atol=atol, verify=verify,
        int8_encoder=variant != "fp32", metadata=metadata,
    )  # fmt: skip
