"""Mixed-domain MAE Stage-1 pretraining: the masked-autoencoder baseline of SpectraFlow's Table 2.

SpectraFlow (Chen et al.) compares its Stage-1 objective with a masked autoencoder (He et al. 2022, "Masked
Autoencoders Are Scalable Vision Learners") trained on the same mixed image/mask mini-batches: random patches are
removed, the encoder sees only the visible ones, a light decoder (:class:`~spectraflow_monai.networks.MAEDecoder`)
reconstructs the pixels of the removed ones, and the decoder is discarded afterwards. The encoder is exported in the
same timm layout as the MeanFlow one (:class:`~spectraflow_monai.handlers.EncoderExportHandler`), so Stage-2 loads
it unchanged.

This module provides :func:`random_masking`, :func:`encode_visible` (a DINOv2 / timm ViT run on the visible tokens
only) and :class:`MAEPretrainer`, a :class:`~spectraflow_monai.engines.stage1.Stage1Trainer` whose iteration is the
MAE objective (batch preparation, gradient accumulation, mixed precision, EMA, multi-process gradient averaging and
checkpoint dictionary are shared with :class:`~spectraflow_monai.engines.MeanFlowPretrainer`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.utils.checkpoint
from monai.engines.utils import IterationEvents
from torch import nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader

from spectraflow_monai.engines.config import DispersiveConfig, MAEConfig
from spectraflow_monai.engines.stage1 import Stage1Trainer

__all__ = ["MAEPretrainer", "encode_visible", "random_masking"]


def random_masking(
    batch_size: int,
    num_patches: int,
    mask_ratio: float,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample random patch masking of MAE: shuffle by the ``argsort`` of uniform noise, keep the first ``K``.

    ``K = int(num_patches * (1 - mask_ratio))`` patches stay visible in every sample (as in MAE), a different random
    subset for each sample.

    Args:
        batch_size: ``B``.
        num_patches: ``N``, patches per image.
        mask_ratio: fraction of removed patches, in ``(0, 1)``.
        device: device of the outputs.
        generator: optional random generator (else the global one of ``device``).

    Returns:
        ``(ids_keep, mask, ids_restore)``: ``(B, K)`` raster indices of the visible patches; ``(B, N)`` float mask in
        raster order, 1 removed / 0 visible; ``(B, N)`` permutation that puts ``[visible..., removed...]`` back in
        raster order.

    Raises:
        ValueError: ``mask_ratio`` outside ``(0, 1)``, or a ratio that leaves no visible or no removed patch of
            ``num_patches``.
    """
    if isinstance(mask_ratio, bool) or not isinstance(mask_ratio, (int, float)) or not 0 < mask_ratio < 1:
        raise ValueError(f"mask_ratio must be in (0, 1), got {mask_ratio!r}.")
    keep = int(num_patches * (1 - mask_ratio))
    if not 0 < keep < num_patches:
        raise ValueError(
            f"mask_ratio={mask_ratio} keeps {keep} of {num_patches} patches; at least one patch must stay visible and "
            "one be removed (use larger images or another mask_ratio)."
        )
    noise = torch.rand(batch_size, num_patches, device=device, generator=generator)
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :keep]
    mask = torch.ones(batch_size, num_patches, device=noise.device)
    mask[:, :keep] = 0
    mask = torch.gather(mask, 1, ids_restore)
    return ids_keep, mask, ids_restore


def _vit(encoder: nn.Module) -> nn.Module:
    vit = getattr(encoder, "vit", encoder)
    for attr in ("patch_embed", "_pos_embed", "blocks", "norm"):
        if not hasattr(vit, attr):
            raise ValueError(
                f"encoder must be a DINOv2Encoder or a timm VisionTransformer (missing {attr!r}), got "
                f"{type(encoder).__name__}."
            )
    return vit


def encode_visible(
    encoder: nn.Module, images: torch.Tensor, ids_keep: torch.Tensor, return_pooled: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a DINOv2 / timm ViT encoder on the visible patches only (the MAE encoder pass).

    ``patch_embed -> _pos_embed -> norm_pre`` on the full image (every patch gets its own position), then the
    prefix tokens (class token, registers) and the patch tokens listed in ``ids_keep`` go through all blocks and the
    final norm. timm's ``patch_drop`` is not applied (the masking replaces it). Gradient checkpointing of the timm
    model (``set_grad_checkpointing``) is honoured.

    Args:
        encoder: a :class:`~spectraflow_monai.networks.DINOv2Encoder` (its ``vit`` is used) or a timm
            ``VisionTransformer`` built with ``dynamic_img_size=True`` (or for the input size).
        images: ``(B, C, H, W)``.
        ids_keep: ``(B, K)`` raster indices of the visible patches (from :func:`random_masking`).
        return_pooled: also return the mean of the visible patch tokens after the penultimate block (the features
            of the dispersive loss). Defaults to False.

    Returns:
        ``(tokens, pooled)``: ``(B, P + K, C)`` normed tokens (``P`` prefix tokens first, then the visible patches in
        the order of ``ids_keep``) and ``(B, C)`` pooled features, or None.
    """
    vit = _vit(encoder)
    tokens = vit._pos_embed(vit.patch_embed(images))
    norm_pre = getattr(vit, "norm_pre", None)
    if norm_pre is not None:
        tokens = norm_pre(tokens)
    prefix = int(getattr(vit, "num_prefix_tokens", 1))
    index = ids_keep.to(device=tokens.device, dtype=torch.long).unsqueeze(-1).expand(-1, -1, tokens.shape[-1])
    tokens = torch.cat([tokens[:, :prefix], torch.gather(tokens[:, prefix:], 1, index)], dim=1)
    checkpointing = bool(getattr(vit, "grad_checkpointing", False)) and torch.is_grad_enabled()
    pooled = None
    penultimate = len(vit.blocks) - 2
    for i, blk in enumerate(vit.blocks):
        tokens = torch.utils.checkpoint.checkpoint(blk, tokens, use_reentrant=False) if checkpointing else blk(tokens)
        if return_pooled and i == penultimate:
            pooled = tokens[:, prefix:].mean(dim=1)
    return vit.norm(tokens), pooled


class MAEPretrainer(Stage1Trainer):
    """SpectraFlow Stage-1 variant: mixed-domain masked autoencoding (He et al. 2022), the Table 2 baseline.

    One iteration, on the Stage-1 batches of ``MeanFlowPretrainer`` (``image_key`` ``(B, 3, H, W)``, images or
    3-channel masks of a mixed-domain batch; the domain flag is read but not used):

    1. :func:`random_masking` removes ``mae.mask_ratio`` of the ``N = (H/p)·(W/p)`` patches of every sample (a
       different random subset per sample, ``K = int(N·(1 - mask_ratio))`` visible);
    2. :func:`encode_visible` runs the encoder on the prefix + visible tokens only;
    3. the decoder (:class:`~spectraflow_monai.networks.MAEDecoder`, held as ``head``) predicts the pixels of all
       patches; ``L_MAE = mae.loss(pred, x, mask)`` scores the removed ones only
       (:class:`~spectraflow_monai.losses.MAELoss`, per-patch normalised targets by default);
    4. optionally ``+ λ·L_Disp`` on the mean of the visible tokens after the penultimate block (off by default:
       ``DispersiveConfig(weight=0)``);
    5. backward, gradient accumulation, optimizer step, EMA update and multi-process gradient averaging exactly as
       in ``MeanFlowPretrainer`` (:class:`~spectraflow_monai.engines.stage1.Stage1Trainer`).

    ``engine.state.output`` is ``{"loss", "loss_mae", "loss_dispersive"}`` (Python floats). The encoder export
    (:class:`~spectraflow_monai.handlers.EncoderExportHandler`, by default the EMA encoder) is the same timm-layout
    state dict as for MeanFlow and the decoder is not part of it. :meth:`checkpoint_dict` lists the decoder under
    ``"head"``.

    Args:
        device: device to run on.
        max_epochs: number of epochs.
        train_data_loader: the Stage-1 data loader (see :class:`MeanFlowPretrainer`).
        encoder: a ``DINOv2Encoder`` (or a timm ViT with ``dynamic_img_size=True``); its trainable parameters are
            optimised.
        decoder: the MAE decoder, ``decoder(tokens, ids_restore, grid_size, num_prefix_tokens)`` returning
            ``(B, N, p*p*C)``.
        optimizer: optimizer over the trainable parameters of encoder and decoder.
        mae: the MAE objective (:class:`~spectraflow_monai.engines.config.MAEConfig`: the loss and ``mask_ratio``).
            None: ``MAEConfig()`` (``mask_ratio`` 0.75; the loss ``MAELoss(patch_size=<encoder patch>,
            check_mask=False)``: the masking removes at least one patch of every sample, :func:`random_masking`
            refuses otherwise). Defaults to None.
        dispersive: the dispersive term on the pooled visible tokens of the penultimate block
            (:class:`~spectraflow_monai.engines.config.DispersiveConfig`; its loss defaults to ``DispersiveLoss()``
            when ``weight > 0``). None: ``DispersiveConfig(weight=0)`` (plain MAE). Defaults to None.
        kwargs: the other arguments of :class:`~spectraflow_monai.engines.stage1.Stage1Trainer` (``ema``,
            ``gradients``, ``image_key``, ``domain_key``, ``epoch_length``, ``non_blocking``, ``prepare_batch``,
            ``iteration_update``, ``train_handlers``, ``amp``, ``event_names``, ``event_to_attr``, ``decollate``,
            ``optim_set_to_none``, ``to_kwargs``, ``amp_kwargs``, ``precision``, ``output_on_device``), passed by
            name.

    Raises:
        ValueError: invalid arguments; at run time an image size whose patch grid leaves no visible or no removed
            patch, a batch of fewer than 2 samples with the dispersive loss on, or a malformed batch.

    Example::

        encoder = DINOv2Encoder(pretrained="dinov2_vits14.pth", trainable_blocks="all")
        decoder = MAEDecoder(encoder.embed_dim, encoder.patch_size)
        opt = torch.optim.AdamW(encoder.trainable_parameters() + list(decoder.parameters()), lr=1e-5)
        trainer = MAEPretrainer("cuda", 300, loader, encoder, decoder, opt, mae=MAEConfig(mask_ratio=0.75))
        EncoderExportHandler(path="models/encoder_stage1.pt").attach(trainer)
        trainer.run()
    """

    def __init__(
        self,
        device: str | torch.device,
        max_epochs: int,
        train_data_loader: Iterable | DataLoader,
        encoder: nn.Module,
        decoder: nn.Module,
        optimizer: Optimizer,
        mae: MAEConfig | None = None,
        dispersive: DispersiveConfig | None = None,
        **kwargs: Any,
    ) -> None:
        mae = MAEConfig() if mae is None else mae
        if not isinstance(mae, MAEConfig):
            raise ValueError(f"mae must be MAEConfig or None, got {type(mae).__name__}.")
        mae_loss = mae.loss
        if not isinstance(encoder, nn.Module):
            raise ValueError(f"encoder must be an nn.Module, got {type(encoder).__name__}.")
        vit = _vit(encoder)
        patch = tuple(int(p) for p in vit.patch_embed.patch_size)
        if patch[0] != patch[1]:
            raise ValueError(f"only square patches are supported, the encoder has patch_size={patch}.")
        if mae_loss is None:
            from spectraflow_monai.losses.mae import MAELoss

            mae_loss = MAELoss(patch_size=patch[0], check_mask=False)  # random_masking removes >= 1 patch per sample
        loss_patch = getattr(mae_loss, "patch_size", patch[0])
        if loss_patch != patch[0]:
            raise ValueError(
                f"MAEConfig: loss.patch_size={loss_patch} differs from the encoder's patch size {patch[0]}."
            )
        dispersive = DispersiveConfig(weight=0.0) if dispersive is None else dispersive
        super().__init__(
            device, max_epochs, train_data_loader, encoder, decoder, optimizer, dispersive=dispersive, **kwargs
        )
        self.mae_loss = mae_loss
        self.mask_ratio = float(mae.mask_ratio)
        self.patch_size = patch[0]
        self.num_prefix_tokens = int(getattr(vit, "num_prefix_tokens", 1))

    @property
    def decoder(self) -> nn.Module:
        """The MAE decoder (stored as ``head``, discarded after Stage-1)."""
        return self.head

    def _iteration(self, engine: MAEPretrainer, batchdata: Any) -> dict[str, float]:  # type: ignore[override]
        """One MAE Stage-1 iteration; returns ``{"loss", "loss_mae", "loss_dispersive"}`` (floats).

        Raises:
            ValueError: empty or malformed batch, image size not a multiple of the patch size or too small for the
                mask ratio, batch size < 2 with the dispersive loss on.
        """
        images, _, use_disp, should_step = engine._start_iteration(batchdata)
        batch_size, height, width = int(images.shape[0]), int(images.shape[-2]), int(images.shape[-1])
        p = engine.patch_size
        if height % p or width % p:
            raise ValueError(f"image size ({height}, {width}) must be a multiple of the encoder patch size {p}.")
        grid = (height // p, width // p)

        ids_keep, mask, ids_restore = random_masking(batch_size, grid[0] * grid[1], engine.mask_ratio, images.device)
        with engine._autocast():
            tokens, pooled = encode_visible(engine.encoder, images, ids_keep, return_pooled=use_disp)
            engine.fire_event(IterationEvents.FORWARD_COMPLETED)
            pred = engine.head(tokens, ids_restore, grid, engine.num_prefix_tokens)
            loss_mae = engine.mae_loss(pred, images, mask).mean().float()
            loss_disp = engine._dispersive_term(pooled) if use_disp else loss_mae.new_zeros(())
            loss = loss_mae + engine.dispersive_weight * loss_disp
        engine._backward_and_step(loss, should_step)
        return engine._finish_iteration(("loss", "loss_mae", "loss_dispersive"), [loss, loss_mae, loss_disp])
