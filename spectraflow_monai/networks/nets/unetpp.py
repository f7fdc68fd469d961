"""U-Net++ as a segmentation network with one output, the baseline of the paper's Fig. 5."""

from __future__ import annotations

import torch
from monai.networks.nets import BasicUNetPlusPlus

__all__ = ["UNetPlusPlus"]


class UNetPlusPlus(BasicUNetPlusPlus):
    """MONAI's :class:`~monai.networks.nets.BasicUNetPlusPlus` (Zhou et al., "UNet++: A Nested U-Net Architecture
    for Medical Image Segmentation", DLMIA 2018) returning the final nested output as a tensor.

    The paper compares SpectraFlow with U-Net++ under distribution shift (Fig. 5). ``BasicUNetPlusPlus`` always
    returns a list (its deep-supervision heads, or the final head alone); the Stage-2 trainer, MONAI's inferers and
    the metrics take one logits tensor, which this class returns: the last (deepest nested) head, the prediction
    U-Net++ makes at inference. Deep supervision is not part of the paper's comparison and is not offered here.

    Args:
        spatial_dims: number of spatial dimensions (2 for the 2D bundle).
        in_channels: input channels.
        out_channels: output channels (logits).
        features: the six feature widths of ``BasicUNetPlusPlus`` (default MONAI's ``(32, 32, 64, 128, 256, 32)``).
        kwargs: further ``BasicUNetPlusPlus`` arguments (``act``, ``norm``, ``bias``, ``dropout``, ``upsample``).

    Input height and width must be multiples of 16 (four poolings).
    """

    def __init__(
        self,
        spatial_dims: int = 2,
        in_channels: int = 3,
        out_channels: int = 1,
        features: tuple[int, ...] = (32, 32, 64, 128, 256, 32),
        **kwargs,
    ) -> None:
        if kwargs.get("deep_supervision"):
            raise ValueError("deep_supervision=True is not supported: UNetPlusPlus returns the final head only")
        kwargs.pop("deep_supervision", None)
        super().__init__(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            features=features,
            deep_supervision=False,
            **kwargs,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Logits ``(B, out_channels, *spatial)`` of the final nested head."""
        for i, size in enumerate(x.shape[2:]):
            if size % 16:
                raise ValueError(f"UNetPlusPlus needs spatial sizes that are multiples of 16, got {tuple(x.shape[2:])} "
                                 f"(dimension {i}: {size})")  # fmt: skip
        return super().forward(x)[-1]
