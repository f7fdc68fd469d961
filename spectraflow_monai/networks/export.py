"""Deployment exports of the SpectraFlow networks: ONNX (with the frequency transforms as real matrix products)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.nn as nn

__all__ = ["export_onnx", "set_real_dft"]

logger = logging.getLogger(__name__)


def set_real_dft(network: nn.Module, enabled: bool = True) -> nn.Module:
    """Switch the frequency transforms of every ``FDConv2d`` and FBM in ``network`` to real matrix products.

    FDConv's kernels (``irfft2`` of the frequency weights) and FBM's low-pass bands (FFTs of the feature map) are
    computed with complex FFTs by default. ONNX exporters (and TensorRT) do not take complex tensors; with
    ``enabled`` the same transforms run as products with real DFT matrices (equal within float32 round-off, about
    1e-6 relative; tested). Returns ``network``.
    """
    for module in network.modules():
        if hasattr(module, "real_dft"):
            module.real_dft = bool(enabled)
    return network


def export_onnx(
    network: nn.Module,
    path: str | os.PathLike,
    image_size: int | tuple[int, int] = 224,
    in_channels: int | None = None,
    batch_size: int = 1,
    verify: bool = True,
    atol: float = 1e-4,
) -> Path:
    """Export ``network`` (e.g. ``SpectraFlowNet``) to ONNX at a fixed image size, and check it with onnxruntime.

    A copy of the network in ``eval`` mode with :func:`set_real_dft` is exported with ``torch.onnx.export(...,
    dynamo=True)`` (needs the ``onnx`` and ``onnxscript`` packages: the ``onnx`` extra); input ``image``
    ``(batch_size, C, H, W)``, output ``logits``. The shapes are static: FDConv convolves every sample with its own
    kernel as one grouped convolution whose group count is the batch size, and ONNX's ``Conv`` takes the group count
    as a constant. With ``verify`` and onnxruntime installed, the ONNX model's logits on a random batch must equal
    the network's own (eager, complex FFTs) within ``atol``.

    Args:
        network: the network; it is not modified.
        path: the ``.onnx`` file written.
        image_size: ``H`` (= ``W``) or ``(H, W)``, multiples of the patch size. Defaults to 224.
        in_channels: input channels. Defaults to ``network.in_channels`` (or 3).
        batch_size: the batch size of the exported model, >= 1. Defaults to 1.
        verify: run the check with onnxruntime (skipped with a log line where it is not installed). Defaults to True.
        atol: the largest absolute difference of the logits the check accepts. Defaults to 1e-4.

    Returns:
        the path written.

    Raises:
        ValueError: ``batch_size`` < 1, or the exported model's logits differ from the network's by more than ``atol``.
    """
    import copy

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    channels = int(in_channels if in_channels is not None else getattr(network, "in_channels", 3))
    model = set_real_dft(copy.deepcopy(network).eval())
    example = torch.randn(batch_size, channels, *size, device=next(network.parameters()).device)
    path = Path(path)
    with torch.no_grad():
        torch.onnx.export(model, (example,), str(path), input_names=["image"], output_names=["logits"], dynamo=True)
    if not verify:
        return path
    try:
        import onnxruntime
    except ImportError:
        logger.info("onnxruntime is not installed: the ONNX export %s was not checked", path)
        return path
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"image": example.cpu().numpy()})[0])
    with torch.no_grad():
        want = network.eval()(example).cpu()
    diff = float((got - want).abs().max())
    if not diff <= atol:
        raise ValueError(f"the ONNX export {path} differs from the network by {diff:.3g} (atol={atol}).")
    logger.info("ONNX export %s: logits within %.3g of the network's", path, diff)
    return path
