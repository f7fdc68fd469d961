"""U-Net++ (Zhou et al.), the baseline of the paper's Fig. 5, on MONAI's ``BasicUNetPlusPlus``: Zhou et al.'s widths
and up-sampling, with batch norm (the bundle's baseline) or as their reference code (no normalisation, dropout 0.5)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from monai.networks.nets import BasicUNetPlusPlus
from monai.networks.nets.basic_unet import UpCat

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
    configuration. The widths and the up-sampling here are Zhou et al.'s: widths 32-512 (:data:`ZHOU_UNETPP_FEATURES`)
    and 2x2 transposed convolutions that halve the channels at every level, the level-0 nodes included
    (``halve_level0``; MONAI's ``BasicUNetPlusPlus`` keeps ``features[1]`` channels there, 64 at these widths). Zhou
    et al.'s reference code (the Keras ``Nest_Net`` of the DLMIA paper) then has no normalisation, ReLU, dropout 0.5
    after every 3x3 convolution and an L2 penalty of 1e-4 on the convolution kernels: ``norm=None, dropout=0.5``
    here, with the penalty in the optimizer (:func:`~spectraflow_monai.optimizers.kernel_l2_parameter_groups`), is
    that network, 9,041,700 parameters at 1 -> 1 channels (their count, 9,041,601, plus the three 1x1 side heads of 33
    parameters each that MONAI builds also without deep supervision). The defaults instead put batch normalisation
    after every 3x3 convolution, without dropout: the 2D bundle's Fig. 5 baseline (``configs/unetpp_baseline.yaml``,
    9.05 M parameters at 3 -> 1 channels), a labelled deviation from the reference code (docs/method.md); the
    reference reading is ``configs/unetpp_zhou_literal_baseline.yaml``. MONAI's own defaults (widths 32-256, no
    halving at level 0, instance normalisation, LeakyReLU 0.1: 2.41 M parameters) are
    ``configs/unetpp_monai_baseline.yaml``; instance normalisation standardises every feature map per image and so
    partly cancels the brightness and contrast shifts Fig. 5 applies.

    MONAI orders a convolution's normalisation, dropout and activation as N, D, A: dropout before the ReLU, where
    Zhou et al. apply it after; the two are the same function, as ReLU commutes with a non-negative scaling. The
    weights start from PyTorch's default initialisation, not Keras's ``he_normal``.

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
        norm: normalisation after each 3x3 convolution, a MONAI ``Norm`` name, ``(name, args)`` or None for none.
            Defaults to ``("batch", {"affine": True})``, the bundle's baseline (Zhou et al.'s reference code: None;
            MONAI's default: instance normalisation).
        act: activation, a MONAI ``Act`` name or ``(name, args)``. Defaults to ``("relu", {"inplace": True})``, as
            Zhou et al. (MONAI's default is LeakyReLU 0.1).
        dropout: dropout probability after each 3x3 convolution. Defaults to 0.0 (Zhou et al.'s reference code: 0.5).
        deep_supervision: return the four level-0 heads in training mode (the final head at evaluation). Defaults to
            False.
        halve_level0: the up-sampling into the level-0 nodes halves the channels (``features[1] // 2``), as at every
            other level and as Zhou et al.; False keeps MONAI's ``features[1]`` there (its default widths have 32 at
            levels 0 and 1). Defaults to True.
        bias: convolutions with a bias. Defaults to True.
        upsample: ``BasicUNetPlusPlus``'s up-sampling mode. Defaults to ``"deconv"`` (a 2x2 transposed convolution
            of stride 2, as Zhou et al.).

    Raises:
        ValueError: ``features`` is not six positive integers, or ``deep_supervision`` or ``halve_level0`` is not a
            bool.

    Input height and width must be multiples of 16 (four poolings).
    """

    def __init__(
        self,
        spatial_dims: int = 2,
        in_channels: int = 3,
        out_channels: int = 1,
        features: Sequence[int] = ZHOU_UNETPP_FEATURES,
        norm: str | tuple | None = ("batch", {"affine": True}),
        act: str | tuple = ("relu", {"inplace": True}),
        dropout: float | tuple = 0.0,
        deep_supervision: bool = False,
        halve_level0: bool = True,
        bias: bool = True,
        upsample: str = "deconv",
    ) -> None:
        features = tuple(features)
        if len(features) != 6 or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in features):
            raise ValueError(f"features must be six positive integers, got {features!r}.")
        for name, value in (("deep_supervision", deep_supervision), ("halve_level0", halve_level0)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}.")
        super().__init__(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            features=features,
            deep_supervision=deep_supervision,
            act=act,
            norm=norm,
            bias=bias,
            dropout=dropout,
            upsample=upsample,
        )
        self.halve_level0 = halve_level0
        if halve_level0:  # X^{0,j} from X^{1,j-1} up-sampled to features[1] // 2 channels, as at the other levels
            for j in range(1, 5):
                out = features[5] if j == 4 else features[0]
                up = UpCat(spatial_dims, features[1], features[0] * j, out, act, norm, bias, dropout, upsample)
                setattr(self, f"upcat_0_{j}", up)

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
