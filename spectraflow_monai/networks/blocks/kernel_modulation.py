"""Kernel Spatial Modulation (KSM) of FDConv: the attentions that multiply the frequency-synthesised kernel.

Chen et al., "Frequency Dynamic Convolution for Dense Image Prediction", CVPR 2025 (official code
``Linwei-Chen/FDConv``, ``KernelSpatialModulation_Global`` / ``KernelSpatialModulation_Local``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["KernelSpatialModulationGlobal", "KernelSpatialModulationLocal", "StarReLU"]


class StarReLU(nn.Module):
    """StarReLU ``s * relu(x) ** 2 + b`` with learnable scalars (Yu et al., "MetaFormer Baselines", 2022).

    timm ships it only inside ``timm.models.metaformer`` (not in ``timm.layers``); this copy keeps timm optional.

    Args:
        scale: initial value of ``s``. Defaults to 1.0.
        bias: initial value of ``b``. Defaults to 0.0.
    """

    def __init__(self, scale: float = 1.0, bias: float = 0.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), float(scale)))
        self.bias = nn.Parameter(torch.full((1,), float(bias)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * F.relu(x).square() + self.bias


class KernelSpatialModulationGlobal(nn.Module):
    """Global branch of FDConv's Kernel Spatial Modulation (KSM) on the globally pooled input.

    Trunk ``Linear(Cin, A, bias=False) -> LayerNorm(A) -> StarReLU`` followed by four linear heads: channel
    (``Cin``), filter (``Cout``), spatial (``k*k``, only for ``k > 1``) and kernel-number (``kernel_num``, only for
    ``kernel_num > 1``) attentions. Channel, filter and spatial attentions are ``2 * sigmoid(logit / temperature)``;
    the kernel attention is ``2 * sigmoid(logit / kernel_temperature) / kernel_num``. All heads are zero-initialised,
    so at initialisation every attention is exactly 1 (kernel attention exactly ``1 / kernel_num``).

    Args:
        in_channels: input channels ``Cin``.
        out_channels: output channels ``Cout``.
        kernel_size: square kernel size ``k``.
        kernel_num: number of frequency bands ``kernel_num``.
        attention_channels: trunk width ``A``.
        temperature: temperature of the channel/filter/spatial attentions.
        kernel_temperature: temperature of the kernel attention.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        kernel_num: int,
        attention_channels: int,
        temperature: float = 1.0,
        kernel_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.kernel_num = kernel_num
        self.temperature = float(temperature)
        self.kernel_temperature = float(kernel_temperature)
        self.fc = nn.Linear(in_channels, attention_channels, bias=False)
        self.norm = nn.LayerNorm(attention_channels)
        self.act = StarReLU()
        self.channel_fc = nn.Linear(attention_channels, in_channels)
        self.filter_fc = nn.Linear(attention_channels, out_channels)
        self.spatial_fc = nn.Linear(attention_channels, kernel_size * kernel_size) if kernel_size > 1 else None
        self.kernel_fc = nn.Linear(attention_channels, kernel_num) if kernel_num > 1 else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming (fan-out) trunk as in the official code; all heads zero so that every attention starts at 1."""
        nn.init.kaiming_normal_(self.fc.weight, mode="fan_out", nonlinearity="relu")
        self.norm.reset_parameters()
        with torch.no_grad():
            self.act.scale.fill_(1.0)
            self.act.bias.fill_(0.0)
        for head in (self.channel_fc, self.filter_fc, self.spatial_fc, self.kernel_fc):
            if head is not None:
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def forward(
        self, pooled: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """
        Args:
            pooled: globally average-pooled input, shape ``(B, Cin)``.

        Returns:
            channel ``(B, Cin)``, filter ``(B, Cout)``, spatial ``(B, k, k)`` or None, kernel ``(B, kernel_num)``
            or None attentions.
        """
        hidden = self.act(self.norm(self.fc(pooled)))
        channel = 2.0 * torch.sigmoid(self.channel_fc(hidden) / self.temperature)
        filt = 2.0 * torch.sigmoid(self.filter_fc(hidden) / self.temperature)
        spatial: Optional[torch.Tensor] = None
        if self.spatial_fc is not None:
            spatial_logit = self.spatial_fc(hidden).reshape(-1, self.kernel_size, self.kernel_size)
            spatial = 2.0 * torch.sigmoid(spatial_logit / self.temperature)
        kernel: Optional[torch.Tensor] = None
        if self.kernel_fc is not None:
            kernel = 2.0 * torch.sigmoid(self.kernel_fc(hidden) / self.kernel_temperature) / self.kernel_num
        return channel, filt, spatial, kernel


class KernelSpatialModulationLocal(nn.Module):
    """Local branch of FDConv's Kernel Spatial Modulation: a dense, per-element kernel modulation (ECA-like).

    The pooled input ``(B, Cin)`` is layer-normalised and read by a ``Conv1d(1, Cout*k*k)`` sliding along the input
    channels (kernel ``round(log2(Cin) / 2 + 0.5) // 2 * 2 + 1``, i.e. 5 for 64-256 channels), giving one logit per
    kernel element; the modulation is ``2 * sigmoid(logit)``. The convolution is zero-initialised (modulation 1).

    Args:
        in_channels: input channels ``Cin``.
        out_channels: output channels ``Cout``.
        kernel_size: square kernel size ``k``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        eca_kernel = round(math.log2(in_channels) / 2 + 0.5) // 2 * 2 + 1
        self.norm = nn.LayerNorm(in_channels)
        self.conv = nn.Conv1d(
            1, out_channels * kernel_size * kernel_size, eca_kernel, padding=eca_kernel // 2, bias=False
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        nn.init.zeros_(self.conv.weight)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """Map the pooled input ``(B, Cin)`` to the modulation ``(B, Cout, Cin, k, k)``."""
        logits = self.conv(self.norm(pooled).unsqueeze(1))  # (B, Cout*k*k, Cin)
        k = self.kernel_size
        logits = logits.reshape(logits.shape[0], self.out_channels, k, k, logits.shape[-1]).permute(0, 1, 4, 2, 3)
        return 2.0 * torch.sigmoid(logits)
