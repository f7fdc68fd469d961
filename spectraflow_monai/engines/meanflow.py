"""SpectraFlow Stage-1 encoder pretraining (MeanFlow + dispersive loss) as a MONAI/ignite trainer.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Sec. "Stage-1: MeanFlow Pretraining" and "Implementation Details") pretrains the DINOv2 encoder
with the MeanFlow objective (Geng et al. 2025, "Mean Flows for One-step Generative Modeling") on the encoder latent
``z0 = E(x)`` plus a dispersive regulariser (Wang & He 2025, "Diffuse and Disperse") on the pooled penultimate-block
features: ``L = L_MF + lambda * L_Disp`` (eq. 4, ``lambda = 0.4``); AdamW, lr ``1e-5`` decayed linearly to ``1e-6``
(:func:`spectraflow_monai.optimizers.linear_lr_schedule`), global batch 8 with gradient accumulation, EMA 0.999.

This module provides :class:`MeanFlowPretrainer` (a :class:`~spectraflow_monai.engines.stage1.Stage1Trainer`:
gradient accumulation, mixed precision, EMA of the encoder and multi-process training without
``DistributedDataParallel`` are shared with the MAE variant) and :func:`normalize_latent`, the per-token,
non-affine normalisation of the latent. The encoder is written for Stage-2 by
:class:`spectraflow_monai.handlers.EncoderExportHandler`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from monai.engines.utils import IterationEvents
from torch import nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader

from spectraflow_monai.engines.config import DispersiveConfig, MeanFlowConfig
from spectraflow_monai.engines.stage1 import Stage1Trainer

__all__ = ["MeanFlowPretrainer", "STAGE1_OUTPUT_KEYS", "normalize_latent"]

#: names of the floats in ``MeanFlowPretrainer``'s ``engine.state.output``, the headline first
STAGE1_OUTPUT_KEYS = ("meanflow_error", "loss_meanflow_weighted", "loss_dispersive", "dispersive_weighted", "loss")


def normalize_latent(z: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Normalise a latent map ``(B, C, h, w)`` per token over the channels (non-affine layer norm).

    Each of the ``h·w`` token vectors gets zero mean and unit variance over its ``C`` channels, so the elements of
    ``z0`` have (on average) unit second moment, the scale of the ``N(0, I)`` noise of the MeanFlow path
    ``z_t = (1 - t)·z0 + t·ε`` (SpectraFlow eq. 1). Without it the signal-to-noise ratio along the path would depend
    on the arbitrary scale of the encoder's final LayerNorm (its affine weights are trainable), and the encoder
    could shrink or inflate its latent to make the regression easier instead of learning structure.

    Args:
        z: ``(B, C, h, w)`` latent map.
        eps: variance floor of the layer norm. Defaults to 1e-6.

    Returns:
        the normalised map, same shape; computed in at least float32 under autocast.
    """
    if z.ndim != 4:
        raise ValueError(f"z must have shape (B, C, h, w), got {tuple(z.shape)}.")
    return F.layer_norm(z.permute(0, 2, 3, 1), (z.shape[1],), eps=eps).permute(0, 3, 1, 2)


class MeanFlowPretrainer(Stage1Trainer):
    """SpectraFlow Stage-1 trainer: MeanFlow latent regression + dispersive loss on a DINOv2 encoder.

    One iteration (SpectraFlow, Chen et al., Sec. "Stage-1: MeanFlow Pretraining", eqs. 1-5):

    1. ``x`` (``(B, 3, H, W)``, images or 3-channel masks in mixed-domain batches) and the optional domain flag
       (``(B,)``, 0 image / 1 mask, e.g. from ``RandMixedDomaind``) are read from the batch by ``prepare_batch``
       (:class:`~spectraflow_monai.engines.utils.PrepareBatchMixedDomain`);
    2. ``feats = encoder(x)``; ``z0 = feats.final`` normalised per token by :func:`normalize_latent` when
       ``meanflow.latent_norm`` (so that it has the unit scale of the ``N(0, I)`` noise);
    3. ``L_MF = meanflow_loss(head, z0, domain=...)`` (the domain is passed when the head is domain-conditioned);
       the MeanFlow target is a stop-gradient JVP, so the gradient reaches the encoder through ``z_t`` only;
    4. ``L_Disp = dispersive_loss(feats.pooled)`` on the GAP of the penultimate block; ``L = L_MF + λ·L_Disp``;
    5. backward, gradient accumulation, multi-process gradient averaging, optimizer step and EMA update as
       described in :class:`~spectraflow_monai.engines.stage1.Stage1Trainer` (with the EMA, checkpoint and
       distributed notes).

    ``engine.state.output`` is a dict of Python floats of the current process (0-d tensors on the device with
    ``output_on_device=True``), so that every term is logged by name:

    - ``meanflow_error``: the unweighted mean squared MeanFlow error (mean over samples and latent elements), the
      headline curve: it falls as the head learns the average velocity (NaN when the MeanFlow loss has no
      ``compute`` method);
    - ``loss_meanflow_weighted``: the adaptively weighted MeanFlow loss ``L / (L + c)^p`` that is optimised; with
      the weight's gradient stopped it sits close to 1 by construction (``p = 1``) and says little about progress;
      with ``p = 0`` (eq. 3 as printed) it is the per-sample sum of squared errors, ``meanflow_error`` times the
      number of latent elements;
    - ``loss_dispersive``: ``L_Disp``; ``dispersive_weighted``: ``λ·L_Disp``;
    - ``loss``: the total ``loss_meanflow_weighted + dispersive_weighted`` being optimised.

    For example::

        TensorBoardStatsHandler(log_dir=..., output_transform=lambda out: out)   # tags "meanflow_error", "loss", ...
        StatsHandler(tag_name="loss", output_transform=lambda out: out["loss"])  # the total only
        ignite.handlers.ProgressBar().attach(trainer, output_transform=lambda out: {"err": out["meanflow_error"]})

    (MONAI's default ``output_transform=lambda x: x[0]`` expects a decollated list and does not apply here, and
    ``from_engine(["loss"], first=True)`` returns a 1-tuple for a dict output, which the handlers skip as
    non-scalar. In a bundle config: ``"output_transform": "$lambda out: out"``.)

    Args:
        device: device to run on (e.g. ``"cuda:0"``, ``"cpu"``).
        max_epochs: number of epochs (paper: 300).
        train_data_loader: data loader or iterable of batches (dicts with ``image_key`` and optionally
            ``domain_key``; tensors or ``(image, domain)`` tuples also work).
        encoder: the encoder (``DINOv2Encoder``): ``encoder(x)`` returns features with ``final`` ``(B, C, h, w)``
            and ``pooled`` ``(B, C)``. Its trainable parameters (``requires_grad``) are optimised; for the
            dispersive loss to reach the encoder the penultimate block must be trainable (``trainable_blocks >= 2``
            or ``"all"``), otherwise a warning is issued once.
        head: the MeanFlow head ``head(z, t, s[, domain=...])``
            (:class:`spectraflow_monai.networks.nets.meanflow_head.MeanFlowHead`).
        optimizer: optimizer over the trainable parameters of encoder and head (paper: AdamW, lr 1e-5).
        meanflow: the MeanFlow objective (:class:`~spectraflow_monai.engines.config.MeanFlowConfig`: the loss,
            ``latent_norm``, ``condition_on_domain``). None: ``MeanFlowConfig()`` (``MeanFlowLoss()``, the latent
            normalised, the domain passed when the head has ``num_domains > 0``). Defaults to None.
        dispersive: the dispersive term on ``feats.pooled``
            (:class:`~spectraflow_monai.engines.config.DispersiveConfig`). None: ``DispersiveConfig()``
            (``λ = 0.4``, ``DispersiveLoss()``). Defaults to None.
        amp: mixed precision (see :class:`~spectraflow_monai.engines.stage1.Stage1Trainer`); the MeanFlow JVP always
            runs in float32. Defaults to False.
        kwargs: the other arguments of :class:`~spectraflow_monai.engines.stage1.Stage1Trainer` (``ema``
            ``EMAConfig()``, ``gradients``, ``image_key`` ``"image"``, ``domain_key`` ``"domain"``,
            ``epoch_length``, ``non_blocking``, ``prepare_batch``, ``iteration_update``, ``train_handlers``,
            ``event_names``, ``event_to_attr``, ``decollate``, ``optim_set_to_none``, ``to_kwargs``, ``amp_kwargs``,
            ``precision``, ``output_on_device``), passed by name.

    Raises:
        ValueError: invalid arguments (named with their value); at run time a batch with fewer than 2 samples
            while the dispersive loss is on, a missing ``image_key``, or a domain flag that does not match the batch.

    Example::

        encoder = DINOv2Encoder("vit_small_patch14_dinov2", pretrained="dinov2_vits14.pth", trainable_blocks="all")
        head = MeanFlowHead(in_channels=encoder.embed_dim)
        opt = torch.optim.AdamW(encoder.trainable_parameters() + list(head.parameters()), lr=1e-5)
        trainer = MeanFlowPretrainer("cuda", 300, loader, encoder, head, opt, gradients=GradientConfig(2))
        lr = linear_lr_schedule(opt, total_steps=300 * len(loader))  # spectraflow_monai.optimizers
        for h in (LrScheduleHandler(lr, epoch_level=False), StatsHandler(output_transform=lambda o: o),
                  CheckpointSaver("ckpt", trainer.checkpoint_dict(lr), save_final=True, save_interval=10),
                  EncoderExportHandler(path="ckpt/encoder_ema.pt")):  # spectraflow_monai.handlers
            h.attach(trainer)
        trainer.run()
    """

    def __init__(
        self,
        device: str | torch.device,
        max_epochs: int,
        train_data_loader: Iterable | DataLoader,
        encoder: nn.Module,
        head: nn.Module,
        optimizer: Optimizer,
        meanflow: MeanFlowConfig | None = None,
        dispersive: DispersiveConfig | None = None,
        amp: bool = False,
        **kwargs: Any,
    ) -> None:
        meanflow = MeanFlowConfig() if meanflow is None else meanflow
        if not isinstance(meanflow, MeanFlowConfig):
            raise ValueError(f"meanflow must be MeanFlowConfig or None, got {type(meanflow).__name__}.")
        condition_on_domain, meanflow_loss = meanflow.condition_on_domain, meanflow.loss
        head_domains = getattr(head, "num_domains", 0) or 0
        if condition_on_domain is None:
            condition_on_domain = head_domains > 0
        elif condition_on_domain and head_domains <= 0:
            raise ValueError(
                f"condition_on_domain=True needs a domain-conditioned head (num_domains > 0), got "
                f"num_domains={head_domains!r}."
            )
        if meanflow_loss is None:
            from spectraflow_monai.losses.meanflow import MeanFlowLoss

            meanflow_loss = MeanFlowLoss()
        super().__init__(
            device, max_epochs, train_data_loader, encoder, head, optimizer, dispersive=dispersive, amp=amp, **kwargs
        )
        self.meanflow_loss = meanflow_loss
        self.latent_norm = meanflow.latent_norm
        self.condition_on_domain = bool(condition_on_domain)

    def _iteration(self, engine: MeanFlowPretrainer, batchdata: Any) -> dict[str, float]:
        """One Stage-1 iteration; returns the floats listed in the class notes (``meanflow_error``, ``loss``, ...).

        Args:
            engine: this trainer.
            batchdata: the batch from the data loader.

        Raises:
            ValueError: empty batch, batch size < 2 with the dispersive loss on, or malformed batch.
        """
        images, domain, use_disp, should_step = engine._start_iteration(batchdata)
        head_kwargs = {"domain": domain} if (engine.condition_on_domain and domain is not None) else {}
        with engine._autocast():
            feats = engine.encoder(images)
            if not (hasattr(feats, "final") and hasattr(feats, "pooled")):
                raise ValueError(
                    "encoder(x) must return features with `final` (B, C, h, w) and `pooled` (B, C) "
                    f"(e.g. DINOv2Encoder), got {type(feats).__name__}."
                )
            z0 = normalize_latent(feats.final) if engine.latent_norm else feats.final
            engine.fire_event(IterationEvents.FORWARD_COMPLETED)
            if hasattr(engine.meanflow_loss, "compute"):
                mf = engine.meanflow_loss.compute(engine.head, z0, **head_kwargs)
                loss_mf, mse = mf["loss"].mean(), mf.get("mse")
            else:
                loss_mf, mse = engine.meanflow_loss(engine.head, z0, **head_kwargs).mean(), None
            loss_disp = engine._dispersive_term(feats.pooled) if use_disp else loss_mf.new_zeros(())
            loss = loss_mf.float() + engine.dispersive_weight * loss_disp
        engine._backward_and_step(loss, should_step)

        mse = mse if isinstance(mse, torch.Tensor) else torch.full_like(loss, float("nan"))  # no host-to-device copy
        weighted = engine.dispersive_weight * loss_disp.detach().float()
        return engine._finish_iteration(STAGE1_OUTPUT_KEYS, [mse, loss_mf, loss_disp, weighted, loss])
