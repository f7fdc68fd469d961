"""U-Net++ as Zhou et al. built it, the baseline of the paper's Fig. 5, on MONAI's ``BasicUNetPlusPlus``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from monai.networks.nets import BasicUNetPlusPlus

__all__ = ["MONAI_UNETPP_FEATURES", "ZHOU_UNETPP_FEATURES", "UNetPlusPlus"]

#: the widths of Zhou et al.'s U-Net++ (32, 64, 128, 256, 512 over the five levels; the sixth value is the width of
#: the nested level-0 nodes that MONAI's ``BasicUNetPlusPlus`` takes separately, 32 as in Zhou et al.).
ZHOU_UNETPP_FEATURES: tuple[int, ...] = (32, 64, 128, 256, 512, 32)
#: MONAI's ``BasicUNetPlusPlus`` default widths (32-256; 2.41 M parameters at 3 -> 1 channels).
MONAI_UNETPP_FEATURES: tuple[int, ...] = (32, 32, 64, 128, 256, 32)


class UNetPlusPlus(BasicUNetPlusPlus):
    """U-Net++ (Zhou et al., "UNet++: A Nested U-Net Architecture for Medical Image Segmentation", DLMIA 2018) on
    MONAI's :class:`~monai.networks.nets.BasicUNetPlusPlus`, returning logits as one tensor at evaluation.

    SpectraFlow (Chen et al.) compares itself with U-Net++ under distribution shift (Fig. 5) without giving its
    configuration. The defaults here are Zhou et al.'s: widths 32-512 (:data:`ZHOU_UNETPP_FEATURES`, 9.12 M
    parameters at 3 -> 1 channels), batch normalisation and ReLU after every 3x3 convolution. MONAI's own defaults
    (widths 32-256, instance normalisation, LeakyReLU 0.1: 2.41 M parameters) are a named variant of the 2D bundle
    (``configs/unetpp_monai_baseline.yaml``); instance normalisation standardises every feature map per image and so
    partly cancels the brightness and contrast shifts Fig. 5 applies.

    ``BasicUNetPlusPlus`` always returns a list; the Stage-2 trainer, MONAI's inferers and the metrics take one logits
    tensor. Without deep supervision this class returns the final nested head ``X^{0,4}`` as that tensor. With
    ``deep_supervision=True`` (Zhou et al.'s deep supervision) it returns, in training mode, the list of the four
    level-0 heads ``[X^{0,1}, X^{0,2}, X^{0,3}, X^{0,4}]`` (final head last) for MONAI's
    :class:`~monai.losses.DeepSupervisionLoss` (the bundle averages the heads' losses, weights 1/4 each, as Zhou et
    al.), and in evaluation mode the final head alone (Zhou et al.'s "fast mode" with the full network; their
    "accurate mode" averages the heads' outputs instead).

    Args:
        spatial_dims: number of spatial dimensions (2 for the 2D bundle). Defaults to 2.
        in_channels: input channels. Defaults to 3.
        out_channels: output channels (logits). Defaults to 1.
        features: the six widths of ``BasicUNetPlusPlus`` (five levels, then the nested level-0 nodes). Defaults to
            :data:`ZHOU_UNETPP_FEATURES`.
        norm: normalisation after each convolution, a MONAI ``Norm`` name or ``(name, args)``. Defaults to
            ``("batch", {"affine": True})``, as Zhou et al. (MONAI's default is instance normalisation).
        act: activation, a MONAI ``Act`` name or ``(name, args)``. Defaults to ``("relu", {"inplace": True})``, as
            Zhou et al. (MONAI's default is LeakyReLU 0.1).
        deep_supervision: return the four level-0 heads in training mode (the final head at evaluation). Defaults to
            False.
        kwargs: further ``BasicUNetPlusPlus`` arguments (``bias``, ``dropout``, ``upsample``).

    Raises:
        ValueError: ``features`` is not six positive integers, or ``deep_supervision`` is not a bool.

    Input height and width must be multiples of 16 (four poolings).
    """

    def __init__(
        self,
        spatial_dims: int = 2,
        in_channels: int = 3,
        out_channels: int = 1,
        features: Sequence[int] = ZHOU_UNETPP_FEATURES,
        norm: str | tuple = ("batch", {"affine": True}),
        act: str | tuple = ("relu", {"inplace": True}),
        deep_supervision: bool = False,
        **kwargs,
    ) -> None:
        features = tuple(features)
        if len(features) != 6 or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in features):
            raise ValueError(f"features must be six positive integers, got {features!r}.")
        if not isinstance(deep_supervision, bool):
            raise ValueError(f"deep_supervision must be a bool, got {deep_supervision!r}.")
        super().__init__(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            features=features,
            deep_supervision=deep_supervision,
            norm=norm,
            act=act,
            **kwargs,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:  # type: ignore[override]
        """Logits ``(B, out_channels, *spatial)`` of the final nested head; with deep supervision in training mode,
        the list of the four level-0 heads (final head last)."""
        for i, size in enumerate(x.shape[2:]):
            if size % 16:
                raise ValueError(f"UNetPlusPlus needs spatial sizes that are multiples of 16, got {tuple(x.shape[2:])} "
                                 f"(dimension {i}: {size})")  # fmt: skip
        heads = super().forward(x)
        if self.deep_supervision and self.training:
            return list(heads)
        return heads[-1]
