"""Direct Attentional Fusion (DAF): the gated skip fusion of the SpectraFlow decoder."""

from __future__ import annotations

import torch
import torch.nn as nn
from monai.networks.layers.factories import Act, Norm
from monai.networks.layers.utils import get_act_layer, get_norm_layer

from spectraflow_monai.networks.scripting import shape_str

__all__ = ["DirectAttentionalFusion"]


class DirectAttentionalFusion(nn.Module):
    """Direct Attentional Fusion of a decoder feature with a projected encoder skip feature.

    SpectraFlow (Chen et al.), Stage-2, eqs. (8)-(9):

    .. math::

        \\mathbf{f}_{sum} = \\mathbf{f}_{dec} + \\mathbf{f}_{skip}, \\quad
        \\mathbf{M} = \\sigma\\big(\\mathcal{B}_{local}(\\mathbf{f}_{sum}) + \\mathcal{B}_{global}(\\mathbf{f}_{sum})\\big),

        \\mathbf{f}_{fused} = 2\\,\\mathbf{f}_{dec} \\odot \\mathbf{M} + 2\\,\\mathbf{f}_{skip} \\odot (1 - \\mathbf{M}).

    The local branch is a point-wise bottleneck (1x1 conv - norm - act - 1x1 conv - norm) evaluated at every
    position; the global branch is the same bottleneck on the globally average-pooled feature (channel attention),
    broadcast over space. This is the attentional feature fusion (AFF) of Dai et al., "Attentional Feature Fusion",
    WACV 2021, with ``x = f_dec`` and ``residual = f_skip``.

    With the default batch normalisation the global branch normalises a 1x1 map, so training needs batches of at
    least two samples (as in the original AFF); pass a group norm spec such as ``("group", {"num_groups": 4})`` or
    ``None`` to train with batch size 1.

    Args:
        channels: number of channels C of both inputs (and of the output).
        reduction: bottleneck reduction ratio r of both branches (inner width ``max(channels // r, 1)``). Defaults to 4.
        norm: normalisation after each 1x1 conv, any MONAI norm spec (``"batch"``, ``("group", {"num_groups": 4})``,
            ...) or ``None``. Defaults to ``"batch"``.
        act: activation inside the bottlenecks, any MONAI act spec. Defaults to ``"relu"``.

    Example::

        >>> daf = DirectAttentionalFusion(64)
        >>> fused, gate = daf(torch.randn(2, 64, 32, 32), torch.randn(2, 64, 32, 32), return_gate=True)
        >>> fused.shape, gate.shape
        (torch.Size([2, 64, 32, 32]), torch.Size([2, 64, 32, 32]))
    """

    def __init__(
        self,
        channels: int,
        reduction: int = 4,
        norm: str | tuple | None = Norm.BATCH,
        act: str | tuple = Act.RELU,
    ) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be a positive integer, got {channels!r}.")
        if not isinstance(reduction, int) or reduction < 1:
            raise ValueError(f"reduction must be a positive integer, got {reduction!r}.")
        self.channels = channels
        inner = max(channels // reduction, 1)
        self.local_branch = self._bottleneck(channels, inner, norm, act)
        self.global_branch = nn.Sequential(nn.AdaptiveAvgPool2d(1), self._bottleneck(channels, inner, norm, act))

    @staticmethod
    def _bottleneck(channels: int, inner: int, norm, act) -> nn.Sequential:
        def _norm(ch: int) -> nn.Module:
            return nn.Identity() if norm is None else get_norm_layer(norm, spatial_dims=2, channels=ch)

        return nn.Sequential(
            nn.Conv2d(channels, inner, kernel_size=1),
            _norm(inner),
            get_act_layer(act),
            nn.Conv2d(inner, channels, kernel_size=1),
            _norm(channels),
        )

    def gate(self, f_dec: torch.Tensor, f_skip: torch.Tensor) -> torch.Tensor:
        """The gate map M in [0, 1] of shape (B, C, H, W) (eq. 8)."""
        f_sum = f_dec + f_skip
        return torch.sigmoid(self.local_branch(f_sum) + self.global_branch(f_sum))

    def forward(
        self, f_dec: torch.Tensor, f_skip: torch.Tensor, return_gate: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Fuse ``f_dec`` and ``f_skip`` (both (B, C, H, W)); optionally also return the gate map M."""
        fused, m = self.fuse_with_gate(f_dec, f_skip)
        if return_gate:
            return fused, m
        return fused

    def fuse_with_gate(self, f_dec: torch.Tensor, f_skip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(fused, M)``: the fused map and the gate map (one return type, for TorchScript)."""
        if f_dec.shape != f_skip.shape:
            raise ValueError(f"f_dec and f_skip must have the same shape, got {shape_str(f_dec)} and {shape_str(f_skip)}.")
        if f_dec.shape[1] != self.channels:
            raise ValueError(f"expected {self.channels} input channels, got {f_dec.shape[1]} (shape {shape_str(f_dec)}).")
        m = self.gate(f_dec, f_skip)
        return 2.0 * f_dec * m + 2.0 * f_skip * (1.0 - m), m
