"""The lightweight SpectraFlow decoder: up-sampling stages, the gated skip fusion and the refinement block."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from monai.networks.blocks import Convolution
from monai.networks.layers.factories import Act, Norm
from monai.networks.layers.utils import get_act_layer, get_norm_layer

from spectraflow_monai.networks.blocks.daf import DirectAttentionalFusion
from spectraflow_monai.utils.settings import FUSION_MODES, REFINE_MODES

__all__ = ["FUSION_MODES", "REFINE_MODES", "RefinementBlock", "SpectraFlowDecoder"]


class RefinementBlock(nn.Module):
    """The decoder refinement block: a residual block of two 3x3 convolutions.

    SpectraFlow (Chen et al.), Stage-2 and Table 3: "Standard denotes the baseline residual block with 3x3
    convolutions. FDConv replaces the first 3x3 convolution (conv1) in the refinement block, while CBAM is inserted
    within the block before residual addition."

    ``y = act(x + [cbam](norm(conv2(act(norm(conv1(x)))))))`` with ``conv1`` an :class:`FDConv2d` when ``refine`` is
    ``"fdconv"`` / ``"fdconv_cbam"`` and an ``nn.Conv2d`` otherwise.

    Args:
        channels: number of input and output channels.
        refine: one of ``"fdconv"`` (default, the paper's full model), ``"standard"``, ``"cbam"`` (standard + CBAM)
            and ``"fdconv_cbam"``.
        norm: MONAI norm spec used after each convolution. Defaults to ``"batch"``.
        act: MONAI activation spec. Defaults to ``"relu"``.
        fdconv_kwargs: the options of :class:`FDConv2d`, the fields of :class:`FDConvConfig` (e.g. ``kernel_num``).
    """

    def __init__(
        self,
        channels: int,
        refine: str = "fdconv",
        norm: str | tuple = Norm.BATCH,
        act: str | tuple = Act.RELU,
        fdconv_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be a positive integer, got {channels!r}.")
        if refine not in REFINE_MODES:
            raise ValueError(f"refine must be one of {REFINE_MODES}, got {refine!r}.")
        self.refine = refine
        if refine.startswith("fdconv"):
            from spectraflow_monai.networks.blocks.fdconv import FDConv2d, FDConvConfig

            config = FDConvConfig(**(fdconv_kwargs or {}))
            self.conv1: nn.Module = FDConv2d(channels, channels, kernel_size=3, padding=1, bias=False, config=config)
        else:
            self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.norm1 = get_norm_layer(norm, spatial_dims=2, channels=channels)
        self.act1 = get_act_layer(act)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.norm2 = get_norm_layer(norm, spatial_dims=2, channels=channels)
        if refine.endswith("cbam"):
            from timm.layers.cbam import CbamModule

            self.attention: nn.Module = CbamModule(channels)
        else:
            self.attention = nn.Identity()
        self.act2 = get_act_layer(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act1(self.norm1(self.conv1(x)))
        y = self.attention(self.norm2(self.conv2(y)))
        return self.act2(x + y)


class SpectraFlowDecoder(nn.Module):
    """The lightweight single-pass SpectraFlow decoder.

    SpectraFlow (Chen et al.), Sec. 3 and Sec. 4.2: "a lightweight decoder progressively upsamples encoder features.
    DAF performs gated fusion on a mid-level skip connection, followed by FDConv-based frequency-directional
    refinement" (the ordering DAF -> FDConv).

    Data flow, for encoder token maps at stride ``s`` (14 for DINOv2) and ``decoder_channels = (c0, c1, ...)``:

    1. the final encoder map is projected (1x1 conv) to ``c0`` channels and up-sampled x2 by a 3x3 conv stage;
    2. the mid-level skip map is projected (1x1 conv) to ``c0`` channels and up-sampled x2 bilinearly, giving
       ``f_skip`` aligned with ``f_dec``;
    3. ``fusion`` merges them: :class:`DirectAttentionalFusion` (``"daf"``), a 1x1 conv on the concatenation
       (``"concat"``, the paper's baseline) or a sum (``"add"``);
    4. the :class:`RefinementBlock` (FDConv in ``conv1``) refines the fused map;
    5. each further width ``c_i`` adds an up-sampling stage (bilinear x2 then 3x3 conv-norm-act);
    6. a 1x1 conv gives ``out_channels`` logits, resized bilinearly to the requested output size.

    The channel widths of the encoder come from the encoder object (``in_channels`` here is its ``embed_dim``), so
    the two cannot drift apart.

    Args:
        in_channels: channels of the encoder's final and skip maps.
        out_channels: number of output channels (1 for binary segmentation, 9 for Synapse).
        decoder_channels: widths of the up-sampling stages, coarse to fine. Defaults to ``(96, 32, 16)``.
        fusion: ``"daf"`` (default), ``"concat"`` or ``"add"``.
        refine: refinement block variant, see :class:`RefinementBlock`. Defaults to ``"fdconv"``.
        daf_reduction: bottleneck reduction of DAF. Defaults to 4.
        norm: MONAI norm spec of the decoder. Defaults to ``"batch"``.
        act: MONAI activation spec of the decoder. Defaults to ``"relu"``.
        fdconv_kwargs: the options of :class:`FDConv2d`, the fields of :class:`FDConvConfig` (e.g. ``kernel_num``).
    """

    # TorchScript compiles only the fusion branch a decoder takes: these are constants of the scripted module. (An
    # ``isinstance`` test on ``self.fuse`` named the DAF class by its TorchScript name, which is another decoder's once
    # two differently built decoders were scripted in one process: the second one failed to script.)
    __constants__ = ["gated_fusion", "concat_fusion"]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        decoder_channels: Sequence[int] = (96, 32, 16),
        fusion: str = "daf",
        refine: str = "fdconv",
        daf_reduction: int = 4,
        norm: str | tuple = Norm.BATCH,
        act: str | tuple = Act.RELU,
        fdconv_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"in_channels must be a positive integer, got {in_channels!r}.")
        if not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"out_channels must be a positive integer, got {out_channels!r}.")
        decoder_channels = tuple(decoder_channels)
        if len(decoder_channels) < 1 or any(not isinstance(c, int) or c < 1 for c in decoder_channels):
            raise ValueError(f"decoder_channels must be a non-empty sequence of positive integers, got {decoder_channels!r}.")
        if fusion not in FUSION_MODES:
            raise ValueError(f"fusion must be one of {FUSION_MODES}, got {fusion!r}.")
        self.fusion = fusion
        self.gated_fusion = fusion == "daf"
        self.concat_fusion = fusion == "concat"
        c0 = decoder_channels[0]

        def conv(cin: int, cout: int, k: int, conv_only: bool = False) -> Convolution:
            return Convolution(2, cin, cout, kernel_size=k, act=act, norm=norm, conv_only=conv_only, bias=conv_only)

        self.project = conv(in_channels, c0, 1)
        self.skip_project = conv(in_channels, c0, 1)
        self.up0 = conv(c0, c0, 3)
        if fusion == "daf":
            self.fuse: nn.Module = DirectAttentionalFusion(c0, reduction=daf_reduction, norm=norm, act=act)
        elif fusion == "concat":
            self.fuse = conv(2 * c0, c0, 1)
        else:
            self.fuse = nn.Identity()
        self.refinement = RefinementBlock(c0, refine=refine, norm=norm, act=act, fdconv_kwargs=fdconv_kwargs)
        self.stages = nn.ModuleList(conv(cin, cout, 3) for cin, cout in zip(decoder_channels[:-1], decoder_channels[1:]))
        self.head = conv(decoder_channels[-1], out_channels, 1, conv_only=True)

    @staticmethod
    def _up(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)

    def forward(
        self, final: torch.Tensor, skip: torch.Tensor, output_size: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode the encoder maps.

        Args:
            final: final encoder map (B, in_channels, h, w).
            skip: mid-level encoder map (B, in_channels, h, w).
            output_size: spatial size (H, W) of the returned logits; ``None`` keeps the decoder's native size.

        Returns:
            ``(logits, gate)``: logits (B, out_channels, H, W) and the DAF gate map M (B, c0, 2h, 2w), or ``None``
            when ``fusion`` is not ``"daf"``.
        """
        f_dec = self.up0(self._up(self.project(final)))
        f_skip = self._up(self.skip_project(skip))
        gate: torch.Tensor | None = None
        if self.gated_fusion:
            x, gate = self.fuse.fuse_with_gate(f_dec, f_skip)
        elif self.concat_fusion:
            x = self.fuse(torch.cat([f_dec, f_skip], dim=1))
        else:
            x = f_dec + f_skip
        x = self.refinement(x)
        for stage in self.stages:
            x = stage(self._up(x))
        logits = self.head(x)
        if output_size is not None and list(logits.shape[-2:]) != list(output_size):
            logits = F.interpolate(logits, size=list(output_size), mode="bilinear", align_corners=False)
        return logits, gate
