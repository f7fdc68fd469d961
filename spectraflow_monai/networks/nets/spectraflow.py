"""SpectraFlowNet: DINOv2 encoder + lightweight DAF/FDConv decoder."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
from monai.networks.layers.factories import Act, Norm

from spectraflow_monai.networks.blocks.decoder import SpectraFlowDecoder
from spectraflow_monai.networks.scripting import shape_str

__all__ = ["SpectraFlowNet"]


class SpectraFlowNet(nn.Module):
    """The SpectraFlow segmentation network ``y = D(E(x))``.

    Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
    Segmentation", Sec. 3 and 4.2. The encoder ``E`` is a DINOv2 ViT (:class:`DINOv2Encoder`); the decoder ``D``
    (:class:`SpectraFlowDecoder`) progressively up-samples the final token map, fuses a mid-level skip map with
    Direct Attentional Fusion and refines the result with a residual block whose first 3x3 convolution is an
    FDConv. Stage-2 fine-tuning unfreezes only the last encoder block (``trainable_blocks=1``).

    The ablation switches of the paper's Table 3 are arguments: ``fusion`` ("daf" | "concat") and ``refine``
    ("fdconv" | "standard" | "cbam" | "fdconv_cbam").

    Args:
        in_channels: input channels; DINOv2 takes 3. A 1-channel input (CT) is repeated to 3 channels inside the
            network, so ``in_channels`` may be 1 or 3. Defaults to 3.
        out_channels: output channels (logits): 1 for binary segmentation with a sigmoid, 9 for Synapse with a
            softmax. Defaults to 1.
        encoder: timm DINOv2 model name, see :attr:`DINOv2Encoder.SUPPORTED_MODELS`. Defaults to
            ``"vit_small_patch14_dinov2"``.
        pretrained: ``None`` (default): the architecture only, with timm's random initialisation. Other values are
            a convenience for Python users, handed to :meth:`load_pretrained` once the encoder is built: ``"timm"``
            (timm's hub download), a path to a local checkpoint (official DINOv2 / timm keys, or a Stage-1 export of
            this package) or ``"none"``. The bundles build the network without weights and call
            :func:`spectraflow_monai.apps.encoder_init.initialize_encoder` in their encoder-weights step.
        img_size: the training image size the encoder's position grid is built for; other multiples of 14 are
            accepted at run time. Defaults to 224.
        skip_index: encoder block whose output is the mid-level skip; ``None`` picks ``depth // 2 - 1``.
        trainable_blocks: number of trailing encoder blocks (+ final norm) to train: ``1`` (the paper's default),
            ``0``/``"frozen"``, ``"all"``/``-1`` or any ``k``.
        fusion: skip fusion, ``"daf"`` (default), ``"concat"`` or ``"add"``.
        refine: refinement block variant, ``"fdconv"`` (default), ``"standard"``, ``"cbam"`` or ``"fdconv_cbam"``.
        decoder_channels: widths of the decoder stages, coarse to fine. Defaults to ``(96, 32, 16)``.
        norm: MONAI norm spec of the decoder. Defaults to ``"batch"``.
        act: MONAI activation spec of the decoder. Defaults to ``"relu"``.
        encoder_kwargs: extra keyword arguments passed to ``timm.create_model`` (e.g. ``{"depth": 2}`` in tests).
        fdconv_kwargs: the options of :class:`FDConv2d`, the fields of :class:`FDConvConfig` (e.g. ``kernel_num``).

    Example::

        >>> net = SpectraFlowNet(out_channels=1)
        >>> net(torch.randn(2, 3, 224, 224)).shape
        torch.Size([2, 1, 224, 224])
        >>> logits, gate = net(torch.randn(2, 3, 224, 224), return_gate=True)  # gate: (2, 96, 32, 32)
    """

    def __init__(
        self,
        in_channels: int = 3,
        out_channels: int = 1,
        encoder: str = "vit_small_patch14_dinov2",
        pretrained: str | os.PathLike | None = None,
        img_size: int = 224,
        skip_index: int | None = None,
        trainable_blocks: int | str = 1,
        fusion: str = "daf",
        refine: str = "fdconv",
        decoder_channels: Sequence[int] = (96, 32, 16),
        norm: str | tuple = Norm.BATCH,
        act: str | tuple = Act.RELU,
        encoder_kwargs: dict | None = None,
        fdconv_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 or 3 (DINOv2 takes RGB; 1 is repeated), got {in_channels!r}.")
        if not isinstance(out_channels, int) or out_channels < 1:
            raise ValueError(f"out_channels must be a positive integer, got {out_channels!r}.")
        from spectraflow_monai.networks.encoders.dinov2 import DINOv2Encoder

        self.in_channels = in_channels
        self.out_channels = out_channels
        self.encoder = DINOv2Encoder(
            model_name=encoder,
            pretrained=pretrained,
            img_size=img_size,
            skip_index=skip_index,
            trainable_blocks=trainable_blocks,
            model_kwargs=encoder_kwargs,
        )
        self.decoder = SpectraFlowDecoder(
            in_channels=self.encoder.embed_dim,
            out_channels=out_channels,
            decoder_channels=decoder_channels,
            fusion=fusion,
            refine=refine,
            norm=norm,
            act=act,
            fdconv_kwargs=fdconv_kwargs,
        )

    def load_pretrained(self, source: Any, label: str | None = None) -> str | None:
        """Put the encoder weights named by ``source`` into the encoder
        (:meth:`~spectraflow_monai.networks.DINOv2Encoder.load_pretrained`); the decoder keeps its initialisation.

        Returns:
            the normalised source: ``"timm"``, the file path, or ``None`` (random initialisation).
        """
        return self.encoder.load_pretrained(source, label=label)

    def forward(self, x: torch.Tensor, return_gate: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        """Segment ``x`` (B, in_channels, H, W), H and W multiples of 14.

        Args:
            x: input batch.
            return_gate: also return the DAF gate map M (B, C, H', W') for visualisation (``None`` without DAF).

        Returns:
            logits (B, out_channels, H, W), or ``(logits, gate)`` when ``return_gate``.
        """
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"expected input of shape (B, {self.in_channels}, H, W), got {shape_str(x)}.")
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)
        feats = self.encoder(x)
        logits, gate = self.decoder(feats.final, feats.skip, output_size=x.shape[-2:])
        if return_gate:
            return logits, gate
        return logits
