"""SpectraFlow Stage-1 encoder pretraining (MeanFlow + dispersive loss) as a MONAI/ignite trainer.

SpectraFlow (Chen et al., "SpectraFlow: Unifying Structural Pretraining and Frequency Adaptation for Medical Image
Segmentation", Sec. "Stage-1: MeanFlow Pretraining" and "Implementation Details") pretrains the DINOv2 encoder
with the MeanFlow objective (Geng et al. 2025, "Mean Flows for One-step Generative Modeling") on the encoder latent
``z0 = E(x)`` plus a dispersive regulariser (Wang & He 2025, "Diffuse and Disperse") on the pooled penultimate-block
features: ``L = L_MF + lambda * L_Disp`` (eq. 4, ``lambda = 0.4``); AdamW, lr ``1e-5`` decayed linearly to ``1e-6``,
global batch 8 with gradient accumulation, EMA 0.999.

This module provides:

- :class:`MeanFlowPretrainer`: a ``monai.engines.Trainer`` running one Stage-1 iteration per batch, with gradient
  accumulation, optional mixed precision, EMA of the encoder (ignite ``EMAHandler``) and multi-process training
  without ``DistributedDataParallel`` (see the class notes);
- :class:`EncoderExportHandler`: writes the (EMA) encoder as a timm-layout state dict that
  ``DINOv2Encoder(pretrained=path)`` loads for Stage-2;
- :func:`linear_lr_schedule` / :class:`LinearDecayLR`: the paper's linear learning-rate decay, resumable with a
  different number of epochs;
- :func:`normalize_latent`: the per-token, non-affine normalisation of the latent.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from monai.engines.trainer import Trainer
from monai.engines.utils import IterationEvents
from monai.engines.workflow import Workflow
from monai.utils import IgniteInfo, min_version, optional_import
from torch import nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader

from spectraflow_monai.utils.checkpoint import atomic_torch_save, check_finite_state, cpu_state_dict

if TYPE_CHECKING:
    from ignite.engine import Engine, EventEnum, Events
    from ignite.handlers import EMAHandler
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")
    Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
    EventEnum, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "EventEnum")
    EMAHandler, _ = optional_import("ignite.handlers", IgniteInfo.OPT_IMPORT_VERSION, min_version, "EMAHandler")

__all__ = [
    "MeanFlowPretrainer",
    "STAGE1_OUTPUT_KEYS",
    "EncoderExportHandler",
    "linear_lr_schedule",
    "LinearDecayLR",
    "normalize_latent",
    "encoder_export_state_dict",
    "save_encoder_export",
]

#: names of the floats in ``MeanFlowPretrainer``'s ``engine.state.output``, the headline first
STAGE1_OUTPUT_KEYS = ("meanflow_error", "loss_meanflow_weighted", "loss_dispersive", "dispersive_weighted", "loss")

_PARALLEL_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


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


def linear_lr_schedule(
    optimizer: Optimizer, total_steps: int, start_lr: float | None = 1e-5, end_lr: float = 1e-6
) -> torch.optim.lr_scheduler.LinearLR:
    """Linear learning-rate decay from ``start_lr`` to ``end_lr`` over ``total_steps`` scheduler steps.

    SpectraFlow Stage-1 (Implementation Details): AdamW, "initial learning rate of 1e-5, linearly decayed to 1e-6".
    This is ``torch.optim.lr_scheduler.LinearLR(start_factor=1, end_factor=end_lr / start_lr)``; after
    ``total_steps`` steps the rate stays at ``end_lr``. Attach it to the trainer with MONAI's
    ``LrScheduleHandler(lr_scheduler, epoch_level=False)``, which steps it after every iteration: then
    ``total_steps = max_epochs * epoch_length`` (iterations, not optimizer steps; with gradient accumulation the
    rate used at each optimizer step still follows the same straight line).

    Args:
        optimizer: the optimizer whose parameter groups are scheduled.
        total_steps: number of scheduler steps over which to decay, ``>= 1``.
        start_lr: initial learning rate; every parameter group's ``lr`` is set to it. ``None`` keeps the groups'
            current rates and uses the first group's rate as the start of the ratio. Defaults to 1e-5.
        end_lr: final learning rate, ``0 <= end_lr <= start_lr``. Defaults to 1e-6.

    Returns:
        a :class:`LinearDecayLR` (a ``LinearLR``; checkpoint it with the rest of the training state; loading a
        checkpoint keeps the configured schedule and restores only the step count).

    Raises:
        ValueError: non-positive ``total_steps`` or ``start_lr``, or ``end_lr`` outside ``[0, start_lr]``.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive int, got {total_steps!r}.")
    if start_lr is None:
        start_lr = float(optimizer.param_groups[0]["lr"])
    else:
        if not (math.isfinite(start_lr) and start_lr > 0):
            raise ValueError(f"start_lr must be > 0, got {start_lr!r}.")
        for group in optimizer.param_groups:
            group["lr"] = float(start_lr)
            group["initial_lr"] = float(start_lr)
    if not start_lr > 0:
        raise ValueError(f"the optimizer's learning rate must be > 0 when start_lr=None, got {start_lr!r}.")
    if not (math.isfinite(end_lr) and 0 <= end_lr <= start_lr):
        raise ValueError(f"end_lr must be in [0, start_lr={start_lr}], got {end_lr!r}.")
    return LinearDecayLR(optimizer, start_factor=1.0, end_factor=end_lr / start_lr, total_iters=total_steps)


class LinearDecayLR(torch.optim.lr_scheduler.LinearLR):
    """``torch.optim.lr_scheduler.LinearLR`` whose checkpoint restores the progress, not the schedule.

    ``load_state_dict`` takes the step count (``last_epoch``) from the checkpoint and keeps this scheduler's own
    configuration (``base_lrs``, ``start_factor``, ``end_factor``, ``total_iters``). Resuming Stage-1 with the same
    settings is therefore an exact resume, and resuming it with more (or fewer) epochs, or other rates, continues on
    the newly configured straight line: the rate right after loading is the new schedule's rate at the restored step
    (a plain ``LinearLR`` would keep decaying over the old length, because its state dict holds ``total_iters``).
    """

    _SCHEDULE_KEYS = ("base_lrs", "start_factor", "end_factor", "total_iters")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        configured = {key: getattr(self, key) for key in self._SCHEDULE_KEYS}
        super().load_state_dict(state_dict)
        if all(state_dict.get(key) == value for key, value in configured.items()):
            return  # same schedule: the loaded state (and the optimizer's restored rates) resume it exactly
        self.__dict__.update(configured)
        rates = self._get_closed_form_lr()
        for group, lr, base_lr in zip(self.optimizer.param_groups, rates, self.base_lrs):
            group["lr"] = lr
            group["initial_lr"] = base_lr
        self._last_lr = list(rates)
        warnings.warn(
            f"learning-rate schedule changed since the checkpoint (total_iters {state_dict.get('total_iters')} -> "
            f"{self.total_iters}, end_factor {state_dict.get('end_factor')} -> {self.end_factor}): continuing at step "
            f"{self.last_epoch} on the new schedule with lr {rates[0]:.3g}.",
            stacklevel=2,
        )


def encoder_export_state_dict(encoder: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copy of an encoder's weights in timm layout (``encoder.vit.state_dict()`` when it has ``vit``).

    Args:
        encoder: a :class:`spectraflow_monai.networks.encoders.DINOv2Encoder` (its timm ``vit`` is exported), an
            ignite ``EMAHandler`` (its ``ema_model`` is exported) or any module (its own state dict).
    """
    if isinstance(encoder, EMAHandler):
        encoder = encoder.ema_model
    if isinstance(encoder, _PARALLEL_WRAPPERS):
        encoder = encoder.module
    if not isinstance(encoder, nn.Module):
        raise ValueError(f"encoder must be an nn.Module or an EMAHandler, got {type(encoder).__name__}.")
    module = encoder.vit if isinstance(getattr(encoder, "vit", None), nn.Module) else encoder
    return cpu_state_dict(module.state_dict())


def save_encoder_export(encoder: nn.Module, path: str | os.PathLike) -> Path:
    """Atomically write :func:`encoder_export_state_dict` of ``encoder`` to ``path``.

    The file is a plain state dict of tensors (loadable with ``torch.load(..., weights_only=True)``) that
    ``DINOv2Encoder(model_name=..., pretrained=path)`` and ``DINOv2Encoder.load_weights(path)`` accept.

    Raises:
        NonFiniteStateError: a weight holds NaN or inf; nothing is written (an earlier export is kept).
    """
    state = encoder_export_state_dict(encoder)
    check_finite_state(state, os.fspath(path))
    return atomic_torch_save(state, path)


def _is_rank_zero() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class EncoderExportHandler:
    """Ignite handler writing the Stage-1 encoder for Stage-2 fine-tuning (SpectraFlow, Chen et al.).

    SpectraFlow Stage-2 initialises its encoder "from Stage-1"; the MeanFlow head is discarded. This handler saves
    the encoder (by default the EMA encoder of :class:`MeanFlowPretrainer`, i.e. the EMA-0.999-stabilised weights)
    as a timm-layout state dict, atomically (temporary file + ``os.replace``), on rank 0 only, at
    ``Events.COMPLETED`` and, when ``epoch_level``, every ``interval`` epochs. ``DINOv2Encoder(pretrained=path)``
    loads the file.

    Args:
        encoder: the module to export: a ``DINOv2Encoder``, an ignite ``EMAHandler`` (its ``ema_model``) or any
            module. ``None`` resolves at save time to ``engine.ema_encoder`` when the engine has one (EMA enabled),
            else ``engine.encoder``. Defaults to ``None``.
        path: destination file. Defaults to ``"encoder_stage1.pt"``.
        epoch_level: also save after every ``interval`` epochs (the file is overwritten). Defaults to True.
        interval: epoch interval when ``epoch_level``, ``>= 1``. Defaults to 1.

    Example (bundle config)::

        {"_target_": "spectraflow_monai.engines.EncoderExportHandler", "path": "$@ckpt_dir + '/encoder_ema.pt'"}
    """

    def __init__(
        self,
        encoder: nn.Module | EMAHandler | None = None,
        path: str | os.PathLike = "encoder_stage1.pt",
        epoch_level: bool = True,
        interval: int = 1,
    ) -> None:
        if encoder is not None and not isinstance(encoder, (nn.Module, EMAHandler)):
            raise ValueError(f"encoder must be None, an nn.Module or an EMAHandler, got {type(encoder).__name__}.")
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"path must be a non-empty file path, got {path!r}.")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be a positive int, got {interval!r}.")
        self.encoder = encoder
        self.path = Path(os.fspath(path)).expanduser()
        self.epoch_level = bool(epoch_level)
        self.interval = interval
        self._last_saved_iteration: int | None = None

    def attach(self, engine: Engine) -> None:
        """Register the save events on ``engine``."""
        if self.epoch_level:
            engine.add_event_handler(Events.EPOCH_COMPLETED(every=self.interval), self)
        engine.add_event_handler(Events.COMPLETED, self)

    def _resolve(self, engine: Engine) -> nn.Module:
        if self.encoder is not None:
            return self.encoder.ema_model if isinstance(self.encoder, EMAHandler) else self.encoder
        for attr in ("ema_encoder", "encoder"):
            module = getattr(engine, attr, None)
            if isinstance(module, nn.Module):
                return module
        raise ValueError(
            "EncoderExportHandler(encoder=None) needs an engine with an `ema_encoder` or `encoder` module "
            f"(e.g. MeanFlowPretrainer), got {type(engine).__name__}; pass the encoder explicitly."
        )

    def __call__(self, engine: Engine) -> None:
        """Save the encoder unless it was already saved at this iteration (last epoch + completion)."""
        iteration = int(engine.state.iteration)
        if self._last_saved_iteration == iteration and self.path.is_file():
            return
        module = self._resolve(engine)
        if _is_rank_zero():
            save_encoder_export(module, self.path)
            engine.logger.info(f"encoder exported to {self.path} (iteration {iteration}).")
        self._last_saved_iteration = iteration


class MeanFlowPretrainer(Trainer):
    """SpectraFlow Stage-1 trainer: MeanFlow latent regression + dispersive loss on a DINOv2 encoder.

    One iteration (SpectraFlow, Chen et al., Sec. "Stage-1: MeanFlow Pretraining", eqs. 1-5):

    1. ``x`` (``(B, 3, H, W)``, images or 3-channel masks in mixed-domain batches) and the optional domain flag
       (``(B,)``, 0 image / 1 mask, e.g. from ``RandMixedDomaind``) are read from the batch;
    2. ``feats = encoder(x)``; ``z0 = feats.final`` normalised per token by :func:`normalize_latent` when
       ``latent_norm`` (so that it has the unit scale of the ``N(0, I)`` noise);
    3. ``L_MF = meanflow_loss(head, z0, domain=...)`` (the domain is passed when the head is domain-conditioned);
       the MeanFlow target is a stop-gradient JVP, so the gradient reaches the encoder through ``z_t`` only;
    4. ``L_Disp = dispersive_loss(feats.pooled)`` on the GAP of the penultimate block; ``L = L_MF + λ·L_Disp``;
    5. ``(L / accumulation_steps).backward()``; every ``accumulation_steps`` iterations (and at the end of an
       epoch whose length is not a multiple of it, as in MONAI's ``SupervisedTrainer``) the gradients are
       averaged across processes (distributed runs), the optimizer steps and the EMA encoder is updated.

    ``engine.state.output`` is a dict of Python floats of the current process, so that every term is logged by
    name:

    - ``meanflow_error``: the unweighted mean squared MeanFlow error (mean over samples and latent elements), the
      headline curve: it falls as the head learns the average velocity (NaN when ``meanflow_loss`` has no
      ``compute`` method);
    - ``loss_meanflow_weighted``: the adaptively weighted MeanFlow loss ``L / (L + c)^p`` that is optimised; with
      the weight's gradient stopped it sits close to 1 by construction and says little about progress;
    - ``loss_dispersive``: ``L_Disp``; ``dispersive_weighted``: ``λ·L_Disp``;
    - ``loss``: the total ``loss_meanflow_weighted + dispersive_weighted`` being optimised.

    For example::

        TensorBoardStatsHandler(log_dir=..., output_transform=lambda out: out)   # tags "meanflow_error", "loss", ...
        StatsHandler(tag_name="loss", output_transform=lambda out: out["loss"])  # the total only
        ignite.handlers.ProgressBar().attach(trainer, output_transform=lambda out: {"err": out["meanflow_error"]})

    (MONAI's default ``output_transform=lambda x: x[0]`` expects a decollated list and does not apply here, and
    ``from_engine(["loss"], first=True)`` returns a 1-tuple for a dict output, which the handlers skip as
    non-scalar. In a bundle config: ``"output_transform": "$lambda out: out"``.)

    Global batch = ``batch_size × accumulation_steps × world_size`` (the paper uses a global batch of 8).

    EMA: with ``ema_decay`` an ignite ``EMAHandler(encoder, momentum=1 - ema_decay)`` is attached (before the
    ``train_handlers``, so that iteration-level checkpoints see the updated EMA) to ``ITERATION_COMPLETED`` filtered
    to the iterations where the optimizer stepped; ``engine.ema_encoder`` is the EMA model and
    ``engine.ema_handler`` the handler. At the first iteration of a fresh run (``state.iteration == 1``) the EMA
    encoder is reset to the live encoder, so weights loaded at ``Events.STARTED`` (e.g. a ``CheckpointLoader``
    that loads only the encoder) are the EMA's starting point; when resuming (``iteration > 1``) the loaded EMA is
    kept.

    Checkpoints: :meth:`checkpoint_dict` returns the objects to hand to MONAI's ``CheckpointSaver`` /
    ``CheckpointLoader`` (``encoder``, ``head``, ``optimizer``, ``ema``, ``trainer`` for epoch/iteration, and the lr
    scheduler / AMP grad scaler when used) so that training resumes exactly; :class:`EncoderExportHandler` writes
    the EMA encoder for Stage-2. In a bundle, a handler passed in ``train_handlers`` cannot reference the trainer
    (circular reference); pass a pre-built ``ema_encoder`` module and reference that, or attach the saver after
    construction (``"$@saver.attach(@train#trainer)"``) with ``save_dict="$@train#trainer.checkpoint_dict(@lr)"``.

    Distributed training: ``torch.func.jvp`` (used by the MeanFlow target) cannot differentiate through a
    ``DistributedDataParallel`` wrapper, so the modules are NOT wrapped. Instead, when ``torch.distributed`` is
    initialised with more than one process (or ``distributed=True``), at the first iteration of every ``run()``
    (after all ``Events.STARTED`` handlers, e.g. checkpoint loading) the parameters and buffers of the encoder, the
    head and the EMA encoder are broadcast from rank 0, and before every optimizer step the gradients of all
    trainable parameters of encoder + head are summed with ``all_reduce`` (in flat buckets of ``grad_bucket_mb``)
    and divided by the world size, which is what DDP does. A trainable parameter without gradient gets a zero
    gradient first, so all ranks take part in the same collectives. Each process must see a different data shard
    (``DistributedSampler``) with the same number of iterations per epoch. The dispersive loss uses the in-process
    batch only (negatives are not gathered across processes), as in the single-GPU setting of the paper; with
    that, ``N`` processes with ``accumulation_steps=1`` give the same update as one process with
    ``accumulation_steps=N`` that sees the shards one after another.

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
        meanflow_loss: MeanFlow loss; its ``compute`` method (returning ``{"loss", "mse"}``) is used when present.
            Defaults to ``MeanFlowLoss()``.
        dispersive_loss: dispersive loss on ``feats.pooled``. Defaults to ``DispersiveLoss()``.
        dispersive_weight: ``λ >= 0`` of eq. 4; 0 disables the dispersive term. Defaults to 0.4.
        accumulation_steps: mini-batches per optimizer step, ``>= 1``. Defaults to 1.
        latent_norm: normalise ``z0`` with :func:`normalize_latent`. Defaults to True.
        ema_decay: EMA decay of the encoder in ``(0, 1)`` (paper: 0.999), or None to disable. Defaults to 0.999.
        ema_encoder: optional module of the encoder's architecture that holds the EMA weights (its weights are
            overwritten with the encoder's); lets other objects reference the EMA model before the trainer exists.
            Defaults to None (a deep copy of ``encoder``).
        image_key: batch key of the input images. Defaults to ``"image"``.
        domain_key: batch key of the 0/1 domain flag (missing key: no domain). Defaults to ``"domain"``.
        condition_on_domain: pass the domain to the head. None: when ``head.num_domains > 0``. Defaults to None.
        epoch_length: iterations per epoch, default ``len(train_data_loader)``.
        non_blocking: non-blocking host-to-device copies. Defaults to False.
        prepare_batch: optional ``prepare_batch(batchdata, device, non_blocking, **to_kwargs)`` returning the image
            tensor or ``(image, domain)``; None reads ``image_key`` / ``domain_key``. Defaults to None.
        iteration_update: replaces :meth:`_iteration` (ignite process function) when given. Defaults to None.
        train_handlers: ignite/MONAI handlers with ``attach(engine)`` (StatsHandler, CheckpointSaver, ...).
        amp: mixed precision: ``torch.autocast`` with float16 + ``GradScaler`` on CUDA, bfloat16 without scaler on
            CPU (``amp_kwargs={"dtype": torch.bfloat16}`` selects bfloat16 on CUDA). The MeanFlow JVP always runs in
            float32. Defaults to False.
        event_names: additional custom ignite events to register.
        event_to_attr: mapping of events to state attributes (ignite ``register_events``).
        decollate: decollate batch and output after the iteration; the output is a dict of scalars, so keep False.
            Defaults to False.
        optim_set_to_none: ``optimizer.zero_grad(set_to_none=...)``. Defaults to False.
        to_kwargs: extra arguments for ``Tensor.to`` when moving the batch (and for ``prepare_batch``).
        amp_kwargs: extra arguments for ``torch.autocast`` (e.g. ``{"dtype": torch.bfloat16}``).
        distributed: all-reduce gradients across processes. None: when ``torch.distributed`` is initialised with
            world size > 1 (checked at the start of every run); True: require an initialised process group.
            Defaults to None.
        grad_bucket_mb: size of the flat gradient buckets of the all-reduce, in MiB, > 0. Defaults to 25.

    Raises:
        ValueError: invalid arguments (named with their value); at run time a batch with fewer than 2 samples
            while the dispersive loss is on, a missing ``image_key``, or a domain flag that does not match the batch.

    Example::

        encoder = DINOv2Encoder("vit_small_patch14_dinov2", pretrained="dinov2_vits14.pth", trainable_blocks="all")
        head = MeanFlowHead(in_channels=encoder.embed_dim)
        opt = torch.optim.AdamW(encoder.trainable_parameters() + list(head.parameters()), lr=1e-5)
        trainer = MeanFlowPretrainer("cuda", 300, loader, encoder, head, opt, accumulation_steps=2)
        lr = linear_lr_schedule(opt, total_steps=300 * len(loader))
        for h in (LrScheduleHandler(lr, epoch_level=False), StatsHandler(output_transform=lambda o: o),
                  CheckpointSaver("ckpt", trainer.checkpoint_dict(lr), save_final=True, save_interval=10),
                  EncoderExportHandler(path="ckpt/encoder_ema.pt")):
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
        meanflow_loss: Callable | None = None,
        dispersive_loss: Callable | None = None,
        dispersive_weight: float = 0.4,
        accumulation_steps: int = 1,
        latent_norm: bool = True,
        ema_decay: float | None = 0.999,
        ema_encoder: nn.Module | None = None,
        image_key: str = "image",
        domain_key: str | None = "domain",
        condition_on_domain: bool | None = None,
        epoch_length: int | None = None,
        non_blocking: bool = False,
        prepare_batch: Callable | None = None,
        iteration_update: Callable[[Engine, Any], Any] | None = None,
        train_handlers: Sequence | None = None,
        amp: bool = False,
        event_names: list[str | EventEnum | type[EventEnum]] | None = None,
        event_to_attr: dict | None = None,
        decollate: bool = False,
        optim_set_to_none: bool = False,
        to_kwargs: dict | None = None,
        amp_kwargs: dict | None = None,
        distributed: bool | None = None,
        grad_bucket_mb: float = 25.0,
    ) -> None:
        if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
            raise ValueError(f"max_epochs must be a positive int, got {max_epochs!r}.")
        for name, module in (("encoder", encoder), ("head", head)):
            if not isinstance(module, nn.Module):
                raise ValueError(f"{name} must be an nn.Module, got {type(module).__name__}.")
            if isinstance(module, _PARALLEL_WRAPPERS):
                raise ValueError(
                    f"{name} must be the plain module, got {type(module).__name__}: torch.func.jvp cannot "
                    "differentiate through (Distributed)DataParallel; the trainer all-reduces gradients itself."
                )
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be a positive int, got {accumulation_steps!r}.")
        if isinstance(dispersive_weight, bool) or not isinstance(dispersive_weight, (int, float)):
            raise ValueError(f"dispersive_weight must be a number >= 0, got {dispersive_weight!r}.")
        if not (math.isfinite(dispersive_weight) and dispersive_weight >= 0):
            raise ValueError(f"dispersive_weight must be a finite number >= 0, got {dispersive_weight!r}.")
        if ema_decay is not None and not (isinstance(ema_decay, (int, float)) and 0 < ema_decay < 1):
            raise ValueError(f"ema_decay must be None or in (0, 1), got {ema_decay!r}.")
        if ema_encoder is not None:
            if ema_decay is None:
                raise ValueError("ema_encoder was given but ema_decay is None; set ema_decay or drop ema_encoder.")
            if not isinstance(ema_encoder, nn.Module) or ema_encoder is encoder:
                raise ValueError("ema_encoder must be a separate nn.Module with the encoder's architecture.")
        if not isinstance(image_key, str) or not image_key:
            raise ValueError(f"image_key must be a non-empty str, got {image_key!r}.")
        if domain_key is not None and not isinstance(domain_key, str):
            raise ValueError(f"domain_key must be a str or None, got {domain_key!r}.")
        head_domains = getattr(head, "num_domains", 0) or 0
        if condition_on_domain is None:
            condition_on_domain = head_domains > 0
        elif condition_on_domain and head_domains <= 0:
            raise ValueError(
                f"condition_on_domain=True needs a domain-conditioned head (num_domains > 0), got "
                f"num_domains={head_domains!r}."
            )
        if distributed is not None and not isinstance(distributed, bool):
            raise ValueError(f"distributed must be None, True or False, got {distributed!r}.")
        if distributed and not dist.is_available():
            raise ValueError("distributed=True but torch.distributed is not available in this build of torch.")
        if not (isinstance(grad_bucket_mb, (int, float)) and grad_bucket_mb > 0):
            raise ValueError(f"grad_bucket_mb must be > 0, got {grad_bucket_mb!r}.")
        if prepare_batch is not None and not callable(prepare_batch):
            raise ValueError(f"prepare_batch must be callable or None, got {type(prepare_batch).__name__}.")

        # handlers are attached below, after the EMA handler (see the class notes)
        super().__init__(
            device=device,
            max_epochs=max_epochs,
            data_loader=train_data_loader,
            epoch_length=epoch_length,
            non_blocking=non_blocking,
            iteration_update=iteration_update,
            handlers=None,
            amp=amp,
            event_names=event_names,
            event_to_attr=event_to_attr,
            decollate=decollate,
            to_kwargs=to_kwargs,
            amp_kwargs=amp_kwargs,
        )
        if meanflow_loss is None:
            from spectraflow_monai.losses.meanflow import MeanFlowLoss

            meanflow_loss = MeanFlowLoss()
        if dispersive_loss is None and dispersive_weight > 0:
            from spectraflow_monai.losses.dispersive import DispersiveLoss

            dispersive_loss = DispersiveLoss()
        if not callable(meanflow_loss):
            raise ValueError(f"meanflow_loss must be callable, got {type(meanflow_loss).__name__}.")
        if dispersive_loss is not None and not callable(dispersive_loss):
            raise ValueError(f"dispersive_loss must be callable, got {type(dispersive_loss).__name__}.")

        self.encoder = encoder
        self.head = head
        self.optimizer = optimizer
        self.meanflow_loss = meanflow_loss
        self.dispersive_loss = dispersive_loss
        self.dispersive_weight = float(dispersive_weight)
        self.accumulation_steps = accumulation_steps
        self.latent_norm = bool(latent_norm)
        self.image_key = image_key
        self.domain_key = domain_key
        self.condition_on_domain = bool(condition_on_domain)
        self.custom_prepare_batch = prepare_batch
        self.optim_set_to_none = optim_set_to_none
        self.distributed_arg = distributed
        self.grad_bucket_bytes = int(grad_bucket_mb * 2**20)

        # mixed precision: fp16 + GradScaler on CUDA, bf16 elsewhere (no scaler needed)
        dev = self.state.device if self.state.device is not None else torch.device("cpu")
        self._device_type = dev.type if dev.type in ("cuda", "cpu", "xpu", "mps") else "cpu"
        autocast_kwargs = dict(self.amp_kwargs)
        autocast_kwargs.setdefault("dtype", torch.float16 if self._device_type == "cuda" else torch.bfloat16)
        self._autocast_kwargs = autocast_kwargs
        use_scaler = self.amp and self._device_type == "cuda" and autocast_kwargs["dtype"] == torch.float16
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None

        # per-run state
        self.optimizer_stepped = False  # True after an iteration that stepped the optimizer
        self.distributed = False
        self.world_size = 1
        self._run_setup_pending = True
        self._warned_no_disp_grad = False
        self.add_event_handler(Events.STARTED, self._mark_run_started)

        self.ema_handler: EMAHandler | None = None
        if ema_decay is not None:
            self.ema_handler = EMAHandler(encoder, momentum=1.0 - float(ema_decay))
            if ema_encoder is not None:
                ema_encoder.load_state_dict(encoder.state_dict())
                for p in ema_encoder.parameters():
                    p.requires_grad_(False)
                ema_encoder.eval()
                self.ema_handler.ema_model = ema_encoder
            self.ema_handler.attach(
                self,
                name="ema_momentum",
                event=Events.ITERATION_COMPLETED(event_filter=lambda engine, _: engine.optimizer_stepped),
            )
        if train_handlers is not None:
            self._register_handlers(train_handlers)

    # ------------------------------------------------------------------ public helpers
    @property
    def ema_encoder(self) -> nn.Module | None:
        """The EMA copy of the encoder (None when ``ema_decay=None``)."""
        return None if self.ema_handler is None else self.ema_handler.ema_model

    def checkpoint_dict(self, lr_scheduler: Any | None = None) -> dict[str, Any]:
        """Objects to save/load for an exact resume (for MONAI ``CheckpointSaver`` / ``CheckpointLoader``).

        Keys: ``"encoder"``, ``"head"``, ``"optimizer"``, ``"trainer"`` (this engine: epoch and iteration),
        ``"ema"`` (the EMA encoder, when enabled), ``"lr_scheduler"`` (when given) and ``"scaler"`` (AMP fp16).
        """
        out: dict[str, Any] = {"encoder": self.encoder, "head": self.head, "optimizer": self.optimizer}
        if self.ema_encoder is not None:
            out["ema"] = self.ema_encoder
        if lr_scheduler is not None:
            out["lr_scheduler"] = lr_scheduler
        if self.scaler is not None:
            out["scaler"] = self.scaler
        out["trainer"] = self
        return out

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters of encoder + head that require gradient (deduplicated, in module order)."""
        seen: set[int] = set()
        params = []
        for module in (self.encoder, self.head):
            for p in module.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        return params

    def run(self) -> None:  # type: ignore[override]
        """Run training (continues from the current state when called again).

        Unlike ``monai.engines.Trainer.run`` the AMP grad scaler is created once in ``__init__`` (so that it can be
        checkpointed) and only for float16 autocast on CUDA.
        """
        Workflow.run(self)

    # ------------------------------------------------------------------ internals
    def _mark_run_started(self, engine: Engine) -> None:
        self._run_setup_pending = True

    def _setup_run(self) -> None:
        """First iteration of a run: resolve distributed mode, sync ranks, reset the EMA on a fresh start."""
        initialised = dist.is_available() and dist.is_initialized()
        if self.distributed_arg and not initialised:
            raise RuntimeError(
                "MeanFlowPretrainer(distributed=True) needs an initialised torch.distributed process group "
                "(call torch.distributed.init_process_group before running)."
            )
        self.world_size = dist.get_world_size() if initialised else 1
        self.distributed = initialised and self.world_size > 1 and self.distributed_arg is not False
        if self.ema_handler is not None and self.state.iteration == 1:
            self.ema_handler.ema_model.load_state_dict(self.encoder.state_dict())
        if self.distributed:
            modules = [self.encoder, self.head]
            if self.ema_encoder is not None:
                modules.append(self.ema_encoder)
            with torch.no_grad():
                for module in modules:
                    for tensor in [*module.parameters(), *module.buffers()]:
                        dist.broadcast(tensor.data, src=0)
        self._run_setup_pending = False

    def _all_reduce_gradients(self) -> None:
        """Average the gradients of all trainable encoder + head parameters across processes (bucketed)."""
        params = self.trainable_parameters()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        buckets: dict[tuple, list[list[torch.Tensor]]] = {}
        for p in params:
            grad = p.grad
            key = (grad.device, grad.dtype)
            groups = buckets.setdefault(key, [[]])
            current = groups[-1]
            size = sum(g.numel() for g in current) * grad.element_size()
            if current and size + grad.numel() * grad.element_size() > self.grad_bucket_bytes:
                current = []
                groups.append(current)
            current.append(grad)
        for groups in buckets.values():
            for bucket in groups:
                flat = torch._utils._flatten_dense_tensors(bucket)
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat.div_(self.world_size)
                for grad, synced in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket)):
                    grad.copy_(synced)

    def _prepare(self, batchdata: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self.state.device
        if self.custom_prepare_batch is not None:
            out = self.custom_prepare_batch(batchdata, device, self.non_blocking, **self.to_kwargs)
            image, domain = (
                (out[0], out[1] if len(out) > 1 else None) if isinstance(out, (tuple, list)) else (out, None)
            )
        elif isinstance(batchdata, Mapping):
            if self.image_key not in batchdata:
                raise ValueError(
                    f"the batch has no image_key {self.image_key!r}; its keys are {sorted(map(str, batchdata))}."
                )
            image = batchdata[self.image_key]
            domain = batchdata.get(self.domain_key) if self.domain_key is not None else None
        elif isinstance(batchdata, torch.Tensor):
            image, domain = batchdata, None
        elif isinstance(batchdata, (tuple, list)) and len(batchdata) > 0:
            image, domain = batchdata[0], (batchdata[1] if len(batchdata) > 1 else None)
        else:
            raise ValueError(
                f"unsupported batch type {type(batchdata).__name__}; expected a dict with {self.image_key!r}."
            )
        if not isinstance(image, torch.Tensor):
            raise ValueError(f"the batch image must be a tensor (B, C, H, W), got {type(image).__name__}.")
        if image.ndim != 4:
            raise ValueError(f"the batch image must have shape (B, C, H, W), got {tuple(image.shape)}.")
        if hasattr(image, "as_tensor"):  # MetaTensor -> plain tensor
            image = image.as_tensor()
        image = image.to(device=device, non_blocking=self.non_blocking, **self.to_kwargs)
        if not image.is_floating_point():
            image = image.float()
        if domain is not None:
            if hasattr(domain, "as_tensor"):
                domain = domain.as_tensor()
            domain = torch.as_tensor(domain)
            if domain.is_floating_point():
                domain = domain.round()
            domain = domain.reshape(-1).to(device=device, dtype=torch.long, non_blocking=self.non_blocking)
            if domain.numel() != image.shape[0]:
                raise ValueError(
                    f"the domain flag {self.domain_key!r} has {domain.numel()} entries for a batch of "
                    f"{image.shape[0]} images."
                )
        return image, domain

    def _accumulation_flags(self) -> tuple[bool, bool]:
        acc = self.accumulation_steps
        if acc == 1:
            return True, True
        epoch_length = self.state.epoch_length
        if epoch_length is not None:
            local = (self.state.iteration - 1) % epoch_length
            return local % acc == 0, (local + 1) % acc == 0 or (local + 1) == epoch_length
        local = self.state.iteration - 1
        return local % acc == 0, (local + 1) % acc == 0

    def _backward_and_step(self, loss: torch.Tensor, should_step: bool) -> None:
        """The optimisation half of an iteration, shared by the Stage-1 objectives: expose the loss to
        ``LOSS_COMPLETED`` handlers (e.g. ``StopOnNonFiniteLoss``, before any weight changes), back-propagate the
        (accumulation-scaled, grad-scaled) loss and, on an optimizer step, average gradients across processes and step.
        """
        self.state.output = {"loss": loss.detach()}  # what LOSS_COMPLETED handlers (StopOnNonFiniteLoss) read
        self.fire_event(IterationEvents.LOSS_COMPLETED)
        scaled = loss / self.accumulation_steps if self.accumulation_steps > 1 else loss
        if self.scaler is not None:
            self.scaler.scale(scaled).backward()
        else:
            scaled.backward()
        self.fire_event(IterationEvents.BACKWARD_COMPLETED)
        if should_step:
            if self.distributed:
                self._all_reduce_gradients()
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer_stepped = True

    def _iteration(self, engine: MeanFlowPretrainer, batchdata: Any) -> dict[str, float]:
        """One Stage-1 iteration; returns the floats listed in the class notes (``meanflow_error``, ``loss``, ...).

        Args:
            engine: this trainer.
            batchdata: the batch from the data loader.

        Raises:
            ValueError: empty batch, batch size < 2 with the dispersive loss on, or malformed batch.
        """
        if batchdata is None:
            raise ValueError("Must provide batch data for current iteration.")
        if engine._run_setup_pending:
            engine._setup_run()
        engine.optimizer_stepped = False
        images, domain = engine._prepare(batchdata)
        batch_size = int(images.shape[0])
        use_disp = engine.dispersive_weight > 0 and engine.dispersive_loss is not None
        if use_disp and batch_size < 2:
            raise ValueError(
                f"the dispersive loss needs at least 2 samples per batch (in-batch negatives), got batch size "
                f"{batch_size} at iteration {engine.state.iteration}; use batch_size >= 2 (and drop_last=True), or "
                "dispersive_weight=0."
            )
        should_zero_grad, should_step = engine._accumulation_flags()

        engine.encoder.train()
        engine.head.train()
        if should_zero_grad:
            engine.optimizer.zero_grad(set_to_none=engine.optim_set_to_none)

        head_kwargs = {"domain": domain} if (engine.condition_on_domain and domain is not None) else {}
        autocast = torch.autocast(engine._device_type, **engine._autocast_kwargs) if engine.amp else nullcontext()
        with autocast:
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
            if use_disp:
                pooled = feats.pooled
                if not pooled.requires_grad and torch.is_grad_enabled() and not engine._warned_no_disp_grad:
                    warnings.warn(
                        "the pooled penultimate-block features do not require gradient, so the dispersive loss "
                        "cannot change the encoder; make the penultimate block trainable "
                        "(DINOv2Encoder(trainable_blocks>=2 or 'all')) or set dispersive_weight=0.",
                        stacklevel=2,
                    )
                    engine._warned_no_disp_grad = True
                loss_disp = engine.dispersive_loss(pooled).mean().float()
            else:
                loss_disp = loss_mf.new_zeros(())
            loss = loss_mf.float() + engine.dispersive_weight * loss_disp
        engine._backward_and_step(loss, should_step)

        values = torch.stack(
            [
                (mse.detach().float() if isinstance(mse, torch.Tensor) else loss.new_tensor(float("nan"))),
                loss_mf.detach().float(),
                loss_disp.detach().float(),
                engine.dispersive_weight * loss_disp.detach().float(),
                loss.detach().float(),
            ]
        ).tolist()  # one device synchronisation for all five
        engine.state.output = dict(zip(STAGE1_OUTPUT_KEYS, values))
        engine.fire_event(IterationEvents.MODEL_COMPLETED)
        return engine.state.output
