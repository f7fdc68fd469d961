"""DINOv2 vision-transformer encoder of SpectraFlow.

The encoder :math:`E(\\cdot)` of SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and
Frequency Adaptation for Medical Image Segmentation") is a DINOv2 vision transformer (Oquab et al., "DINOv2:
Learning Robust Visual Features without Supervision", TMLR 2024, arXiv:2304.07193), built here from timm. It
provides the three feature sets the rest of SpectraFlow consumes:

- the final token map (after the last block and the final LayerNorm): the Stage-1 MeanFlow latent and the
  deepest decoder input;
- a mid-level token map (output of block ``skip_index``): the skip connection fused by the decoder's DAF;
- the global average of the penultimate block's patch tokens: the :math:`h_i` of the Stage-1 dispersive loss.

Stage-2 fine-tunes "only the last encoder block (keeping earlier blocks frozen)"; this is the default
``trainable_blocks=1`` (last block plus the final LayerNorm).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.utils.checkpoint

from spectraflow_monai.networks import weights
from spectraflow_monai.networks.weights import interpolate_official_pos_embed

__all__ = ["EncoderFeatures", "DINOv2Encoder", "interpolate_official_pos_embed"]

logger = logging.getLogger(__name__)


class EncoderFeatures(NamedTuple):
    """Features returned by :class:`DINOv2Encoder`.

    Attributes:
        final: ``(B, C, H/14, W/14)`` output of the last block after the final LayerNorm.
        skip: ``(B, C, H/14, W/14)`` output of block ``skip_index`` (without norm), the mid-level skip feature.
        pooled: ``(B, C)`` global average over the patch tokens of the penultimate block's output (without norm),
            the features SpectraFlow's dispersive loss acts on.
    """

    final: torch.Tensor
    skip: torch.Tensor
    pooled: torch.Tensor


class DINOv2Encoder(nn.Module):
    """DINOv2 ViT encoder (timm) returning the final, mid-level and pooled penultimate features.

    The encoder :math:`E` of SpectraFlow (Chen et al.) is a DINOv2 ViT (Oquab et al. 2023). The timm model is built
    with ``img_size=img_size`` (the grid of the stored position embedding: 224 gives 16x16 tokens, the resolution
    of the paper) and ``dynamic_img_size=True``, so any input whose height and width are multiples of the patch size
    (14) is accepted; the position embedding is resampled on the fly for other grids.

    Forward makes a single pass ``patch_embed -> _pos_embed -> patch_drop -> norm_pre -> blocks`` collecting the
    output of block ``skip_index`` and of the penultimate block, then applies the final LayerNorm. Prefix tokens
    (class token and registers) are dropped and patch tokens reshaped to ``(B, C, h, w)``.

    Freezing follows SpectraFlow's Stage-2 protocol ("unfreeze only the last encoder block"): ``trainable_blocks=1``
    leaves the last block and the final LayerNorm trainable. Leading stages whose parameters are all frozen (the
    embeddings, then blocks 0..k-1) are run under ``torch.no_grad()`` when the input does not require gradient:
    nothing before them can receive gradient, so results and gradients are unchanged while activations of the
    frozen part are not stored (autograd records nothing there in any case, so this is exact). The check reads
    ``requires_grad`` at every call, so manual changes are honoured.

    Args:
        model_name: timm model name, one of :attr:`SUPPORTED_MODELS`. Defaults to ``"vit_small_patch14_dinov2"``.
        pretrained: ``None`` (default) builds the architecture with timm's random initialisation and loads nothing.
            Any other value is handed, after the encoder is built, to :meth:`load_pretrained` (the call the
            bundles make in their encoder-weights step): ``"timm"`` (timm's hub copy of the DINOv2 weights, needs
            network access), a path to a local weight file (official facebookresearch DINOv2 layout or timm layout,
            see :meth:`load_weights`), or ``"none"`` (random, logged).
        img_size: image size the position embedding is built for (a multiple of the patch size). Defaults to 224.
        skip_index: index of the block whose output is the mid-level skip feature, ``0 <= skip_index < depth - 1``.
            Defaults to ``depth // 2 - 1`` (block 5 of 12).
        trainable_blocks: ``0`` or ``"frozen"``: nothing trainable; ``k >= 1``: last ``k`` blocks and the final norm
            trainable; ``-1`` or ``"all"``: everything trainable. Defaults to 1 (SpectraFlow Stage-2).
        model_kwargs: extra keyword arguments forwarded to ``timm.create_model`` (e.g. ``{"depth": 3}``,
            ``{"drop_path_rate": 0.1}``). Defaults to ``None``.

    Raises:
        ValueError: an unknown ``model_name`` or an invalid ``img_size``, ``skip_index`` or ``trainable_blocks``.
        SettingError: ``pretrained="timm"`` and the weights could not be downloaded (the message says how to pass a
            local file or opt into random initialisation).
    """

    SUPPORTED_MODELS: tuple[str, ...] = (
        "vit_small_patch14_dinov2",
        "vit_base_patch14_dinov2",
        "vit_large_patch14_dinov2",
        "vit_small_patch14_reg4_dinov2",
        "vit_base_patch14_reg4_dinov2",
        "vit_large_patch14_reg4_dinov2",
    )

    def __init__(
        self,
        model_name: str = "vit_small_patch14_dinov2",
        pretrained: str | os.PathLike | None = None,
        img_size: int = 224,
        skip_index: int | None = None,
        trainable_blocks: int | str = 1,
        model_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        import timm  # optional dependency, needed only by the encoder

        if model_name not in self.SUPPORTED_MODELS:
            raise ValueError(f"model_name must be one of {list(self.SUPPORTED_MODELS)}, got {model_name!r}.")
        if isinstance(img_size, bool) or not isinstance(img_size, int) or img_size <= 0:
            raise ValueError(f"img_size must be a positive int, got {img_size!r}.")
        if skip_index is not None and (isinstance(skip_index, bool) or not isinstance(skip_index, int)):
            raise ValueError(f"skip_index must be an int or None, got {skip_index!r}.")
        if model_kwargs is not None and not isinstance(model_kwargs, Mapping):
            raise ValueError(f"model_kwargs must be a dict or None, got {type(model_kwargs).__name__}.")
        kwargs: dict[str, Any] = {"num_classes": 0, **dict(model_kwargs or {})}
        for reserved in ("pretrained", "img_size", "dynamic_img_size"):
            if reserved in kwargs:
                raise ValueError(f"model_kwargs must not contain {reserved!r}; use the encoder's arguments instead.")

        # the architecture only: weights are put in by load_pretrained
        self.vit = timm.create_model(model_name, pretrained=False, img_size=img_size, dynamic_img_size=True, **kwargs)

        patch = tuple(int(p) for p in self.vit.patch_embed.patch_size)
        if patch[0] != patch[1]:
            raise ValueError(f"only square patches are supported, the model has patch_size={patch}.")
        self.model_name = model_name
        self.patch_size: int = patch[0]
        self.embed_dim: int = int(self.vit.embed_dim)
        self.out_channels: int = self.embed_dim
        self.depth: int = len(self.vit.blocks)
        self.img_size = img_size
        if img_size % self.patch_size != 0:
            raise ValueError(f"img_size must be a multiple of the patch size {self.patch_size}, got {img_size}.")
        if self.depth < 2:
            raise ValueError(f"the encoder needs at least 2 blocks (model_kwargs depth), got depth={self.depth}.")
        if skip_index is None:
            skip_index = self.depth // 2 - 1
        if not 0 <= skip_index < self.depth - 1:
            raise ValueError(
                f"skip_index must satisfy 0 <= skip_index < depth - 1 = {self.depth - 1}, got {skip_index}."
            )
        self.skip_index: int = skip_index

        self.trainable_blocks: int | str = 1
        self.set_trainable_blocks(trainable_blocks)
        if pretrained is not None:  # a convenience for Python users: the loading the bundles run as a step
            self.load_pretrained(pretrained)

    # ------------------------------------------------------------------ freezing
    def set_trainable_blocks(self, trainable_blocks: int | str) -> None:
        """Set which parameters require gradient.

        Args:
            trainable_blocks: ``0`` or ``"frozen"``: none; ``k`` in ``1..depth``: the last ``k`` blocks and the final
                LayerNorm (SpectraFlow Stage-2 uses ``1``); ``-1`` or ``"all"``: all parameters.

        Raises:
            ValueError: any other value.
        """
        if isinstance(trainable_blocks, str):
            if trainable_blocks not in ("frozen", "all"):
                raise ValueError(
                    f"trainable_blocks must be 'frozen', 'all' or an int in [-1, {self.depth}], "
                    f"got {trainable_blocks!r}."
                )
            n = 0 if trainable_blocks == "frozen" else -1
        elif isinstance(trainable_blocks, int) and not isinstance(trainable_blocks, bool):
            if not -1 <= trainable_blocks <= self.depth:
                raise ValueError(
                    f"trainable_blocks must be 'frozen', 'all' or an int in [-1, {self.depth}], "
                    f"got {trainable_blocks!r}."
                )
            n = trainable_blocks
        else:
            raise ValueError(
                f"trainable_blocks must be 'frozen', 'all' or an int in [-1, {self.depth}], got {trainable_blocks!r}."
            )

        self.vit.requires_grad_(n == -1)
        if n > 0:
            for blk in self.vit.blocks[self.depth - n :]:
                blk.requires_grad_(True)
            self.vit.norm.requires_grad_(True)
        self.trainable_blocks = trainable_blocks

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters that currently require gradient (e.g. to build the optimizer)."""
        return [p for p in self.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ weights
    def load_weights(self, path: str | os.PathLike) -> None:
        """Load encoder weights from a local file.

        Accepted layouts: the official facebookresearch DINOv2 checkpoints (``mask_token``, position embedding on the
        37x37 grid of 518-px training plus the class position, optional ``register_tokens``) and timm's
        ``VisionTransformer`` layout (e.g. written by SpectraFlow's Stage-1 pretrainer). The state dict may be nested
        under ``"model"``, ``"state_dict"``, ``"encoder"``, ``"teacher"`` or ``"network"`` and its keys prefixed by
        ``"module."``, ``"_orig_mod."``, ``"encoder."``, ``"vit."`` or ``"backbone."``. The mapping (official keys,
        registers) is timm's ``checkpoint_filter_fn``. The official 37x37 position grid is resized to this model's
        grid the way the official DINOv2 code interpolates (:func:`interpolate_official_pos_embed`: bicubic,
        ``scale_factor=(g + 0.1) / 37``, no antialiasing; registers checkpoints: bicubic to the size, antialiased);
        timm-layout grids of another size are resampled by timm (bicubic, antialiased). Classifier-head keys
        (``head.*``) are ignored: the encoder has no head.

        Args:
            path: the weight file, read with ``torch.load(..., weights_only=True)``.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: the file cannot be read, holds no state dict, or its keys/shapes do not match the model.
        """
        weights.load_dinov2_state_dict(self.vit, path, self._weights_target())

    def _weights_target(self, note: str = "") -> str:
        """This encoder as error messages about its weights name it."""
        return f"{self.model_name} (depth {self.depth}, embed_dim {self.embed_dim}{note})"

    def load_pretrained(self, source: Any, label: str | None = None) -> str | None:
        """Put the weights named by ``source`` into this encoder, logged as ``encoder weights: <label> (<where>)``.

        Args:
            source: ``"timm"`` (timm's hub copy of the DINOv2 weights, mapped by timm's ``checkpoint_filter_fn``:
                :func:`~spectraflow_monai.networks.weights.load_timm_weights`); a local file (:meth:`load_weights`:
                official facebookresearch DINOv2 checkpoint, timm state dict, or this package's Stage-1 export); or
                ``None`` / ``"none"`` for the random initialisation the encoder was built with. When the weights
                are random and some parameters are frozen, a prominent warning says that those frozen blocks are
                random features.
            label: the name logged for the source (e.g. ``"stage1"``). Defaults to ``source`` itself.

        Returns:
            the normalised source: ``"timm"``, the file path, or ``None``.

        Raises:
            SettingError: ``source`` is not a string/path, or ``"timm"`` and the download failed (the message says
                how to pass a local file or opt into ``none``).
            FileNotFoundError: the file does not exist.
            ValueError: the file or the downloaded weights do not fit the encoder.
        """
        source = weights.normalize_weights_source(source)
        label = label or ("none" if source is None else source if source == "timm" else "file")
        if source is None:
            logger.info(f"encoder weights: {label} (random initialisation, {self.model_name})")
            if any(not p.requires_grad for p in self.parameters()):
                bar = "!" * 100
                logger.warning(
                    f"\n{bar}\n!! RANDOM ENCODER WEIGHTS WITH FROZEN BLOCKS (encoder weights: {label}, "
                    f"trainable_blocks={self.trainable_blocks!r}).\n!! The frozen blocks of {self.model_name} stay "
                    "random features for the whole run: results are not comparable with the paper.\n!! Give DINOv2 "
                    "weights (pretrained_weights timm or a local file) or train every block (trainable_blocks all)."
                    f"\n{bar}"
                )
            return None
        if source == "timm":
            target = self._weights_target("; check encoder_kwargs")
            location, count = weights.load_timm_weights(self.vit, self.model_name, target)
            logger.info(f"encoder weights: {label} ({location}): {count} tensors loaded into {self.model_name}")
            return source
        file = Path(source).expanduser()
        self.load_weights(file)
        count = len(self.vit.state_dict())
        logger.info(f"encoder weights: {label} ({file}): {count} tensors loaded into {self.model_name}")
        return source

    # ------------------------------------------------------------------ forward
    def _num_frozen_leading_blocks(self, x: torch.Tensor) -> int:
        """Number of leading stages that can run under no_grad: -1 none, 0 embeddings only, k embeddings + k blocks."""
        if not torch.is_grad_enabled() or x.requires_grad:
            return -1
        vit = self.vit
        embed_params = [*vit.patch_embed.parameters(), *vit.norm_pre.parameters()]
        embed_params += [p for p in (vit.cls_token, vit.reg_token, vit.pos_embed) if p is not None]
        if any(p.requires_grad for p in embed_params):
            return -1
        n = 0
        for blk in vit.blocks:
            if any(p.requires_grad for p in blk.parameters()):
                break
            n += 1
        return n

    def _to_map(self, tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
        patches = tokens[:, self.vit.num_prefix_tokens :]
        return patches.reshape(tokens.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()

    def forward(self, x: torch.Tensor) -> EncoderFeatures:
        """Encode an image batch.

        Args:
            x: ``(B, in_chans, H, W)`` with ``H`` and ``W`` multiples of the patch size (14).

        Returns:
            :class:`EncoderFeatures` with ``final`` and ``skip`` of shape ``(B, C, H/14, W/14)`` and ``pooled`` of
            shape ``(B, C)``.

        Raises:
            ValueError: wrong number of dimensions or channels, or H/W not a multiple of the patch size.
        """
        if torch.jit.is_scripting():  # TorchScript (model-zoo's bundle check, deployment): the plain loop
            return self._forward_scripted(x)
        return self._forward_eager(x)

    def _forward_scripted(self, x: torch.Tensor) -> EncoderFeatures:
        """:meth:`forward` as TorchScript compiles it: the same features, every block under the caller's grad mode."""
        if x.dim() != 4 or x.shape[1] != self.vit.patch_embed.proj.in_channels:
            raise ValueError("input must have shape (B, in_chans, H, W) with the encoder's input channels.")
        height, width = x.shape[-2], x.shape[-1]
        if height % self.patch_size != 0 or width % self.patch_size != 0 or height == 0 or width == 0:
            raise ValueError("input spatial size (H, W) must be positive multiples of the patch size.")
        h, w = height // self.patch_size, width // self.patch_size
        vit = self.vit
        tokens = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))
        skip = pooled = tokens
        for i, blk in enumerate(vit.blocks):
            tokens = blk(tokens)
            if i == self.skip_index:
                skip = self._to_map(tokens, h, w)
            if i == self.depth - 2:
                pooled = tokens[:, vit.num_prefix_tokens :].mean(dim=1)
        return EncoderFeatures(final=self._to_map(vit.norm(tokens), h, w), skip=skip, pooled=pooled)

    @torch.jit.unused
    def _forward_eager(self, x: torch.Tensor) -> EncoderFeatures:
        """:meth:`forward` in eager mode (input checks naming the shapes, frozen blocks under no_grad)."""
        in_chans = self.vit.patch_embed.proj.in_channels
        if x.ndim != 4 or x.shape[1] != in_chans:
            raise ValueError(f"input must have shape (B, {in_chans}, H, W), got {tuple(x.shape)}.")
        height, width = int(x.shape[-2]), int(x.shape[-1])
        if height % self.patch_size or width % self.patch_size or height == 0 or width == 0:
            raise ValueError(
                f"input spatial size (H, W) = ({height}, {width}) (input shape {tuple(x.shape)}) must be positive "
                f"multiples of the patch size {self.patch_size}."
            )
        h, w = height // self.patch_size, width // self.patch_size
        vit = self.vit
        n_frozen = self._num_frozen_leading_blocks(x)
        penultimate = self.depth - 2
        skip = pooled = None

        # The taps equal timm's ``forward_intermediates`` (skip: block ``skip_index`` un-normed; final: last block
        # normed; tested), but this loop runs the frozen leading blocks under no_grad, so Stage-2 with 11 of 12
        # blocks frozen stores no activations for them; ``forward_intermediates`` has no such switch.
        with torch.no_grad() if n_frozen >= 0 else nullcontext():
            tokens = vit.patch_embed(x)
            tokens = vit._pos_embed(tokens)
            tokens = vit.patch_drop(tokens)
            tokens = vit.norm_pre(tokens)
        checkpointing = bool(getattr(vit, "grad_checkpointing", False)) and torch.is_grad_enabled()
        for i, blk in enumerate(vit.blocks):
            if i < n_frozen:
                with torch.no_grad():
                    tokens = blk(tokens)
            elif checkpointing:
                tokens = torch.utils.checkpoint.checkpoint(blk, tokens, use_reentrant=False)
            else:
                tokens = blk(tokens)
            if i == self.skip_index:
                skip = self._to_map(tokens, h, w)
            if i == penultimate:
                pooled = tokens[:, vit.num_prefix_tokens :].mean(dim=1)
        final = self._to_map(vit.norm(tokens), h, w)
        return EncoderFeatures(final=final, skip=skip, pooled=pooled)  # type: ignore[arg-type]
